//! Where a compressed tar decoded whole goes: private RAM within the budget, the node's local disk (`--stage disk`, or `--stage auto` once RAM is short), and the refusal that says why it must be decoded whole and what to do when neither has room.
//!
//! A single zstd frame, a single xz block and lz4 have no point to restart from, so no
//! file can be served before the whole stream is decoded. On the local disk the decoded
//! tar is a nameless file in the checked staging directory (as `disk` stages), so
//! nothing is left after any exit. When the decoded size is known up front (a zstd
//! frame's header, an xz index) the choice is made before a byte is decoded; otherwise
//! decoding starts in RAM and moves to the disk when the budget is reached.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::budget::RamBudget;
use super::disk::{self, DiskStaged};
use super::error::{NoRoomWhole, StageError, Why};
use super::modes::Staging;
use super::ram::{map_staged, memfd};
use crate::places::CheckedDir;
use crate::report::human;
use stagefs_archive::Backing;

/// Where the decoded tar may go.
pub enum Destination {
    /// Private RAM only.
    Ram,
    /// The local disk (`--stage disk`).
    Disk(CheckedDir),
    /// RAM, or a staging directory in this base directory once RAM is short (`--stage
    /// auto`); or why there is none.
    RamThenDisk(Result<PathBuf, String>),
}

/// The decoded tar as staged.
pub struct Staged {
    pub backing: Backing,
    pub staging: Staging,
    /// Bytes in private RAM.
    pub staged_bytes: u64,
    pub disk: Option<DiskStaged>,
}

/// Decoded bytes being written to RAM or disk.
pub struct Target<'a> {
    path: &'a Path,
    budget: &'a RamBudget,
    why: Why,
    /// The decoded size, when known up front.
    needed: Option<u64>,
    ram: Option<File>,
    disk: Option<(File, CheckedDir)>,
    /// The base directory RAM overflows to, or why it cannot.
    spill: Option<Result<PathBuf, String>>,
    written: u64,
}

