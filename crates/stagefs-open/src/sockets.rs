//! The Unix sockets a mount binds beside its record (`<hash of the mountpoint>.control`, `.share`), bound and reached through the runtime directory's checked descriptor.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use crate::places::{self, CheckedDir, PlaceError};

/// A socket bound beside a mount's record; removed when dropped (the daemon's exit).
pub struct BoundSocket {
    dir: CheckedDir,
    name: String,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = self.dir.remove(&self.name, false);
    }
}

/// The socket's file name in the runtime directory; fails when there is no runtime
/// directory of this user's (it says why).
pub fn socket_name(mountpoint: &Path, extension: &str) -> Result<String, PlaceError> {
    let path = places::mountpoint_file(mountpoint, extension)?;
    Ok(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

/// Binds the socket `<hash of the mountpoint>.<extension>` in the runtime directory, through
/// the directory's descriptor (a `control` socket, a `share` one); the socket is removed
/// when the returned [`BoundSocket`] is dropped.
pub fn bind(mountpoint: &Path, extension: &str) -> Result<(UnixListener, BoundSocket), PlaceError> {
    let dir = CheckedDir::open(places::runtime_dir()?, "")?;
    let name = socket_name(mountpoint, extension)?;
    let failed = |source: std::io::Error| PlaceError::Io {
        path: dir.path().to_owned(),
        what: if extension == "share" {
            "cannot make the share socket in it"
        } else {
            "cannot make the control socket in it"
        },
        source,
    };
    // A socket left by a daemon that was killed: ours (the directory is), and dead.
    let _ = dir.remove(&name, false);
    let listener = UnixListener::bind(dir.fd_path(&name).map_err(failed)?).map_err(failed)?;
    Ok((listener, BoundSocket { dir, name }))
}

/// Connects to the socket [`bind`] made for `mountpoint`, in whichever runtime directory of
/// this user holds it; `None` when none answers.
pub fn connect(mountpoint: &Path, extension: &str) -> Option<UnixStream> {
    let name = socket_name(mountpoint, extension).ok()?;
    places::runtime_dirs().iter().find_map(|dir| {
        let dir = CheckedDir::open(dir, "").ok()?;
        UnixStream::connect(dir.fd_path(&name).ok()?).ok()
    })
}

/// The uid of the process at the other end of `stream` (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream).ok().map(|c| c.uid.as_raw())
}
