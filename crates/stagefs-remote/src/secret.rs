//! [`Secret`]: credentials and what is derived from them (signed headers, presigned query strings), printed as `***` by `Display` and `Debug`; the text only through one explicit call.

use std::fmt;

/// A password, bearer token, secret key, session token, signed `Authorization` header or
/// a presigned URL's query string (`X-Amz-Signature`, `X-Amz-Credential`,
/// `X-Amz-Security-Token`, ...).
///
/// `Display` and `Debug` print `***`, so that no message, log line or debug print of a
/// structure holding one can carry it by accident. The code that must send it calls
/// [`Secret::expose`]: grep for that name to find every place a secret leaves.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The clear text, for the request that sends it (and nothing else).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_as_stars_sent_as_is() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?} {:?} {:#?}", Some(&s), vec![s.clone()]), "*** *** Some(***) [\n    ***,\n]");
        assert_eq!(s.expose(), "hunter2");
        assert!(!Secret::default().expose().contains('*') && Secret::default().is_empty());
    }
}
