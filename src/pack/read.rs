//! Reader threads: open and read files (and read symlinks) in archive order, at most a byte budget ahead of the writer.
//!
//! Readers claim members strictly in order and reserve their bytes before reading, so a
//! member waits only for budget held by members before it, which the writer is about to
//! release: the window cannot deadlock. Files above [`STREAM_ABOVE`] are not read here:
//! the writer streams them in chunks, so no file is ever held whole beyond that size.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Condvar, Mutex};

use super::errors::PackError;
use super::member::Member;
use super::walk::{full_path, Stat};

/// Files larger than this are streamed by the writer instead of read ahead whole.
pub const STREAM_ABOVE: u64 = 16 << 20;
/// Most members read ahead at once, whatever their size (empty files cost no bytes).
const MAX_AHEAD: usize = 1 << 16;

/// A member's content, as a reader left it for the writer.
#[derive(Debug)]
pub enum Content {
    /// Nothing to read: directories, devices, hard links, empty files.
    None,
    /// A whole small file, with the stat that matches these bytes.
    Bytes(Vec<u8>, Stat),
    /// A large (or sparse) file the writer streams itself.
    Stream,
    /// A symlink's target.
    Link(Vec<u8>),
}

#[derive(Default)]
struct State {
    next: usize,
    in_use: u64,
    ahead: usize,
    done: BTreeMap<usize, Result<Content, PackError>>,
    stop: bool,
}

/// The members read ahead of the writer, bounded by bytes and by count.
pub struct Window<'a> {
    root: &'a Path,
    members: &'a [Member],
    budget: u64,
    state: Mutex<State>,
    claimable: Condvar,
    finished: Condvar,
}

