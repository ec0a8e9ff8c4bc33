//! One file identity — device, inode, size, mtime and ctime — that every "is this still the same file?" check compares.
//!
//! A file served in place, a saved index's key, a growing set's shard and the `--watch`
//! poll all ask whether a file is the version they saw. Size and mtime alone are not
//! enough: an in-place rewrite of the same length that restores the mtime (`dd
//! conv=notrunc` then `touch -r`, which is what `rsync --inplace -t` does) keeps both, but
//! no unprivileged writer can set the ctime back. So every check compares all of it, with
//! one exception: a file whose last name was removed (`rm`, or a replacement renamed over
//! it, as `rsync` and `mv new.tar data.tar` do) moves its ctime without a byte changing,
//! and nobody can open it by name to write it any more: with size and mtime unchanged, it
//! is the same version. (A rename of the file itself, a `chmod` or a new hard link move the
//! ctime too, and count as a change: stat cannot tell them from a rewrite.)

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;

/// One version of one file, as `fstat` describes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileId {
    /// The device it is on.
    pub dev: u64,
    /// Its inode number.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Its status change time, seconds and nanoseconds.
    pub ctime: (i64, i64),
    /// Names it has (0: deleted), only to explain a ctime that moved (see the module doc).
    pub nlink: u64,
}

impl FileId {
    /// The identity that `meta` (its `fstat`) describes.
    pub fn of(meta: &Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            nlink: meta.nlink(),
        }
    }

    /// The identity of an open file now.
    pub(crate) fn of_file(file: &File) -> std::io::Result<FileId> {
        file.metadata().map(|m| FileId::of(&m))
    }

    /// Whether `now` is the same version of the same file as `self`.
    pub fn same_version(&self, now: &FileId) -> bool {
        self.change_to(now).is_none()
    }

    /// What changed from `self` to `now`, in words; `None` when it is the same version.
    pub fn change_to(&self, now: &FileId) -> Option<String> {
        let same_bytes = (self.dev, self.ino, self.size, self.mtime) == (now.dev, now.ino, now.size, now.mtime);
        if same_bytes && (self.ctime == now.ctime || now.nlink == 0) {
            return None;
        }
        Some(if (self.dev, self.ino) != (now.dev, now.ino) {
            "it is another file now".to_string()
        } else if self.size != now.size {
            format!("its size went from {} to {} bytes", self.size, now.size)
        } else if self.mtime != now.mtime {
            format!(
                "same size, but its contents were modified: mtime {}.{:09} at first, {}.{:09} now",
                self.mtime.0, self.mtime.1, now.mtime.0, now.mtime.1
            )
        } else {
            format!(
                "same size and mtime, but its ctime moved ({}.{:09} at first, {}.{:09} now): rewritten in place with \
                 its mtime restored, or renamed, chmod'ed or linked",
                self.ctime.0, self.ctime.1, now.ctime.0, now.ctime.1
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_that_restores_size_and_mtime_is_still_a_change() {
        let tmp = crate::test_kit::TempDir::new("file-id");
        let path = tmp.join("f");
        std::fs::write(&path, b"hello world").unwrap();
        let file = File::open(&path).unwrap();
        let before = FileId::of_file(&file).unwrap();
        assert_eq!(before.change_to(&FileId::of_file(&file).unwrap()), None);
        let mtime = file.metadata().unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::os::unix::fs::FileExt::write_all_at(&std::fs::File::options().write(true).open(&path).unwrap(), b"J", 0)
            .unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        let after = FileId::of_file(&file).unwrap();
        assert_eq!((after.size, after.mtime), (before.size, before.mtime), "size and mtime restored");
        let change = before.change_to(&after).expect("the ctime tells");
        assert!(change.contains("ctime"), "{change}");
        // Deleted: the ctime moved, not a byte.
        std::fs::remove_file(&path).unwrap();
        let deleted = FileId::of_file(&file).unwrap();
        assert_ne!(deleted.ctime, after.ctime);
        assert!(after.same_version(&deleted), "a deleted file keeps its bytes");
    }
}
