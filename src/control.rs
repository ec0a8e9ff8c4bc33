//! The control socket of a growing mount: `stagefs add` and `stagefs remove` ask its daemon over a Unix socket in the user's private runtime directory, and only this user is answered.
//!
//! The socket sits beside the mount's record (`<hash of the mountpoint>.control`), in the
//! runtime directory that `places` checked to be this user's alone, and is bound and
//! reached through that directory's descriptor. The daemon checks each caller's uid
//! (SO_PEERCRED) before it reads a byte, and the caller the daemon's: root can reach any
//! socket, and nobody else is ever answered. Each connection is answered on a thread of
//! its own (a few at a time), so a caller that sends slowly holds nobody else up; a
//! request must arrive whole within [`REQUEST_TIMEOUT`].
//!
//! A request is its length (8 bytes, little-endian), then NUL-separated fields: a magic,
//! the verb, the trust flag, then the paths; the answer is the exit code and a message.
//! The caller keeps the connection open until it has the answer: a change is applied only
//! while the caller still waits for it, so one that gave up (a timeout, Ctrl-C) never sees
//! its change made behind its back.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{code, Failure};
use crate::growing::{GrowingSet, Outcome};
use stagefs_archive::escape::Shown;
use stagefs_open::places;
use stagefs_open::sockets::{bind, connect, peer_uid, socket_name, BoundSocket};

const MAGIC: &[u8] = b"stagefs-control-2";
/// Largest request read: a list of paths, not data.
const MAX_REQUEST: u64 = 16 << 20;
/// A caller gets this long to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections answered at once; more are told to retry.
const MAX_CALLERS: usize = 8;

/// What a caller asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Remove,
    /// Which shards the set serves now.
    List,
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
        let verb: &[u8] = match self.verb {
            Verb::Add => b"add",
            Verb::Remove => b"remove",
            Verb::List => b"list",
        };
        let mut body = [MAGIC, verb, if self.trust { b"1" } else { b"0" }].join(&0u8);
        for path in &self.paths {
            body.push(0);
            body.extend_from_slice(path.as_os_str().as_bytes());
        }
        let mut out = (body.len() as u64).to_le_bytes().to_vec();
        out.extend(body);
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
            b"list" => Verb::List,
            _ => return None,
        };
        let trust = fields.next()? == b"1";
        let paths: Vec<PathBuf> = fields.map(|f| PathBuf::from(std::ffi::OsStr::from_bytes(f))).collect();
        paths.iter().all(|p| p.is_absolute()).then_some(Request { verb, trust, paths })
    }
}

/// Starts answering requests for `set`, mounted at `mountpoint`, on a thread.
pub fn listen(set: Arc<GrowingSet>, mountpoint: &Path) -> Result<BoundSocket, Failure> {
    let (listener, control) = bind(mountpoint, "control").map_err(socket_failure)?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            let callers = Arc::new(AtomicUsize::new(0));
            for mut stream in listener.incoming().flatten() {
                if callers.fetch_add(1, Ordering::AcqRel) >= MAX_CALLERS {
                    callers.fetch_sub(1, Ordering::AcqRel);
                    reply(&mut stream, code::BUSY, "the daemon is answering other requests; try again");
                    continue;
                }
                let (set, callers) = (set.clone(), callers.clone());
                let spawned = std::thread::Builder::new().name("control-caller".into()).spawn(move || {
                    answer(&set, stream);
                    callers.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    tracing::warn!("cannot start a thread for a control request");
                }
            }
        })
        .map_err(|e| Failure::other(format!("cannot start the control thread: {e}")))?;
    Ok(control)
}

fn reply(stream: &mut UnixStream, code: u8, message: &str) {
    let _ = stream.write_all(&[&[b'0' + code / 10, b'0' + code % 10, 0][..], message.as_bytes()].concat());
}

