//! Local-disk staging (`--stage disk`): one copy of the archive on the node's own disk, in a nameless file, served in place.
//!
//! For archives on a parallel filesystem that do not fit in RAM: read once from the
//! parallel filesystem (several large reads in flight, its pages dropped behind), written
//! to an `O_TMPFILE` in `<stage dir>/stagefs-<uid>` (checked 0700), then served like an
//! archive in place, with the page cache as its RAM cache. The file has no name, so
//! nothing is left on the disk after any exit, SIGKILL included.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::error::StageError;
use crate::places::CheckedDir;

/// Where an archive was staged on disk, for `stagefs status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskStaged {
    /// The checked directory holding the (nameless) copy.
    pub dir: PathBuf,
    pub bytes: u64,
}

/// The base directory to stage in: `--stage-dir`, else `$SLURM_TMPDIR`, else `$TMPDIR`.
pub fn base_dir(chosen: Option<&Path>) -> Option<PathBuf> {
    let env = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    chosen.map(Path::to_owned).or_else(|| env("SLURM_TMPDIR")).or_else(|| env("TMPDIR"))
}

/// `<base>/stagefs-<uid>`, created 0700 and checked (new or found), with no parent
/// another user could rename; held open, so the copy lands in the directory checked.
pub fn staging_dir(base: &Path) -> Result<CheckedDir, StageError> {
    const ADVICE: &str = "remove it if you can, or give another --stage-dir";
    let dir = staging_dir_path(base);
    crate::places::check_ancestors(&dir)?;
    crate::places::own_dir(&dir, ADVICE)?;
    Ok(CheckedDir::open(&dir, ADVICE)?)
}

/// Where [`staging_dir`] is, without making it.
pub fn staging_dir_path(base: &Path) -> PathBuf {
    std::path::absolute(base).unwrap_or_else(|_| base.to_owned()).join(format!("stagefs-{}", crate::places::my_uid()))
}

/// Removes the staging directory `<base>/stagefs-<uid>` once it is empty: it goes with the
/// last mount that used it. Nameless copies have no name in it, so only a named entry (a
/// broadcast inbox still in use) keeps it; a mount racing this makes it again.
pub fn remove_if_empty(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
}

/// Room left for others on a shared local disk: 5 % of it, at most 1 GiB.
pub fn margin(total: u64) -> u64 {
    (total / 20).min(1 << 30)
}

/// Whether `needed` bytes fit in `dir`'s free space less the margin: the free bytes seen,
/// or `Err` saying why not.
pub fn check_room(archive: &Path, dir: &CheckedDir, needed: u64) -> Result<u64, StageError> {
    let (free, total) = dir.free_space().map_err(|source| StageError::Io {
        path: dir.path().to_owned(),
        what: "cannot measure the free space of the staging directory".into(),
        source,
    })?;
    let margin = margin(total);
    if needed > free.saturating_sub(margin) {
        return Err(StageError::NoDiskRoom {
            path: archive.to_owned(),
            dir: dir.path().to_owned(),
            needed,
            free,
            margin,
        });
    }
    Ok(free)
}

