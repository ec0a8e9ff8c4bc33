//! A whole object into a file descriptor (a memfd, a nameless local file) with many range requests in flight, each pinned to the version first seen, resumed where a dropped connection left it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::client::{parse_content_range, Ask, Client, Object};
use crate::error::RemoteError;

/// Where the bytes of a range go as they arrive: `(offset, bytes)`.
pub(crate) type Sink<'a> = dyn FnMut(u64, &[u8]) -> Result<(), RemoteError> + 'a;

/// What the caller sees of a fetch while it runs, on its own thread.
pub struct Hooks<'a> {
    /// Bytes written so far (called every 50 ms or so).
    pub progress: &'a dyn Fn(u64),
    /// True once the fetch must stop (Ctrl-C): the fetch returns within 0.1 s.
    pub cancelled: &'a dyn Fn() -> bool,
}

/// Writes every byte of `object` into `file` at its own offset (`pwrite`), with up to
/// `config.concurrency` range requests of `config.chunk_size` in flight. A request that
/// fails midway is resumed from the byte it reached; every answer must be of the same
/// version (ETag, Last-Modified, size), else [`RemoteError::Changed`].
///
/// The caller's thread only waits and reports: a worker stuck on a silent server (until
/// its read timeout) cannot delay a cancellation, and is left to end by itself.
pub fn fetch_into(client: &Client, object: &Object, file: &File, hooks: &Hooks) -> Result<(), RemoteError> {
    let len = object.version.size;
    if len == 0 {
        return Ok(());
    }
    let write_error = |e: std::io::Error| RemoteError::Write {
        what: format!("{}: cannot write the fetched bytes: {e}", object.url.shown()),
        errno: e.raw_os_error(),
    };
    let shared = Arc::new(Shared {
        client: client.clone(),
        object: object.clone(),
        file: file.try_clone().map_err(write_error)?,
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        chunk: client.config().chunk_size.max(64 << 10),
    });
    let workers = (client.config().concurrency as u64).min(len.div_ceil(shared.chunk)).max(1);
    let (tx, rx) = mpsc::channel::<Result<(), RemoteError>>();
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (mine, tx) = (shared.clone(), tx.clone());
        let spawned = std::thread::Builder::new().name("stagefs-fetch".into()).spawn(move || {
            let result = mine.work();
            if result.is_err() {
                mine.stop.store(true, Ordering::Relaxed);
            }
            let _ = tx.send(result);
        });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                shared.stop.store(true, Ordering::Relaxed);
                return Err(RemoteError::Write { what: format!("cannot start a fetch thread: {e}"), errno: None });
            }
        }
    }
    drop(tx);
    let mut finished = 0;
    while finished < handles.len() {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Ok(())) => finished += 1,
            Ok(Err(e)) => {
                shared.stop.store(true, Ordering::Relaxed);
                return Err(e);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        (hooks.progress)(shared.done.load(Ordering::Relaxed));
        if (hooks.cancelled)() {
            shared.stop.store(true, Ordering::Relaxed);
            return Err(RemoteError::Cancelled);
        }
    }
    // All workers said they are done: joining them takes no time, and leaves no thread
    // behind (the daemon may fork next).
    for handle in handles {
        let _ = handle.join();
    }
    let done = shared.done.load(Ordering::Relaxed);
    (hooks.progress)(done);
    if done != len {
        return Err(RemoteError::Unavailable(format!(
            "{}: the fetch ended with {done} of {len} bytes",
            object.url.shown()
        )));
    }
    Ok(())
}

struct Shared {
    client: Client,
    object: Object,
    file: File,
    next: AtomicU64,
    done: AtomicU64,
    stop: AtomicBool,
    chunk: u64,
}

impl Shared {
    /// Takes chunks until none is left or the fetch stops.
    fn work(&self) -> Result<(), RemoteError> {
        let len = self.object.version.size;
        let stopped = || self.stop.load(Ordering::Relaxed);
        loop {
            if stopped() {
                return Ok(());
            }
            let offset = self.next.fetch_add(self.chunk, Ordering::Relaxed);
            if offset >= len {
                return Ok(());
            }
            let end = (offset + self.chunk).min(len);
            let tries = self.client.config().tries;
            read_range(&self.client, &self.object, (offset, end, tries), &stopped, &mut |at, bytes| {
                self.file.write_all_at(bytes, at).map_err(|e| RemoteError::Write {
                    what: format!("{}: cannot write the fetched bytes at byte {at}: {e}", self.object.url.shown()),
                    errno: e.raw_os_error(),
                })?;
                self.done.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok(())
            })?;
        }
    }
}

