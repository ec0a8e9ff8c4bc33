//! Saved tar indexes, so later mounts of the same archive (on every node of a job) skip the scan.
//!
//! The file is keyed by the archive's size, mtime, ctime, inode number and a content
//! fingerprint (samples from the start, the end and evenly in between), so a changed
//! archive is never served with a stale index: an in-place rewrite can restore the size
//! and (with `touch -r`, as `rsync --inplace -t` does) the mtime, and keep the sampled
//! bytes, but no unprivileged writer can set the ctime back, and a replacement by rename
//! is another inode. It ends with a checksum, and every number in it is checked on
//! load, so a damaged file is ignored (with a warning) rather than trusted.
//! Saved next to the archive when that directory is writable, else in
//! `$XDG_CACHE_HOME/stagefs` (default `~/.cache/stagefs`).
//!
//! Trust: an index says which archive bytes each file is, so it is trusted exactly as far
//! as the archive: it is used only when it is a regular file owned by this user or by the
//! archive's owner (who could change the archive itself), writable by nobody else, and no
//! larger than an index of that archive can be. It is written with the archive's read
//! permissions at most, so it never shows member names to someone who cannot read them.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::archive::tar::{Extent, SparseFile, TarReader};
use crate::archive::{Archive, Backing};
use crate::hash::{self, Hasher};
use crate::index::{Attrs, Data, Dirent, Index, Inode, Span, Xattr};
use crate::places;

const MAGIC: &[u8; 16] = b"STAGEFS-INDEX\0v2";

/// Identifies one version of an archive's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
    inode: u64,
    fingerprint: u64,
}

impl Key {
    /// Reads 64 KiB at each end and 16 samples of 4 KiB in between.
    pub fn of(path: &Path) -> std::io::Result<Key> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let size = meta.len();
        let mut samples = Hasher::default();
        let mut buf = vec![0u8; 64 << 10];
        let mut sample = |offset: u64, len: usize| -> std::io::Result<()> {
            let len = len.min(size.saturating_sub(offset) as usize);
            file.read_exact_at(&mut buf[..len], offset)?;
            samples.write(&buf[..len]);
            Ok(())
        };
        sample(0, 64 << 10)?;
        for i in 1..=16 {
            sample(size / 17 * i, 4 << 10)?;
        }
        sample(size.saturating_sub(64 << 10), 64 << 10)?;
        Ok(Key {
            size,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
            inode: meta.ino(),
            fingerprint: samples.finish(),
        })
    }

    /// The key's fields in the order a saved index stores them.
    fn fields(&self) -> [u64; 7] {
        [
            self.size,
            self.mtime as u64,
            self.mtime_nsec as u64,
            self.ctime as u64,
            self.ctime_nsec as u64,
            self.inode,
            self.fingerprint,
        ]
    }

    fn from_fields(f: [u64; 7]) -> Key {
        Key {
            size: f[0],
            mtime: f[1] as i64,
            mtime_nsec: f[2] as i64,
            ctime: f[3] as i64,
            ctime_nsec: f[4] as i64,
            inode: f[5],
            fingerprint: f[6],
        }
    }
}

/// The saved index next to `archive` (a canonical path).
fn beside(archive: &Path) -> PathBuf {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    archive.with_file_name(format!("{name}.stagefs-index"))
}

/// The saved index of `archive` (a canonical path) in the cache directory `dir`.
fn in_cache(dir: &Path, archive: &Path) -> PathBuf {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let path_hash = hash::hash(archive.as_os_str().as_encoded_bytes());
    dir.join(format!("{path_hash:016x}-{name}.index"))
}

/// Where an index for `archive` may live, preferred first (looked up, never created).
fn candidates(archive: &Path) -> Vec<PathBuf> {
    let mut paths = vec![beside(archive)];
    if let Ok(dir) = places::cache_dir() {
        paths.push(in_cache(&dir, archive));
    }
    paths
}

/// The largest index an archive of `archive_len` bytes can have: a tar member takes at
/// least a 512-byte header, its index entry far less, even with the directories its path
/// implies; sparse maps cost at most a few times their text.
fn size_cap(archive_len: u64) -> u64 {
    archive_len.saturating_mul(8).saturating_add(16 << 20)
}

