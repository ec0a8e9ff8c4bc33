//! How a mount shows the archive's tree: whose files they are, their permission bits, and which directory is its root (`--owner`, `--umask`, `--mode`, `--prefix`).
//!
//! A tar packed by root with mode 0600 mounts fine and then refuses every read to the user
//! who mounted it (the kernel checks the modes the archive stores: mounts are private,
//! without `allow_other`, so `default_permissions` is the only check there is). These
//! options change what `stat` shows, as `ratarmount -o uid=,gid=,umask=` and squashfuse's
//! `-o uid=,gid=` do; they never make a mount reachable by other users.

use std::path::{Component, Path, PathBuf};

use stagefs_archive::escape::Shown;
use stagefs_archive::index::{Index, IndexError, InodeId, ROOT};

/// Why a mount cannot show the `--prefix` directory as its root.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error("--prefix {}: name a directory inside the archive", prefix.shown())]
    NotInside { prefix: PathBuf },
    /// No such directory: `name` (shown) missing from `dir`, which holds `there`.
    #[error("--prefix {}: the archive has no directory {name} in {dir}; there: {there}", prefix.shown())]
    Missing { prefix: PathBuf, name: String, dir: String, there: String },
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("--prefix cannot be used with --growing or --watch")]
    Growing,
}

/// An `--owner` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--owner {text:?}: use me, UID or UID:GID")]
pub struct OwnerError {
    pub text: String,
}

/// An octal mode or umask that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an octal mode (e.g. 022 or 0644)")]
pub struct OctalError {
    pub text: String,
}

/// What a mount changes in how it shows the archive's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presentation {
    /// Every entry owned by this uid and gid (`--owner`).
    pub owner: Option<(u32, u32)>,
    /// Permission bits cleared from every entry (`--umask`).
    pub umask: Option<u32>,
    /// Every file's permission bits (`--mode`); directories, and files with an execute
    /// bit, get execute where the mode reads (as `chmod X`).
    pub mode: Option<u32>,
    /// The directory of the archive shown as the mount's root (`--prefix`).
    pub prefix: Option<PathBuf>,
}

impl Presentation {
    /// `st_mode`, uid and gid as shown.
    pub fn attrs(&self, mode: u32, uid: u32, gid: u32) -> (u32, u32, u32) {
        let kind = mode & libc::S_IFMT;
        let mut perm = mode & 0o7777;
        if let Some(set) = self.mode {
            let searchable = kind == libc::S_IFDIR || perm & 0o111 != 0;
            let x = if searchable { (set & 0o444) >> 2 } else { 0 };
            perm = (set & 0o7777) | x;
        }
        if let Some(umask) = self.umask {
            perm &= !umask;
        }
        let (uid, gid) = self.owner.unwrap_or((uid, gid));
        (kind | perm, uid, gid)
    }

    /// Whether anything is changed at all.
    pub fn is_plain(&self) -> bool {
        *self == Presentation::default()
    }

    /// The position of the `--prefix` directory in `index` (the root without one).
    pub fn root(&self, index: &Index) -> Result<InodeId, PrefixError> {
        let Some(prefix) = &self.prefix else { return Ok(ROOT) };
        let mut at = ROOT;
        for part in prefix.components() {
            let name = match part {
                Component::Normal(name) => name.as_encoded_bytes(),
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(PrefixError::NotInside { prefix: prefix.clone() })
                }
            };
            let inode = index.inode(at)?;
            let found = index.lookup(&inode, name)?;
            at = match found.filter(|&id| index.inode(id).is_ok_and(|n| n.attrs.is_dir())) {
                Some(id) => id,
                None => return Err(missing(index, at, prefix, name)),
            };
        }
        Ok(at)
    }

    /// Whether `uid` (in groups `gids`) could read a file of this mode and owners as shown.
    fn readable(&self, (mode, uid_of, gid_of): (u32, u32, u32), uid: u32, gids: &[u32]) -> bool {
        let (mode, owner, group) = self.attrs(mode, uid_of, gid_of);
        match () {
            _ if uid == 0 => true,
            _ if owner == uid => mode & 0o400 != 0,
            _ if gids.contains(&group) => mode & 0o040 != 0,
            _ => mode & 0o004 != 0,
        }
    }

    /// Regular files of `index` below `root` that `uid` (in groups `gids`) could not read
    /// as shown: how many (names), and the first one's path. Below the root, from the
    /// owners and modes the index counted when it was built (a few records, whatever the
    /// archive's size); below a `--prefix`, or for an archive of many owners, by a walk.
    pub fn unreadable(&self, index: &Index, root: InodeId, uid: u32, gids: &[u32]) -> (u64, Option<String>) {
        let summary = index.summary();
        if root == ROOT && summary.modes_complete {
            let (mut count, mut first) = (0u64, None);
            for m in &summary.modes {
                if !self.readable((libc::S_IFREG | m.perm, m.uid, m.gid), uid, gids) {
                    count += m.count;
                    let (dir, pos) = m.example;
                    first = first.or_else(|| index.dirent(pos).ok().map(|d| index.path_in(dir, &d)));
                }
            }
            return (count, first);
        }
        let (mut count, mut first) = (0u64, None);
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            let Ok(inode) = index.inode(dir) else { continue };
            let Ok(children) = index.children(&inode) else { continue };
            for dirent in children {
                let Ok(child) = index.inode(dirent.inode) else { continue };
                if child.attrs.is_dir() {
                    stack.push(dirent.inode);
                    continue;
                }
                let a = &child.attrs;
                if a.file_type() == libc::S_IFREG && !self.readable((a.mode, a.uid, a.gid), uid, gids) {
                    count += 1;
                    first.get_or_insert_with(|| index.path_in(dir, &dirent));
                }
            }
        }
        (count, first)
    }
}

