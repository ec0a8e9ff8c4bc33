//! Object URLs: `s3://bucket/key`, `https://host/path` and `http://` (loopback or opted in), parsed once, shown without credentials or query strings.

use crate::secret::Secret;

/// Where an object lives.
#[derive(Clone, PartialEq, Eq)]
pub enum ObjectUrl {
    /// An object in an S3-compatible store; the endpoint comes from the client's config.
    S3 { bucket: String, key: String },
    /// A file on an HTTP(S) server.
    Http(HttpUrl),
}

/// An `http://` or `https://` URL, split where requests and messages need it.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub tls: bool,
    /// Host name or address as written (IPv6 in brackets), without the port.
    pub host: String,
    pub port: Option<u16>,
    /// The path, starting with `/`, as written (already percent-encoded where needed).
    pub path: String,
    /// The query string without `?` (a presigned URL's signature): sent, never shown.
    pub query: Option<Secret>,
    /// `user:password@` in the URL (HTTP basic authentication): sent, never shown.
    pub userinfo: Option<Secret>,
}

/// Why text is not an object URL stagefs can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError(pub String);

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlError {}

/// True for text that names an object (`s3://`, `http://`, `https://`), not a local path.
pub fn is_url(text: &str) -> bool {
    let lower = text.get(..8).unwrap_or(text).to_ascii_lowercase();
    lower.starts_with("s3://") || lower.starts_with("http://") || lower.starts_with("https://")
}

impl ObjectUrl {
    /// Parses `text`. Plain `http://` is refused unless it points at this machine
    /// (loopback) or `allow_http` (`--allow-http`): anyone on the path could change the
    /// bytes, and credentials would travel in clear.
    pub fn parse(text: &str, allow_http: bool) -> Result<ObjectUrl, UrlError> {
        let bad = |why: &str| UrlError(format!("{}: {why}", display_unparsed(text)));
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("not a URL"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if !valid_bucket(bucket) {
                    return Err(bad("the bucket name must be 3 to 63 letters, digits, dots and hyphens"));
                }
                Ok(ObjectUrl::S3 { bucket: bucket.to_string(), key: key.to_string() })
            }
            "http" | "https" => {
                let tls = scheme.eq_ignore_ascii_case("https");
                let (authority, path_query) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, "/"),
                };
                let (path_query, _fragment) = path_query.split_once('#').unwrap_or((path_query, ""));
                let (path, query) = match path_query.split_once('?') {
                    Some((p, q)) => (p.to_string(), Some(Secret::new(q))),
                    None => (path_query.to_string(), None),
                };
                let (userinfo, hostport) = match authority.rsplit_once('@') {
                    Some((u, h)) => (Some(Secret::new(u)), h),
                    None => (None, authority),
                };
                let (host, port) = split_port(hostport).ok_or_else(|| bad("bad host or port"))?;
                if host.is_empty() {
                    return Err(bad("no host"));
                }
                if text.bytes().any(|b| b <= b' ' || b == 0x7f) {
                    return Err(bad("spaces and control characters must be percent-encoded in a URL"));
                }
                let url = HttpUrl { tls, host, port, path, query, userinfo };
                if !tls && !allow_http && !url.is_loopback() {
                    return Err(bad(
                        "plain http:// is refused except to this machine (127.0.0.1, ::1, localhost): anyone on the \
                         way could change the bytes; use https://, or pass --allow-http for a network you trust",
                    ));
                }
                Ok(ObjectUrl::Http(url))
            }
            _ => Err(bad("stagefs reads s3://, https:// and http:// URLs")),
        }
    }

    /// The URL for messages, logs and `stagefs status`: no query string, no user or
    /// password, control characters escaped.
    pub fn shown(&self) -> String {
        match self {
            ObjectUrl::S3 { bucket, key } => display_text(&format!("s3://{bucket}/{key}")),
            ObjectUrl::Http(u) => display_text(&format!("{}{}", u.origin(), u.path)),
        }
    }

    /// The object's name: the last part of its key or path (`train.tar`).
    pub fn file_name(&self) -> String {
        let path = match self {
            ObjectUrl::S3 { key, .. } => key.as_str(),
            ObjectUrl::Http(u) => u.path.as_str(),
        };
        path.rsplit('/').next().unwrap_or("").to_string()
    }

    /// The object beside this one whose name ends in `suffix` (`KEY.stagefs-index`); an
    /// HTTP URL's query (a presigned signature, valid for this object only) is dropped.
    pub fn with_suffix(&self, suffix: &str) -> ObjectUrl {
        match self {
            ObjectUrl::S3 { bucket, key } => ObjectUrl::S3 { bucket: bucket.clone(), key: format!("{key}{suffix}") },
            ObjectUrl::Http(u) => {
                ObjectUrl::Http(HttpUrl { path: format!("{}{suffix}", u.path), query: None, ..u.clone() })
            }
        }
    }

    /// The same place with another key or path (`key` as the listing gave it, for S3).
    pub fn with_key(&self, key: &str) -> ObjectUrl {
        match self {
            ObjectUrl::S3 { bucket, .. } => ObjectUrl::S3 { bucket: bucket.clone(), key: key.to_string() },
            ObjectUrl::Http(u) => ObjectUrl::Http(HttpUrl { path: key.to_string(), query: None, ..u.clone() }),
        }
    }

    /// The full URL to send (with its query and user), for HTTP; `None` for S3.
    pub fn http(&self) -> Option<&HttpUrl> {
        match self {
            ObjectUrl::Http(u) => Some(u),
            ObjectUrl::S3 { .. } => None,
        }
    }
}