/// Loads a saved index for `archive` if one matches `key` and deserves trust (see the
/// module docs); says why it ignores one.
pub fn load(archive: &Path, key: &Key, backing: &Backing) -> Option<Archive> {
    let owners = [places::my_uid(), std::fs::metadata(archive).map_or(places::my_uid(), |m| m.uid())];
    for path in candidates(archive) {
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let bytes = match places::read_trusted(&path, &owners, size_cap(key.size)) {
            Ok(bytes) => bytes,
            Err(why) => {
                tracing::warn!(index = %path.display(), "ignoring saved index: {why}; scanning the archive");
                continue;
            }
        };
        match decode(&bytes, key, backing) {
            Ok(opened) => {
                tracing::info!(index = %path.display(), "using saved index");
                if path != beside(archive) {
                    // A cached index in use is kept by `prune`: its mtime says when.
                    let _ = std::fs::File::options()
                        .write(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&path)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                }
                return Some(opened);
            }
            Err(why) => tracing::warn!(index = %path.display(), "ignoring saved index: {why}; rebuilding it"),
        }
    }
    None
}

/// Saves the index of a tar archive; returns where it went. SquashFS images carry their
/// own on-disk index, so they are not saved.
pub fn save(archive_path: &Path, key: &Key, archive: &Archive) -> std::io::Result<PathBuf> {
    let Some(reader) = archive.tar_reader() else {
        return Err(std::io::Error::other("only tar indexes are saved (SquashFS has its own)"));
    };
    let bytes = encode(key, &archive.index, reader);
    // Never more readable than the archive: the index lists its member names.
    let archive_mode = std::fs::metadata(archive_path)?.mode();
    let mode = 0o600 | (archive_mode & 0o044);
    let beside = beside(archive_path);
    let beside_error = match places::write_atomically(&beside, &bytes, mode) {
        Ok(()) => return Ok(beside),
        Err(e) => e,
    };
    let dir = places::cache_dir().map_err(|e| {
        std::io::Error::other(format!("cannot write {} ({beside_error}), nor use the cache: {e}", beside.display()))
    })?;
    let cached = in_cache(&dir, archive_path);
    places::write_atomically(&cached, &bytes, mode)?;
    prune(&dir, CACHE_MAX_AGE, CACHE_MAX_BYTES);
    Ok(cached)
}

/// Saved indexes in the cache directory not used for this long are removed.
const CACHE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
/// Beyond this many bytes of indexes in the cache directory, the least recently used go.
const CACHE_MAX_BYTES: u64 = 2 << 30;

