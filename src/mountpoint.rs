//! Mountpoint checks: create, detect live or stale mounts, unmount (as root or via fusermount3).

use stagefs_archive::escape::Shown;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use stagefs_open::places;

/// Problems with the mountpoint itself, each telling the user what to do.
#[derive(Debug, thiserror::Error)]
pub enum MountpointError {
    #[error("{}: mountpoint is not empty; choose an empty or new directory", .0.shown())]
    NotEmpty(PathBuf),
    #[error("{}: already mounted{}; run `stagefs umount {}` first", .0.shown(), describe(.1), .0.shown())]
    AlreadyMounted(PathBuf, Option<String>),
    #[error("{}: not a directory", .0.shown())]
    NotADirectory(PathBuf),
    #[error("{}: mount is busy (a process has a file open or its working directory inside); stop it, or use `stagefs umount --lazy`", .0.shown())]
    Busy(PathBuf),
    #[error("{}: not mounted", .0.shown())]
    NotMounted(PathBuf),
    #[error("{}: {what}: {source}", path.shown())]
    Io { path: PathBuf, what: &'static str, source: std::io::Error },
    #[error("cannot unmount {}: {message}", path.shown())]
    Unmount { path: PathBuf, message: String },
    #[error(transparent)]
    Place(#[from] places::PlaceError),
}

fn describe(fstype: &Option<String>) -> String {
    fstype.as_ref().map(|t| format!(" (by a {t} filesystem)")).unwrap_or_default()
}

/// Makes `path` absolute with its parent's symlinks resolved; the last component is not
/// resolved, because stat on a dead FUSE mount fails.
pub fn resolve(path: &Path) -> Result<PathBuf, MountpointError> {
    let absolute = std::path::absolute(path).map_err(|source| MountpointError::Io {
        path: path.to_owned(),
        what: "cannot make the path absolute",
        source,
    })?;
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => match parent.canonicalize() {
            Ok(parent) => Ok(parent.join(name)),
            Err(_) => Ok(absolute),
        },
        _ => Ok(absolute),
    }
}

/// Gets `path` ready to mount on: creates it and its missing parents (0700, checked
/// against other users by [`places`]), recovers a stale FUSE mount, refuses a live mount
/// or a non-empty directory. Returns the directories it created, outermost first.
pub fn prepare(path: &Path) -> Result<Vec<PathBuf>, MountpointError> {
    let mut created = places::mountpoint_parents(path)?;
    // statfs always reaches the filesystem; stat may be answered from the kernel's cache
    // even after a FUSE daemon died, hiding the stale mount.
    let probe =
        nix::sys::statfs::statfs(path).err().map(std::io::Error::from).map_or_else(|| std::fs::metadata(path), Err);
    match probe {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if places::create_mountpoint(path).is_err() {
                // The last mount leaving may have just removed an empty parent that
                // stagefs made (see `places::remove_created`): make them again, once.
                created.extend(places::mountpoint_parents(path)?);
                places::create_mountpoint(path)?;
            }
            created.push(path.to_owned());
            return Ok(created);
        }
        // ENOTCONN: the daemon is gone; ECONNABORTED: it died while a request was in flight.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
            tracing::warn!(mountpoint = %path.shown(), "found a stale mount (its daemon died); unmounting it");
            unmount(path, true)?;
        }
        Err(source) => {
            return Err(MountpointError::Io { path: path.to_owned(), what: "cannot inspect the mountpoint", source })
        }
        Ok(meta) if !meta.is_dir() => return Err(MountpointError::NotADirectory(path.to_owned())),
        Ok(_) => {}
    }
    if let Some(fstype) = mounted_fstype(path) {
        return Err(MountpointError::AlreadyMounted(path.to_owned(), Some(fstype)));
    }
    let mut entries = std::fs::read_dir(path).map_err(|source| MountpointError::Io {
        path: path.to_owned(),
        what: "cannot list the mountpoint",
        source,
    })?;
    if entries.next().is_some() {
        return Err(MountpointError::NotEmpty(path.to_owned()));
    }
    Ok(created)
}

/// What `/proc/self/mountinfo` says is mounted at a path (the topmost mount).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    /// `user_id=` of a FUSE mount: who mounted it.
    pub fuse_user: Option<u32>,
}

impl MountEntry {
    /// A stagefs mount made by `uid` (fuser names the source "stagefs").
    pub fn is_stagefs_of(&self, uid: u32) -> bool {
        self.source == "stagefs" && self.fstype.starts_with("fuse") && self.fuse_user == Some(uid)
    }

