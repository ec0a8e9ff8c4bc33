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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::places::{self, OutsideFile};
use stagefs_archive::codec::Compression;
use stagefs_archive::escape::Shown;
use stagefs_archive::hash;
use stagefs_archive::index::{map_index, Index, IndexError, IndexMap, Saving};
pub use stagefs_archive::tar::key::{fingerprint, Key};
use stagefs_archive::tar::saved_format::{decode, decode_tree, encode, tables as tables_of};
use stagefs_archive::{Backing, Caches, Reader, SavedTables};
use std::sync::Arc;

/// Which saved index of an archive, and where it may be.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flavor<'a> {
    /// `--recursive`'s tree (inner tars opened this many levels deep; 0: none): another
    /// tree than the flat one. The depth is recorded inside: a mount asking another depth
    /// rebuilds it.
    pub depth: usize,
    /// A compressed tar decoded whole (`--stage copy`), not served from restart points:
    /// other offsets, so another index (both are kept).
    pub whole: bool,
    /// `--index-dir`: the one place looked up and written, instead of beside the archive
    /// and the cache.
    pub dir: Option<&'a Path>,
}

impl Flavor<'_> {
    /// What follows [`INDEX_SUFFIX`] in the file's name.
    pub fn suffix(&self) -> &'static str {
        match (self.depth > 0, self.whole) {
            (false, false) => "",
            (true, false) => "-recursive",
            (false, true) => "-whole",
            (true, true) => "-recursive-whole",
        }
    }
}

/// What every saved index beside an archive has in its name (a shard pattern must not
/// take one for a shard, whatever its flavour).
pub const INDEX_SUFFIX: &str = ".stagefs-index";

/// Whether a file of this name is a saved index beside its archive (of any flavour).
pub fn is_saved_index(name: &std::ffi::OsStr) -> bool {
    let name = name.as_encoded_bytes();
    let flavors = [(false, false), (true, false), (false, true), (true, true)];
    flavors.iter().any(|&(recursive, whole)| {
        let suffix = format!("{INDEX_SUFFIX}{}", Flavor { depth: usize::from(recursive), whole, dir: None }.suffix());
        name.ends_with(suffix.as_bytes())
    })
}

/// The name of the saved index beside the archive at `archive`.
fn beside_name(archive: &Path, flavor: &Flavor) -> String {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}{INDEX_SUFFIX}{}", flavor.suffix())
}

/// The name of `archive`'s saved index (a resolved path) in the cache or `--index-dir`.
fn cache_name(archive: &Path, flavor: &Flavor) -> String {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let path_hash = hash::hash(archive.as_os_str().as_encoded_bytes());
    format!("{path_hash:016x}-{name}{}.index", flavor.suffix())
}

const INDEX_DIR_ADVICE: &str = "--index-dir must be a directory of yours that nobody else can write";

/// The directory a flavor's indexes are kept in, besides the archive's own: `--index-dir`
/// (made if missing, checked as the user's own), else the user's cache.
pub(crate) fn index_dir(flavor: &Flavor) -> Result<places::CheckedDir, String> {
    match flavor.dir {
        Some(dir) => {
            places::own_dir(dir, INDEX_DIR_ADVICE).map_err(|e| e.to_string())?;
            places::CheckedDir::open(dir, INDEX_DIR_ADVICE).map_err(|e| e.to_string())
        }
        None => places::cache_dir()
            .and_then(|dir| places::CheckedDir::open(&dir, ""))
            .map_err(|e| format!("no cache directory: {e}")),
    }
}

/// The largest index an archive of `archive_len` bytes can have: a tar member takes at
/// least a 512-byte header, its index entry far less, even with the directories its path
/// implies; sparse maps cost at most a few times their text.
pub fn size_cap(archive_len: u64) -> u64 {
    archive_len.saturating_mul(8).saturating_add(16 << 20)
}

/// Maps a saved index for `archive` if one matches `key` and deserves trust (see the
/// module docs); says why it ignores one.
/// `codec`: `backing` holds a compressed tar, served by the restart points saved with the index.
pub fn load(
    archive: &OutsideFile,
    key: &Key,
    staged: (&Backing, Option<Compression>),
    flavor: &Flavor,
    caches: &Caches,
) -> Option<(Index, Arc<dyn Reader>)> {
    let beside = beside_name(archive.resolved(), flavor);
    let found = match flavor.dir {
        None => Some((archive.resolved().with_file_name(&beside), archive.open_beside(&beside, size_cap(key.size)))),
        Some(_) => None,
    };
    load_found(found, archive.resolved(), key, staged, flavor, caches)
}

/// [`load`] for an archive that is no local file (an object in a store, named by
/// `archive`, its URL): only the kept ones (`--index-dir` or the cache), this user's.
pub fn load_kept(
    archive: &Path,
    key: &Key,
    staged: (&Backing, Option<Compression>),
    flavor: &Flavor,
    caches: &Caches,
) -> Option<(Index, Arc<dyn Reader>)> {
    load_found(None, archive, key, staged, flavor, caches)
}