impl<'a> Target<'a> {
    /// A target in `place` for a decoded size of `needed` (if known): refused now if it
    /// is known not to fit anywhere.
    pub fn new(
        path: &'a Path,
        budget: &'a RamBudget,
        place: Destination,
        needed: Option<u64>,
        why: Why,
    ) -> Result<Target<'a>, StageError> {
        let mut target = Target { path, budget, why, needed, ram: None, disk: None, spill: None, written: 0 };
        match place {
            Destination::Disk(dir) => target.onto_disk(dir)?,
            Destination::Ram => target.spill = Some(Err(String::new())),
            Destination::RamThenDisk(dir) => {
                target.spill = Some(dir);
                if let Some(needed) = needed.filter(|&n| n > budget.bytes) {
                    target.spill_now(needed)?;
                }
            }
        }
        if target.disk.is_none() {
            if needed.is_some_and(|n| n > budget.bytes) {
                return Err(target.no_room(needed.unwrap_or(0)));
            }
            // A memfd's size costs nothing until written: size it to the budget, trim at the end.
            target.ram = Some(memfd(path, budget.bytes)?);
        }
        Ok(target)
    }

    /// Decodes onto the disk from now on, in a nameless file of `dir` (room checked for
    /// the whole decoded size if known, else for what is decoded so far).
    fn onto_disk(&mut self, dir: CheckedDir) -> Result<(), StageError> {
        match disk::check_room(self.path, &dir, self.needed.unwrap_or(self.written)) {
            Ok(_) => {}
            Err(StageError::NoDiskRoom { dir: at, free, margin, .. }) => {
                let why = format!(
                    "the local disk has no room for it: {} has {} free less a margin of {}",
                    at.shown(),
                    human(free),
                    human(margin)
                );
                self.spill = Some(Err(why));
                return Err(self.no_room(self.needed.unwrap_or(self.written)));
            }
            Err(e) => return Err(e),
        };
        let file = dir.nameless_file().map_err(|source| StageError::Io {
            path: dir.path().to_owned(),
            what: "cannot create the staging file (nameless, O_TMPFILE)".into(),
            source,
        })?;
        self.disk = Some((file, dir));
        Ok(())
    }

    /// RAM is short (`so_far` bytes decoded): move what is decoded to the disk, if
    /// there is one with room.
    fn spill_now(&mut self, so_far: u64) -> Result<(), StageError> {
        let needed = self.needed.unwrap_or(so_far);
        let dir = match self.spill.take() {
            Some(Ok(base)) => match disk::staging_dir(&base) {
                Ok(dir) => dir,
                Err(e) => {
                    self.spill = Some(Err(format!("the local disk cannot be used: {e}")));
                    return Err(self.no_room(needed));
                }
            },
            other => {
                self.spill = other;
                return Err(self.no_room(needed));
            }
        };
        tracing::info!(
            "{}: the decoded tar does not fit the RAM budget ({}, {}): decoding it onto the local disk ({})",
            self.path.shown(),
            human(self.budget.bytes),
            self.budget.reason,
            dir.path().shown()
        );
        self.onto_disk(dir)?;
        if let Some(ram) = self.ram.take() {
            let (file, dir) = self.disk.as_ref().expect("just made");
            let mut buf = vec![0u8; 8 << 20];
            let mut at = 0;
            while at < self.written {
                let n = buf.len().min((self.written - at) as usize);
                ram.read_exact_at(&mut buf[..n], at).map_err(|source| StageError::Io {
                    path: self.path.to_owned(),
                    what: "cannot read the staging memory".into(),
                    source,
                })?;
                file.write_all_at(&buf[..n], at).map_err(|e| write_error(self.path, dir, self.written, e))?;
                at += n as u64;
            }
        }
        Ok(())
    }

    /// Appends decoded bytes.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StageError> {
        let end = self.written + bytes.len() as u64;
        if self.disk.is_none() && end > self.budget.bytes {
            self.spill_now(end)?;
        }
        match (&self.disk, &self.ram) {
            (Some((file, dir)), _) => {
                file.write_all_at(bytes, self.written).map_err(|e| write_error(self.path, dir, end, e))?
            }
            (None, Some(ram)) => ram.write_all_at(bytes, self.written).map_err(|source| StageError::Io {
                path: self.path.to_owned(),
                what: format!("out of staging memory at byte {}", self.written),
                source,
            })?,
            (None, None) => unreachable!("a target has RAM or a disk"),
        }
        self.written = end;
        Ok(())
    }

    /// The decoded tar, mapped.
    pub fn finish(self) -> Result<Staged, StageError> {
        let path = self.path;
        if let Some((mut file, dir)) = self.disk {
            file.flush().ok();
            let backing = stagefs_archive::map_file(&file).map_err(|source| StageError::Io {
                path: dir.path().to_owned(),
                what: "cannot map the decoded copy".into(),
                source,
            })?;
            let disk = DiskStaged { dir: dir.path().to_owned(), bytes: self.written };
            return Ok(Staged { backing, staging: Staging::Disk, staged_bytes: 0, disk: Some(disk) });
        }
        let ram = self.ram.expect("a target has RAM or a disk");
        ram.set_len(self.written).map_err(|source| StageError::Io {
            path: path.to_owned(),
            what: "cannot trim the staging memory".into(),
            source,
        })?;
        let backing = map_staged(path, &ram)?;
        Ok(Staged { backing, staging: Staging::Copy, staged_bytes: self.written, disk: None })
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// The refusal: no RAM and no disk for `needed` decoded bytes.
    fn no_room(&self, needed: u64) -> StageError {
        let disk = match &self.spill {
            Some(Err(why)) if !why.is_empty() => Some(why.clone()),
            _ => None,
        };
        StageError::NoRoomWhole(Box::new(NoRoomWhole {
            path: self.path.to_owned(),
            why: self.why,
            needed,
            known: self.needed.is_some(),
            budget: self.budget.bytes,
            budget_reason: self.budget.reason.clone(),
            disk,
        }))
    }
}

/// A failed write to the staged decoded copy: the disk filled (someone else took the
/// room), or another error.
fn write_error(path: &Path, dir: &CheckedDir, needed: u64, e: std::io::Error) -> StageError {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        let free_now = dir.free_space().map_or(0, |(f, _)| f);
        return StageError::DiskFilled {
            path: path.to_owned(),
            dir: dir.path().to_owned(),
            needed,
            free_at_check: free_now,
            free_now,
        };
    }
    StageError::Io { path: dir.path().to_owned(), what: "cannot write the decoded copy".into(), source: e }
}
