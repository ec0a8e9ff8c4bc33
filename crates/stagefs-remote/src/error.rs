//! What can go wrong with an object, each error naming the object (never a credential) and saying what to do.

/// A failed request or fetch. Messages carry [`crate::ObjectUrl::display`] forms only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteError {
    /// The URL, an option or a setting (a profile, a CA bundle) cannot be used (a usage error).
    BadUrl(String),
    /// 404: no such object, or no such bucket.
    NotFound(String),
    /// 401/403, a bad signature, an unknown access key, or no credentials where needed.
    Denied(String),
    /// The object was replaced while it was read: its bytes would mix two versions.
    Changed(String),
    /// The server does not do what is needed (no Range support, no size).
    Unsupported(String),
    /// Timeouts, reset connections, 5xx and 429, still failing after every retry.
    Unavailable(String),
    /// Nothing listens at the address (connection refused): the server is down or the port
    /// is wrong. Tried again only a few times (see `retry::REFUSED_TRIES`).
    Refused(String),
    /// The host name does not resolve, or the server's certificate is not trusted: no other
    /// try could help, so there is none.
    Unreachable(String),
    /// Writing the fetched bytes (memfd or local disk) failed: `errno` tells ENOSPC apart.
    Write { what: String, errno: Option<i32> },
    /// The caller's cancellation check said stop (Ctrl-C).
    Cancelled,
}

impl RemoteError {
    /// Whether another try may succeed (connection trouble, 5xx, 429, timeouts).
    pub fn is_transient(&self) -> bool {
        matches!(self, RemoteError::Unavailable(_) | RemoteError::Refused(_))
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::BadUrl(m)
            | RemoteError::NotFound(m)
            | RemoteError::Denied(m)
            | RemoteError::Changed(m)
            | RemoteError::Unsupported(m)
            | RemoteError::Unavailable(m)
            | RemoteError::Refused(m)
            | RemoteError::Unreachable(m) => f.write_str(m),
            RemoteError::Write { what, .. } => f.write_str(what),
            RemoteError::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl std::error::Error for RemoteError {}