/// Bytes `offset..end` of `object` (at most `tries` tries), handed to `sink` in pieces as
/// they arrive (each with its offset), by range requests pinned to the object's version.
/// A try that fails after some bytes arrived resumes after them; `stopped` ends it early
/// (returns `Ok` with the range incomplete).
pub(crate) fn read_range(
    client: &Client,
    object: &Object,
    (offset, end, tries): (u64, u64, u32),
    stopped: &dyn Fn() -> bool,
    sink: &mut Sink,
) -> Result<(), RemoteError> {
    let mut at = offset;
    let mut failed = 0;
    let started = std::time::Instant::now();
    while at < end {
        let Some(_permit) = client.inner.permits.acquire(stopped) else { return Ok(()) };
        match one_try(client, object, &mut at, end, stopped, sink) {
            Ok(()) if stopped() => return Ok(()),
            Ok(()) => {}
            Err(e) if e.is_transient() => {
                // Progress does not reset the count: a server that stalls after a little
                // of every answer must end in an error, not trickle on forever.
                failed += 1;
                let of = crate::retry::allowed(&e, tries);
                if failed >= of {
                    return Err(crate::retry::gave_up(e, failed, started));
                }
                drop(_permit);
                let line = |wait| format!("{e} (bytes {at}-{end}: try {failed} of {of}; again in {wait:.1} s)");
                if !client.again(failed, stopped, line) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One range request for `*at..end`, streamed to `sink`; `*at` moves with every byte.
fn one_try(
    client: &Client,
    object: &Object,
    at: &mut u64,
    end: u64,
    stopped: &dyn Fn() -> bool,
    sink: &mut Sink,
) -> Result<(), RemoteError> {
    let what = object.url.shown();
    let version = &object.version;
    let mut headers = vec![("range", format!("bytes={}-{}", *at, end - 1))];
    // A weak ETag never matches If-Match (strong comparison): only compared below.
    if let Some(etag) = version.etag.as_ref().filter(|e| !e.starts_with("W/")) {
        headers.push(("if-match", etag.clone()));
    }
    let answer = client.send(&Ask { method: "GET", url: &object.url, query: &[], headers, body: None })?;
    let status = answer.status().as_u16();
    let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    match status {
        206 => {
            let range = header("content-range").and_then(|r| parse_content_range(&r));
            match range {
                Some((_, _, total)) if total != version.size => {
                    return Err(changed(&what, format!("its size went from {} to {total} bytes", version.size)));
                }
                Some((start, last, _)) if start == *at && last == end - 1 => {}
                _ => {
                    return Err(RemoteError::Unsupported(format!(
                        "{what}: asked for bytes {}-{}, the server sent {}",
                        *at,
                        end - 1,
                        header("content-range").map_or("no Content-Range".into(), |r| crate::url::display_text(&r))
                    )))
                }
            }
        }
        200 if *at == 0 && end == version.size => {}
        200 => {
            return Err(RemoteError::Unsupported(format!(
                "{what}: the server ignores Range requests (it sent the whole object for a part); stagefs needs a \
                 server that answers them (S3, nginx, Apache, Caddy do)"
            )))
        }
        _ => return Err(client.refusal(answer, &object.url, &what)),
    }
    for (name, pinned) in [("etag", &version.etag), ("last-modified", &version.last_modified)] {
        if let (Some(pinned), Some(now)) = (pinned, header(name)) {
            if &now != pinned {
                let shown = |t: &str| crate::url::display_text(t);
                return Err(changed(&what, format!("its {name} went from {} to {}", shown(pinned), shown(&now))));
            }
        }
    }
    let mut reader = answer.into_body().into_reader();
    let mut buf = vec![0u8; (256 << 10).min((end - *at) as usize)];
    while *at < end {
        if stopped() {
            return Ok(());
        }
        let want = buf.len().min((end - *at) as usize);
        let n = match std::io::Read::read(&mut reader, &mut buf[..want]) {
            Ok(0) => {
                return Err(RemoteError::Unavailable(format!(
                    "{what}: the connection closed at byte {} of range {}-{end}",
                    *at, end
                )))
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(client.failed_reading(&object.url, &e, *at)),
        };
        sink(*at, &buf[..n])?;
        *at += n as u64;
    }
    Ok(())
}

fn changed(what: &str, how: String) -> RemoteError {
    RemoteError::Changed(format!(
        "{what}: the object was replaced while stagefs read it ({how}); no bytes of two versions were mixed: \
         mount again once the upload is complete"
    ))
}
