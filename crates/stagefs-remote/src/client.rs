//! The client: one blocking HTTP agent (ureq, rustls), requests addressed and signed for S3 or authenticated for HTTP, answers sorted into errors, retries with backoff.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use crate::credentials::Chain;
use crate::error::RemoteError;
use crate::sigv4::{self, EMPTY_SHA256};
use crate::url::{display_text, HttpUrl, ObjectUrl};
use crate::Secret;

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
}

impl Default for Config {
    fn default() -> Config {
        Config {
            concurrency: 16,
            chunk_size: 8 << 20,
            timeout: Duration::from_secs(30),
            tries: 8,
            backoff: Duration::from_millis(200),
            endpoint_url: None,
            no_sign_request: false,
            profile: None,
            bearer_token: None,
            allow_http: false,
        }
    }
}

impl std::fmt::Debug for crate::client::Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client { .. }")
    }
}

/// One version of an object: what every later request is pinned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    /// The ETag as the server sent it (quotes included), if it sent one.
    pub etag: Option<String>,
    /// `Last-Modified` as the server sent it, if it did.
    pub last_modified: Option<String>,
}

impl Version {
    /// `Last-Modified` in seconds since 1970, if it parses.
    pub fn modified_unix(&self) -> Option<i64> {
        let at = httpdate::parse_http_date(self.last_modified.as_deref()?).ok()?;
        at.duration_since(SystemTime::UNIX_EPOCH).ok().map(|d| d.as_secs() as i64)
    }
}

/// An object and the version of it this process reads.
#[derive(Clone, Debug)]
pub struct Object {
    pub url: ObjectUrl,
    pub version: Version,
}

/// Shared by all threads: cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) agent: ureq::Agent,
    pub(crate) config: Config,
    chain: Chain,
    endpoint: Option<HttpUrl>,
    /// Region per bucket once a store said where a bucket lives (AWS redirects).
    regions: Mutex<std::collections::HashMap<String, String>>,
    region: String,
    netrc: Vec<crate::netrc::Entry>,
    /// Range requests in flight, bounded by `config.concurrency`.
    pub(crate) permits: Permits,
}

/// What one request asks for.
pub(crate) struct Ask<'a> {
    pub method: &'a str,
    pub url: &'a ObjectUrl,
    pub query: &'a [(&'a str, &'a str)],
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<&'a [u8]>,
}

pub(crate) type Answer = ureq::http::Response<ureq::Body>;

