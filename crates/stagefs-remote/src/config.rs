//! How the client reaches objects: concurrency, timeouts, tries, the endpoint and credentials' sources; built once from the command line and the environment.

use std::sync::Arc;
use std::time::Duration;

use crate::secret::Secret;

/// How to reach objects; built once from the command line and the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Range requests in flight at once, for all fetches of this process together.
    pub concurrency: usize,
    /// Bytes per range request of a fetch.
    pub chunk_size: u64,
    /// Connecting, waiting for an answer, and each read: a server silent this long fails
    /// that try (retried), never hangs.
    pub timeout: Duration,
    /// The whole of one request, from connecting to its last byte: a server that trickles
    /// (a byte a second never trips `timeout`) fails that try (retried, resuming where it
    /// stopped) instead of holding a range for days. The partner of `timeout`.
    pub deadline: Duration,
    /// Tries per request, the first included (connection trouble, 5xx, 429).
    pub tries: u32,
    /// First pause between tries; it doubles up to 10 s, with jitter.
    pub backoff: Duration,
    /// `--endpoint-url`: an S3-compatible store (path-style addressing).
    pub endpoint_url: Option<String>,
    /// `--no-sign-request`: anonymous requests (public buckets).
    pub no_sign_request: bool,
    /// `--profile`.
    pub profile: Option<String>,
    /// A bearer token for HTTP(S) URLs (read from `--bearer-token-file`, never the command line).
    pub bearer_token: Option<Secret>,
    /// `--allow-http`: plain http:// to hosts other than this machine.
    pub allow_http: bool,
    /// Told of each failed try that will be tried again (the CLI prints it on a terminal).
    pub on_retry: Option<RetryHook>,
    /// The one door the client reads files through (credentials, CA bundles, tokens,
    /// `~/.netrc`): see [`crate::Files`]. The default reads none.
    pub files: crate::files::Files,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            concurrency: 16,
            chunk_size: 8 << 20,
            timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(300),
            tries: 8,
            backoff: Duration::from_millis(200),
            endpoint_url: None,
            no_sign_request: false,
            profile: None,
            bearer_token: None,
            allow_http: false,
            on_retry: None,
            files: crate::files::Files::none(),
        }
    }
}

/// Called with one line for each failed try that will be tried again ("...: connection
/// refused by h:9000 ... (try 1 of 4; again in 0.3 s)"), so that a caller can show it
/// where a person sees it (a terminal: this crate knows none). Without one, the line
/// is logged at info level.
#[derive(Clone)]
pub struct RetryHook(Arc<dyn Fn(&str) + Send + Sync>);

impl RetryHook {
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> RetryHook {
        RetryHook(Arc::new(f))
    }

    /// Tells the caller of one failed try, in one line.
    pub(crate) fn call(&self, line: &str) {
        (self.0)(line)
    }
}

impl std::fmt::Debug for RetryHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryHook")
    }
}
