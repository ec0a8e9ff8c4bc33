//! Shard sets on the command line: a glob pattern, an `@list` file or several archives, resolved to one ordered list.
//!
//! stagefs expands the pattern itself (quoted, so no shell limit on the number of shards
//! applies), sorted by path; an `@FILE` names one archive per line, kept in that order
//! (relative paths are relative to the list's directory; blank lines and `#` comments are
//! skipped); `--archive` adds more of either. Later shards win where names collide. A set
//! is known by its label (the spec, the shard count and a digest of the canonical list):
//! the election and the mount's record key on it, so two spellings of the same shards
//! share one mount, and a shard added to the directory makes a different set.
//!
//! Trust: a set is what its owner put there, not whatever another user of a shared
//! directory adds. Each shard must belong to this user, to root or to the owner of the
//! directory it sits in (the dataset's owner), and that directory must not let other users
//! replace files (writable by them without the sticky bit); otherwise the mount is refused
//! (exit 4) unless `--trust-shards` says the data is trusted on purpose. A pattern is always
//! a pattern: a file literally named `train-*.tar` is one more match, not the set.

mod member;
mod open;
mod saved;

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};

pub use crate::open::SetStats;
pub use crate::places::ArchiveSet;
pub use member::{How, Member};
pub use open::{open_each, open_set, open_shared, report_indexed, warn_conflicts};

use crate::places::{self, Trust};
use stagefs_archive::OpenError;
/// Why a shard set could not be named, each saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A pattern that does not parse (a usage error).
    #[error("bad pattern {pattern:?}: {why}")]
    BadPattern { pattern: String, why: String },
    /// No archive where the spec points: nothing matched, a list that names none.
    #[error("{0}")]
    NotFound(String),
    /// A shard or mountpoint refused for safety (another user's shard, an archive given as
    /// the mountpoint).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Outside(#[from] places::OutsideError),
}

/// Resolves `spec` (an archive, a glob pattern or `@list`) and any `more` of them; the
/// shards of a set are checked against other users (see the module's doc) unless
/// `trust_shards`, by opening each the one way files from outside are opened.
pub fn resolve(spec: &Path, more: &[PathBuf], trust_shards: bool) -> Result<ArchiveSet, ShardError> {
    resolve_as(spec, more, trust_shards, false)
}

/// [`resolve`] for a pattern `--watch` follows: a match that cannot serve (another user's,
/// empty, damaged) is skipped with a warning, as the running watch skips it.
pub fn resolve_watched(spec: &Path, trust_shards: bool) -> Result<ArchiveSet, ShardError> {
    resolve_as(spec, &[], trust_shards, true)
}