impl std::fmt::Debug for ObjectUrl {
    /// As [`ObjectUrl::display`]: a debug print must not leak a presigned signature.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl HttpUrl {
    /// `https://host:port`.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        match self.port {
            Some(port) => format!("{scheme}://{}:{port}", self.host),
            None => format!("{scheme}://{}", self.host),
        }
    }

    /// What a request is sent to: origin, path and query (a secret when presigned), no user.
    pub fn request_url(&self) -> Secret {
        match &self.query {
            Some(q) => Secret::new(format!("{}{}?{}", self.origin(), self.path, q.expose())),
            None => Secret::new(format!("{}{}", self.origin(), self.path)),
        }
    }

    /// The host without IPv6 brackets (for `~/.netrc` and loopback checks).
    pub fn bare_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    pub fn is_loopback(&self) -> bool {
        let host = self.bare_host();
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// `host:port` (or `[v6]:port`) split; `None` for a port that does not parse.
fn split_port(hostport: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((format!("[{v6}]"), port));
    }
    match hostport.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), Some(port.parse().ok()?))),
        None => Some((hostport.to_string(), None)),
    }
}

/// S3's bucket naming rules (the lenient, path-style ones S3-compatible stores accept).
fn valid_bucket(bucket: &str) -> bool {
    (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

/// Text from outside (a URL someone else chose, a server's message) as one printable
/// line: control characters, bidi overrides and backslashes escaped; the query string
/// and user of a URL are not this function's business (see [`ObjectUrl::display`]).
pub fn display_text(text: &str) -> String {
    stagefs_text::escape(text.as_bytes())
}

/// A URL as the user wrote it, for a message about text that did not parse: its query
/// and user cut off, escaped.
fn strip_secrets(text: &str) -> String {
    let text = text.split(['?', '#']).next().unwrap_or(text);
    match text.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => text.to_string(),
    }
}

/// Escaped, secrets cut off: for messages about `text` before it parsed.
pub fn display_unparsed(text: &str) -> String {
    display_text(&strip_secrets(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_and_https_urls_parse_and_show_no_secrets() {
        let s3 = ObjectUrl::parse("s3://my-bucket/shards/train 1.tar", false).unwrap();
        assert_eq!(s3, ObjectUrl::S3 { bucket: "my-bucket".into(), key: "shards/train 1.tar".into() });
        assert_eq!(s3.shown(), "s3://my-bucket/shards/train 1.tar");
        assert_eq!(s3.file_name(), "train 1.tar");
        assert_eq!(s3.with_suffix(".stagefs-index").shown(), "s3://my-bucket/shards/train 1.tar.stagefs-index");
        let signed = "https://alice:hunter2@data.example.org:8443/sets/a.tar?X-Amz-Signature=abc&X-Amz-Credential=k#f";
        let https = ObjectUrl::parse(signed, false).unwrap();
        let u = https.http().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("data.example.org", Some(8443), "/sets/a.tar"));
        assert_eq!(
            u.request_url().expose(),
            "https://data.example.org:8443/sets/a.tar?X-Amz-Signature=abc&X-Amz-Credential=k"
        );
        assert_eq!(u.userinfo.as_ref().map(Secret::expose), Some("alice:hunter2"));
        let shown = https.shown();
        assert_eq!(shown, "https://data.example.org:8443/sets/a.tar");
        assert!(!format!("{https:?}").contains("hunter2") && !format!("{https:?}").contains("Signature"));
        assert_eq!(https.with_suffix(".stagefs-index").http().unwrap().query, None);
        let v6 = ObjectUrl::parse("http://[::1]:8080/x.tar", false).unwrap();
        assert!(v6.http().unwrap().is_loopback());
    }

    #[test]
    fn plain_http_only_to_loopback_unless_allowed_and_bad_text_is_refused_escaped() {
        assert!(ObjectUrl::parse("http://127.0.0.1:9/x.tar", false).is_ok());
        assert!(ObjectUrl::parse("http://localhost/x.tar", false).is_ok());
        let err = ObjectUrl::parse("http://data.example.org/x.tar", false).unwrap_err().to_string();
        assert!(err.contains("--allow-http"), "{err}");
        assert!(ObjectUrl::parse("http://data.example.org/x.tar", true).is_ok());
        assert!(ObjectUrl::parse("s3://x/k", false).is_err(), "bucket too short");
        assert!(ObjectUrl::parse("ftp://host/k", false).is_err());
        let err = ObjectUrl::parse("https://u:secret@h/a\x1b[31m.tar?sig=1", false).unwrap_err().to_string();
        assert!(!err.contains('\x1b') && !err.contains("secret") && !err.contains("sig=1"), "{err}");
        assert!(is_url("S3://b/k") && is_url("https://h/") && !is_url("/data/s3:/x") && !is_url("data.tar"));
        assert_eq!(display_unparsed("https://u:p@h/x?y"), "https://h/x");
    }
}