/// The error for a `--prefix` that names no directory of the archive.
fn missing(index: &Index, at: InodeId, prefix: &Path, name: &[u8]) -> PrefixError {
    let mut names: Vec<String> = index
        .inode(at)
        .and_then(|dir| index.children(&dir))
        .map(|c| c.iter().take(12).filter_map(|d| Some(index.name(&d).ok()?.shown().to_string())).collect())
        .unwrap_or_default();
    if names.len() == 12 {
        names.push("...".into());
    }
    PrefixError::Missing {
        prefix: prefix.to_path_buf(),
        name: name.shown().to_string(),
        dir: index.path_of(at),
        there: if names.is_empty() { "nothing".into() } else { names.join(", ") },
    }
}

/// Parses `--owner`: `me` (the mounting user), `UID` or `UID:GID`.
pub fn parse_owner(text: &str) -> Result<(u32, u32), OwnerError> {
    if text == "me" {
        // SAFETY: geteuid and getegid have no preconditions.
        return Ok(unsafe { (libc::geteuid(), libc::getegid()) });
    }
    let bad = || OwnerError { text: text.to_owned() };
    let (uid, gid) = text.split_once(':').unwrap_or((text, ""));
    let uid: u32 = uid.parse().map_err(|_| bad())?;
    let gid = if gid.is_empty() {
        nix::unistd::User::from_uid(uid.into()).ok().flatten().map_or(uid, |u| u.gid.as_raw())
    } else {
        gid.parse().map_err(|_| bad())?
    };
    Ok((uid, gid))
}

/// Parses an octal mode or umask (`022`, `0644`).
pub fn parse_octal(text: &str) -> Result<u32, OctalError> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| OctalError { text: text.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_modes_as_shown() {
        let plain = Presentation::default();
        assert!(plain.is_plain());
        assert_eq!(plain.attrs(libc::S_IFREG | 0o600, 0, 0), (libc::S_IFREG | 0o600, 0, 0));
        let me = Presentation { owner: Some((1000, 100)), ..Presentation::default() };
        assert_eq!(me.attrs(libc::S_IFREG | 0o600, 0, 0), (libc::S_IFREG | 0o600, 1000, 100));
        let umask = Presentation { umask: Some(0o027), ..Presentation::default() };
        assert_eq!(umask.attrs(libc::S_IFDIR | 0o777, 0, 0).0, libc::S_IFDIR | 0o750);
        let mode = Presentation { mode: Some(0o644), ..Presentation::default() };
        assert_eq!(mode.attrs(libc::S_IFREG | 0o600, 0, 0).0, libc::S_IFREG | 0o644);
        assert_eq!(mode.attrs(libc::S_IFREG | 0o700, 0, 0).0, libc::S_IFREG | 0o755, "executables stay so");
        assert_eq!(mode.attrs(libc::S_IFDIR | 0o700, 0, 0).0, libc::S_IFDIR | 0o755, "directories searchable");
        assert_eq!(parse_owner("12:34"), Ok((12, 34)));
        assert!(parse_owner("x").is_err());
        assert_eq!(parse_octal("022"), Ok(0o22));
        assert!(parse_octal("99").is_err());
        assert_eq!(parse_owner("x").unwrap_err().to_string(), "--owner \"x\": use me, UID or UID:GID");
        assert_eq!(parse_octal("99").unwrap_err().to_string(), "\"99\" is not an octal mode (e.g. 022 or 0644)");
    }
}