/// Keeps the cache directory bounded, whatever happened to the archives (deleted long ago,
/// moved): indexes unused for `max_age` go, then the least recently used until the rest
/// holds at most `max_bytes`. Use is the file's mtime, renewed by [`load`].
fn prune(dir: &Path, max_age: std::time::Duration, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let now = std::time::SystemTime::now();
    let mut kept: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || path.extension().is_none_or(|x| x != "index") {
            continue;
        }
        let used = meta.modified().unwrap_or(now);
        if now.duration_since(used).is_ok_and(|age| age > max_age) {
            let _ = std::fs::remove_file(&path);
        } else {
            kept.push((used, meta.len(), path));
        }
    }
    kept.sort();
    let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum();
    for (_, len, path) in kept {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// Little-endian writer for the index file.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

fn encode(key: &Key, index: &Index, reader: &TarReader) -> Vec<u8> {
    let mut w = Writer::default();
    w.0.extend_from_slice(MAGIC);
    for v in key.fields() {
        w.u64(v);
    }
    let counts = [
        index.inodes.len(),
        index.dirents.len(),
        index.xattrs.len(),
        index.arena.len(),
        reader.sparse_files().len(),
        reader.extents().len(),
    ];
    for c in counts {
        w.u64(c as u64);
    }
    for inode in &index.inodes {
        let a = &inode.attrs;
        w.u32(a.mode);
        w.u32(a.uid);
        w.u32(a.gid);
        w.u64(a.mtime as u64);
        w.u32(a.mtime_nsec);
        w.u64(a.size);
        let (tag, x, y, z) = match inode.data {
            Data::None => (0, 0, 0, 0),
            Data::Slice { offset } => (1, offset, 0, 0),
            Data::Extern(h) => (2, 0, h, 0),
            Data::Dir { first, count, parent } => (3, parent as u64, first, count),
            Data::Symlink(span) => (4, 0, span.offset, span.len),
            Data::Device(rdev) => (5, 0, rdev, 0),
        };
        w.u32(tag);
        w.u64(x);
        w.u32(y);
        w.u32(z);
        w.u32(inode.nlink);
        w.u32(inode.xattr_first);
        w.u32(inode.xattr_count);
    }
    for d in &index.dirents {
        w.u32(d.name.offset);
        w.u32(d.name.len);
        w.u32(d.inode);
    }
    for x in &index.xattrs {
        for v in [x.name.offset, x.name.len, x.value.offset, x.value.len] {
            w.u32(v);
        }
    }
    w.0.extend_from_slice(&index.arena);
    for f in reader.sparse_files() {
        w.u32(f.first);
        w.u32(f.count);
    }
    for e in reader.extents() {
        w.u64(e.file_offset);
        w.u64(e.len);
        w.u64(e.archive_offset);
    }
    w.u64(hash::hash(&w.0));
    w.0
}

/// Decodes `tables` (what follows the magic and key in a saved index) as if it were a
/// saved index of `backing` with a valid checksum and key: the entry point of the
/// `index_cache` fuzz target, which would otherwise never get past the checksum.
#[doc(hidden)]
pub fn decode_for_fuzz(tables: &[u8], backing: &Backing) -> Result<Archive, String> {
    let key = Key::from_fields([0; 7]);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[0; 32]);
    bytes.extend_from_slice(tables);
    bytes.extend_from_slice(&hash::hash(&bytes).to_le_bytes());
    decode(&bytes, &key, backing)
}

/// Little-endian reader that fails instead of panicking on a short file.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("file is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A count of records of `size` bytes each, bounded by what is left in the file.
    fn count(&mut self, size: usize) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(size) <= self.0.len())
            .ok_or_else(|| format!("count {n} exceeds the file"))
    }
}

const INODE_BYTES: usize = 4 * 3 + 8 + 4 + 8 + 4 + 8 + 4 * 5;

fn decode(bytes: &[u8], key: &Key, backing: &Backing) -> Result<Archive, String> {
    let body_len = bytes.len().checked_sub(8).ok_or("file is truncated")?;
    let (body, stored_hash) = bytes.split_at(body_len);
    if stored_hash != hash::hash(body).to_le_bytes() {
        return Err("checksum mismatch (damaged file)".into());
    }
    let mut r = Reader(body);
    if r.take(MAGIC.len())? != MAGIC {
        return Err("not a stagefs index of this version".into());
    }
    let mut fields = [0u64; 7];
    for field in &mut fields {
        *field = r.u64()?;
    }
    let saved = Key::from_fields(fields);
    if saved != *key {
        return Err("the archive changed since the index was saved".into());
    }
    let n_inodes = r.count(INODE_BYTES)?;
    let n_dirents = r.count(12)?;
    let n_xattrs = r.count(16)?;
    let n_arena = r.count(1)?;
    let n_sparse = r.count(8)?;
    let n_extents = r.count(24)?;
    let mut index = Index::default();
    for _ in 0..n_inodes {
        let attrs = Attrs {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            mtime: r.u64()? as i64,
            mtime_nsec: r.u32()?,
            size: r.u64()?,
        };
        let (tag, x, y, z) = (r.u32()?, r.u64()?, r.u32()?, r.u32()?);
        let data = match tag {
            0 => Data::None,
            1 => Data::Slice { offset: x },
            2 => Data::Extern(y),
            3 => Data::Dir { first: y, count: z, parent: u32::try_from(x).map_err(|_| "bad parent")? },
            4 => Data::Symlink(Span { offset: y, len: z }),
            5 => Data::Device(y),
            _ => return Err(format!("unknown data tag {tag}")),
        };
        index.inodes.push(Inode { attrs, data, nlink: r.u32()?, xattr_first: r.u32()?, xattr_count: r.u32()? });
    }
    for _ in 0..n_dirents {
        index.dirents.push(Dirent { name: Span { offset: r.u32()?, len: r.u32()? }, inode: r.u32()? });
    }
    for _ in 0..n_xattrs {
        index.xattrs.push(Xattr {
            name: Span { offset: r.u32()?, len: r.u32()? },
            value: Span { offset: r.u32()?, len: r.u32()? },
        });
    }
    index.arena = r.take(n_arena)?.to_vec();
    let mut sparse = Vec::with_capacity(n_sparse);
    for _ in 0..n_sparse {
        sparse.push(SparseFile { first: r.u32()?, count: r.u32()? });
    }
    let mut extents = Vec::with_capacity(n_extents);
    for _ in 0..n_extents {
        extents.push(Extent { file_offset: r.u64()?, len: r.u64()?, archive_offset: r.u64()? });
    }
    if !r.0.is_empty() {
        return Err("trailing bytes".into());
    }
    check_bounds(&index, sparse.len(), backing.len() as u64)?;
    let reader = TarReader::from_parts(backing.clone(), sparse, extents).ok_or("sparse table out of bounds")?;
    Ok(Archive::from_saved_tar(index, reader))
}

