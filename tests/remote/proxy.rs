//! A small HTTP proxy in front of a real server that misbehaves on purpose: resets every Nth request midway, stalls answers, or runs a hook (the object replaced) before the Nth request; a server that accepts and never answers; and one that answers at once but trickles its bodies a byte at a time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// A proxy to `127.0.0.1:upstream`, stopped on drop (stalled connections then close).
pub struct Proxy {
    pub port: u16,
    /// Requests seen so far.
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16, fault: Fault) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (requests, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let hook_ran = Arc::new(Mutex::new(false));
        let (r, s) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded: the proxy serves one test and stops with it (or after 10 minutes).
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (r, s, fault, hook_ran) = (r.clone(), s.clone(), fault.clone(), hook_ran.clone());
                        std::thread::spawn(move || {
                            let _ = serve(client, upstream, &r, &s, &fault, &hook_ran);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy { port, requests, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One request: its head read, forwarded with `Connection: close`, the answer copied
/// back (or broken per `fault`).
fn serve(
    mut client: TcpStream,
    upstream: u16,
    requests: &AtomicUsize,
    stop: &AtomicBool,
    fault: &Fault,
    hook_ran: &Mutex<bool>,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 || head.len() > 64 << 10 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    lines.retain(|l| !l.to_ascii_lowercase().starts_with("connection:"));
    let forwarded = format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"));
    let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
    if let Fault::HookBefore(at, hook) = fault {
        let mut ran = hook_ran.lock().unwrap();
        if n >= *at && !*ran {
            *ran = true;
            hook();
        }
    }
    let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
    server.write_all(forwarded.as_bytes())?;
    let limit = match fault {
        Fault::ResetEvery(every) if n % every == 0 => Some(64 << 10),
        Fault::StallAfter(bytes) => Some(*bytes),
        _ => None,
    };
    let mut sent_body = 0usize;
    let mut in_body = false;
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let got = server.read(&mut buf)?;
        if got == 0 {
            return Ok(());
        }
        let mut piece = &buf[..got];
        if !in_body {
            seen.extend_from_slice(piece);
            if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                in_body = true;
                let body_in_piece = seen.len() - (end + 4);
                let header_part = got - body_in_piece;
                client.write_all(&piece[..header_part])?;
                piece = &piece[header_part..];
            } else {
                client.write_all(piece)?;
                continue;
            }
        }
        let allowed = limit.map_or(piece.len(), |l| l.saturating_sub(sent_body).min(piece.len()));
        client.write_all(&piece[..allowed])?;
        sent_body += allowed;
        if limit.is_some_and(|l| sent_body >= l) {
            break;
        }
    }
    match fault {
        Fault::StallAfter(_) => {
            // Silent, the connection open, until the test ends.
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        _ => reset(&client),
    }
    Ok(())
}

/// Closes with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client.
fn reset(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a socket we own, with a correctly sized struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A server that accepts connections and never says a word; stopped on drop.
pub struct Silent {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Silent {
    pub fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                if let Ok((c, _)) = listener.accept() {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Silent { port, stop }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A server of one object of `size` zero bytes that answers every range request at once
/// (206, `Content-Range`, an ETag), sends a 1-byte range whole (the client's first request,
/// which pins the version), and trickles every other body one byte per 200 ms: never
/// silent for a per-read timeout, never done. Stopped on drop.
pub struct Trickle {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Trickle {
    pub fn start(size: u64) -> Trickle {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((c, _)) => {
                        let s = s.clone();
                        std::thread::spawn(move || {
                            let _ = trickle(c, size, &s);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Trickle { port, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers the requests of one connection, as [`Trickle`] says.
fn trickle(mut client: TcpStream, size: u64, stop: &AtomicBool) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let mut reader = std::io::BufReader::new(client.try_clone()?);
    loop {
        let mut range = (0, size - 1);
        loop {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut reader, &mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
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
}
