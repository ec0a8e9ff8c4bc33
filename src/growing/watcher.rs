//! `--watch`: a growing mount follows its pattern, adding the shards that appear once they are complete (unchanged over a whole interval), re-reading those rewritten since, and removing those whose file is gone.
//!
//! A writer that fills a shard in place is seen as growing until it stops; one that
//! renames a finished file into place is seen at once complete. A shard that was added
//! and then changes (a fetcher paused at a member boundary longer than the interval, then
//! went on) is read again once it is stable again. A shard that fails to open (damaged,
//! refused) is logged once and retried only when its file changes; it never holds the
//! others back, and it is forgotten once its name is gone (names another user creates
//! and deletes cost nothing after they are gone). A deleted shard leaves the tree, and
//! its RAM and disk space go once no process has its files open.
//! "Unchanged" is the one file identity every check uses ([`FileId`]), seen through the
//! one way files from outside are opened.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::GrowingSet;
use stagefs_archive::escape::Shown;
use stagefs_archive::FileId;
use stagefs_open::places::{self, Trust};

/// Names remembered as refused at most: beyond this many refused files present at once,
/// the oldest are forgotten (and tried again when next seen stable).
const MAX_REFUSED: usize = 65_536;

/// What the watcher remembers between polls.
#[derive(Default)]
pub struct Memory {
    /// Names not served, as they looked at the last poll: unchanged at the next, they are added.
    seen: HashMap<PathBuf, FileId>,
    /// Names whose file failed to open as it looks now (retried once it changes).
    refused: HashMap<PathBuf, Option<FileId>>,
}

impl Memory {
    /// Forgets the refused names that no longer match (another user may create and delete
    /// names without end); what is left stays within [`MAX_REFUSED`].
    fn forget_absent(&mut self, named: &HashSet<PathBuf>) {
        self.refused.retain(|path, _| named.contains(path));
        while self.refused.len() > MAX_REFUSED {
            let Some(any) = self.refused.keys().next().cloned() else { break };
            self.refused.remove(&any);
        }
    }

    /// Remembers that `path` (as named) failed to serve.
    pub fn refuse(&mut self, path: &Path) {
        let id = look(path, None).map(|(_, id)| id);
        self.refused.insert(path.to_owned(), id);
    }
}

/// The file a name leads to now, every link followed: where it is and which version.
fn look(path: &Path, not_on: Option<u64>) -> Option<(PathBuf, FileId)> {
    let file = places::open_outside(path, Trust::Named, not_on).ok()?;
    file.file().metadata().ok()?.is_file().then(|| (file.resolved().to_owned(), file.id()))
}

/// Polls `pattern` every `interval` on a thread, for the life of the daemon.
pub fn spawn(set: Arc<GrowingSet>, pattern: String, interval: Duration, memory: Memory) -> std::io::Result<()> {
    std::thread::Builder::new().name("watch".into()).spawn(move || {
        let mut memory = memory;
        loop {
            std::thread::sleep(interval);
            poll(&set, &pattern, &mut memory);
        }
    })?;
    Ok(())
}

/// One poll: what is new and unchanged since the last one is added, what was rewritten
/// and is stable again is read again, what is gone removed.
fn poll(set: &GrowingSet, pattern: &str, memory: &mut Memory) {
    let served: HashMap<PathBuf, FileId> = set.served().into_iter().collect();
    let matches = match stagefs_open::shards::matches(pattern) {
        Ok(m) => m,
        Err(e) => return tracing::warn!("--watch: {e}"),
    };
    let mut now: HashMap<PathBuf, FileId> = HashMap::new();
    // The files matched (links followed), and the names that matched.
    let mut present: HashSet<PathBuf> = HashSet::new();
    let named: HashSet<PathBuf> = matches.iter().cloned().collect();
    let (mut complete, mut rewritten) = (Vec::new(), Vec::new());
    for path in matches {
        let Some((resolved, id)) = look(&path, set.mount_dev()) else { continue };
        present.insert(resolved.clone());
        if let Some(served_id) = served.get(&resolved) {
            if !served_id.same_version(&id) {
                if memory.seen.get(&path) == Some(&id) {
                    rewritten.push((path.clone(), resolved));
                }
                now.insert(path, id);
            }
            continue;
        }
        if memory.refused.get(&path) == Some(&Some(id)) {
            continue;
        }
        if memory.seen.get(&path) == Some(&id) {
            complete.push(path.clone());
        }
        now.insert(path, id);
    }
    memory.seen = now;
    memory.forget_absent(&named);
    let gone: Vec<PathBuf> = served.into_keys().filter(|p| !present.contains(p)).collect();
    for (path, resolved) in &rewritten {
        tracing::info!("--watch: {} changed since it was added; reading it again", path.shown());
        // The old version goes and the new one comes in one change.
        if let Err(e) = set.change(std::slice::from_ref(path), std::slice::from_ref(resolved), false, &|| true) {
            tracing::warn!("--watch: cannot read {} again: {e}; its old version is removed", path.shown());
            let _ = set.change(&[], std::slice::from_ref(resolved), false, &|| true);
            memory.refuse(path);
        }
    }
    if complete.is_empty() && gone.is_empty() {
        return;
    }
    if set.change(&complete, &gone, false, &|| true).is_ok() {
        return;
    }
    // One shard that fails must not hold the others back: each alone, the failures noted.
    for path in complete {
        if let Err(e) = set.change(std::slice::from_ref(&path), &[], false, &|| true) {
            tracing::warn!("--watch: not adding {}: {e}; retried once the file changes", path.shown());
            memory.seen.remove(&path);
            memory.refuse(&path);
        }
    }
    if let Err(e) = set.change(&[], &gone, false, &|| true) {
        tracing::warn!("--watch: cannot remove the shards whose files are gone: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names another user creates, keeps for two polls and deletes cost nothing once gone,
    /// and however many are present at once, at most MAX_REFUSED are remembered.
    #[test]
    fn refused_names_are_forgotten_once_gone_and_bounded() {
        let mut memory = Memory::default();
        let names: Vec<PathBuf> = (0..1000).map(|i| PathBuf::from(format!("/shared/s-{i}.tar"))).collect();
        for name in &names {
            memory.refused.insert(name.clone(), Some(FileId::default()));
        }
        let present: HashSet<PathBuf> = names[..10].iter().cloned().collect();
        memory.forget_absent(&present);
        assert_eq!(memory.refused.len(), 10, "the deleted names are forgotten");
        let many: Vec<PathBuf> = (0..MAX_REFUSED + 50).map(|i| PathBuf::from(format!("/shared/m-{i}.tar"))).collect();
        memory.refused.extend(many.iter().map(|n| (n.clone(), None)));
        memory.forget_absent(&many.into_iter().collect());
        assert_eq!(memory.refused.len(), MAX_REFUSED);
    }
}