/// Every reference in the index must point inside it (and file data inside the archive,
/// where a tar puts data: after a 512-byte header), every field must be one the scan could
/// have produced, and the directories must form a tree, so that nothing read from disk can
/// make the request path panic, loop or index out of bounds.
fn check_bounds(index: &Index, n_sparse: usize, archive_len: u64) -> Result<(), String> {
    let span_ok = |s: Span| (s.offset as u64 + s.len as u64) <= index.arena.len() as u64;
    let range_ok = |first: u32, count: u32, len: usize| (first as u64 + count as u64) <= len as u64;
    if index.inodes.is_empty() || !index.inodes[0].attrs.is_dir() {
        return Err("no root directory".into());
    }
    for inode in &index.inodes {
        // No file may be larger than Linux allows (`off_t` is signed), as when scanning.
        let ok = inode.attrs.size <= i64::MAX as u64
            && range_ok(inode.xattr_first, inode.xattr_count, index.xattrs.len())
            && inode.attrs.mtime_nsec < 1_000_000_000
            && match inode.data {
                Data::Slice { offset } => {
                    offset % 512 == 0
                        && offset >= 512
                        && offset.checked_add(inode.attrs.size).is_some_and(|end| end <= archive_len)
                }
                Data::Extern(h) => (h as usize) < n_sparse,
                Data::Dir { first, count, parent } => {
                    inode.attrs.is_dir()
                        && range_ok(first, count, index.dirents.len())
                        && (parent as usize) < index.inodes.len()
                }
                Data::Symlink(span) => span_ok(span),
                Data::None | Data::Device(_) => true,
            };
        if !ok {
            return Err("an inode points outside the index or archive".into());
        }
    }
    // A name is one path component, as the scan makes them.
    let component_ok = |s: Span| {
        span_ok(s) && {
            let name = index.bytes(s);
            !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
        }
    };
    let dirents_ok = index.dirents.iter().all(|d| component_ok(d.name) && (d.inode as usize) < index.inodes.len());
    // listxattr separates names with NUL: a name must be non-empty and NUL-free.
    let name_ok = |s: Span| span_ok(s) && s.len > 0 && !index.bytes(s).contains(&0);
    let xattrs_ok = index.xattrs.iter().all(|x| name_ok(x.name) && span_ok(x.value));
    if !dirents_ok || !xattrs_ok {
        return Err("an entry points outside the index".into());
    }
    // Lookups search a directory's entries by binary search: strictly sorted names.
    let sorted = |dir: &Inode| index.children(dir).windows(2).all(|w| index.bytes(w[0].name) < index.bytes(w[1].name));
    if !index.inodes.iter().all(sorted) {
        return Err("a directory's entries are not sorted".into());
    }
    check_tree(index)
}

