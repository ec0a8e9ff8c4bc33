//! What the whole tree holds, counted once when it is built: so that `index --print-stats` and the mount's "files you cannot read" warning read a few bytes, not every inode.

use super::layout::{u32_at, u64_at};
use super::records::InodeId;

/// Distinct owner and mode combinations kept; an archive with more keeps none
/// ([`Summary::modes_complete`] false) and its readers walk the tree instead.
pub(crate) const MAX_MODES: usize = 64;

/// How many names of regular files have one owner, group and permission bits, and one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeCount {
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Permission bits (07777).
    pub perm: u32,
    /// Names of files with these (a file with two names counts twice, as a walk meets it).
    pub count: u64,
    /// One of them: the directory holding it and its entry's position among all entries.
    pub example: (InodeId, u32),
}

/// Counts of the tree, each inode once (the root and unreachable inodes left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Regular files, their bytes (saturating) and the largest.
    pub files: u64,
    /// Bytes of the regular files (saturating).
    pub file_bytes: u64,
    /// The largest regular file's size.
    pub largest: u64,
    /// Directories.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Names of regular files by owner and mode, when there are at most `MAX_MODES` kinds.
    pub modes: Vec<ModeCount>,
    /// Whether `modes` counts every regular file (false past `MAX_MODES` kinds).
    pub modes_complete: bool,
}

const HEAD_LEN: usize = 48;
const MODE_LEN: usize = 32;

pub(crate) fn encode(s: &Summary) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN + s.modes.len() * MODE_LEN);
    for v in [s.files, s.file_bytes, s.largest, s.dirs, s.symlinks] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&u32::from(s.modes_complete).to_le_bytes());
    out.extend_from_slice(&(s.modes.len() as u32).to_le_bytes());
    for m in &s.modes {
        for v in [m.uid, m.gid, m.perm, m.example.0, m.example.1, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&m.count.to_le_bytes());
    }
    out
}

/// The summary in `b`, or `None` if it is not one.
pub(crate) fn decode(b: &[u8]) -> Option<Summary> {
    let head = b.get(..HEAD_LEN)?;
    let n = u32_at(head, 44) as usize;
    if n > MAX_MODES || b.len() < HEAD_LEN + n * MODE_LEN {
        return None;
    }
    let modes = (0..n)
        .map(|i| {
            let m = &b[HEAD_LEN + i * MODE_LEN..];
            ModeCount {
                uid: u32_at(m, 0),
                gid: u32_at(m, 4),
                perm: u32_at(m, 8) & 0o7777,
                example: (u32_at(m, 12), u32_at(m, 16)),
                count: u64_at(m, 24),
            }
        })
        .collect();
    Some(Summary {
        files: u64_at(head, 0),
        file_bytes: u64_at(head, 8),
        largest: u64_at(head, 16),
        dirs: u64_at(head, 24),
        symlinks: u64_at(head, 32),
        modes,
        modes_complete: u32_at(head, 40) == 1,
    })
}