fn resolve_as(spec: &Path, more: &[PathBuf], trust_shards: bool, skip: bool) -> Result<ArchiveSet, ShardError> {
    let named: Vec<PathBuf> = std::iter::once(spec)
        .chain(more.iter().map(PathBuf::as_path))
        .map(|spec| expand(spec, trust_shards))
        .collect::<Result<Vec<_>, _>>()?
        .concat();
    let trust = if trust_shards || (named.len() == 1 && !is_set_spec(spec)) { Trust::Named } else { Trust::Member };
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for path in named {
        let resolved = match places::open_outside(&path, trust, None) {
            Ok(file) => file.resolved().to_owned(),
            Err(e) if skip => {
                tracing::warn!("--watch: not serving {}: {e}; retried once the file changes", path.shown());
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // A shard named twice would only conflict with itself everywhere (a set, not a
        // search of the list: 10,000 shards).
        if seen.insert(resolved.clone()) {
            shards.push(resolved);
        }
    }
    // A pattern or list that names one archive mounts it like that archive.
    if shards.len() == 1 {
        return Ok(ArchiveSet { label: shards[0].clone(), shards, trust });
    }
    let mut text = absolute(spec).to_string_lossy().into_owned();
    if !more.is_empty() {
        text += &format!(" + {} more", more.len());
    }
    let mut digest = stagefs_archive::hash::Hasher::default();
    for shard in &shards {
        digest.write(shard.as_os_str().as_encoded_bytes());
        digest.write(b"\0");
    }
    let label = format!("{text} ({} shard{}, set {:016x})", shards.len(), plural(shards.len()), digest.finish());
    Ok(ArchiveSet { label: PathBuf::from(label), shards, trust })
}

/// The default mountpoint for local `spec`: the archive's stem, or for a pattern or list
/// its name without the wildcards (`train-*.tar` mounts at `.../stagefs/train`); a pattern
/// that names nothing but an extension (`shards/*.tar`) takes its directory's name.
pub fn default_mountpoint(spec: &Path) -> PathBuf {
    if !is_set_spec(spec) {
        return crate::places::default_mountpoint(spec);
    }
    let name = spec.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let cleaned: String = name.chars().filter(|c| !"*?[]{}@".contains(*c)).collect();
    let stem = if cleaned.starts_with('.') { String::new() } else { crate::places::archive_stem(Path::new(&cleaned)) };
    let stem = stem.trim_end_matches(".txt").trim_matches(|c| "-_.".contains(c));
    let dir = spec.parent().and_then(Path::file_name).map(|d| d.to_string_lossy().into_owned());
    let name = match (stem.is_empty(), dir) {
        (false, _) => stem.to_string(),
        (true, Some(dir)) if !dir.is_empty() && !dir.contains(['*', '?', '[']) => dir,
        (true, _) => "shards".to_string(),
    };
    crate::places::default_mount_root().join(name)
}

/// Refuses a MOUNTPOINT that is itself an archive: the shell expanded an unquoted
/// pattern, and its second match took the mountpoint's place.
pub fn check_not_an_archive(mountpoint: &Path) -> Result<(), ShardError> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 512];
    let Ok(file) = places::open_outside(mountpoint, Trust::Named, None) else { return Ok(()) };
    if !file.file().metadata().is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let n = file.file().read_at(&mut head, 0).unwrap_or(0);
    let head = &head[..n];
    if stagefs_archive::Format::detect(head).is_none() && crate::stage::Compression::detect(head).is_none() {
        return Ok(());
    }
    Err(ShardError::Refused(format!(
        "{}: not a directory but an archive; did the shell expand a pattern? Quote it so that stagefs \
             expands it: stagefs mount 'shards/*.tar' MOUNTPOINT",
        mountpoint.shown()
    )))
}

/// True for a glob pattern or an `@list`, which name a set even when it has one shard.
fn is_set_spec(spec: &Path) -> bool {
    let text = spec.to_string_lossy();
    text.starts_with('@') || is_pattern(&text)
}

/// True for text with glob wildcards.
pub fn is_pattern(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// The paths one spec names: itself, the matches of a pattern, or the lines of a list;
/// absolute, links not followed. A list is judged as its shards are (`trust_shards`: not
/// at all): a list someone else could have written names their shards.
pub fn expand(spec: &Path, trust_shards: bool) -> Result<Vec<PathBuf>, ShardError> {
    Ok(expand_relative(spec, trust_shards)?.into_iter().map(|p| absolute(&p)).collect())
}

fn expand_relative(spec: &Path, trust_shards: bool) -> Result<Vec<PathBuf>, ShardError> {
    let text = spec.to_string_lossy();
    if let Some(list) = text.strip_prefix('@') {
        let trust = if trust_shards { Trust::Named } else { Trust::Member };
        return read_list(Path::new(list), trust);
    }
    if !is_pattern(&text) {
        return Ok(vec![spec.to_owned()]);
    }
    let matches = matches(&text)?;
    if matches.is_empty() {
        // A file whose name holds `[` is no match of itself: say how to name it.
        let literal = if spec.exists() {
            format!(
                "; {} exists, but its name is read as a pattern: escape it as {:?}",
                spec.shown(),
                glob::Pattern::escape(&text)
            )
        } else {
            String::new()
        };
        return Err(ShardError::NotFound(format!(
            "no archive matches the pattern {text:?} (relative to {}); check the path, and quote the pattern so \
             that stagefs expands it{literal}",
            std::env::current_dir().map_or_else(|_| "the current directory".into(), |d| d.shown().to_string())
        )));
    }
    Ok(matches)
}

/// The files `pattern` matches, sorted, saved indexes left out (none: empty).
pub fn matches(pattern: &str) -> Result<Vec<PathBuf>, ShardError> {
    let bad = |why: String| ShardError::BadPattern { pattern: pattern.to_string(), why };
    let mut matches: Vec<PathBuf> = glob::glob(pattern)
        .map_err(|e| bad(e.to_string()))?
        .filter_map(|entry| match entry {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::warn!("skipping {}: {}", e.path().shown(), e.error());
                None
            }
        })
        .filter(|p| !p.file_name().is_some_and(crate::saved_index::is_saved_index))
        .collect();
    matches.sort();
    Ok(matches)
}