/// Every directory is listed once, by its parent, and reached from the root: no cycles,
/// no directory with two parents (`..` would be ambiguous).
fn check_tree(index: &Index) -> Result<(), String> {
    let mut seen = vec![false; index.inodes.len()];
    let mut stack = vec![crate::index::ROOT];
    seen[0] = true;
    while let Some(dir) = stack.pop() {
        let inode = &index.inodes[dir as usize];
        if let Data::Dir { parent, .. } = inode.data {
            if dir == crate::index::ROOT && parent != crate::index::ROOT {
                return Err("the root directory has a parent".into());
            }
        }
        for child in index.children(inode) {
            let Data::Dir { parent, .. } = index.inodes[child.inode as usize].data else { continue };
            if seen[child.inode as usize] || parent != dir {
                return Err("the directories do not form a tree".into());
            }
            seen[child.inode as usize] = true;
            stack.push(child.inode);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{run_tool, TempDir};
    use std::ffi::OsStr;

    /// The cache stays bounded: an index unused for longer than the age limit goes, then
    /// the least recently used until the rest fits the byte limit; other files stay.
    #[test]
    fn the_cache_directory_is_pruned_by_age_then_size() {
        let tmp = crate::test_support::TempDir::new("cache-prune");
        let day = std::time::Duration::from_secs(24 * 3600);
        let now = std::time::SystemTime::now();
        let make = |name: &str, len: usize, age_days: u32| {
            let path = tmp.join(name);
            std::fs::write(&path, vec![0u8; len]).unwrap();
            File::options().write(true).open(&path).unwrap().set_modified(now - day * age_days).unwrap();
        };
        make("a-ancient.index", 10, 400);
        make("b-old.index", 1000, 20);
        make("c-mid.index", 1000, 10);
        make("d-new.index", 1000, 1);
        make("not-an-index.txt", 10, 400);
        prune(tmp.path(), day * 30, 2000);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["c-mid.index", "d-new.index", "not-an-index.txt"]);
    }

    fn sample_archive(dir: &Path) -> PathBuf {
        let path = dir.join("a.tar");
        let src = dir.join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/f.txt"), b"indexed content").unwrap();
        std::os::unix::fs::symlink("d/f.txt", src.join("l")).unwrap();
        run_tool(
            "tar",
            &[OsStr::new("-cf"), path.as_os_str(), OsStr::new("-C"), src.as_os_str(), OsStr::new(".")],
            None,
        );
        path
    }

    #[test]
    fn round_trip_and_rejections() {
        let tmp = TempDir::new("index-cache");
        let dir = tmp.path();
        let path = sample_archive(dir);
        let key = Key::of(&path).unwrap();
        let fresh = Archive::open(&path).unwrap();
        let saved_at = save(&path, &key, &fresh).unwrap();
        assert_eq!(saved_at, dir.join("a.tar.stagefs-index"));
        let backing = crate::archive::map_file(&File::open(&path).unwrap()).unwrap();
        let loaded = load(&path, &key, &backing).expect("a matching index loads");
        assert_eq!(loaded.index.inodes, fresh.index.inodes);
        assert_eq!(loaded.index.dirents, fresh.index.dirents);
        assert_eq!(loaded.index.arena, fresh.index.arena);

        // A changed archive: different key, index ignored.
        let mut other = key;
        other.fingerprint ^= 1;
        assert!(load(&path, &other, &backing).is_none());
        // Every single-byte corruption is caught by the checksum or the bounds checks.
        let bytes = std::fs::read(&saved_at).unwrap();
        for i in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x5a;
            assert!(decode(&damaged, &key, &backing).is_err(), "corruption at byte {i} was accepted");
        }
        assert!(decode(&bytes[..bytes.len() / 2], &key, &backing).is_err());
    }

    #[test]
    fn key_changes_with_content() {
        let tmp = TempDir::new("index-key");
        let path = tmp.join("x");
        std::fs::write(&path, vec![1u8; 300_000]).unwrap();
        let a = Key::of(&path).unwrap();
        let mut bytes = vec![1u8; 300_000];
        bytes[299_999] = 2;
        std::fs::write(&path, &bytes).unwrap();
        let b = Key::of(&path).unwrap();
        assert_ne!(a.fingerprint, b.fingerprint);
    }
}
