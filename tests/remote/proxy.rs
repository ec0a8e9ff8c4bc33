//! A small HTTP proxy in front of a real server that misbehaves on purpose: resets every Nth request midway, stalls answers, or runs a hook (the object replaced) before the Nth request; a server that accepts and never answers; and one that answers at once but trickles its bodies a byte at a time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use nix::sys::socket::{setsockopt, sockopt};

/// A server on 127.0.0.1 that serves each connection with `handle` in a thread of its own,
/// stopped on drop: its handlers see `stop` set (stalled connections then close).
pub struct Server {
    pub port: u16,
    /// Requests the handlers counted (the proxy's).
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(handle: impl Fn(TcpStream, &AtomicUsize, &AtomicBool) + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (requests, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (r, s, handle) = (requests.clone(), stop.clone(), Arc::new(handle));
        std::thread::spawn(move || {
            // Bounded: the server serves one test and stops with it (or after 10 minutes).
            let deadline = Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (r, s, handle) = (r.clone(), s.clone(), handle.clone());
                        std::thread::spawn(move || client.set_nonblocking(false).map(|()| handle(client, &r, &s)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server { port, requests, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// Requests seen so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How the proxy misbehaves.
#[derive(Clone)]
pub enum Fault {
    /// Every Nth request: the answer's headers and 64 KiB of its body, then a TCP reset.
    ResetEvery(usize),
    /// Every answer: its headers and this many body bytes, then silence (connection open).
    StallAfter(usize),
    /// Before forwarding request N (counted from 1), run the hook once.
    HookBefore(usize, Arc<dyn Fn() + Send + Sync>),
}

/// A proxy to `127.0.0.1:upstream`.
pub fn proxy(upstream: u16, fault: Fault) -> Server {
    let hook_once = Once::new();
    Server::start(move |client, requests, stop| {
        let _ = serve(client, upstream, requests, stop, &fault, &hook_once);
    })
}

/// One request: its head read, forwarded with `Connection: close`, the answer copied
/// back (or broken per `fault`).
fn serve(
    mut client: TcpStream,
    upstream: u16,
    requests: &AtomicUsize,
    stop: &AtomicBool,
    fault: &Fault,
    hook_once: &Once,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let Some(head) = read_head(&mut client)? else { return Ok(()) };
    let text = String::from_utf8_lossy(&head);
    let mut lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    lines.retain(|l| !l.to_ascii_lowercase().starts_with("connection:"));
    let forwarded = format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"));
    let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
    if let Fault::HookBefore(at, hook) = fault {
        if n >= *at {
            hook_once.call_once(|| hook());
        }
    }
    let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
    server.write_all(forwarded.as_bytes())?;
    let limit = match fault {
        Fault::ResetEvery(every) if n % every == 0 => Some(64 << 10),
        Fault::StallAfter(bytes) => Some(*bytes),
        _ => None,
    };
    let Some(answer) = read_head(&mut server)? else { return Ok(()) };
    client.write_all(&answer)?;
    let (mut sent_body, mut buf) = (0usize, vec![0u8; 16 << 10]);
    while limit.is_none_or(|l| sent_body < l) {
        let got = server.read(&mut buf)?;
        if got == 0 {
            return Ok(());
        }
        let allowed = limit.map_or(got, |l| (l - sent_body).min(got));
        client.write_all(&buf[..allowed])?;
        sent_body += allowed;
    }
    match fault {
        Fault::StallAfter(_) => until_stopped(stop), // Silent, the connection open.
        _ => reset(&client),
    }
    Ok(())
}

/// A message's head, up to and with its blank line (`None`: the peer closed first, or sent
/// more than 64 KiB of head).
pub fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let (mut head, mut byte) = (Vec::new(), [0u8; 1]);
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 || head.len() > 64 << 10 {
            return Ok(None);
        }
        head.push(byte[0]);
    }
    Ok(Some(head))
}

/// Returns once the server stops (the test ends).
fn until_stopped(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Closes with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client.
fn reset(stream: &TcpStream) {
    let _ = setsockopt(stream, sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 });
}

/// A server that accepts connections and never says a word.
pub fn silent() -> Server {
    Server::start(|_held, _, stop| until_stopped(stop))
}

/// A server of one object of `size` zero bytes that answers every range request at once
/// (206, `Content-Range`, an ETag), sends a 1-byte range whole (the client's first request,
/// which pins the version), and trickles every other body one byte per 200 ms: never
/// silent for a per-read timeout, never done.
pub fn trickle(size: u64) -> Server {
    Server::start(move |client, _, stop| {
        let _ = trickle_to(client, size, stop);
    })
}

/// Answers the requests of one connection, as [`trickle`] says.
fn trickle_to(mut client: TcpStream, size: u64, stop: &AtomicBool) -> std::io::Result<()> {
    while let Some(head) = read_head(&mut client)? {
        let mut range = (0, size - 1);
        for line in String::from_utf8_lossy(&head).lines() {
            if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                let (a, b) = r.trim().split_once('-').unwrap();
                range = (a.parse().unwrap(), b.parse::<u64>().unwrap().min(size - 1));
            }
        }
        let (a, b) = range;
        write!(
            client,
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{b}/{size}\r\nETag: \"t\"\r\n\r\n",
            b + 1 - a
        )?;
        for sent in 0..b + 1 - a {
            if sent > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            client.write_all(&[0])?;
        }
    }
    Ok(())
}
