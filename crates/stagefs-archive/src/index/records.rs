//! The records an index is made of, as a read decodes them: inodes (attributes, where the bytes are), directory entries, extended attributes.

/// Position of an inode in the index; FUSE sees `InodeId + 1`.
pub type InodeId = u32;

/// The root directory's position.
pub const ROOT: InodeId = 0;
/// Longest symlink target any reader accepts: Linux's PATH_MAX less the terminating NUL.
/// A longer one cannot be followed or even read back, so it only costs memory.
pub(crate) const MAX_LINK_TARGET: usize = libc::PATH_MAX as usize - 1;

/// A run of bytes in the index's arena (64-bit offsets: a billion names need more than
/// 4 GiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Where the run starts in the arena.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u32,
}

/// Where an inode's content comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Data {
    /// No content: fifos, sockets, empty files.
    None,
    /// The bytes `archive[offset..offset + size]` (plain tar members).
    Slice {
        /// Where the bytes start in the archive.
        offset: u64,
    },
    /// A handle into the format reader's own table (SquashFS block lists, tar sparse maps).
    Extern(u32),
    /// A directory: its children are entries `first..first + count`.
    Dir {
        /// Position of its first entry.
        first: u32,
        /// How many entries it has.
        count: u32,
        /// The directory holding it (the root: itself).
        parent: InodeId,
    },
    /// A symbolic link and its target.
    Symlink(Span),
    /// A character or block device number (`rdev`).
    Device(u32),
}

/// Attributes as the archive states them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// File type bits (`S_IFMT`) and permission bits (07777), as in `st_mode`.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
    /// Size in bytes (a symlink's: its target's length).
    pub size: u64,
}

impl Attrs {
    /// Attributes of a directory the archive implies but never lists.
    pub fn implicit_dir() -> Attrs {
        Attrs { mode: libc::S_IFDIR | 0o755, uid: 0, gid: 0, mtime: 0, mtime_nsec: 0, size: 0 }
    }

    /// The file type bits (`S_IFMT`) of the mode.
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
}

/// One inode: attributes, content location and link count (its extended attributes
/// are found by [`super::tree::Index::xattrs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    /// What the archive states of it.
    pub attrs: Attrs,
    /// Where its content comes from.
    pub data: Data,
    /// How many directory entries name it.
    pub nlink: u32,
}

/// One name in a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent {
    /// The name, in the arena.
    pub name: Span,
    /// The inode it names.
    pub inode: InodeId,
}

/// One extended attribute: full name (`user.foo`) and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xattr {
    /// The full name (`user.foo`), in the arena.
    pub name: Span,
    /// The value, in the arena.
    pub value: Span,
}

/// Whether `name` can name an entry of a directory: one path component, neither `.` nor
/// `..`, without `/` or NUL (the kernel's names end at a NUL: such a name would be listed
/// cut short, and never found).
pub(crate) fn is_file_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}
