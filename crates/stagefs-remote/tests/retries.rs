//! What the client tries again and what it does not, seen through its retry hook: a server failing (503) gets every try, a refused connection a few, a name that does not resolve, a 404 and a 403 none.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{answer_with, closed_port};
use stagefs_remote::{Client, Config, ObjectUrl, RemoteError, RetryHook};

/// A client with `tries` and a hook that keeps the lines it is told.
fn client(tries: u32) -> (Client, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    let on_retry = Some(RetryHook::new(move |line| kept.lock().unwrap().push(line.to_string())));
    let config = Config { tries, backoff: Duration::from_millis(1), on_retry, ..Config::default() };
    (Client::new(config).unwrap(), lines)
}

fn stat(client: &Client, url: &str) -> RemoteError {
    client.stat(&ObjectUrl::parse(url, false).unwrap()).unwrap_err()
}

#[test]
fn only_what_may_change_is_tried_again_and_each_try_is_told() {
    let (client, lines) = client(6);
    let busy = answer_with("503 Service Unavailable");
    let err = stat(&client, &format!("http://127.0.0.1:{busy}/a.tar"));
    assert!(matches!(err, RemoteError::Unavailable(_)) && err.to_string().contains("gave up after 6 tries"), "{err}");
    let told = std::mem::take(&mut *lines.lock().unwrap());
    assert_eq!(told.len(), 5, "{told:?}");
    assert!(told[0].contains("HTTP 503") && told[0].contains("(try 1 of 6; again in 0.0 s)"), "{told:?}");

    let closed = closed_port();
    let err = stat(&client, &format!("http://127.0.0.1:{closed}/a.tar"));
    assert!(matches!(err, RemoteError::Refused(_)), "{err}");
    assert!(err.to_string().contains(&format!("connection refused by 127.0.0.1:{closed}")), "{err}");
    assert!(err.to_string().contains("gave up after 4 tries"), "{err}");
    let told = std::mem::take(&mut *lines.lock().unwrap());
    assert_eq!(told.len(), 3, "{told:?}");
    assert!(told[2].contains("try 3 of 4"), "{told:?}");

    let err = stat(&client, "https://nosuch.invalid/a.tar");
    assert!(matches!(err, RemoteError::Unreachable(_)), "{err}");
    assert!(err.to_string().contains("could not resolve nosuch.invalid"), "{err}");
    for status in ["404 Not Found", "403 Forbidden"] {
        let err = stat(&client, &format!("http://127.0.0.1:{}/a.tar", answer_with(status)));
        assert!(matches!(err, RemoteError::NotFound(_) | RemoteError::Denied(_)), "{err}");
    }
    assert_eq!(*lines.lock().unwrap(), Vec::<String>::new(), "no retry of a permanent failure");
}
