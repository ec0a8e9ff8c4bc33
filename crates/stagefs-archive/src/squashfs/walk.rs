//! Indexing: walks the directory tree from the root inode and fills the [`IndexBuilder`].

use std::collections::{BTreeMap, HashMap};

use super::data::Layouts;
use super::directory::read_listing;
use super::inode::{self, FileInode, Kind, RawInode, NO_XATTRS};
use super::metadata::{Cursor, MetaReader};
use super::superblock::Superblock;
use super::xattr::XattrTable;
use crate::fault::Fault;
use crate::index::{Attrs, Data, Index, IndexBuilder, InodeId, XattrRun, ROOT};

/// A directory whose listing is still to be read.
struct PendingDir {
    id: InodeId,
    listing: Cursor,
    len: u32,
}

struct Walk<'a> {
    sb: &'a Superblock,
    meta: MetaReader<'a>,
    ids: Vec<u8>,
    xattrs: Option<XattrTable>,
    builder: IndexBuilder,
    layouts: Layouts,
    /// SquashFS inode number -> index inode, for directories (to refuse loops), for
    /// files with several names (so hardlinks share one inode), and for inodes that cost
    /// more than their fixed fields to describe (see [`Walk::remember`]). Other
    /// single-name inodes, the vast majority, are left out to keep this map small.
    seen: HashMap<u32, InodeId>,
    pending: Vec<PendingDir>,
    /// xattr set -> its entries in the index. mksquashfs stores one set for all inodes
    /// with the same attributes (values up to 64 KiB): the index keeps it once too.
    xattr_sets: HashMap<u32, XattrRun>,
    /// Directory listings read so far, in the directory table.
    listings: Ranges,
    /// Block lists read so far, in the inode table.
    block_lists: Ranges,
}

/// Byte ranges of a metadata table read so far, as (block, offset) start -> end.
/// mksquashfs gives every directory a listing of its own and every file a block list of
/// its own; refusing overlaps keeps a crafted image from making many directories share
/// one listing, or many inodes one block list, and blowing the index up quadratically.
#[derive(Default)]
struct Ranges(BTreeMap<(u64, usize), (u64, usize)>);

impl Ranges {
    /// Records `[start, end)`; false if it overlaps a range already recorded.
    fn claim(&mut self, start: (u64, usize), end: (u64, usize)) -> bool {
        if start == end {
            return true; // Empty directories have no listing, small files no block list.
        }
        let before = self.0.range(..=start).next_back().is_some_and(|(_, &e)| e > start);
        let after = self.0.range(start..).next().is_some_and(|(&s, _)| s < end);
        if before || after {
            return false;
        }
        self.0.insert(start, end);
        true
    }
}

/// Indexes the image (`image` is already cut to `bytes_used`).
pub(super) fn index(image: &[u8], sb: &Superblock) -> Result<(Index, Layouts), Fault> {
    let mut meta = MetaReader::new(image, sb.compressor);
    let ids = meta.lookup_table(sb.id_table, sb.id_count.into(), 4, "id table")?;
    let xattrs = XattrTable::load(&mut meta, sb)?;
    let layouts = Layouts::new(&mut meta, sb.block_size, sb.bytes_used, sb.fragment_table, sb.fragment_count)?;
    let mut walk = Walk {
        sb,
        meta,
        ids,
        xattrs,
        builder: IndexBuilder::new(),
        layouts,
        seen: HashMap::new(),
        pending: Vec::new(),
        xattr_sets: HashMap::new(),
        listings: Ranges::default(),
        block_lists: Ranges::default(),
    };
    walk.root()?;
    while let Some(dir) = walk.pending.pop() {
        walk.directory(dir)?;
    }
    let index = walk.builder.finish()?;
    walk.layouts.shrink_to_fit();
    tracing::debug!(
        inodes = index.inode_count(),
        bytes = sb.bytes_used,
        block_size = sb.block_size,
        compressor = ?sb.compressor,
        "indexed SquashFS image"
    );
    Ok((index, walk.layouts))
}