/// A saved index found (where, and the file if it was there and trusted, or why not).
type Found = (PathBuf, Result<Option<File>, places::Distrust>);

/// The first of `found` (a saved index beside the archive, opened and judged) and the kept
/// one that maps to `key`'s version; says why it ignores the others.
fn load_found(
    found: Option<Found>,
    archive: &Path,
    key: &Key,
    staged: (&Backing, Option<Compression>),
    flavor: &Flavor,
    caches: &Caches,
) -> Option<(Index, Arc<dyn Reader>)> {
    let cap = size_cap(key.size);
    let cached_name = cache_name(archive, flavor);
    let kept = index_dir(flavor);
    if let (Some(_), Err(why)) = (flavor.dir, &kept) {
        tracing::warn!("{why}; scanning the archive");
    }
    let kept_found = kept.as_ref().ok().map(|dir| (dir.path().join(&cached_name), dir.open_own(&cached_name, cap)));
    for (path, opened) in found.into_iter().chain(kept_found) {
        let file = match opened {
            Ok(Some(file)) => file,
            Ok(None) => continue,
            Err(why) => {
                tracing::warn!(index = %path.shown(), "ignoring saved index: {why}; scanning the archive");
                continue;
            }
        };
        if let Some(dir) = kept.as_ref().ok().filter(|dir| path == dir.path().join(&cached_name)) {
            // A kept index in use is kept by `prune`: its mtime says when. Touched before
            // it is mapped: a mapped index whose identity changes is taken for rewritten.
            dir.touch(&cached_name);
        }
        let mapped = map_index(&file)
            .map_err(|e| IndexError::Invalid { index: Arc::from(path.as_path()), what: format!("cannot map it: {e}") });
        match mapped.and_then(|map| decode(map, &path, key, flavor.depth, staged, caches)) {
            Ok(opened) => {
                tracing::info!(index = %path.shown(), "using saved index");
                return Some(opened);
            }
            Err(why) => tracing::warn!("ignoring saved index: {why}; rebuilding it"),
        }
    }
    None
}

/// Where [`save`] wrote an index, and the tree read back from there: mapped, so that the
/// scan's copy in the heap can go.
pub struct Saved {
    pub path: PathBuf,
    pub mapped: Option<Index>,
}

/// Saves the index of a tar archive beside it (unless `--index-dir` says where), else in
/// the cache; returns where it went, and the tree mapped from there.
pub fn save(
    archive: &OutsideFile,
    key: &Key,
    index: &Index,
    tables: SavedTables,
    flavor: &Flavor,
) -> std::io::Result<Saved> {
    let tables = tables_of(tables);
    let saving = encode(key, flavor.depth, index, &tables);
    // Never more readable than the archive: the index lists its member names.
    let archive_mode = archive.file().metadata()?.mode();
    let mode = 0o600 | (archive_mode & 0o044);
    let beside = beside_name(archive.resolved(), flavor);
    if flavor.dir.is_none() {
        match archive.write_beside(&beside, &saving.parts(), mode) {
            Ok(()) => {
                let path = archive.resolved().with_file_name(&beside);
                let mapped = archive.open_beside(&beside, size_cap(key.size)).ok().flatten();
                return Ok(Saved { mapped: mapped.and_then(|file| map_tree(&file, &path, key, flavor)), path });
            }
            Err(e) => tracing::debug!("cannot write {} ({e}); keeping it in the cache", beside.shown()),
        }
    }
    save_kept_parts(archive.resolved(), key, &saving, mode, flavor)
}

/// [`save`] for an archive that is no local file (an object, named by its URL): kept in
/// `--index-dir` or the cache, mode 0600.
pub fn save_kept(
    archive: &Path,
    key: &Key,
    index: &Index,
    tables: SavedTables,
    flavor: &Flavor,
) -> std::io::Result<Saved> {
    let tables = tables_of(tables);
    save_kept_parts(archive, key, &encode(key, flavor.depth, index, &tables), 0o600, flavor)
}

fn save_kept_parts(archive: &Path, key: &Key, saving: &Saving, mode: u32, flavor: &Flavor) -> std::io::Result<Saved> {
    let dir = index_dir(flavor).map_err(std::io::Error::other)?;
    let name = cache_name(archive, flavor);
    dir.write_parts_atomically(&name, &saving.parts(), mode)?;
    if flavor.dir.is_none() {
        prune(dir.path(), CACHE_MAX_AGE, CACHE_MAX_BYTES);
    }
    let path = dir.path().join(&name);
    let mapped = dir.open_own(&name, size_cap(key.size)).ok().flatten();
    Ok(Saved { mapped: mapped.and_then(|file| map_tree(&file, &path, key, flavor)), path })
}

/// The tree of the index just written to `file` (at `path`), mapped.
fn map_tree(file: &File, path: &Path, key: &Key, flavor: &Flavor) -> Option<Index> {
    let map = map_index(file).ok()?;
    decode_tree(map, path, key, flavor.depth).map_err(|e| tracing::debug!("cannot map the index just saved: {e}")).ok()
}