impl<'a> Window<'a> {
    pub fn new(root: &'a Path, members: &'a [Member], budget: u64) -> Window<'a> {
        Window { root, members, budget, state: Mutex::default(), claimable: Condvar::new(), finished: Condvar::new() }
    }

    /// Bytes member `i` holds while read ahead.
    fn cost(&self, i: usize) -> u64 {
        let m = &self.members[i];
        match m.needs_read() {
            true if m.stat.size <= STREAM_ABOVE && !m.stat.maybe_sparse() => m.stat.size,
            _ => 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One reader thread: claims the next member in order, reads it, hands it over.
    pub fn reader(&self) {
        loop {
            let i = {
                let mut s = self.lock();
                loop {
                    if s.stop || s.next >= self.members.len() {
                        return;
                    }
                    let cost = self.cost(s.next);
                    let fits = s.in_use == 0 || (s.in_use + cost <= self.budget && s.ahead < MAX_AHEAD);
                    if fits {
                        break;
                    }
                    s = self.claimable.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                let i = s.next;
                s.next += 1;
                s.in_use += self.cost(i);
                s.ahead += 1;
                i
            };
            let result = stagefs_open::cancel::check().map_err(PackError::Interrupted).and_then(|()| self.load(i));
            let mut s = self.lock();
            s.done.insert(i, result);
            self.finished.notify_all();
        }
    }

    /// The writer takes member `i` once read (in order, each once).
    pub fn take(&self, i: usize) -> Result<Content, PackError> {
        let mut s = self.lock();
        loop {
            if let Some(result) = s.done.remove(&i) {
                return result;
            }
            s = self.finished.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The writer is done with member `i`: its bytes no longer count.
    pub fn release(&self, i: usize) {
        let mut s = self.lock();
        s.in_use -= self.cost(i);
        s.ahead -= 1;
        self.claimable.notify_all();
    }

    /// Stops the readers (after an error): they finish the member in hand and exit.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.claimable.notify_all();
    }

    fn load(&self, i: usize) -> Result<Content, PackError> {
        let m = &self.members[i];
        if !m.needs_read() {
            return Ok(Content::None);
        }
        let path = full_path(self.root, &m.path);
        match m.stat.file_type() {
            libc::S_IFLNK => std::fs::read_link(&path)
                .map(|t| Content::Link(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()).to_vec()))
                .map_err(|source| PackError::Source { path, source }),
            _ if m.stat.size > STREAM_ABOVE || m.stat.maybe_sparse() => Ok(Content::Stream),
            _ => read_whole(&path, m.stat).map(|(bytes, stat)| Content::Bytes(bytes, stat)),
        }
    }
}

/// Opens a regular file for reading: never through a symlink swapped in since the walk,
/// never blocking on a FIFO swapped in, and only if it is the file the walk saw (same
/// device and inode), not one renamed (or a directory swapped) into its place.
pub fn open(path: &Path, walked: &Stat) -> Result<std::fs::File, PackError> {
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| PackError::Source { path: path.to_owned(), source })?;
    let meta = file.metadata().map_err(|source| PackError::Source { path: path.to_owned(), source })?;
    if !meta.is_file() {
        return Err(PackError::Changed { path: path.to_owned(), what: "it is no longer a regular file".into() });
    }
    if (meta.dev(), meta.ino()) != (walked.dev, walked.ino) {
        return Err(PackError::Replaced { path: path.to_owned() });
    }
    Ok(file)
}

/// What differs between the stat before and after reading, if anything: the one file
/// identity (a writer that restores the mtime still moves the ctime), then the bytes read.
pub fn change(before: &Stat, after: &std::fs::Metadata, read: u64) -> Option<String> {
    if let Some(change) = before.id().change_to(&stagefs_archive::FileId::of(after)) {
        Some(change)
    } else if read != before.size {
        Some(format!("{read} bytes could be read of the {} its size says", before.size))
    } else {
        None
    }
}

/// Reads a small file whole, checked unchanged; re-read once if it changed.
fn read_whole(path: &Path, walked: Stat) -> Result<(Vec<u8>, Stat), PackError> {
    let mut before = walked;
    let mut what = String::new();
    for attempt in 0..2 {
        let mut file = open(path, &walked)?;
        let io = |source| PackError::Source { path: path.to_owned(), source };
        if attempt > 0 {
            before = Stat::of(&file.metadata().map_err(io)?);
        }
        let mut bytes = Vec::with_capacity(before.size as usize);
        // One byte more than expected tells a file that grew.
        (&mut file).take(before.size + 1).read_to_end(&mut bytes).map_err(io)?;
        let after = file.metadata().map_err(io)?;
        match change(&before, &after, bytes.len() as u64) {
            None => return Ok((bytes, before)),
            Some(why) => what = why,
        }
    }
    Err(PackError::Changed { path: path.to_owned(), what })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rewrite of the same size that restores the mtime (`touch -r`, as `rsync --inplace
    /// -t` does) is a change: the ctime moved. Before, size and mtime alone let a pack
    /// finish with bytes that never stood on disk together.
    #[test]
    fn a_rewrite_that_restores_the_mtime_is_a_change() {
        let tmp = crate::test_support::TempDir::new("pack-rewrite");
        let path = tmp.join("f");
        std::fs::write(&path, b"first").unwrap();
        let before = Stat::of(&std::fs::symlink_metadata(&path).unwrap());
        assert_eq!(change(&before, &std::fs::metadata(&path).unwrap(), 5), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"other").unwrap();
        let mtime = std::time::UNIX_EPOCH + std::time::Duration::new(before.mtime as u64, before.mtime_nsec as u32);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!((after.len(), after.mtime(), after.mtime_nsec()), (5, before.mtime, before.mtime_nsec));
        let why = change(&before, &after, 5).expect("a rewrite with its mtime restored is a change");
        assert!(why.contains("ctime moved"), "{why}");
    }

    /// A file renamed into the place of the one the walk saw is refused, not packed.
    #[test]
    fn a_file_put_in_place_of_the_walked_one_is_refused() {
        let tmp = crate::test_support::TempDir::new("pack-replaced");
        let path = tmp.join("f");
        std::fs::write(&path, b"first").unwrap();
        let walked = Stat::of(&std::fs::symlink_metadata(&path).unwrap());
        assert!(open(&path, &walked).is_ok());
        std::fs::write(tmp.join("g"), b"other").unwrap();
        std::fs::rename(tmp.join("g"), &path).unwrap();
        let err = open(&path, &walked).unwrap_err().to_string();
        assert!(err.contains("was replaced by another file"), "{err}");
    }
}
