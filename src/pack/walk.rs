//! The parallel walk: list directories and `lstat` their entries on many threads, then sort by path bytes.
//!
//! On a parallel filesystem every `lstat` is a metadata round trip; one thread walking a
//! million files waits a million times. Here a directory's listing is cut into batches of
//! names that any thread stats, so one huge flat directory keeps every thread busy too.

use stagefs_archive::escape::Shown;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use super::errors::PackError;
use stagefs_archive::escape::escape;

/// Names stat'ed per task: small enough to spread a flat directory over every thread.
const STAT_BATCH: usize = 32;

/// What `lstat` said about an entry (all `pack` needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
    pub ctime: i64,
    pub ctime_nsec: i64,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub rdev: u64,
    /// 512-byte blocks allocated: fewer than the size needs means holes.
    pub blocks: u64,
}

impl Stat {
    pub fn of(meta: &std::fs::Metadata) -> Stat {
        Stat {
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
            dev: meta.dev(),
            ino: meta.ino(),
            nlink: meta.nlink(),
            rdev: meta.rdev(),
            blocks: meta.blocks(),
        }
    }

    /// The one file identity (see `stagefs_archive::FileId`) of what was stat'ed.
    pub fn id(&self) -> stagefs_archive::FileId {
        stagefs_archive::FileId {
            dev: self.dev,
            ino: self.ino,
            size: self.size,
            mtime: (self.mtime, self.mtime_nsec),
            ctime: (self.ctime, self.ctime_nsec),
            nlink: self.nlink,
        }
    }

    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// A regular file with fewer blocks allocated than its size needs: it may have holes,
    /// which the writer looks for (and stores as a pax 1.0 sparse member).
    pub fn maybe_sparse(&self) -> bool {
        self.file_type() == libc::S_IFREG && self.size >= 64 << 10 && self.blocks * 512 + (32 << 10) < self.size
    }
}

/// One path of the tree, relative to its root (`""` is the root itself).
#[derive(Clone, Debug)]
pub struct Entry {
    pub path: Vec<u8>,
    pub stat: Stat,
}

/// `--exclude` patterns: a pattern with a `/` matches the whole relative path, one without
/// matches any single name (as `tar --exclude` does). An excluded directory is not entered.
#[derive(Debug, Default)]
pub struct Filter {
    patterns: Vec<(glob::Pattern, bool)>,
}

impl Filter {
    pub fn new(patterns: &[String]) -> Result<Filter, PackError> {
        let patterns = patterns
            .iter()
            .map(|p| {
                let pattern = glob::Pattern::new(p.trim_end_matches('/'))
                    .map_err(|e| PackError::Usage(format!("--exclude {p:?}: not a valid pattern: {e}")))?;
                Ok((pattern, p.trim_end_matches('/').contains('/')))
            })
            .collect::<Result<_, PackError>>()?;
        Ok(Filter { patterns })
    }

    pub fn excluded(&self, rel: &[u8]) -> bool {
        let text = String::from_utf8_lossy(rel);
        let name = text.rsplit('/').next().unwrap_or(&text);
        let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
        self.patterns
            .iter()
            .any(|(p, whole)| if *whole { p.matches_with(&text, options) } else { p.matches_with(name, options) })
    }
}

/// `root`/`rel` as a path.
pub fn full_path(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

enum Task {
    /// List a directory and queue its entries.
    List(Vec<u8>),
    /// `lstat` these paths; directories among them are listed next.
    Stat(Vec<Vec<u8>>),
}

#[derive(Default)]
struct Queue {
    tasks: Vec<Task>,
    busy: usize,
    error: Option<PackError>,
}

/// Walks `root` on `threads` threads: the whole tree, or (with `listed`) those paths,
/// directories among them with everything below. Returns the entries sorted by path
/// bytes, the root first, without duplicates.
pub fn walk(
    root: &Path,
    listed: Option<Vec<Vec<u8>>>,
    filter: &Filter,
    threads: usize,
) -> Result<Vec<Entry>, PackError> {
    let root_meta = std::fs::metadata(root).map_err(|source| PackError::Source { path: root.to_owned(), source })?;
    let first = match listed {
        Some(paths) => paths.chunks(STAT_BATCH).map(|c| Task::Stat(c.to_vec())).collect(),
        None => vec![Task::List(Vec::new())],
    };
    let queue = Mutex::new(Queue { tasks: first, ..Queue::default() });
    let wake = Condvar::new();
    let mut entries = vec![Entry { path: Vec::new(), stat: Stat::of(&root_meta) }];
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(|| worker(root, filter, &queue, &wake))).collect();
        for w in workers {
            entries.extend(w.join().expect("walk threads do not panic"));
        }
    });
    if let Some(error) = queue.into_inner().unwrap_or_else(|e| e.into_inner()).error {
        return Err(error);
    }
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    entries.dedup_by(|a, b| a.path == b.path);
    Ok(entries)
}

