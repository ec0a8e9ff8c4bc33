//! A TCP proxy on 127.0.0.1 that delays every byte by a fixed time each way, for
//! benches/remote.sh where the kernel has no netem qdisc (`tc qdisc add dev lo root netem
//! delay 20ms` is refused there). Built by the script with `rustc -O`; std only.
//!
//! Model: each direction of each connection is a queue of chunks, each released DELAY
//! after it was read; at most WINDOW bytes wait in a queue (the reader blocks beyond), like
//! a TCP window of 2 × WINDOW at an RTT of 2 × DELAY: one connection then moves at most
//! WINDOW / DELAY bytes per second, as a long fat link with default Linux buffers would.
//!
//!     delay_proxy LISTEN_PORT UPSTREAM_PORT DELAY_MS [WINDOW_MIB]
//!
//! Stops when its parent (the bench script) is gone, or after an hour.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc::sync_channel;
use std::thread;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listen: u16 = args[1].parse().expect("LISTEN_PORT");
    let upstream: u16 = args[2].parse().expect("UPSTREAM_PORT");
    let delay = Duration::from_millis(args[3].parse().expect("DELAY_MS"));
    let window_mib: usize = args.get(4).map_or(2, |w| w.parse().expect("WINDOW_MIB"));
    let slots = (window_mib << 20) / CHUNK;
    let listener = TcpListener::bind(("127.0.0.1", listen)).expect("bind");
    let started = Instant::now();
    thread::spawn(move || loop {
        // The bench script is our parent: once it is gone, so are we.
        if std::os::unix::process::parent_id() == 1 || started.elapsed() > Duration::from_secs(3600) {
            std::process::exit(0);
        }
        thread::sleep(Duration::from_millis(500));
    });
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        pipe(client, server, delay, slots);
        pipe(s2, c2, delay, slots);
    }
}

/// Bytes from `from` reach `to` `delay` after they were read, at most `slots` chunks queued.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration, slots: usize) {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(slots.max(1));
    thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