impl Walk<'_> {
    fn root(&mut self) -> Result<(), Fault> {
        let root = inode::parse(&mut self.meta, Cursor::from_ref(self.sb.inode_table, self.sb.root_inode)?)?;
        if !matches!(root.kind, Kind::Dir { .. }) {
            return Err(Fault::corrupt(
                self.sb.inode_table,
                format!("root inode is a {:?}, expected a directory", root.kind),
            ));
        }
        let (attrs, data) = self.describe(&root)?;
        self.builder.set_inode(ROOT, attrs, data);
        self.add_xattrs(ROOT, root.xattr)?;
        self.remember(ROOT, &root)
    }

    fn directory(&mut self, dir: PendingDir) -> Result<(), Fault> {
        let (entries, end) = read_listing(&mut self.meta, dir.listing, dir.len)?;
        self.claim_listing(dir.listing, end)?;
        for entry in entries {
            if let Some(&known) = self.seen.get(&entry.inode_number) {
                if self.builder.attrs(known).is_dir() {
                    return Err(Fault::corrupt(
                        dir.listing.block,
                        format!(
                            "directory '{}' is listed twice (a loop in the tree)",
                            stagefs_text::escape(&entry.name)
                        ),
                    ));
                }
                self.builder.link(dir.id, &entry.name, known)?;
                continue;
            }
            let at = Cursor::at(self.sb.inode_table, entry.inode_block.into(), entry.inode_offset)?;
            let raw = inode::parse(&mut self.meta, at)?;
            if raw.common.number != entry.inode_number {
                return Err(Fault::corrupt(
                    at.block,
                    format!(
                        "directory entry names inode {}, the inode there is {}",
                        entry.inode_number, raw.common.number
                    ),
                ));
            }
            let (attrs, data) = self.describe(&raw)?;
            let id = self.builder.add_inode(attrs, data)?;
            self.add_xattrs(id, raw.xattr)?;
            self.builder.link(dir.id, &entry.name, id)?;
            self.remember(id, &raw)?;
        }
        Ok(())
    }

    /// Records the listing `[start, end)`, refusing one that overlaps a listing already read.
    fn claim_listing(&mut self, start: Cursor, end: Cursor) -> Result<(), Fault> {
        if self.listings.claim((start.block, start.offset), (end.block, end.offset)) {
            return Ok(());
        }
        Err(Fault::corrupt(start.block, "two directories share one directory listing".to_string()))
    }

    /// Records directories (and queues their listing), multiply-linked files, and inodes
    /// whose description read more than their fixed fields: a file's block list (8 KiB
    /// for a 2 GiB sparse file) or a symlink's target (up to 64 KiB). Their link count
    /// cannot be trusted to be right: a crafted image can name one such inode from
    /// thousands of entries while it claims a single link, and describing it anew for each
    /// would cost the block list per entry, gigabytes from a few hundred KiB of image.
    /// Here every entry after the first names the same index inode, as for hardlinks.
    fn remember(&mut self, id: InodeId, raw: &RawInode) -> Result<(), Fault> {
        let costly = match &raw.kind {
            Kind::Dir { start_block, offset, listing_len } => {
                let listing = Cursor::at(self.sb.directory_table, (*start_block).into(), *offset)?;
                self.pending.push(PendingDir { id, listing, len: *listing_len });
                true
            }
            Kind::File(file) => file.block_count(self.sb.block_size) > 0,
            Kind::Symlink { .. } => true,
            _ => false,
        };
        if costly || raw.nlink > 1 {
            self.seen.insert(raw.common.number, id);
        }
        Ok(())
    }

    /// A file's block-list handle, refusing a block list that overlaps one already read
    /// (distinct inodes never share one; overlapping ones would be read many times).
    fn add_file(&mut self, file: &FileInode) -> Result<u32, Fault> {
        let (handle, end) = self.layouts.add_file(&mut self.meta, file)?;
        let start = file.block_sizes;
        if !self.block_lists.claim((start.block, start.offset), (end.block, end.offset)) {
            return Err(Fault::corrupt(start.block, "two inodes share one block list".to_string()));
        }
        Ok(handle)
    }

    fn describe(&mut self, raw: &RawInode) -> Result<(Attrs, Data), Fault> {
        let (size, data) = match &raw.kind {
            Kind::Dir { listing_len, .. } => (u64::from(*listing_len) + 3, Data::None),
            Kind::File(file) if file.size == 0 => (0, Data::None),
            Kind::File(file) => (file.size, Data::Extern(self.add_file(file)?)),
            Kind::Symlink { target } => (target.len() as u64, Data::Symlink(self.builder.intern(target)?)),
            Kind::BlockDevice { rdev } | Kind::CharDevice { rdev } => (0, Data::Device(*rdev)),
            Kind::Fifo | Kind::Socket => (0, Data::None),
        };
        let attrs = Attrs {
            mode: raw.type_bits() | u32::from(raw.common.permissions & 0o7777),
            uid: self.id(raw.common.uid_index)?,
            gid: self.id(raw.common.gid_index)?,
            mtime: raw.common.mtime.into(),
            mtime_nsec: 0,
            size,
        };
        Ok((attrs, data))
    }

    /// A uid or gid from the id table.
    fn id(&self, index: u16) -> Result<u32, Fault> {
        let at = usize::from(index) * 4;
        self.ids.get(at..at + 4).map(|raw| u32::from_le_bytes(raw.try_into().unwrap_or_default())).ok_or_else(|| {
            Fault::corrupt(self.sb.id_table, format!("id index {index}, the id table has {} ids", self.sb.id_count))
        })
    }

    fn add_xattrs(&mut self, id: InodeId, index: u32) -> Result<(), Fault> {
        if index == NO_XATTRS {
            return Ok(());
        }
        let Some(table) = &self.xattrs else {
            return Err(Fault::corrupt(
                self.sb.xattr_id_table,
                format!("an inode has xattr set {index}, but the image has no xattr table"),
            ));
        };
        let run = match self.xattr_sets.get(&index) {
            Some(&run) => run,
            None => {
                let pairs = table.pairs(&mut self.meta, index)?;
                let borrowed: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
                let run = self.builder.add_xattrs(&borrowed)?;
                self.xattr_sets.insert(index, run);
                run
            }
        };
        self.builder.set_xattr_run(id, run);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    #[test]
    fn overlapping_ranges_are_refused() {
        let mut ranges = Ranges::default();
        assert!(ranges.claim((0, 10), (0, 50)));
        assert!(ranges.claim((0, 50), (1, 0)), "adjacent listings are fine");
        assert!(ranges.claim((0, 5), (0, 5)), "empty listings claim nothing");
        assert!(!ranges.claim((0, 10), (0, 50)), "the same listing twice");
        assert!(!ranges.claim((0, 20), (0, 30)), "inside another");
        assert!(!ranges.claim((0, 0), (0, 11)), "overlapping its start");
        assert!(!ranges.claim((0, 49), (2, 0)), "overlapping its end");
        assert!(ranges.claim((1, 0), (1, 8)));
    }
}
