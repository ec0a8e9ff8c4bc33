//! The background copy of a mount that serves while it stages: chunks of the archive into its copy, in file order, jumping ahead to what readers ask for; stops at the first change of the archive.
//!
//! The copy and its bitmap live in the archive's [`Source`](stagefs_archive::Source)
//! (`stagefs_archive::fill`), which serves each read from the copy or from the archive in
//! place; this module only decides which chunk goes next and reports. Several chunks are
//! in flight (parallel filesystems serve one stream slowly). A reader that finds a chunk
//! missing leaves its number behind; the next free stream copies that chunk and goes on
//! after it, so the copy follows a reader through the file, then fills what it skipped.

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::StageError;
use super::progress::{Phase, Progress};
use crate::report::human;
use stagefs_archive::fill::Fill;
use stagefs_archive::{Backing, StageChunkError};

/// Bytes a chunk holds: one bit of the bitmap (128 KiB of bits for 4 TiB), one read.
pub(crate) const CHUNK: u64 = 4 << 20;
/// Chunks in flight at once.
const STREAMS: usize = 4;

/// A copy to fill in the background (see the module doc); made by `stage::load`.
pub struct Copier {
    path: PathBuf,
    backing: Backing,
    /// The local-disk directory holding the copy (`None`: a memfd).
    disk_dir: Option<PathBuf>,
}

/// How a copy ended without failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Every chunk is in: every read is served from the copy.
    Complete,
    /// Asked to stop (the mount went away) before that.
    Stopped,
}

impl Copier {
    pub(crate) fn new(path: &Path, backing: Backing, disk_dir: Option<PathBuf>) -> Copier {
        Copier { path: path.to_owned(), backing, disk_dir }
    }

