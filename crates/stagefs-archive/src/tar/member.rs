//! The scan's state: one member's record as its headers are folded in, the global pax keywords, and what the pass builds.

use std::collections::BTreeMap;
use std::path::Path;

use super::reader::{Extent, SparseFile};
use crate::index::{Attrs, IndexBuilder, InodeId, XattrRun};

/// The largest file size Linux allows (`off_t` is signed): a sparse member may declare
/// no more.
pub(super) const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most xattrs global pax headers may give every member: more than any real archive
/// sets, few enough that merging them into a member's own costs that member little.
pub(super) const MAX_GLOBAL_XATTRS: usize = 256;

/// The state of one pass over the headers.
pub(super) struct Scan<'a> {
    pub(super) path: &'a Path,
    pub(super) window: super::window::Window<'a>,
    /// The end of the last member's data (checked against the length of a stream
    /// once it is known) and that member's header offset.
    pub(super) last_data: (u64, u64),
    /// The directory chain of the last member and its position (see `Scan::parents`).
    pub(super) last_parent: (Vec<Box<[u8]>>, InodeId),
    /// Members added so far.
    pub(super) members: u64,
    /// Where the pass notes how far it got ([`crate::Caches::scan_progress`]): the pass
    /// over the whole archive does, a worker of the parallel pass does not.
    pub(super) progress: Option<&'a std::sync::atomic::AtomicU64>,
    /// Whether a global pax header was read (its keywords change every later member: a
    /// pass that split the archive cannot know them, see `parallel.rs`).
    pub(super) saw_globals: bool,
    pub(super) builder: IndexBuilder,
    pub(super) globals: Globals,
    pub(super) sparse_files: Vec<SparseFile>,
    pub(super) extents: Vec<Extent>,
    /// pax keywords applied to members, global ones included (for the debug log, and
    /// the test that a member's cost does not grow with the global keywords declared).
    pub(super) pax_keywords: u64,
}

/// The keywords of global pax headers ('g') that stagefs uses, parsed once when their
/// header is read. They apply to every later member until a later global header sets
/// them again (POSIX); folding the declared keywords into each member's own instead
/// cost every member all of them (8,000 keywords and members: 19 s). Keywords that
/// stagefs does not use (comment, atime, ...) are dropped here.
#[derive(Default)]
pub(super) struct Globals {
    pub(super) path: Option<Vec<u8>>,
    pub(super) linkpath: Option<Vec<u8>>,
    pub(super) size: Option<u64>,
    pub(super) uid: Option<u64>,
    pub(super) gid: Option<u64>,
    pub(super) mtime: Option<(i64, u32)>,
    /// Extended attributes of every member; a member's own win by name.
    pub(super) xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `xattrs` as stored in the index, shared by the members with none of their own.
    pub(super) xattrs_run: Option<XattrRun>,
}

/// Everything known about a member once its extension headers are folded in.
#[derive(Default)]
pub(super) struct Member {
    pub(super) header_offset: u64,
    pub(super) typeflag: u8,
    pub(super) path: Vec<u8>,
    pub(super) link: Vec<u8>,
    pub(super) attrs: Option<Attrs>,
    /// Bytes stored in the archive after the header.
    pub(super) stored_size: u64,
    pub(super) data_offset: u64,
    pub(super) rdev: u32,
    /// Extended attributes from the member's own pax keywords, by name.
    pub(super) xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Sparse layout: (file offset, length) of each data run, and the real size.
    pub(super) sparse: Option<(Vec<(u64, u64)>, u64)>,
}

/// Extension headers read but not applied yet (GNU `L`/`K`, pax `x`): they apply to the
/// next member. `group`: where the first of them (or the member itself) starts.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) long_name: Option<Vec<u8>>,
    pub(super) long_link: Option<Vec<u8>>,
    pub(super) pax: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    pub(super) group: Option<u64>,
}

/// What one step of the pass over the headers found.
pub(super) enum Found {
    /// A member (its extension headers folded in), the first of its headers at `group`, its
    /// data ending at `end`.
    Member { group: u64, member: Member, end: u64 },
    /// The end of the archive.
    End,
}
