//! The test that a directory is this user's alone: a real directory, owned by them, that nobody else may write or rename entries in.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::errors::PlaceError;
use super::users::{my_uid, user_label};

/// Checks that `path` (not followed if a symlink) is a directory owned by this user that no
/// one else may write to. `advice` finishes the error message.
pub fn check_private(path: &Path, advice: &str) -> Result<(), PlaceError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| PlaceError::Io {
        path: path.to_owned(),
        what: "cannot inspect this directory",
        source,
    })?;
    check_meta(path, &meta, advice)
}

/// [`check_private`] of metadata already in hand (an open directory's).
pub(super) fn check_meta(path: &Path, meta: &std::fs::Metadata, advice: &str) -> Result<(), PlaceError> {
    if !meta.file_type().is_dir() {
        return Err(PlaceError::NotADirectory { path: path.to_owned(), advice: advice.into() });
    }
    if meta.uid() != my_uid() {
        return Err(PlaceError::NotOwned {
            path: path.to_owned(),
            owner: user_label(meta.uid()),
            advice: advice.into(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(PlaceError::Writable { path: path.to_owned(), mode: meta.mode() & 0o7777, advice: advice.into() });
    }
    Ok(())
}

/// Whether users other than the owner can rename or remove entries of the directory
/// `meta` describes: writable by others, or by a group other than the owner's private
/// group (named after the owner, with no other members), without the sticky bit.
pub fn others_can_write(meta: &std::fs::Metadata) -> bool {
    let mode = meta.mode();
    if mode & libc::S_ISVTX != 0 {
        return false;
    }
    mode & 0o002 != 0 || (mode & 0o020 != 0 && !private_group(meta.gid(), meta.uid()))
}

/// A user private group: named like its one user, listing no other members.
fn private_group(gid: u32, uid: u32) -> bool {
    use uzers::os::unix::GroupExt;
    match (uzers::get_group_by_gid(gid), uzers::get_user_by_uid(uid)) {
        (Some(group), Some(user)) => group.name() == user.name() && group.members().iter().all(|m| m == user.name()),
        _ => false,
    }
}
