//! `--watch`: a growing mount follows its pattern, adding the shards that appear once they are complete (size and mtime unchanged over a whole interval) and removing those whose file is gone.
//!
//! A writer that fills a shard in place is seen as growing until it stops; one that
//! renames a finished file into place is seen at once complete. A shard that fails to
//! open (damaged, refused) is logged once and retried only when its file changes; it
//! never holds the others back. A deleted shard leaves the tree, and its RAM and disk
//! space go once no process has its files open.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::GrowingSet;

/// What a file looked like at one poll: size, mtime (s, ns), inode.
type Look = (u64, i64, i64, u64);

fn look(path: &std::path::Path) -> Option<Look> {
    let m = std::fs::metadata(path).ok()?;
    m.is_file().then(|| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
}

/// Polls `pattern` every `interval` on a thread, for the life of the daemon.
pub fn spawn(set: Arc<GrowingSet>, pattern: String, interval: Duration) -> std::io::Result<()> {
    std::thread::Builder::new().name("watch".into()).spawn(move || {
        let mut seen: HashMap<PathBuf, Look> = HashMap::new();
        let mut refused: HashMap<PathBuf, Look> = HashMap::new();
        loop {
            std::thread::sleep(interval);
            poll(&set, &pattern, &mut seen, &mut refused);
        }
    })?;
    Ok(())
}

/// One poll: what is new and unchanged since the last one is added, what is gone removed.
fn poll(set: &GrowingSet, pattern: &str, seen: &mut HashMap<PathBuf, Look>, refused: &mut HashMap<PathBuf, Look>) {
    let served: HashSet<PathBuf> = set.paths().into_iter().collect();
    let matches = match crate::shards::matches(pattern) {
        Ok(m) => m,
        Err(e) => return tracing::warn!("--watch: {e}"),
    };
    let mut now: HashMap<PathBuf, Look> = HashMap::new();
    let mut complete = Vec::new();
    for path in matches {
        let Ok(path) = path.canonicalize() else { continue };
        let Some(look) = look(&path) else { continue };
        if served.contains(&path) || refused.get(&path) == Some(&look) {
            continue;
        }
        if seen.get(&path) == Some(&look) {
            complete.push(path.clone());
        }
        now.insert(path, look);
    }
    *seen = now;
    let gone: Vec<PathBuf> = served.into_iter().filter(|p| look(p).is_none()).collect();
    if complete.is_empty() && gone.is_empty() {
        return;
    }
    if set.change(&complete, &gone, false).is_ok() {
        return;
    }
    // One shard that fails must not hold the others back: each alone, the failures noted.
    for path in complete {
        if let Err(e) = set.change(std::slice::from_ref(&path), &[], false) {
            tracing::warn!("--watch: not adding {}: {e}; retried once the file changes", path.display());
            if let Some(look) = seen.remove(&path) {
                refused.insert(path, look);
            }
        }
    }
    if let Err(e) = set.change(&[], &gone, false) {
        tracing::warn!("--watch: cannot remove the shards whose files are gone: {e}");
    }
}