/// A nameless file in `dir` with `len` bytes reserved, for the copy. `free_at_check` is
/// what [`check_room`] saw: a disk full now was filled by someone else since.
pub fn reserve(path: &Path, len: u64, dir: &CheckedDir, free_at_check: u64) -> Result<File, StageError> {
    let target = dir.nameless_file().map_err(|source| StageError::Io {
        path: dir.path().to_owned(),
        what: "cannot create the staging file (nameless, O_TMPFILE)".into(),
        source,
    })?;
    let no_room = |e: std::io::Error| -> StageError {
        if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
            let free_now = dir.free_space().map_or(0, |(f, _)| f);
            StageError::DiskFilled {
                path: path.to_owned(),
                dir: dir.path().to_owned(),
                needed: len,
                free_at_check,
                free_now,
            }
        } else {
            StageError::Io { path: dir.path().to_owned(), what: "cannot write the staged copy".into(), source: e }
        }
    };
    // Reserve the blocks first: a disk that fills meanwhile fails now, before the mount
    // serves, not halfway through the copy.
    // SAFETY: posix_fallocate on a descriptor we own.
    match unsafe { libc::posix_fallocate(target.as_raw_fd(), 0, len as libc::off_t) } {
        0 => {}
        libc::EOPNOTSUPP | libc::EINVAL => target.set_len(len).map_err(no_room)?,
        errno => return Err(no_room(std::io::Error::from_raw_os_error(errno))),
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;
    use std::os::unix::fs::FileExt;

    #[test]
    fn copies_leave_no_name_behind() {
        let tmp = TempDir::new("disk");
        let archive = tmp.join("a.tar");
        let bytes: Vec<u8> = (0..(20u32 << 20) + 77).map(|i| (i % 251) as u8).collect();
        std::fs::write(&archive, &bytes).unwrap();
        let dir = staging_dir(&tmp.join("base")).unwrap();
        let copy = reserve(&archive, bytes.len() as u64, &dir, u64::MAX).unwrap();
        let source = std::sync::Arc::new(File::open(&archive).unwrap());
        let backing = stagefs_archive::Source::filling(
            source,
            stagefs_archive::fill::StagedCopy::Disk(copy.try_clone().unwrap()),
            super::super::copier::CHUNK,
        )
        .unwrap();
        let copier = crate::stage::copier::Copier::new(&archive, backing, Some(dir.path().to_owned()));
        let progress = crate::stage::progress::Progress::new(crate::stage::progress::Phase::Copying, 0);
        assert_eq!(copier.run(&progress, &|| false).unwrap(), crate::stage::copier::Finished::Complete);
        assert_eq!(progress.snapshot().done, bytes.len() as u64);
        let mut back = vec![0u8; bytes.len()];
        copy.read_exact_at(&mut back, 0).unwrap();
        assert!(back == bytes, "the copy holds the archive's bytes");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a nameless file");
    }

    #[test]
    fn room_is_checked_with_a_margin() {
        assert_eq!(margin(10 << 30), 512 << 20);
        assert_eq!(margin(1 << 40), 1 << 30);
        let tmp = TempDir::new("disk");
        let dir = staging_dir(tmp.path()).unwrap();
        let err = check_room(Path::new("/a.tar"), &dir, u64::MAX / 2).unwrap_err().to_string();
        assert!(err.contains("not enough room") && err.contains(&dir.path().display().to_string()), "{err}");
        check_room(Path::new("/a.tar"), &dir, 1).unwrap();
    }

    /// Two stagers racing for one disk: the room was there when checked, then another
    /// process took it. The loser says what the other wrote meanwhile (a 4 MiB tmpfs).
    #[test]
    fn a_disk_filled_by_another_stager_says_what_was_taken() {
        let tmp = TempDir::new("disk-race");
        let disk = tmp.join("disk");
        std::fs::create_dir(&disk).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"])
            .arg(&disk)
            .status()
            .expect("mount(8)");
        assert!(mounted.success(), "these tests run as root: a tmpfs stands for the local disk");
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg("-l").arg(self.0).status();
            }
        }
        let _unmount = Unmount(&disk);
        let archive = tmp.join("a.tar");
        std::fs::write(&archive, vec![7u8; 2 << 20]).unwrap();
        let dir = staging_dir(&disk).unwrap();
        let free = check_room(&archive, &dir, 2 << 20).unwrap();
        // The other stager: 3 MiB, after our check.
        std::fs::write(disk.join("other"), vec![1u8; 3 << 20]).unwrap();
        let err = reserve(&archive, 2 << 20, &dir, free).unwrap_err();
        assert!(matches!(err, StageError::DiskFilled { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("filled up while staging") && text.contains("wrote 3.0 MiB there meanwhile"), "{text}");
    }
}
