//! The one client of the process: the options it is made from, making it (once, or again for other options), and reading object URLs with them.

use stagefs_archive::escape::Shown;
use stagefs_remote::{Client, Config, ObjectUrl, RemoteError, Secret};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to reach objects in a store or on an HTTP(S) server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(
    feature = "clap",
    command(next_help_heading = "Archives in object storage (s3://BUCKET/KEY, https://HOST/PATH)")
)]
pub struct RemoteOptions {
    /// Range requests in flight while fetching an object, 1 to 256
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256)))]
    pub remote_concurrency: u16,
    /// Give up on a server silent this long (connecting, answering, each read; then retried), e.g. 30s;
    /// a whole request is bounded by --remote-deadline
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::duration::parse_duration))]
    pub remote_timeout: Duration,
    /// Give up on one request not done this long after it began, however steadily the server
    /// trickles (then retried, resuming where it stopped); --remote-timeout's partner, e.g. 5m
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::duration::parse_duration))]
    pub remote_deadline: Duration,
    /// Tries per request: timeouts, resets, 5xx and 429 are retried with backoff, a refused
    /// connection at most 4 times; a name that does not resolve, an untrusted certificate and
    /// 4xx never
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100)))]
    pub remote_tries: u32,
    /// An S3-compatible store (MinIO, Ceph, ...): its URL, addressed path-style.
    /// Default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the profile's endpoint_url, else AWS
    #[cfg_attr(feature = "clap", arg(long, value_name = "URL"))]
    pub endpoint_url: Option<String>,
    /// Send S3 requests unsigned (public buckets), like aws-cli's --no-sign-request
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_sign_request: bool,
    /// The AWS profile of ~/.aws/config and ~/.aws/credentials (default: AWS_PROFILE, else default)
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME"))]
    pub profile: Option<String>,
    /// A file holding a bearer token for https:// URLs (sent as Authorization: Bearer);
    /// a token is never taken on the command line, where other users see it
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub bearer_token_file: Option<PathBuf>,
    /// Allow plain http:// (unencrypted, unauthenticated bytes) to hosts other than this machine
    #[cfg_attr(feature = "clap", arg(long))]
    pub allow_http: bool,
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions {
            remote_concurrency: 16,
            remote_timeout: Duration::from_secs(30),
            remote_deadline: Duration::from_secs(300),
            remote_tries: 8,
            endpoint_url: None,
            no_sign_request: false,
            profile: None,
            bearer_token_file: None,
            allow_http: false,
        }
    }
}

/// The client of this process and the options it was made from: made once by a command
/// ([`configure`]); Python's `stagefs.open` may open objects with other options
/// ([`with_options`]). Readers of open objects keep the client they were opened with.
static CLIENT: std::sync::RwLock<Option<(RemoteOptions, Client)>> = std::sync::RwLock::new(None);
/// Held by an open under [`with_options`]: concurrent opens with other options wait.
static OPENING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes the process's client from `options` (the first call wins).
pub fn configure(options: &RemoteOptions) -> Result<(), RemoteFailure> {
    if CLIENT.read().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Ok(());
    }
    let client = make_client(options)?;
    CLIENT.write().unwrap_or_else(|p| p.into_inner()).get_or_insert((options.clone(), client));
    Ok(())
}

/// Runs `open` with the process's client made from `options` (a new one when they differ
/// from the current client's), one such open at a time: a Python program may open objects
/// of several endpoints, profiles or tokens.
pub fn with_options<T>(options: &RemoteOptions, open: impl FnOnce() -> T) -> Result<T, RemoteFailure> {
    let _one_at_a_time = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    let same = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|(o, _)| o == options);
    if !same {
        let client = make_client(options)?;
        *CLIENT.write().unwrap_or_else(|p| p.into_inner()) = Some((options.clone(), client));
    }
    Ok(open())
}

