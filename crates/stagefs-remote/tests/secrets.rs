//! Secrets given to the client (a bearer token, a URL's password, a presigned query) never appear in its errors or debug prints, whatever the server answers (a small HTTP server in the test answers with a fixed status).

mod common;

use std::time::Duration;

use common::{answer_with, closed_port};

use stagefs_remote::{Client, Config, ObjectUrl, Secret};

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
    let closed = closed_port();
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
