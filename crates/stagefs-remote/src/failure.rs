//! A request that got no answer, in words a user can act on (the host, the cause, where the setting came from), sorted by whether another try may help: a name that does not resolve and an untrusted certificate fail at once, a refused connection is tried briefly, timeouts and resets with the full backoff.

use std::io::ErrorKind;

use crate::config::Config;
use crate::error::RemoteError;

/// What the words of a failure need besides the error itself.
pub(crate) struct Context<'a> {
    /// The object, as shown.
    pub what: &'a str,
    /// The host name the request went to (an S3 endpoint's, not the bucket's).
    pub name: &'a str,
    /// `name:port`, as connected to.
    pub host: &'a str,
    /// Where the address came from when the URL does not say it, with a leading space
    /// (" (the endpoint from $AWS_ENDPOINT_URL)"); empty otherwise.
    pub from: &'a str,
    /// Where the trusted CA certificates came from (see `trust`).
    pub trust: &'a str,
    /// For its timeout and deadline.
    pub config: &'a Config,
}

/// How a failure is retried.
enum Class {
    /// Timeouts, resets, anything that may be over on the next try.
    Transient,
    /// Nothing listens: a few tries.
    Refused,
    /// The name or the certificate: no try.
    Unreachable,
}

/// The error for a request that ureq could not complete.
pub(crate) fn request(e: &ureq::Error, cx: &Context) -> RemoteError {
    if let ureq::Error::BadUri(_) = e {
        // Its text is the URL, query (a presigned signature) included: never quoted.
        return RemoteError::BadUrl(format!("{}: the URL is not one that can be sent", cx.what));
    }
    let (class, words) = classify(e, cx);
    error(class, format!("{}: {words}", cx.what))
}

/// The error for a body read that failed at byte `at` (ureq wraps its own errors,
/// timeouts included, in the reader's io errors).
pub(crate) fn body(e: &std::io::Error, at: u64, cx: &Context) -> RemoteError {
    let (class, words) = match e.get_ref().and_then(|inner| inner.downcast_ref::<ureq::Error>()) {
        Some(inner) => classify(inner, cx),
        None => io(e, cx),
    };
    error(class, format!("{}: reading at byte {at}: {words}", cx.what))
}

fn error(class: Class, message: String) -> RemoteError {
    match class {
        Class::Transient => RemoteError::Unavailable(message),
        Class::Refused => RemoteError::Refused(message),
        Class::Unreachable => RemoteError::Unreachable(message),
    }
}

fn classify(e: &ureq::Error, cx: &Context) -> (Class, String) {
    let host = cx.host;
    match e {
        ureq::Error::HostNotFound => unresolved("it has no address", cx),
        ureq::Error::Io(e) => io(e, cx),
        ureq::Error::Rustls(e) => tls(e, cx),
        ureq::Error::Timeout(t) => timeout(*t, cx),
        ureq::Error::Tls(why) => (Class::Transient, format!("TLS with {host} failed: {why}")),
        ureq::Error::ConnectionFailed => (Class::Transient, format!("cannot connect to {host}{}", cx.from)),
        ureq::Error::Protocol(p) => {
            (Class::Transient, format!("bad HTTP from {host}: {}", crate::url::display_text(&p.to_string())))
        }
        other => (Class::Transient, format!("the request to {host} failed: {other}")),
    }
}

fn io(e: &std::io::Error, cx: &Context) -> (Class, String) {
    let host = cx.host;
    if let Some(tls_error) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        return tls(tls_error, cx);
    }
    // getaddrinfo's failures, as std words them (kind Uncategorized, so only the text tells).
    let text = e.to_string();
    if let Some(detail) = text.strip_prefix("failed to lookup address information: ") {
        // EAI_AGAIN: the resolver did not answer, which may change; anything else means
        // the name has no address, which will not.
        return match detail.starts_with("Temporary failure") {
            true => (Class::Transient, format!("could not resolve {}{} for now ({detail})", cx.name, cx.from)),
            false => unresolved(detail, cx),
        };
    }
    match e.kind() {
        ErrorKind::ConnectionRefused => (
            Class::Refused,
            format!(
                "connection refused by {host}{}: nothing listens there (the server is down, or the port is wrong)",
                cx.from
            ),
        ),
        ErrorKind::TimedOut => (Class::Transient, format!("timed out: {host} stopped answering")),
        kind => (Class::Transient, format!("connection to {host} failed: {}", kind.to_string().to_lowercase())),
    }
}

fn unresolved(detail: &str, cx: &Context) -> (Class, String) {
    (Class::Unreachable, format!("could not resolve {}{} ({detail}); check the host name", cx.name, cx.from))
}

fn tls(e: &rustls::Error, cx: &Context) -> (Class, String) {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(why) = e else {
        return (Class::Transient, format!("TLS with {} failed: {e}", cx.host));
    };
    let hint = match why {
        C::UnknownIssuer => {
            ": no CA there signed it; name the CA's certificate with SSL_CERT_FILE (or AWS_CA_BUNDLE, which takes \
             precedence)"
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => ": it is another host's certificate",
        C::Expired | C::ExpiredContext { .. } => ": it has expired (or this machine's clock is wrong)",
        _ => "",
    };
    // The variant's name, without the details some carry (`ExpiredContext { time, .. }`).
    let kind = format!("{why:?}");
    let kind = kind.split([' ', '(', '{']).next().unwrap_or_default();
    let kind = kind.strip_suffix("Context").unwrap_or(kind);
    (Class::Unreachable, format!("certificate not trusted ({kind}) for host {}; {}{hint}", cx.name, cx.trust))
}

fn timeout(t: ureq::Timeout, cx: &Context) -> (Class, String) {
    let (host, seconds) = (cx.host, cx.config.timeout.as_secs_f64());
    let words = match t {
        ureq::Timeout::Global => format!(
            "the request took longer than its deadline ({} s, --remote-deadline): {host} sends too slowly",
            cx.config.deadline.as_secs_f64()
        ),
        ureq::Timeout::Resolve => format!("timed out resolving {}{} ({seconds} s)", cx.name, cx.from),
        ureq::Timeout::Connect => format!("timed out connecting to {host}{} ({seconds} s)", cx.from),
        t => format!("timed out ({t}, {seconds} s): {host} stopped answering"),
    };
    (Class::Transient, words)
}