/// One archive per line; relative paths are taken from the list's directory.
fn read_list(list: &Path, trust: Trust) -> Result<Vec<PathBuf>, ShardError> {
    /// A list names paths, not data: a larger file is not a list.
    const MAX_LIST: u64 = 64 << 20;
    let cannot =
        |why: String| ShardError::NotFound(format!("cannot read the list of archives {}: {why}", list.shown()));
    let file = match places::open_outside(list, trust, None) {
        Ok(file) => file,
        Err(e @ places::OutsideError::Untrusted { .. }) => return Err(e.into()),
        Err(e) => return Err(cannot(e.to_string())),
    };
    let bytes = places::read_all(file.file(), MAX_LIST).map_err(|e| cannot(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| cannot("it is not UTF-8 text".into()))?;
    let base = list.parent().unwrap_or(Path::new("."));
    let paths: Vec<PathBuf> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(|l| base.join(l)).collect();
    if paths.is_empty() {
        return Err(ShardError::NotFound(format!("the list of archives {} names none", list.shown())));
    }
    if let Some(missing) = paths.iter().find(|p| !p.exists()) {
        return Err(ShardError::NotFound(format!("{} (listed in {}) does not exist", missing.shown(), list.shown())));
    }
    Ok(paths)
}

fn absolute(path: &Path) -> PathBuf {
    std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_owned())
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn patterns_lists_and_labels() {
        let tmp = TempDir::new("shards-resolve");
        for name in ["b.tar", "a.tar", "c.tar", "a.tar.stagefs-index"] {
            std::fs::write(tmp.join(name), b"x").unwrap();
        }
        let pattern = tmp.join("*.tar*");
        let set = resolve(&pattern, &[], false).unwrap();
        let names: Vec<_> = set.shards.iter().map(|p| p.file_name().unwrap().to_owned()).collect();
        assert_eq!(names, ["a.tar", "b.tar", "c.tar"], "sorted, saved indexes skipped");
        assert!(set.label.to_string_lossy().ends_with(")") && set.label.to_string_lossy().contains("(3 shards, set "));
        std::fs::write(tmp.join("list.txt"), "# comment\nc.tar\n\na.tar\n").unwrap();
        let listed = resolve(Path::new(&format!("@{}", tmp.join("list.txt").display())), &[], false).unwrap();
        let names: Vec<_> = listed.shards.iter().map(|p| p.file_name().unwrap().to_owned()).collect();
        assert_eq!(names, ["c.tar", "a.tar"], "a list keeps its order");
        assert_ne!(listed.label, set.label);
        let single = resolve(&tmp.join("a.tar"), &[], false).unwrap();
        assert_eq!(single.label, single.shards[0]);
        assert!(matches!(resolve(&tmp.join("nothing-*.tar"), &[], false), Err(ShardError::NotFound(_))));
        std::fs::write(tmp.join("bad.txt"), "a.tar\nmissing.tar\n").unwrap();
        let err = resolve(Path::new(&format!("@{}", tmp.join("bad.txt").display())), &[], false).unwrap_err();
        let err = err.to_string();
        assert!(err.contains("missing.tar") && err.contains("does not exist"), "{err}");
        let more = resolve(&tmp.join("a.tar"), &[tmp.join("b.tar"), tmp.join("a.tar")], false).unwrap();
        assert_eq!(more.shards.len(), 2, "a shard named twice is served once");
        assert!(default_mountpoint(Path::new("/x/train-*.tar")).ends_with("stagefs/train"));
        assert!(default_mountpoint(Path::new("@/x/shards.txt")).ends_with("stagefs/shards"));
        assert!(default_mountpoint(Path::new("/x/data.tar")).ends_with("stagefs/data"));
        assert!(default_mountpoint(Path::new("/x/shards/*.tar")).ends_with("stagefs/shards"));
        assert!(default_mountpoint(Path::new("data/*.zip")).ends_with("stagefs/data"));
        assert!(default_mountpoint(Path::new("*.tar")).ends_with("stagefs/shards"));
    }
}
