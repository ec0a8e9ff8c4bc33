//! An answer that is not what was asked, in words: S3's error code and message (escaped), and for a refusal what was sent and where it came from (which keys, which password), since each calls for a different fix.

use crate::client::{Answer, Client};
use crate::error::RemoteError;
use crate::secret::Secret;
use crate::url::{display_text, HttpUrl, ObjectUrl};

impl Client {
    /// The error for an answer that is not what was asked: S3's error code and message
    /// (escaped) when the body has them, and advice for the usual causes.
    pub(crate) fn refusal(&self, answer: Answer, url: &ObjectUrl, what: &str) -> RemoteError {
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
            (404, "NoSuchBucket") => {
                RemoteError::NotFound(format!("{what}: no such bucket ({said}{message}){}", self.endpoint_said()))
            }
            (404, _) => RemoteError::NotFound(format!(
                "{what}: no such object ({said}{message}){}; check the key or path",
                self.endpoint_said()
            )),
            (401 | 403, _) | (400, "ExpiredToken" | "InvalidToken" | "AuthorizationHeaderMalformed") => {
                let advice = match url {
                    ObjectUrl::S3 { .. } => self.s3_advice(),
                    ObjectUrl::Http(u) => self.http_advice(u),
                };
                RemoteError::Denied(format!("{what}: access denied ({said}{message}); {advice}"))
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

    /// Where the S3 requests went, when not to AWS: "; endpoint http://h:9000 from $AWS_ENDPOINT_URL".
    fn endpoint_said(&self) -> String {
        match &self.inner.endpoint {
            Some((url, from)) => format!("; endpoint {} from {from}", url.origin()),
            None => String::new(),
        }
    }

    /// What was sent to S3, from where, and where to look.
    fn s3_advice(&self) -> String {
        format!(
            "{}{}; check the keys, the profile (--profile, AWS_PROFILE), the bucket policy, and --endpoint-url for \
             S3-compatible stores",
            self.inner.chain.described(),
            self.endpoint_said()
        )
    }

    /// What was sent to an HTTP(S) server, as [`Client::http_auth`] chose it: a wrong
    /// password and no password call for different fixes.
    fn http_advice(&self, url: &HttpUrl) -> String {
        if self.inner.config.bearer_token.is_some() {
            return "the bearer token of --bearer-token-file was refused: check that it is current and meant for this \
                    server"
                .into();
        }
        let netrc = crate::netrc::shown_path();
        if let Some(userinfo) = &url.userinfo {
            let decoded = Secret::new(crate::netrc::percent_decode(userinfo.expose()));
            let (user, password) = decoded.expose().split_once(':').unwrap_or((decoded.expose(), ""));
            let user = display_text(user);
            return match password.is_empty() {
                true => format!(
                    "the URL names user {user} but no password: write https://{user}:PASSWORD@..., or give the \
                     password in a {netrc} entry"
                ),
                false => format!(
                    "the password in the URL for user {user} was refused: check it (in a URL, @ : / % are written \
                     %40 %3A %2F %25)"
                ),
            };
        }
        match crate::netrc::find(&self.inner.netrc, url.bare_host()) {
            Some(entry) => format!(
                "the password of the {netrc} entry for {} (login {}) was refused: check it",
                entry.machine.as_deref().map_or("every host (default)".into(), display_text),
                display_text(&entry.login)
            ),
            None => format!(
                "no credentials were sent: give them with --bearer-token-file FILE, as https://USER:PASSWORD@... in \
                 the URL, or in a {netrc} entry for {}",
                display_text(url.bare_host())
            ),
        }
    }
}