fn worker(root: &Path, filter: &Filter, queue: &Mutex<Queue>, wake: &Condvar) -> Vec<Entry> {
    let mut found = Vec::new();
    let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if q.error.is_none() {
            if let Err(e) = stagefs_open::cancel::check() {
                q.error = Some(PackError::Interrupted(e));
            }
        }
        let task = match q.tasks.pop() {
            Some(task) if q.error.is_none() => task,
            _ if q.busy == 0 || q.error.is_some() => {
                q.tasks.clear();
                wake.notify_all();
                if q.busy == 0 {
                    return found;
                }
                q = wake.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            _ => {
                let (guard, _) =
                    wake.wait_timeout(q, std::time::Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner());
                q = guard;
                continue;
            }
        };
        q.busy += 1;
        drop(q);
        let mut more = Vec::new();
        let result = run(root, filter, task, &mut found, &mut more);
        q = queue.lock().unwrap_or_else(|e| e.into_inner());
        q.busy -= 1;
        match result {
            Ok(()) => q.tasks.extend(more),
            Err(e) => {
                q.error.get_or_insert(e);
            }
        }
        wake.notify_all();
    }
}

fn run(
    root: &Path,
    filter: &Filter,
    task: Task,
    found: &mut Vec<Entry>,
    more: &mut Vec<Task>,
) -> Result<(), PackError> {
    match task {
        Task::List(dir) => {
            let path = full_path(root, &dir);
            let source = |source| PackError::Source { path: path.clone(), source };
            let mut names = Vec::new();
            for entry in std::fs::read_dir(&path).map_err(source)? {
                let name = entry.map_err(source)?.file_name();
                let mut rel = dir.clone();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(name.as_bytes());
                if !filter.excluded(&rel) {
                    names.push(rel);
                }
            }
            more.extend(names.chunks(STAT_BATCH).map(|c| Task::Stat(c.to_vec())));
        }
        Task::Stat(paths) => {
            for rel in paths {
                let path = full_path(root, &rel);
                let meta = std::fs::symlink_metadata(&path).map_err(|source| PackError::Source { path, source })?;
                if meta.is_dir() {
                    more.push(Task::List(rel.clone()));
                }
                found.push(Entry { path: rel, stat: Stat::of(&meta) });
            }
        }
    }
    Ok(())
}

/// The most bytes a `--files-from` list may have (paths, not data).
const MAX_LIST: u64 = 1 << 30;

/// Reads `--files-from`: one path per line, relative to DIR (a leading `./` and trailing
/// `/` are dropped; empty lines skipped). An absolute path or `..` is refused.
pub fn read_list(list: &Path) -> Result<Vec<Vec<u8>>, PackError> {
    let cannot = |e: String| PackError::Usage(format!("--files-from {}: cannot read it: {e}", list.shown()));
    let file = stagefs_open::places::open_outside(list, stagefs_open::places::Trust::Named, None)
        .map_err(|e| cannot(e.to_string()))?;
    let bytes = stagefs_open::places::read_all(file.file(), MAX_LIST).map_err(|e| cannot(e.to_string()))?;
    let mut paths = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| {
            PackError::Usage(format!("--files-from {} line {}: {why}: {}", list.shown(), n + 1, escape(line)))
        };
        if line.starts_with(b"/") {
            return Err(bad("an absolute path; list paths relative to DIR"));
        }
        let parts = stagefs_archive::tar::normalise(line).ok_or_else(|| bad("a path with '..'"))?;
        if parts.is_empty() {
            continue;
        }
        paths.push(parts.join(&b'/'));
    }
    Ok(paths)
}
