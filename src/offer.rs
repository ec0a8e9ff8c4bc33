//! The daemon's side of one copy per node: a mount that serves one archive from a complete copy in RAM offers it to this user's other processes (`stagefs_open::share` is the protocol and the receiving side).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use stagefs_archive::FileId;

use crate::error::Failure;
use crate::fs::Fs;

/// A daemon's offer, listening; the socket is removed when dropped (the daemon's exit).
pub type Offer = stagefs_open::sockets::BoundSocket;

/// Offers the copy `fs` serves of the archive `id` (one local file) to this user's other
/// processes, on a thread. Callers are answered one after the other: each answer is one
/// message, sent without waiting for the caller.
pub fn offer(fs: Arc<Fs>, id: FileId, mountpoint: &Path) -> Result<Offer, Failure> {
    let (listener, offer) = stagefs_open::sockets::bind(mountpoint, "share").map_err(crate::control::socket_failure)?;
    std::thread::Builder::new()
        .name("share".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(&fs, &id, &stream);
            }
        })
        .map_err(|e| Failure::other(format!("cannot start the share thread: {e}")))?;
    Ok(offer)
}

fn answer(fs: &Fs, id: &FileId, stream: &UnixStream) {
    let archive = fs.fixed();
    let copy = archive.and_then(|a| Some((a.reader().shared_copy()?, a.index.mapped_file())));
    stagefs_open::share::answer(stream, id, copy);
}
