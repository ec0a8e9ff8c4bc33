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

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::places::{self, OutsideFile};
use stagefs_archive::escape::Shown;
use stagefs_archive::hash;
use stagefs_archive::index::Index;
use stagefs_archive::seekable::Codec;
pub use stagefs_archive::tar::key::Key;
use stagefs_archive::tar::saved_format::{decode, encode};
use stagefs_archive::tar::SavedTables;
use stagefs_archive::{Backing, Reader};
use std::sync::Arc;

/// The name of the saved index beside an archive named `archive_name`.
fn beside_name(archive: &Path, depth: usize) -> String {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}{INDEX_SUFFIX}{}", flavor(depth))
}

/// What every saved index beside an archive has in its name (a shard pattern must not
/// take one for a shard, whatever its flavour).
pub const INDEX_SUFFIX: &str = ".stagefs-index";

/// Whether a file of this name is a saved index beside its archive (of any flavour).
pub fn is_saved_index(name: &std::ffi::OsStr) -> bool {
    let name = name.as_encoded_bytes();
    [INDEX_SUFFIX, &format!("{INDEX_SUFFIX}{}", flavor(1))].iter().any(|suffix| name.ends_with(suffix.as_bytes()))
}

/// A `--recursive` index (inner tars opened) is another file than the flat one: the two
/// trees differ, and mounts of either kind must not replace each other's index. The depth
/// it opened is recorded inside: a mount asking another depth rebuilds it.
fn flavor(depth: usize) -> &'static str {
    if depth > 0 {
        "-recursive"
    } else {
        ""
    }
}

/// The name of `archive`'s saved index (a resolved path) in the cache directory.
fn cache_name(archive: &Path, depth: usize) -> String {
    let name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let path_hash = hash::hash(archive.as_os_str().as_encoded_bytes());
    format!("{path_hash:016x}-{name}{}.index", flavor(depth))
}

/// The user's cache directory, held open (none when there is no usable one).
fn cache() -> Option<places::CheckedDir> {
    let dir = places::cache_dir().ok()?;
    places::CheckedDir::open(&dir, "").ok()
}

/// The largest index an archive of `archive_len` bytes can have: a tar member takes at
/// least a 512-byte header, its index entry far less, even with the directories its path
/// implies; sparse maps cost at most a few times their text.
fn size_cap(archive_len: u64) -> u64 {
    archive_len.saturating_mul(8).saturating_add(16 << 20)
}

/// Loads a saved index for `archive` if one matches `key` and deserves trust (see the
/// module docs); says why it ignores one.
/// `codec`: `backing` holds a compressed tar, served by the restart points saved with the
/// index; `depth`: the levels of inner tars the mount opens (`--recursive`; 0: none).
pub fn load(
    archive: &OutsideFile,
    key: &Key,
    backing: &Backing,
    codec: Option<Codec>,
    depth: usize,
) -> Option<(Index, Arc<dyn Reader>)> {
    let cap = size_cap(key.size);
    let beside = beside_name(archive.resolved(), depth);
    let cached_name = cache_name(archive.resolved(), depth);
    let cache = cache();
    let found = [
        (archive.resolved().with_file_name(&beside), archive.read_beside(&beside, cap)),
        match &cache {
            Some(dir) => (dir.path().join(&cached_name), dir.read_own(&cached_name, cap)),
            None => (PathBuf::new(), Ok(None)),
        },
    ];
    for (i, (path, read)) in found.into_iter().enumerate() {
        let bytes = match read {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(why) => {
                tracing::warn!(index = %path.shown(), "ignoring saved index: {why}; scanning the archive");
                continue;
            }
        };
        match decode(&bytes, key, depth, backing, codec) {
            Ok(opened) => {
                tracing::info!(index = %path.shown(), "using saved index");
                if let (1, Some(dir)) = (i, &cache) {
                    // A cached index in use is kept by `prune`: its mtime says when.
                    dir.touch(&cached_name);
                }
                return Some(opened);
            }
            Err(why) => tracing::warn!(index = %path.shown(), "ignoring saved index: {why}; rebuilding it"),
        }
    }
    None
}

/// Saves the index of a tar archive (opened `depth` levels deep, served by the readers
/// `tables` describes) beside it, else in the cache; returns where it went.
pub fn save(
    archive: &OutsideFile,
    key: &Key,
    depth: usize,
    index: &Index,
    tables: SavedTables,
) -> std::io::Result<PathBuf> {
    let bytes = encode(key, depth, index, tables);
    // Never more readable than the archive: the index lists its member names.
    let archive_mode = archive.file().metadata()?.mode();
    let mode = 0o600 | (archive_mode & 0o044);
    let beside = beside_name(archive.resolved(), depth);
    let beside_error = match archive.write_beside(&beside, &bytes, mode) {
        Ok(()) => return Ok(archive.resolved().with_file_name(&beside)),
        Err(e) => e,
    };
    let dir = places::cache_dir().and_then(|dir| places::CheckedDir::open(&dir, "")).map_err(|e| {
        std::io::Error::other(format!(
            "cannot write {} ({beside_error}), nor use the cache: {e}",
            archive.resolved().with_file_name(&beside).shown()
        ))
    })?;
    let name = cache_name(archive.resolved(), depth);
    dir.write_atomically(&name, &bytes, mode)?;
    prune(dir.path(), CACHE_MAX_AGE, CACHE_MAX_BYTES);
    Ok(dir.path().join(name))
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
        let fresh = stagefs_archive::Archive::open(file.file(), &path).unwrap();
        let saved_at = save(&file, &key, 0, &fresh.index, fresh.saved().unwrap()).unwrap();
        assert_eq!(saved_at, file.resolved().with_file_name("a.tar.stagefs-index"));
        let backing = stagefs_archive::map_file(file.file()).unwrap();
        let (loaded, _) = load(&file, &key, &backing, None, 0).expect("a matching index loads");
        assert_eq!(loaded.inodes, fresh.index.inodes);
        assert_eq!(loaded.dirents, fresh.index.dirents);
        assert_eq!(loaded.arena, fresh.index.arena);

        // A changed archive: different key, index ignored.
        let mut other = key;
        other.fingerprint ^= 1;
        assert!(load(&file, &other, &backing, None, 0).is_none());
        // Every single-byte corruption is caught by the checksum or the bounds checks.
        let bytes = std::fs::read(&saved_at).unwrap();
        for i in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x5a;
            assert!(decode(&damaged, &key, 0, &backing, None).is_err(), "corruption at byte {i} was accepted");
        }
        assert!(decode(&bytes[..bytes.len() / 2], &key, 0, &backing, None).is_err());
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