/// A client made from `options`.
fn make_client(options: &RemoteOptions) -> Result<Client, RemoteFailure> {
    let bearer_token = match &options.bearer_token_file {
        Some(file) => Some(read_token(file)?),
        None => None,
    };
    let timeout = options.remote_timeout.max(Duration::from_millis(100));
    if options.remote_deadline < timeout {
        return Err(RemoteFailure::Usage(format!(
            "--remote-deadline ({} s) bounds a whole request, --remote-timeout ({} s) each wait within it: the \
             deadline must not be shorter",
            options.remote_deadline.as_secs_f64(),
            timeout.as_secs_f64()
        )));
    }
    let config = Config {
        concurrency: options.remote_concurrency.into(),
        timeout,
        deadline: options.remote_deadline,
        tries: options.remote_tries,
        endpoint_url: options.endpoint_url.clone(),
        no_sign_request: options.no_sign_request,
        profile: options.profile.clone(),
        bearer_token,
        allow_http: options.allow_http,
        // One line per retry on a terminal: a slow or failing server is never silent.
        on_retry: Some(stagefs_remote::RetryHook::new(crate::report::notice)),
        files: files(),
        ..Config::default()
    };
    Ok(Client::new(config)?)
}

/// The process's client (made with default options if no command configured it): a
/// handle on it, cheap to clone.
pub fn client() -> Result<Client, RemoteError> {
    if let Some((_, client)) = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(client.clone());
    }
    let client = Client::new(Config { files: files(), ..Config::default() })?;
    let mut slot = CLIENT.write().unwrap_or_else(|p| p.into_inner());
    Ok(slot.get_or_insert((RemoteOptions::default(), client)).1.clone())
}

/// The door the client reads its files through (credentials, CA bundles, tokens,
/// `~/.netrc`): `places::read_own_file`, the user's own files only.
fn files() -> stagefs_remote::Files {
    stagefs_remote::Files::new(|path, cap| match crate::places::read_own_file(path, cap) {
        Ok(file) => Ok(file.map(|(bytes, mode)| stagefs_remote::ReadFile { bytes, mode })),
        Err(e) => Err(stagefs_remote::FileError::Refused(Box::new(e))),
    })
}

/// A token file, read as the user's own files are (`places::read_own_file`) and checked as
/// ssh checks keys: a token others can read is no secret.
fn read_token(file: &Path) -> Result<Secret, RemoteFailure> {
    let usage = |why: String| RemoteFailure::Usage(format!("--bearer-token-file {}: {why}", file.shown()));
    let read = crate::places::read_own_file(file, 1 << 20).map_err(|e| usage(e.to_string()))?;
    let (bytes, mode) = read.ok_or_else(|| usage("it does not exist".into()))?;
    if mode & 0o077 != 0 {
        return Err(usage(format!("other users can read it (mode {mode:04o}); chmod 600 it first")));
    }
    let text = String::from_utf8(bytes).map_err(|_| usage("it is not text".into()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(['\n', '\r']) {
        return Err(usage("it must hold one token on one line".into()));
    }
    Ok(Secret::new(token))
}

/// A remote spec or option that cannot be used, or the store's answer to it (exit codes
/// are given in `error.rs`, with every other failure's; opening an object fails with
/// `OpenArchiveError::Remote`).
#[derive(Debug, thiserror::Error)]
pub enum RemoteFailure {
    #[error("{0}")]
    Store(#[from] RemoteError),
    /// A wrong option or spec (exit 2).
    #[error("{0}")]
    Usage(String),
}

/// The URL in `path`.
pub fn parse(path: &Path) -> Result<ObjectUrl, RemoteError> {
    let text = path.to_str().ok_or_else(|| RemoteError::BadUrl("a URL must be UTF-8".into()))?;
    let allow_http = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|(o, _)| o.allow_http);
    ObjectUrl::parse(text, allow_http).map_err(|e| RemoteError::BadUrl(e.to_string()))
}
