//! The control socket of a growing mount: `stagefs add` and `stagefs remove` ask its daemon over a Unix socket in the user's private runtime directory, and only this user is answered.
//!
//! The socket sits beside the mount's record (`<hash of the mountpoint>.control`), in the
//! runtime directory that `places` checked to be this user's alone, and is bound and
//! reached through that directory's descriptor. The daemon also checks each caller's uid
//! (SO_PEERCRED), and the caller the daemon's: root can reach any socket, and nobody else
//! is ever answered. A request is NUL-separated fields: a magic, the verb, the trust flag,
//! then the paths; the answer is the exit code and a message.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{GrowingSet, Outcome};
use crate::error::{code, Failure};
use crate::places::{self, CheckedDir};

const MAGIC: &[u8] = b"stagefs-control-1";
/// Largest request read: a list of paths, not data.
const MAX_REQUEST: u64 = 16 << 20;
/// A caller gets this long to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a caller asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Remove,
}

/// One request: add or remove `paths`; `trust` skips the ownership check of added shards.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub verb: Verb,
    pub trust: bool,
    pub paths: Vec<PathBuf>,
}

impl Request {
    fn encode(&self) -> Vec<u8> {
        let verb: &[u8] = if self.verb == Verb::Add { b"add" } else { b"remove" };
        let mut out = [MAGIC, verb, if self.trust { b"1" } else { b"0" }].join(&0u8);
        for path in &self.paths {
            out.push(0);
            out.extend_from_slice(path.as_os_str().as_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Request> {
        let mut fields = bytes.split(|&b| b == 0);
        if fields.next()? != MAGIC {
            return None;
        }
        let verb = match fields.next()? {
            b"add" => Verb::Add,
            b"remove" => Verb::Remove,
            _ => return None,
        };
        let trust = fields.next()? == b"1";
        let paths: Vec<PathBuf> = fields.map(|f| PathBuf::from(std::ffi::OsStr::from_bytes(f))).collect();
        paths.iter().all(|p| p.is_absolute()).then_some(Request { verb, trust, paths })
    }
}

/// The listening socket; removed when dropped (the daemon's exit).
pub struct Control {
    dir: CheckedDir,
    name: String,
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.dir.remove(&self.name, false);
    }
}

fn socket_name(mountpoint: &Path) -> Result<String, Failure> {
    let path = places::mountpoint_file(mountpoint, "control")?;
    Ok(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

/// Starts answering requests for `set`, mounted at `mountpoint`, on a thread.
pub fn listen(set: Arc<GrowingSet>, mountpoint: &Path) -> Result<Control, Failure> {
    let dir = CheckedDir::open(places::runtime_dir()?, "")?;
    let name = socket_name(mountpoint)?;
    let failed =
        |e: std::io::Error| Failure::other(format!("cannot make the control socket in {}: {e}", dir.path().display()));
    // A socket left by a daemon that was killed: ours (the directory is), and dead.
    let _ = dir.remove(&name, false);
    let listener = UnixListener::bind(dir.fd_path(&name).map_err(failed)?).map_err(failed)?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(&set, stream);
            }
        })
        .map_err(failed)?;
    Ok(Control { dir, name })
}

/// The uid at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials).ok().map(|c| c.uid())
}

fn answer(set: &GrowingSet, mut stream: UnixStream) {
    let reply = |stream: &mut UnixStream, code: u8, message: &str| {
        let _ = stream.write_all(&[&[b'0' + code / 10, b'0' + code % 10, 0][..], message.as_bytes()].concat());
    };
    // Read whole before any answer: an unread request would reset the connection, and the
    // caller would lose the answer that says why it was refused.
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let mut bytes = Vec::new();
    let read = (&mut stream).take(MAX_REQUEST + 1).read_to_end(&mut bytes);
    let caller = peer_uid(&stream);
    if caller != Some(places::my_uid()) {
        tracing::warn!(uid = ?caller, "refused a control request from another user");
        return reply(&mut stream, code::MOUNTPOINT, "this mount belongs to another user");
    }
    if read.is_err() || bytes.len() as u64 > MAX_REQUEST {
        return reply(&mut stream, code::USAGE, "the request was not read whole");
    }
    let Some(request) = Request::decode(&bytes) else {
        return reply(&mut stream, code::USAGE, "not a request this daemon understands (another stagefs version?)");
    };
    let result = match request.verb {
        Verb::Add => set.change(&request.paths, &[], request.trust),
        Verb::Remove => set.change(&[], &request.paths, request.trust),
    };
    match result {
        Ok(outcome) => reply(&mut stream, 0, &describe(&outcome)),
        Err(e) => {
            tracing::warn!("refused a change of the shard set: {e}");
            let failure = Failure::from(e);
            reply(&mut stream, failure.code, &failure.message)
        }
    }
}

