//! Secrets given to the client (a bearer token, a URL's password, a presigned query) never appear in its errors or debug prints, whatever the server answers; a small HTTP server in the test (std only, on 127.0.0.1) answers with a fixed status.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use stagefs_remote::{Client, Config, ObjectUrl, Secret};

/// Answers every request with `status` and an empty body; returns the port.
fn answer_with(status: &'static str) -> u16 {
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

const TOKEN: &str = "tok-Secret-7f3a9c";
const PASSWORD: &str = "pw-Secret-51be02";
const SIGNATURE: &str = "sig-Secret-d4e8a1";

fn assert_clean(text: &str) {
    for secret in [TOKEN, PASSWORD, SIGNATURE, "Secret-"] {
        assert!(!text.contains(secret), "{secret} in: {text}");
    }
}

#[test]
fn no_error_or_debug_print_holds_a_secret() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for bearer in [true, false] {
        let config = Config {
            tries: 2,
            backoff: Duration::from_millis(1),
            timeout: Duration::from_secs(5),
            bearer_token: bearer.then(|| Secret::new(TOKEN)),
            ..Config::default()
        };
        let client = Client::new(config.clone()).unwrap();
        assert_clean(&format!("{config:?} {client:?}"));
        for port in [answer_with("401 Unauthorized"), answer_with("503 Busy"), answer_with("404 Gone"), closed] {
            let text = format!("http://alice:{PASSWORD}@127.0.0.1:{port}/a.tar?X-Amz-Signature={SIGNATURE}");
            let url = ObjectUrl::parse(&text, false).unwrap();
            assert_clean(&format!("{url:?} {}", url.shown()));
            let err = client.stat(&url).unwrap_err();
            assert_clean(&format!("{err} {err:?}"));
        }
    }
}
