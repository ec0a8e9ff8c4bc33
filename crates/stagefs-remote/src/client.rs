//! The client: one blocking HTTP agent (ureq, rustls), requests addressed and signed for S3 or authenticated for HTTP, answers sorted into errors, retries with backoff.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::credentials::Chain;
use crate::error::RemoteError;
use crate::secret::Secret;
use crate::sigv4::{self, EMPTY_SHA256};
use crate::url::{display_text, HttpUrl, ObjectUrl};

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
    pub(crate) chain: Chain,
    /// A custom S3 endpoint and where it came from ("--endpoint-url", "$AWS_ENDPOINT_URL").
    pub(crate) endpoint: Option<(HttpUrl, String)>,
    /// The CA certificates trusted, where they came from, and whether they can be used.
    trust: crate::trust::Trust,
    /// Region per bucket once a store said where a bucket lives (AWS redirects).
    pub(crate) regions: Mutex<std::collections::HashMap<String, String>>,
    region: String,
    pub(crate) netrc: Vec<crate::netrc::Entry>,
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
        let chain = Chain::new(config.profile.as_deref(), config.no_sign_request, &config.files);
        let named = config.endpoint_url.clone().map(|url| (url, "--endpoint-url".to_string()));
        let endpoint = match named.or_else(|| chain.endpoint()) {
            Some((text, from)) => match ObjectUrl::parse(&text, true) {
                Ok(ObjectUrl::Http(u)) if !u.tls && !config.allow_http && !u.is_loopback() => {
                    return Err(RemoteError::BadUrl(format!(
                        "the endpoint {} (from {from}) is plain http:// to another machine; use https://, or pass \
                         --allow-http for a network you trust",
                        crate::url::display_unparsed(&text)
                    )))
                }
                Ok(ObjectUrl::Http(u)) => Some((u, from)),
                _ => {
                    return Err(RemoteError::BadUrl(format!(
                        "the endpoint URL {} (from {from}) is not an http:// or https:// URL",
                        crate::url::display_unparsed(&text)
                    )))
                }
            },
            None => None,
        };
        let trust = crate::trust::load(&config.files);
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_global(Some(config.deadline))
                .timeout_connect(Some(config.timeout))
                .timeout_recv_response(Some(config.timeout))
                .timeout_per_read(Some(config.timeout))
                .timeout_per_write(Some(config.timeout))
                .max_idle_connections(config.concurrency.max(1) * 2)
                .max_idle_connections_per_host(config.concurrency.max(1) * 2)
                .user_agent(concat!("stagefs/", env!("CARGO_PKG_VERSION")))
                .tls_config(trust.config.clone())
                .build(),
        );
        let region = chain.region();
        let netrc = crate::netrc::load(&config.files);
        let permits = Permits::new(config.concurrency.max(1));
        Ok(Client {
            inner: Arc::new(Inner {
                agent,
                config,
                chain,
                endpoint,
                trust,
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
        self.retrying(&|| false, || {
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
                _ => return Err(self.refusal(answer, url, &what)),
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
        self.retrying(&|| false, || {
            let answer = self.send(&Ask { method: "GET", url, query: &[], headers: vec![], body: None })?;
            match answer.status().as_u16() {
                200 => {
                    let mut body = answer.into_body();
                    let bytes = body.with_config().limit(limit).read_to_vec().map_err(|e| match e {
                        ureq::Error::BodyExceedsLimit(_) => {
                            RemoteError::Unsupported(format!("{what}: larger than {limit} bytes"))
                        }
                        e => self.failed(url, &e),
                    })?;
                    Ok(Some(bytes))
                }
                403 | 404 => Ok(None),
                _ => Err(self.refusal(answer, url, &what)),
            }
        })
    }

    /// Uploads `bytes` as the object at `url` (one PUT).
    pub fn put(&self, url: &ObjectUrl, bytes: &[u8]) -> Result<(), RemoteError> {
        let what = url.shown();
        self.retrying(&|| false, || {
            let answer = self.send(&Ask { method: "PUT", url, query: &[], headers: vec![], body: Some(bytes) })?;
            match answer.status().as_u16() {
                200..=299 => Ok(()),
                _ => Err(self.refusal(answer, url, &what)),
            }
        })
    }

    /// One try of `ask`: addressed, authenticated, sent. Transport failures come back as
    /// `failure` sorts them; any status is returned as it is.
    pub(crate) fn send(&self, ask: &Ask) -> Result<Answer, RemoteError> {
        let (url, authentication) = self.address(ask)?;
        if let (Some(problem), true) = (&self.inner.trust.problem, url.expose().starts_with("https://")) {
            return Err(RemoteError::BadUrl(format!("{}: {problem}", ask.url.shown())));
        }
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
        sent.map_err(|e| self.failed(ask.url, &e))
    }

    /// The error for a request to `url` that got no answer.
    pub(crate) fn failed(&self, url: &ObjectUrl, e: &ureq::Error) -> RemoteError {
        self.with_context(url, |cx| crate::failure::request(e, cx))
    }

    /// The error for a body read from `url` that failed at byte `at`.
    pub(crate) fn failed_reading(&self, url: &ObjectUrl, e: &std::io::Error, at: u64) -> RemoteError {
        self.with_context(url, |cx| crate::failure::body(e, at, cx))
    }

    /// Where requests for `url` go, in the words of a failure.
    fn with_context(&self, url: &ObjectUrl, f: impl FnOnce(&crate::failure::Context) -> RemoteError) -> RemoteError {
        let what = url.shown();
        let (name, host, from) = match (url, &self.inner.endpoint) {
            (ObjectUrl::Http(u), _) => (u.bare_host().to_string(), authority(u), String::new()),
            (ObjectUrl::S3 { .. }, Some((e, from))) => {
                (e.bare_host().to_string(), authority(e), format!(" (the endpoint from {from})"))
            }
            (ObjectUrl::S3 { bucket, .. }, None) => {
                let host = self.aws_host(bucket, &self.region_of(bucket));
                (host.clone(), host, String::new())
            }
        };
        let (name, host) = (display_text(&name), display_text(&host));
        let trust = &self.inner.trust.source;
        f(&crate::failure::Context {
            what: &what,
            name: &name,
            host: &host,
            from: &from,
            trust,
            config: &self.inner.config,
        })
    }

    /// The region requests for `bucket` are signed for.
    fn region_of(&self, bucket: &str) -> String {
        let region = self.inner.regions.lock().unwrap_or_else(|p| p.into_inner()).get(bucket).cloned();
        region.unwrap_or_else(|| self.inner.region.clone())
    }

    /// AWS's host for `bucket`: virtual-hosted, except for a bucket with dots, which breaks
    /// the TLS name check of virtual-hosted addresses.
    fn aws_host(&self, bucket: &str, region: &str) -> String {
        match bucket.contains('.') {
            true => format!("s3.{region}.amazonaws.com"),
            false => format!("{bucket}.s3.{region}.amazonaws.com"),
        }
    }

    /// The URL to send `ask` to and the headers that authenticate it (all kept as secrets:
    /// the URL may be presigned, the headers hold signatures and tokens).
    fn address(&self, ask: &Ask) -> Result<(Secret, Vec<(String, Secret)>), RemoteError> {
        let (bucket, key) = match ask.url {
            ObjectUrl::Http(u) => return Ok((u.request_url(), self.http_auth(u))),
            ObjectUrl::S3 { bucket, key } => (bucket, key),
        };
        let region = self.region_of(bucket);
        let encoded_key = sigv4::uri_encode(key, false);
        let (origin, host, path) = match &self.inner.endpoint {
            // Custom endpoints (MinIO, Ceph, s3s) get path-style requests: their buckets
            // rarely have DNS names.
            Some((e, _)) => {
                let base = e.path.trim_end_matches('/');
                (e.origin(), host_header(e), format!("{base}/{bucket}/{encoded_key}"))
            }
            None => {
                let host = self.aws_host(bucket, &region);
                let path =
                    if bucket.contains('.') { format!("/{bucket}/{encoded_key}") } else { format!("/{encoded_key}") };
                (format!("https://{host}"), host, path)
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
}

/// `host:port` as connected to (the scheme's port when the URL names none).
fn authority(u: &HttpUrl) -> String {
    format!("{}:{}", u.host, u.port.unwrap_or(if u.tls { 443 } else { 80 }))
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