fn describe(o: &Outcome) -> String {
    let mut done = Vec::new();
    if o.added > 0 {
        done.push(format!("added {} shard{}", o.added, if o.added == 1 { "" } else { "s" }));
    }
    if o.removed > 0 {
        done.push(format!("removed {} shard{}", o.removed, if o.removed == 1 { "" } else { "s" }));
    }
    if o.already > 0 {
        done.push(format!("{} already served", o.already));
    }
    if done.is_empty() {
        done.push("nothing changed".into());
    }
    format!("{}; {} shards, {} entries", done.join(", "), o.shards, o.entries)
}

/// Sends `request` to the daemon of `mountpoint` and returns its message, or its failure.
pub fn ask(mountpoint: &Path, request: &Request) -> Result<String, Failure> {
    let name = socket_name(mountpoint)?;
    let mut stream = None;
    for dir in places::runtime_dirs() {
        let Ok(dir) = CheckedDir::open(&dir, "") else { continue };
        let Ok(path) = dir.fd_path(&name) else { continue };
        if let Ok(s) = UnixStream::connect(&path) {
            stream = Some(s);
            break;
        }
    }
    let Some(mut stream) = stream else {
        return Err(if crate::registry::read(mountpoint).is_some() {
            Failure::new(
                code::USAGE,
                format!(
                    "{} does not take new shards: it was mounted without --growing. Remount it with \
                     `stagefs mount --growing ...` (or --watch) to add and remove shards while mounted",
                    mountpoint.display()
                ),
            )
        } else {
            Failure::new(code::NOT_MOUNTED, format!("{} is not a stagefs mount of yours", mountpoint.display()))
        });
    };
    if peer_uid(&stream) != Some(places::my_uid()) {
        return Err(Failure::new(code::MOUNTPOINT, "the control socket is not served by you; not asking it".into()));
    }
    let lost = |e: std::io::Error| Failure::other(format!("lost the daemon of {}: {e}", mountpoint.display()));
    // A write error still leaves the daemon's answer to read: it says why.
    let _ = stream.write_all(&request.encode()).and_then(|()| stream.shutdown(std::net::Shutdown::Write));
    let mut answer = Vec::new();
    stream.take(MAX_REQUEST).read_to_end(&mut answer).map_err(lost)?;
    let text = String::from_utf8_lossy(&answer);
    let (code, message) = text.split_once('\0').unwrap_or(("01", "the daemon gave no answer (did it exit?)"));
    match code.parse::<u8>() {
        Ok(0) => Ok(message.to_string()),
        Ok(code) => Err(Failure::new(code, message.to_string())),
        Err(_) => Err(Failure::other(format!("the daemon's answer is not understood: {text:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let request = Request { verb: Verb::Remove, trust: true, paths: vec!["/a b/x.tar".into(), "/y\n.tar".into()] };
        assert_eq!(Request::decode(&request.encode()), Some(request));
        let empty = Request { verb: Verb::Add, trust: false, paths: vec![] };
        assert_eq!(Request::decode(&empty.encode()), Some(empty));
        assert_eq!(Request::decode(b"stagefs-control-1\0add\x000\0relative.tar"), None, "relative paths");
        assert_eq!(Request::decode(b"stagefs-control-9\0add\x000"), None);
        assert_eq!(Request::decode(b"stagefs-control-1\0format\x000"), None);
        assert_eq!(Request::decode(b""), None);
    }
}