/// A saved index for an archive that is no local file (an object in a store): read from
/// `bytes` if it matches `key`, else why not.
pub fn decode_bytes(
    bytes: Vec<u8>,
    name: &Path,
    key: &Key,
    staged: (&Backing, Option<Compression>),
    depth: usize,
    caches: &Caches,
) -> Result<(Index, Arc<dyn Reader>), IndexError> {
    decode(IndexMap::from_vec(bytes), name, key, depth, staged, caches)
}

/// The saved index in `file`, handed over by this user's daemon (see `share`), mapped and
/// checked to be `key`'s, over `backing` (the copy of a plain tar, or of a compressed one
/// decoded whole). `name` names it in messages.
pub fn decode_file(
    file: &File,
    name: &Path,
    key: &Key,
    depth: usize,
    backing: &Backing,
    caches: &Caches,
) -> Result<(Index, Arc<dyn Reader>), IndexError> {
    let map = map_index(file)
        .map_err(|e| IndexError::Invalid { index: Arc::from(name), what: format!("cannot map it: {e}") })?;
    decode(map, name, key, depth, (backing, None), caches)
}

/// Keeps `bytes`, a saved index fetched from beside an object (checked to match it), in
/// `--index-dir` or the cache, where [`load_kept`] maps it.
pub fn keep_fetched(archive: &Path, bytes: &[u8], flavor: &Flavor) -> std::io::Result<()> {
    let dir = index_dir(flavor).map_err(std::io::Error::other)?;
    dir.write_atomically(&cache_name(archive, flavor), bytes, 0o600)?;
    if flavor.dir.is_none() {
        prune(dir.path(), CACHE_MAX_AGE, CACHE_MAX_BYTES);
    }
    Ok(())
}

/// The bytes [`save`] writes, for storing elsewhere (uploaded beside an object).
pub fn encode_bytes(key: &Key, depth: usize, index: &Index, tables: SavedTables) -> Vec<u8> {
    encode(key, depth, index, &tables_of(tables)).to_vec()
}

/// Saved indexes in the cache directory not used for this long are removed.
pub(crate) const CACHE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
/// Beyond this many bytes of indexes in the cache directory, the least recently used go.
pub(crate) const CACHE_MAX_BYTES: u64 = 2 << 30;

/// Keeps the cache directory bounded, whatever happened to the archives (deleted long ago,
/// moved): indexes unused for `max_age` go, then the least recently used until the rest
/// holds at most `max_bytes`. Use is the file's mtime, renewed by [`load`].
pub(crate) fn prune(dir: &Path, max_age: std::time::Duration, max_bytes: u64) {
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
            crate::places::remove_file(&path);
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
        crate::places::remove_file(&path);
        total -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{run_tool, TempDir};
    use std::ffi::OsStr;
    use std::fs::File;

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
        let file = places::open_outside(&path, places::Trust::Named, None).unwrap();
        let key = Key::of(file.file()).unwrap();
        let caches = Caches::default();
        let fresh = stagefs_archive::Archive::open(file.file(), &path, &caches).unwrap();
        let saved = save(&file, &key, &fresh.index, fresh.saved().unwrap(), &Flavor::default()).unwrap();
        let saved_at = saved.path;
        assert_eq!(saved_at, file.resolved().with_file_name("a.tar.stagefs-index"));
        assert!(saved.mapped.is_some_and(|m| m == fresh.index && m.source() == Some(saved_at.as_path())));
        let backing = stagefs_archive::map_file(file.file()).unwrap();
        let (loaded, _) =
            load(&file, &key, (&backing, None), &Flavor::default(), &caches).expect("a matching index loads");
        assert!(loaded == fresh.index);

        // A changed archive: different key, index ignored.
        let mut other = key;
        other.fingerprint ^= 1;
        assert!(load(&file, &other, (&backing, None), &Flavor::default(), &caches).is_none());
        // Every single-byte corruption is caught at open, or by its block's checksum when read.
        let bytes = std::fs::read(&saved_at).unwrap();
        let decode = |bytes: &[u8]| decode_bytes(bytes.to_vec(), &saved_at, &key, (&backing, None), 0, &caches);
        for i in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x5a;
            let caught = decode(&damaged).map_or(true, |(index, _)| index.read_all().is_err());
            assert!(caught, "corruption at byte {i} was accepted");
        }
        assert!(decode(&bytes[..bytes.len() / 2]).is_err());
    }

    #[test]
    fn key_changes_with_content() {
        let tmp = TempDir::new("index-key");
        let path = tmp.join("x");
        std::fs::write(&path, vec![1u8; 300_000]).unwrap();
        let a = Key::of(&File::open(&path).unwrap()).unwrap();
        let mut bytes = vec![1u8; 300_000];
        bytes[299_999] = 2;
        std::fs::write(&path, &bytes).unwrap();
        let b = Key::of(&File::open(&path).unwrap()).unwrap();
        assert_ne!(a.fingerprint, b.fingerprint);
    }
}