    /// The archive's size: the bytes the copy will hold.
    pub fn len(&self) -> u64 {
        self.fill().map_or(0, Fill::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The archive's bytes, served from the copy as it fills.
    pub fn backing(&self) -> Backing {
        self.backing.clone()
    }

    /// Whether the copy is a memfd (RAM) rather than a file on the local disk.
    pub fn in_memory(&self) -> bool {
        self.disk_dir.is_none()
    }

    fn fill(&self) -> Option<&Fill> {
        self.backing.fill()
    }

    /// Fills the copy until it is complete, `stop` says stop, or a chunk fails (the archive
    /// changed, a read or write failed): then nothing more enters the copy, and `progress`
    /// says why. `progress` follows the bytes copied.
    pub fn run(&self, progress: &Progress, stop: &(dyn Fn() -> bool + Sync)) -> Result<Finished, StageError> {
        let Some(fill) = self.fill() else { return Ok(Finished::Complete) };
        let started = Instant::now();
        progress.start(Phase::Copying, fill.len());
        let schedule = Mutex::new(Schedule::new(fill.chunks()));
        let failed = AtomicBool::new(false);
        // Tests slow the copy down to read and change the archive while it runs.
        let delay = crate::test_hooks::var("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS")
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis);
        let streams = STREAMS.min(fill.chunks().max(1) as usize);
        let result = std::thread::scope(|s| {
            let workers: Vec<_> = (0..streams)
                .map(|_| {
                    s.spawn(|| -> Result<Finished, StageChunkError> {
                        let mut buf = Vec::new();
                        loop {
                            if stop() || failed.load(Ordering::Relaxed) {
                                return Ok(Finished::Stopped);
                            }
                            let Some(chunk) = schedule.lock().unwrap_or_else(|p| p.into_inner()).pick(fill) else {
                                return Ok(Finished::Complete);
                            };
                            if let Some(delay) = delay {
                                std::thread::sleep(delay);
                            }
                            if let Err(e) = self.backing.stage_chunk(chunk, &mut buf) {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                            progress.set_done(fill.staged_bytes());
                        }
                    })
                })
                .collect();
            let mut outcome = Ok(Finished::Complete);
            for worker in workers {
                match worker.join().expect("a staging thread panicked") {
                    Err(e) if outcome.is_ok() => outcome = Err(e),
                    Ok(Finished::Stopped) if outcome.is_ok() => outcome = Ok(Finished::Stopped),
                    _ => {}
                }
            }
            outcome
        });
        let staged = fill.staged_bytes();
        match result {
            Ok(_) if fill.is_complete() => {
                self.report_done(fill.len(), started);
                Ok(Finished::Complete)
            }
            Ok(_) => {
                tracing::info!(
                    "staging {} stopped at {} of {}: the mount went away",
                    self.path.shown(),
                    human(staged),
                    human(fill.len())
                );
                Ok(Finished::Stopped)
            }
            Err(e) => {
                let error = StageError::Staging {
                    path: self.path.clone(),
                    staged,
                    total: fill.len(),
                    why: match e {
                        // The words of an in-place read that finds the file changed.
                        StageChunkError::Changed(what) => format!(", rather than mix two versions in the copy: {what}"),
                        other => format!(
                            ": {other}; what was staged is served from the copy, the rest from the archive in place; \
                             remount to stage it again"
                        ),
                    },
                };
                progress.fail(error.to_string());
                tracing::error!("{error}");
                Err(error)
            }
        }
    }

    fn report_done(&self, len: u64, started: Instant) {
        match &self.disk_dir {
            None => crate::report::summary("staged", &self.path, len, started),
            Some(dir) => {
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                crate::report::report_done(&format!(
                    "staged {} to the local disk ({}): {} in {secs:.2} s ({:.0} MB/s)",
                    self.path.shown(),
                    dir.shown(),
                    human(len),
                    len as f64 / 1e6 / secs
                ));
            }
        }
    }
}

/// Which chunk goes next: the one a reader wants, else the next in file order from where
/// the last pick was, else (after a jump) the first left behind.
struct Schedule {
    claimed: Vec<bool>,
    /// Where file order goes on.
    next: u64,
    /// No chunk before this is unclaimed.
    low: u64,
}

impl Schedule {
    fn new(chunks: u64) -> Schedule {
        Schedule { claimed: vec![false; chunks as usize], next: 0, low: 0 }
    }

    fn pick(&mut self, fill: &Fill) -> Option<u64> {
        while let Some(wanted) = fill.take_wanted() {
            if self.claim(wanted) {
                self.next = wanted + 1;
                return Some(wanted);
            }
        }
        let chunks = self.claimed.len() as u64;
        while self.low < chunks && self.claimed[self.low as usize] {
            self.low += 1;
        }
        let found = (self.next..chunks).chain(self.low..self.next.min(chunks)).find(|&i| !self.claimed[i as usize])?;
        self.claim(found);
        self.next = found + 1;
        Some(found)
    }

    fn claim(&mut self, chunk: u64) -> bool {
        match self.claimed.get_mut(chunk as usize) {
            Some(claimed) if !*claimed => {
                *claimed = true;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stagefs_archive::fill::StagedCopy;

    /// The copy goes in file order, jumps to a chunk a reader found missing and goes on
    /// after it, then fills what it skipped; no chunk is handed out twice.
    #[test]
    fn the_copy_follows_a_reader_then_fills_the_gaps() {
        let dir = crate::test_support::TempDir::new("copier");
        let path = dir.join("a.tar");
        std::fs::write(&path, vec![5u8; 10 * 4096]).unwrap();
        let copy = crate::stage::ram::memfd(&path, 10 * 4096).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let backing = stagefs_archive::Source::filling(&file, StagedCopy::Memory(copy), 4096).unwrap();
        let fill = backing.fill().unwrap();
        let mut schedule = Schedule::new(fill.chunks());
        assert_eq!((schedule.pick(fill), schedule.pick(fill)), (Some(0), Some(1)));
        // A reader of chunk 6 finds it missing.
        assert!(backing.read_at(6 * 4096 + 10, 100).is_ok());
        assert_eq!(schedule.pick(fill), Some(6), "jumps to what a reader wants");
        assert_eq!(schedule.pick(fill), Some(7), "and goes on after it");
        let rest: Vec<_> = std::iter::from_fn(|| schedule.pick(fill)).collect();
        assert_eq!(rest, [8, 9, 2, 3, 4, 5], "then fills the gap it left");
        assert!(backing.read_at(0, 10).is_ok());
        assert_eq!(schedule.pick(fill), None, "a chunk wanted but claimed already is not handed out again");
    }
}
