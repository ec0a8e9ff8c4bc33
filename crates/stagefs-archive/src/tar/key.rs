//! The saved index's key: which version of an archive's bytes an index belongs to (the file's identity and a content fingerprint).

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::hash::Hasher;
use crate::identity::FileId;

/// Identifies one version of an archive's bytes: its [`FileId`] but the device (a saved
/// index serves every node of a job, and the same file on a network filesystem has
/// another device number on each node), and samples of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The file's size.
    pub size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
    inode: u64,
    /// A hash of samples of its bytes.
    pub fingerprint: u64,
}

impl Key {
    /// The key of the open archive `file`: its identity, and its content's fingerprint.
    pub fn of(file: &File) -> std::io::Result<Key> {
        let id = FileId::of_file(file)?;
        Ok(Key {
            size: id.size,
            mtime: id.mtime.0,
            mtime_nsec: id.mtime.1,
            ctime: id.ctime.0,
            ctime_nsec: id.ctime.1,
            inode: id.ino,
            fingerprint: fingerprint(id.size, &mut |offset, buf| file.read_exact_at(buf, offset))?,
        })
    }

    /// The key of an object in a store (see `remote`): its size, Last-Modified, a hash of
    /// its ETag in the inode's place, and the same samples as a file's.
    pub fn of_object(size: u64, modified: i64, etag_hash: u64, fingerprint: u64) -> Key {
        Key { size, mtime: modified, mtime_nsec: 0, ctime: 0, ctime_nsec: 0, inode: etag_hash, fingerprint }
    }

    /// The key's fields in the order a saved index stores them.
    pub(crate) fn fields(&self) -> [u64; 7] {
        [
            self.size,
            self.mtime as u64,
            self.mtime_nsec as u64,
            self.ctime as u64,
            self.ctime_nsec as u64,
            self.inode,
            self.fingerprint,
        ]
    }

    pub(crate) fn from_fields(f: [u64; 7]) -> Key {
        Key {
            size: f[0],
            mtime: f[1] as i64,
            mtime_nsec: f[2] as i64,
            ctime: f[3] as i64,
            ctime_nsec: f[4] as i64,
            inode: f[5],
            fingerprint: f[6],
        }
    }
}

/// The content fingerprint of `size` bytes read by `read` (offset, buffer to fill): 64 KiB
/// at each end and 16 samples of 4 KiB in between.
pub fn fingerprint(size: u64, read: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>) -> std::io::Result<u64> {
    let mut samples = Hasher::default();
    let mut buf = vec![0u8; 64 << 10];
    let mut sample = |offset: u64, len: usize| -> std::io::Result<()> {
        let len = len.min(size.saturating_sub(offset) as usize);
        read(offset, &mut buf[..len])?;
        samples.write(&buf[..len]);
        Ok(())
    };
    sample(0, 64 << 10)?;
    for i in 1..=16 {
        sample(size / 17 * i, 4 << 10)?;
    }
    sample(size.saturating_sub(64 << 10), 64 << 10)?;
    Ok(samples.finish())
}