impl Client {
    pub fn new(config: Config) -> Result<Client, RemoteError> {
        let chain = Chain::new(config.profile.as_deref(), config.no_sign_request);
        let endpoint = match config.endpoint_url.clone().or_else(|| chain.endpoint()) {
            Some(text) => match ObjectUrl::parse(&text, true) {
                Ok(ObjectUrl::Http(u)) if !u.tls && !config.allow_http && !u.is_loopback() => {
                    return Err(RemoteError::BadUrl(format!(
                        "the endpoint {} is plain http:// to another machine; use https://, or pass --allow-http \
                         for a network you trust",
                        crate::url::display_unparsed(&text)
                    )))
                }
                Ok(ObjectUrl::Http(u)) => Some(u),
                _ => {
                    return Err(RemoteError::BadUrl(format!(
                        "the endpoint URL {} is not an http:// or https:// URL",
                        crate::url::display_unparsed(&text)
                    )))
                }
            },
            None => None,
        };
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_connect(Some(config.timeout))
                .timeout_recv_response(Some(config.timeout))
                .timeout_per_read(Some(config.timeout))
                .timeout_per_write(Some(config.timeout))
                .max_idle_connections(config.concurrency.max(1) * 2)
                .max_idle_connections_per_host(config.concurrency.max(1) * 2)
                .user_agent(concat!("stagefs/", env!("CARGO_PKG_VERSION")))
                .tls_config(crate::netrc::tls_config())
                .build(),
        );
        let region = chain.region();
        let netrc = crate::netrc::load();
        let permits = Permits::new(config.concurrency.max(1));
        Ok(Client {
            inner: Arc::new(Inner {
                agent,
                config,
                chain,
                endpoint,
                regions: Mutex::default(),
                region,
                netrc,
                permits,
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Size, ETag and Last-Modified of the object at `url`, by a GET of its first byte
    /// (a HEAD answer has no body, so a store could not say whether the bucket or the key
    /// is missing, nor why it refuses).
    pub fn stat(&self, url: &ObjectUrl) -> Result<Object, RemoteError> {
        let what = url.shown();
        self.retrying(&what, &|| false, || {
            let ask = Ask { method: "GET", url, query: &[], headers: vec![("range", "bytes=0-0".into())], body: None };
            let answer = self.send(&ask)?;
            let status = answer.status().as_u16();
            let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            let size = match status {
                206 => header("content-range").and_then(|r| parse_content_range(&r)).map(|(_, _, total)| total),
                // An empty object has no byte 0.
                416 => header("content-range").and_then(|r| r.strip_prefix("bytes */").and_then(|t| t.parse().ok())),
                // The server ignored Range: the body is the whole object, and is not read.
                200 => header("content-length").and_then(|l| l.parse().ok()),
                _ => return Err(self.refusal(answer, &what)),
            };
            let size = size.ok_or_else(|| {
                RemoteError::Unsupported(format!("{what}: the server did not say how large the object is"))
            })?;
            let version = Version { size, etag: header("etag"), last_modified: header("last-modified") };
            Ok(Object { url: url.clone(), version })
        })
    }

    /// A small object whole (a saved index beside the archive), at most `limit` bytes;
    /// `None` when there is none (or it may not be read).
    pub fn get_small(&self, url: &ObjectUrl, limit: u64) -> Result<Option<Vec<u8>>, RemoteError> {
        let what = url.shown();
        self.retrying(&what, &|| false, || {
            let answer = self.send(&Ask { method: "GET", url, query: &[], headers: vec![], body: None })?;
            match answer.status().as_u16() {
                200 => {
                    let mut body = answer.into_body();
                    let bytes = body.with_config().limit(limit).read_to_vec().map_err(|e| match e {
                        ureq::Error::BodyExceedsLimit(_) => {
                            RemoteError::Unsupported(format!("{what}: larger than {limit} bytes"))
                        }
                        e => RemoteError::Unavailable(format!("{what}: {}", describe(&e))),
                    })?;
                    Ok(Some(bytes))
                }
                403 | 404 => Ok(None),
                _ => Err(self.refusal(answer, &what)),
            }
        })
    }

    /// Uploads `bytes` as the object at `url` (one PUT).
    pub fn put(&self, url: &ObjectUrl, bytes: &[u8]) -> Result<(), RemoteError> {
        let what = url.shown();
        self.retrying(&what, &|| false, || {
            let answer = self.send(&Ask { method: "PUT", url, query: &[], headers: vec![], body: Some(bytes) })?;
            match answer.status().as_u16() {
                200..=299 => Ok(()),
                _ => Err(self.refusal(answer, &what)),
            }
        })
    }

    /// Runs `attempt` until it succeeds, fails for good, or `config.tries` tries failed
    /// for transient reasons, pausing with exponential backoff and jitter in between;
    /// `cancelled` is polled during the pauses.
    pub(crate) fn retrying<T>(
        &self,
        what: &str,
        cancelled: &dyn Fn() -> bool,
        mut attempt: impl FnMut() -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        let tries = self.inner.config.tries.max(1);
        let mut expired_once = false;
        for n in 1.. {
            match attempt() {
                Err(RemoteError::Denied(m)) if m.contains("ExpiredToken") && !expired_once => {
                    // Temporary credentials ran out: fetch them again, once.
                    expired_once = true;
                    self.inner.chain.forget();
                }
                Err(e) if e.is_transient() && n < tries => {
                    tracing::info!("{what}: try {n} failed, trying again: {e}");
                    if !self.pause(n, cancelled) {
                        return Err(RemoteError::Cancelled);
                    }
                }
                Err(RemoteError::Unavailable(m)) => {
                    return Err(RemoteError::Unavailable(format!("{m} (gave up after {n} tries)")))
                }
                other => return other,
            }
        }
        unreachable!("the loop returns")
    }

    /// Sleeps the backoff before try `n + 1`; false if cancelled meanwhile.
    pub(crate) fn pause(&self, n: u32, cancelled: &dyn Fn() -> bool) -> bool {
        let base = self.inner.config.backoff.as_millis() as u64;
        let cap = base.saturating_mul(1 << n.min(16)).min(10_000);
        let wait = Duration::from_millis(cap / 2 + jitter(cap / 2 + 1));
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until {
            if cancelled() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20).min(wait));
        }
        !cancelled()
    }

    /// One try of `ask`: addressed, authenticated, sent. Transport failures come back as
    /// [`RemoteError::Unavailable`]; any status is returned as it is.
    pub(crate) fn send(&self, ask: &Ask) -> Result<Answer, RemoteError> {
        let (url, authentication) = self.address(ask)?;
        let mut builder = ureq::http::Request::builder().method(ask.method).uri(url.expose());
        for (k, v) in &authentication {
            builder = builder.header(k.as_str(), v.expose());
        }
        for (k, v) in &ask.headers {
            builder = builder.header(*k, v.as_str());
        }
        let what = ask.url.shown();
        let sent = match ask.body {
            Some(body) => builder.body(body).map(|r| self.inner.agent.run(r)),
            None => builder.body(()).map(|r| self.inner.agent.run(r)),
        };
        let sent = sent.map_err(|e| RemoteError::BadUrl(format!("{what}: cannot make a request: {e}")))?;
        sent.map_err(|e| RemoteError::Unavailable(format!("{what}: {}", describe(&e))))
    }

    /// The URL to send `ask` to and the headers that authenticate it (all kept as secrets:
    /// the URL may be presigned, the headers hold signatures and tokens).
    fn address(&self, ask: &Ask) -> Result<(Secret, Vec<(String, Secret)>), RemoteError> {
        let (bucket, key) = match ask.url {
            ObjectUrl::Http(u) => return Ok((u.request_url(), self.http_auth(u))),
            ObjectUrl::S3 { bucket, key } => (bucket, key),
        };
        let region = self.inner.regions.lock().unwrap_or_else(|p| p.into_inner()).get(bucket).cloned();
        let region = region.unwrap_or_else(|| self.inner.region.clone());
        let encoded_key = sigv4::uri_encode(key, false);
        let (origin, host, path) = match &self.inner.endpoint {
            // Custom endpoints (MinIO, Ceph, s3s) get path-style requests: their buckets
            // rarely have DNS names.
            Some(e) => {
                let base = e.path.trim_end_matches('/');
                (e.origin(), host_header(e), format!("{base}/{bucket}/{encoded_key}"))
            }
            // A bucket with dots breaks the TLS name check of virtual-hosted addresses.
            None if bucket.contains('.') => {
                let host = format!("s3.{region}.amazonaws.com");
                (format!("https://{host}"), host, format!("/{bucket}/{encoded_key}"))
            }
            None => {
                let host = format!("{bucket}.s3.{region}.amazonaws.com");
                (format!("https://{host}"), host, format!("/{encoded_key}"))
            }
        };
        let query = sigv4::canonical_query(ask.query);
        let url = if query.is_empty() { format!("{origin}{path}") } else { format!("{origin}{path}?{query}") };
        let url = Secret::new(url);
        let Some(credentials) = self.inner.chain.keys(&self.inner.agent)? else {
            return Ok((url, Vec::new()));
        };
        let payload = ask.body.map_or_else(|| EMPTY_SHA256.to_string(), sigv4::sha256_hex);
        let amz_date = crate::time::amz_date(SystemTime::now());
        let mut signed = vec![
            ("host".to_string(), Secret::new(host)),
            ("x-amz-content-sha256".to_string(), Secret::new(payload.clone())),
            ("x-amz-date".to_string(), Secret::new(amz_date.clone())),
        ];
        if let Some(token) = &credentials.keys.session_token {
            signed.push(("x-amz-security-token".to_string(), token.clone()));
        }
        let pairs: Vec<(&str, &str)> = signed.iter().map(|(k, v)| (k.as_str(), v.expose())).collect();
        let request = sigv4::Request {
            method: ask.method,
            encoded_path: &path,
            query: ask.query,
            headers: &pairs,
            payload_sha256: &payload,
        };
        let authorization = sigv4::authorization(&request, &credentials.keys, &region, &amz_date);
        signed.retain(|(k, _)| k != "host"); // ureq sends Host itself, the same value.
        signed.push(("authorization".to_string(), authorization));
        Ok((url, signed))
    }

    /// Authentication for an HTTP(S) URL: the bearer token, else the URL's user, else ~/.netrc.
    fn http_auth(&self, url: &HttpUrl) -> Vec<(String, Secret)> {
        if let Some(token) = &self.inner.config.bearer_token {
            return vec![("authorization".into(), Secret::new(format!("Bearer {}", token.expose().trim())))];
        }
        let basic = |user_pass: Secret| {
            let encoded = crate::netrc::base64(user_pass.expose().as_bytes());
            vec![("authorization".into(), Secret::new(format!("Basic {encoded}")))]
        };
        if let Some(userinfo) = &url.userinfo {
            return basic(Secret::new(crate::netrc::percent_decode(userinfo.expose())));
        }
        match crate::netrc::find(&self.inner.netrc, url.bare_host()) {
            Some(entry) => basic(Secret::new(format!("{}:{}", entry.login, entry.password.expose()))),
            None => Vec::new(),
        }
    }

    /// The error for an answer that is not what was asked: S3's error code and message
    /// (escaped) when the body has them, and advice for the usual causes.
    pub(crate) fn refusal(&self, answer: Answer, what: &str) -> RemoteError {
        let status = answer.status().as_u16();
        let bucket_region =
            answer.headers().get("x-amz-bucket-region").and_then(|v| v.to_str().ok()).map(str::to_string);
        let text = answer.into_body().with_config().limit(64 << 10).read_to_string().unwrap_or_default();
        let code = crate::xml::first(&text, "Code").unwrap_or_default();
        let message =
            crate::xml::first(&text, "Message").map(|m| format!(": {}", display_text(&m))).unwrap_or_default();
        let said =
            if code.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status} {}", display_text(&code)) };
        if let (Some(region), true) = (bucket_region, matches!(status, 301 | 307 | 400)) {
            if let Some(bucket) = what.strip_prefix("s3://").and_then(|r| r.split('/').next()) {
                // AWS says where the bucket lives: the next try goes there.
                self.inner.regions.lock().unwrap_or_else(|p| p.into_inner()).insert(bucket.into(), region.clone());
                return RemoteError::Unavailable(format!("{what}: the bucket is in region {}", display_text(&region)));
            }
        }
        match (status, code.as_str()) {
            (301 | 302 | 303 | 307 | 308, _) => RemoteError::Unsupported(format!(
                "{what}: the server redirects ({said}); stagefs does not follow redirects (each request must reach \
                 the same version of one object): mount the URL it redirects to"
            )),
            (404, "NoSuchBucket") => RemoteError::NotFound(format!("{what}: no such bucket ({said}{message})")),
            (404, _) => {
                RemoteError::NotFound(format!("{what}: no such object ({said}{message}); check the key or path"))
            }
            (401 | 403, _) | (400, "ExpiredToken" | "InvalidToken" | "AuthorizationHeaderMalformed") => {
                RemoteError::Denied(format!(
                    "{what}: access denied ({said}{message}); {}",
                    self.credential_advice(what)
                ))
            }
            (412, _) => RemoteError::Changed(format!(
                "{what}: the object was replaced while stagefs read it ({said}); mount again to read the new version"
            )),
            (408 | 429 | 500..=599, _) => {
                RemoteError::Unavailable(format!("{what}: the server is busy or failing ({said}{message})"))
            }
            _ => RemoteError::Unsupported(format!("{what}: unexpected answer ({said}{message})")),
        }
    }

    fn credential_advice(&self, what: &str) -> String {
        if what.starts_with("s3://") {
            let signing = if self.inner.config.no_sign_request {
                "the requests were unsigned (--no-sign-request)".to_string()
            } else {
                format!("credentials from the AWS chain (profile {})", display_text(self.inner.chain.profile_name()))
            };
            format!(
                "{signing}; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials, the \
                 bucket policy, and --endpoint-url for S3-compatible stores"
            )
        } else {
            "give credentials with --bearer-token-file FILE or a ~/.netrc entry for the host".into()
        }
    }
}

/// `Host` as an endpoint URL names it (port included unless it is the scheme's default).
fn host_header(u: &HttpUrl) -> String {
    match u.port {
        Some(p) if !((u.tls && p == 443) || (!u.tls && p == 80)) => format!("{}:{p}", u.host),
        _ => u.host.clone(),
    }
}

/// `bytes START-END/TOTAL` of a `Content-Range` header.
pub(crate) fn parse_content_range(text: &str) -> Option<(u64, u64, u64)> {
    let rest = text.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// A transport error in words, without the URL (ureq's messages may carry the query).
pub(crate) fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(what) => format!("timed out ({what}): the server stopped answering"),
        ureq::Error::HostNotFound => "the host name does not resolve".into(),
        ureq::Error::ConnectionFailed => "cannot connect".into(),
        ureq::Error::Io(io) => format!("connection failed: {}", io.kind()),
        ureq::Error::Tls(t) => format!("TLS failed: {t}"),
        ureq::Error::Protocol(p) => format!("bad HTTP from the server: {p}"),
        // Its text is the URL, query (a presigned signature) included.
        ureq::Error::BadUri(_) => "the URL is not one ureq can send".into(),
        other => format!("request failed: {}", other.to_string().split(" http").next().unwrap_or("error")),
    }
}

/// A few random-enough milliseconds below `range` (spreads retries of many threads).
fn jitter(range: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() % range.max(1)
}

/// A counting semaphore: range requests in flight across all fetches of the process.
pub(crate) struct Permits {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Permits {
    fn new(n: usize) -> Permits {
        Permits { free: Mutex::new(n), freed: Condvar::new() }
    }

    /// Waits for a permit (polling `cancelled`); `None` if cancelled first.
    pub(crate) fn acquire(&self, cancelled: &dyn Fn() -> bool) -> Option<Permit<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            if cancelled() {
                return None;
            }
            free = self.freed.wait_timeout(free, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner()).0;
        }
        *free -= 1;
        Some(Permit(self))
    }
}

pub(crate) struct Permit<'a>(&'a Permits);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}
