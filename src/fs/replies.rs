//! What requests are answered with, in plain Rust types: what `stat` shows, directory entries and `statfs` totals.

/// What `stat` shows for an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub rdev: u32,
}

/// One directory listing entry; `next` is the offset to resume after it.
#[derive(Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    pub ino: u64,
    pub next: u64,
    pub mode: u32,
    pub name: &'a [u8],
}

/// Totals for `statfs`.
#[derive(Debug, PartialEq, Eq)]
pub struct FsStats {
    pub bytes: u64,
    pub files: u64,
}