    /// "a tmpfs filesystem (from tmpfs)", for messages.
    pub fn describe(&self) -> String {
        let owner = self.fuse_user.map(|uid| format!(", mounted by {}", places::user_label(uid))).unwrap_or_default();
        format!("a {} filesystem (from {}{owner})", self.fstype, self.source)
    }
}

/// Every mount in `/proc/self/mountinfo`, in mount order: (mountpoint, what is mounted).
fn mount_table() -> Vec<(PathBuf, MountEntry)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let path = PathBuf::from(std::ffi::OsString::from_vec(unescape(left.split(' ').nth(4)?)));
            let mut fields = right.split(' ');
            let fstype = fields.next().unwrap_or("unknown").to_string();
            let source = String::from_utf8_lossy(&unescape(fields.next().unwrap_or(""))).into_owned();
            let fuse_user =
                fields.next().unwrap_or("").split(',').find_map(|o| o.strip_prefix("user_id=")?.parse().ok());
            Some((path, MountEntry { fstype, source, fuse_user }))
        })
        .collect()
}

/// The mount exactly at `path` (the topmost, when several are stacked there).
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    mount_table().into_iter().rev().find(|(at, _)| at == path).map(|(_, entry)| entry)
}

/// Every stagefs mount of `uid` in this mount namespace, live or dead (by what is on top
/// of each mountpoint).
pub fn stagefs_mounts_of(uid: u32) -> Vec<PathBuf> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut found = Vec::new();
    // Newest first: the first entry seen for a path is what is on top there.
    for (path, entry) in mount_table().into_iter().rev() {
        if !seen.contains(&path) {
            if entry.is_stagefs_of(uid) {
                found.push(path.clone());
            }
            seen.push(path);
        }
    }
    found.reverse();
    found
}

/// The filesystem type mounted exactly at `path`, from `/proc/self/mountinfo`.
pub fn mounted_fstype(path: &Path) -> Option<String> {
    mount_at(path).map(|m| m.fstype)
}

/// Decodes the octal escapes (`\040` for a space) that mountinfo uses.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// True when `path` is the root of a mount that answers (not stale).
pub fn is_live_mount(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (std::fs::metadata(path), path.parent()) else { return false };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) || mounted_fstype(path).is_some()
}

/// Unmounts `path`; `lazy` detaches it even while busy. Root calls umount2(2) directly;
/// other users go through `fusermount3`, which is setuid for this purpose.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), MountpointError> {
    if nix::unistd::geteuid().is_root() {
        let flags = if lazy { nix::mount::MntFlags::MNT_DETACH } else { nix::mount::MntFlags::empty() };
        return match nix::mount::umount2(path, flags) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EBUSY) => Err(MountpointError::Busy(path.to_owned())),
            Err(nix::errno::Errno::EINVAL) => Err(MountpointError::NotMounted(path.to_owned())),
            Err(e) => Err(MountpointError::Unmount { path: path.to_owned(), message: e.desc().to_string() }),
        };
    }
    let mut command = Command::new("fusermount3");
    command.arg("-u");
    if lazy {
        command.arg("-z");
    }
    let output = command.arg(path).output().map_err(|e| MountpointError::Unmount {
        path: path.to_owned(),
        message: format!("cannot run fusermount3 ({e}); install the fuse3 package"),
    })?;
    if output.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let message = match message.strip_prefix("fusermount3: ") {
        Some(rest) => rest.to_string(),
        None if message.is_empty() => format!("fusermount3 failed ({}) without saying why", output.status),
        None => message,
    };
    if message.contains("busy") {
        Err(MountpointError::Busy(path.to_owned()))
    } else if message.contains("not found in") || message.contains("Invalid argument") {
        Err(MountpointError::NotMounted(path.to_owned()))
    } else {
        Err(MountpointError::Unmount { path: path.to_owned(), message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/trail\04"), br"/trail\04");
    }

    #[test]
    fn prepare_creates_private_dirs_and_rejects_non_empty_ones() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = crate::test_support::TempDir::new("mountpoint");
        let base = tmp.join("base");
        let new = base.join("a/b");
        assert_eq!(prepare(&new).unwrap(), [base.clone(), base.join("a"), new.clone()]);
        assert_eq!(std::fs::metadata(&new).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(prepare(&new).unwrap().is_empty());
        std::fs::write(new.join("x"), b"x").unwrap();
        assert!(matches!(prepare(&new), Err(MountpointError::NotEmpty(_))));
        assert!(matches!(prepare(&new.join("x")), Err(MountpointError::NotADirectory(_))));
        assert!(matches!(prepare(Path::new("/proc")), Err(MountpointError::AlreadyMounted(..))));
    }
}
