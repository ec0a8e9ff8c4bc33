//! Why a place stagefs would use is refused, with what to do about it.

use stagefs_archive::escape::Shown;
use std::path::PathBuf;

/// A place stagefs cannot use safely, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error(
        "{}: belongs to {owner}, not to you: another user may be trying to intercept stagefs's files; \
         {advice}",
        path.shown()
    )]
    NotOwned { path: PathBuf, owner: String, advice: String },
    #[error("{}: is a symbolic link (or not a directory) where stagefs expects its own directory; {advice}", path.shown())]
    NotADirectory { path: PathBuf, advice: String },
    #[error(
        "{}: is writable by other users (mode {mode:04o}), so they could replace stagefs's files in it; {advice}",
        path.shown()
    )]
    Writable { path: PathBuf, mode: u32, advice: String },
    #[error(
        "{}: is writable by other users (mode {mode:04o}) without the sticky bit, so they could rename {} and \
         put their own in its place; use a path whose parents only you (or root) can write (such as \
         /dev/shm/$USER/...), or ask the directory's owner for `chmod +t` (as /tmp has)",
        dir.shown(),
        child.shown()
    )]
    Renamable { dir: PathBuf, child: PathBuf, mode: u32 },
    #[error("{}: {what}: {source}", path.shown())]
    Io { path: PathBuf, what: &'static str, source: std::io::Error },
}
