//! The AWS credential chain as users already have it set up, in aws-cli's order: environment, profile files, web identity, `credential_process`, the EC2 instance role; else anonymous.
//!
//! Written by hand (about 300 lines with `profile` and `services`) because the one crate
//! that does it, `aws-config`, brings the AWS SDK's async runtime along (see doc/remote.md).
//! Not supported: `role_arn` with `source_profile` (a signed STS AssumeRole), SSO
//! profiles (`aws sso login` caches), ECS container credentials.

mod profile;
mod services;
mod temporary;

use std::sync::Mutex;

use crate::error::RemoteError;
use crate::secret::Secret;
use crate::sigv4::Keys;
use profile::env;
pub use profile::Profile;
pub use temporary::Temporary;

/// The chain, resolved at the first signed request and again before temporary
/// credentials expire.
pub struct Chain {
    profile: Profile,
    anonymous: bool,
    cached: Mutex<Option<Option<Temporary>>>,
    /// How its files (config, credentials, a web identity token) are read.
    files: crate::files::Files,
}

impl Chain {
    /// `profile`: `--profile` (else `AWS_PROFILE`, else `default`); `anonymous`:
    /// `--no-sign-request`, never sign; `files`: the door its files are read through.
    pub fn new(profile: Option<&str>, anonymous: bool, files: &crate::files::Files) -> Chain {
        let profile = profile::load(profile, files);
        Chain { profile, anonymous, cached: Mutex::new(None), files: files.clone() }
    }

    /// `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else `us-east-1`.
    pub fn region(&self) -> String {
        env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| self.profile.get("region").map(str::to_string))
            .unwrap_or_else(|| "us-east-1".into())
    }

    /// A custom S3 endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
    /// `endpoint_url`; with where it came from, for messages.
    pub fn endpoint(&self) -> Option<(String, String)> {
        for variable in ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"] {
            if let Some(url) = env(variable) {
                return Some((url, format!("${variable}")));
            }
        }
        let url = self.profile.get("endpoint_url")?;
        Some((url.to_string(), format!("endpoint_url of profile {}", crate::url::display_text(&self.profile.name))))
    }

    /// The keys to sign with, `None` to send unsigned requests (`--no-sign-request`, or
    /// no credentials anywhere: a public bucket still works).
    pub fn keys(&self, agent: &ureq::Agent) -> Result<Option<Temporary>, RemoteError> {
        if let Some(missing) = self.profile.missing() {
            return Err(RemoteError::BadUrl(missing));
        }
        if self.anonymous {
            return Ok(None);
        }
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = cached.as_ref() {
            if !services::stale(found.as_ref().and_then(|t| t.expires)) {
                return Ok(found.clone());
            }
        }
        let found = self.resolve(agent).map_err(|e| RemoteError::Denied(e.to_string()))?;
        *cached = Some(found.clone());
        Ok(found)
    }

    /// Forgets cached credentials (after the store said they expired).
    pub fn forget(&self) {
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn resolve(&self, agent: &ureq::Agent) -> Result<Option<Temporary>, services::CredentialError> {
        if let (Some(access_key), Some(secret_key)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            let keys = Keys {
                access_key,
                secret_key: Secret::new(secret_key),
                session_token: env("AWS_SESSION_TOKEN").map(Secret::new),
            };
            let source = match keys.session_token {
                Some(_) => "AWS_ACCESS_KEY_ID and AWS_SESSION_TOKEN",
                None => "AWS_ACCESS_KEY_ID",
            };
            return Ok(Some(Temporary { keys, expires: None, source: source.into() }));
        }
        let p = &self.profile;
        if let (Some(access_key), Some(secret_key)) = (p.get("aws_access_key_id"), p.get("aws_secret_access_key")) {
            let keys = Keys {
                access_key: access_key.into(),
                secret_key: Secret::new(secret_key),
                session_token: p.get("aws_session_token").map(Secret::new),
            };
            let file = p.origin("aws_secret_access_key").unwrap_or_default();
            let source = format!("profile {} in {file}", crate::url::display_text(&p.name));
            return Ok(Some(Temporary { keys, expires: None, source }));
        }
        let token_file =
            env("AWS_WEB_IDENTITY_TOKEN_FILE").or_else(|| p.get("web_identity_token_file").map(Into::into));
        let role_arn = env("AWS_ROLE_ARN").or_else(|| p.get("role_arn").map(Into::into));
        if let (Some(token_file), Some(role_arn)) = (token_file, role_arn) {
            let token = services::token(&self.files, &token_file)?;
            return services::web_identity(agent, token, &role_arn, &self.region()).map(Some);
        }
        if let Some(command) = p.get("credential_process") {
            return services::credential_process(command).map(Some);
        }
        services::imds(agent)
    }

    /// Where the keys of the last signed request came from, in words for messages about a
    /// refusal: "keys from AWS_ACCESS_KEY_ID", "no credentials found ...".
    pub fn described(&self) -> String {
        if self.anonymous {
            return "the requests were unsigned (--no-sign-request)".into();
        }
        let profile = crate::url::display_text(&self.profile.name);
        match self.cached.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(Some(t)) => format!("keys from {}", t.source),
            Some(None) => format!(
                "no credentials found (not in AWS_ACCESS_KEY_ID, profile {profile}, web identity or instance \
                 metadata), so the requests were unsigned"
            ),
            None => format!("credentials from the AWS chain (profile {profile})"),
        }
    }
}