/// Throws away what the caller sent, unread, for a moment after a refusal: closing a socket
/// with bytes still queued resets it, and the caller would lose the answer.
fn discard_the_rest(stream: &mut UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut sink = [0u8; 4096];
    let mut left = MAX_REQUEST as usize + 8;
    loop {
        // Never a read without a timeout: a caller that keeps the socket open gets 1 s.
        let time_left = deadline.saturating_duration_since(Instant::now());
        if left == 0 || time_left.is_zero() || stream.set_read_timeout(Some(time_left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Reads exactly `buf.len()` bytes before `deadline`, however slowly they come.
fn read_before(stream: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether the caller at the other end still waits for the answer (has not closed).
fn still_waiting(stream: &UnixStream) -> bool {
    let mut poll = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd, as passed; a zero timeout only looks.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 0 || poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0
}

fn answer(set: &GrowingSet, mut stream: UnixStream) {
    // Who asks, before a byte of theirs is read.
    let caller = peer_uid(&stream);
    if caller != Some(places::my_uid()) {
        tracing::warn!(uid = ?caller, "refused a control request from another user");
        reply(&mut stream, code::MOUNTPOINT, "this mount belongs to another user");
        return discard_the_rest(&mut stream);
    }
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut len = [0u8; 8];
    let mut bytes = Vec::new();
    let read = read_before(&mut stream, &mut len, deadline).and_then(|()| {
        let len = u64::from_le_bytes(len);
        if len > MAX_REQUEST {
            return Err(std::io::Error::other("too long"));
        }
        bytes = vec![0u8; len as usize];
        read_before(&mut stream, &mut bytes, deadline)
    });
    if let Err(e) = read {
        reply(&mut stream, code::USAGE, &format!("the request was not read whole ({e})"));
        return discard_the_rest(&mut stream);
    }
    let Some(request) = Request::decode(&bytes) else {
        return reply(&mut stream, code::USAGE, "not a request this daemon understands (another stagefs version?)");
    };
    let waiting = || still_waiting(&stream);
    let result = match request.verb {
        Verb::Add => set.change(&request.paths, &[], request.trust, &waiting),
        Verb::Remove => set.change(&[], &request.paths, request.trust, &waiting),
        Verb::List => {
            let shards: Vec<String> = set.paths().iter().map(|p| p.shown().to_string()).collect();
            return reply(&mut stream, 0, &shards.join("\n"));
        }
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

fn report_seconds(d: Duration) -> String {
    format!("{} s", d.as_secs())
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
/// Gives up after `timeout` (the daemon then drops the change: it is applied only while
/// someone waits for it).
pub fn ask(mountpoint: &Path, request: &Request, timeout: Duration) -> Result<String, Failure> {
    socket_name(mountpoint, "control").map_err(socket_failure)?; // no runtime directory: say why, not "not a mount"
    let Some(mut stream) = connect(mountpoint, "control") else {
        return Err(if stagefs_open::registry::read(mountpoint).is_some() {
            Failure::new(
                code::USAGE,
                format!(
                    "{} does not take new shards: it was mounted without --growing. Remount it with \
                     `stagefs mount --growing ...` (or --watch) to add and remove shards while mounted",
                    mountpoint.shown()
                ),
            )
        } else {
            Failure::new(code::NOT_MOUNTED, format!("{} is not a stagefs mount of yours", mountpoint.shown()))
        });
    };
    if peer_uid(&stream) != Some(places::my_uid()) {
        return Err(Failure::new(code::MOUNTPOINT, "the control socket is not served by you; not asking it".into()));
    }
    let lost = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            Failure::other(format!(
                "no answer from the daemon of {} within {}; gave up, so it drops the change",
                mountpoint.shown(),
                report_seconds(timeout)
            ))
        } else {
            Failure::other(format!("lost the daemon of {}: {e}", mountpoint.shown()))
        }
    };
    // A write error still leaves the daemon's answer to read: it says why.
    let _ = stream.write_all(&request.encode());
    let _ = stream.set_read_timeout(Some(timeout));
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

/// A socket that cannot be made: the runtime directory's refusal as it always was (a
/// mountpoint's failure), a failed bind as any other failure.
pub(crate) fn socket_failure(e: places::PlaceError) -> Failure {
    match e {
        places::PlaceError::Io { .. } => Failure::other(e.to_string()),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let request = Request { verb: Verb::Remove, trust: true, paths: vec!["/a b/x.tar".into(), "/y\n.tar".into()] };
        assert_eq!(Request::decode(&request.encode()[8..]), Some(request));
        let empty = Request { verb: Verb::Add, trust: false, paths: vec![] };
        let encoded = empty.encode();
        assert_eq!(u64::from_le_bytes(encoded[..8].try_into().unwrap()), encoded.len() as u64 - 8);
        assert_eq!(Request::decode(&encoded[8..]), Some(empty));
        assert_eq!(Request::decode(b"stagefs-control-2\0add\x000\0relative.tar"), None, "relative paths");
        assert_eq!(Request::decode(b"stagefs-control-9\0add\x000"), None);
        assert_eq!(Request::decode(b"stagefs-control-2\0format\x000"), None);
        assert_eq!(Request::decode(b"stagefs-control-1\0add\x000"), None, "the old protocol");
        assert_eq!(Request::decode(b""), None);
    }
}
