//! Servers for the client's tests, std only, on 127.0.0.1: one that answers every request with a fixed status, and a port where nothing listens.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

/// Answers every request with `status` and an empty body; returns the port.
pub fn answer_with(status: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(1000) {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line == "\r\n" {
                        let head = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                        if out.write_all(head.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// A port nothing listens on (bound a moment ago, then closed): connections are refused.
pub fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
