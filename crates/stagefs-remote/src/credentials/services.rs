//! Temporary credentials from services: EC2 instance metadata (IMDSv2) and STS web identity (Kubernetes/IRSA, GitHub OIDC, Slurm-issued tokens).

use std::time::{Duration, SystemTime};

use super::profile::env;
use super::temporary::Temporary;
use crate::files::FileError;
use crate::secret::Secret;
use crate::sigv4::Keys;

/// Why a service gave no temporary credentials. Texts from outside (a role, STS's code and
/// message, a file's name) are held as [`crate::url::display_text`] shows them.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("instance metadata: {0}")]
    Imds(ureq::Error),
    #[error("instance metadata answered HTTP {0}")]
    ImdsStatus(u16),
    #[error("instance metadata credentials are not JSON: {0}")]
    ImdsJson(serde_json::Error),
    #[error("instance metadata credentials lack AccessKeyId or SecretAccessKey")]
    ImdsKeys,
    #[error("the web identity token file {file} does not exist")]
    NoToken { file: String },
    #[error("cannot read the web identity token file {file}: {why}")]
    Token { file: String, why: FileError },
    #[error("STS (web identity): {0}")]
    Sts(ureq::Error),
    #[error("STS refused the web identity token for role {role} (HTTP {status} {code}: {message})")]
    StsRefused { role: String, status: u16, code: String, message: String },
    #[error("STS answered without AccessKeyId or SecretAccessKey")]
    StsKeys,
    #[error("cannot run the profile's credential_process: {0}")]
    ProcessRun(std::io::Error),
    #[error("the profile's credential_process exited with {0}")]
    ProcessExit(std::process::ExitStatus),
    #[error("the profile's credential_process printed no JSON: {0}")]
    ProcessJson(serde_json::Error),
    #[error("the profile's credential_process printed no AccessKeyId or SecretAccessKey")]
    ProcessKeys,
    /// A service's answer could not be read.
    #[error("cannot read the answer: {0}")]
    Answer(ureq::Error),
}

/// IMDSv2: a session token by PUT, then the instance role's credentials. Off EC2 the
/// address does not answer: the short connect timeout keeps that to one second.
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT` moves it (tests), `AWS_EC2_METADATA_DISABLED=true` skips it.
pub fn imds(agent: &ureq::Agent) -> Result<Option<Temporary>, CredentialError> {
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| "http://169.254.169.254".into());
    let base = base.trim_end_matches('/');
    let quick = |r: ureq::RequestBuilder<ureq::typestate::WithBody>| {
        r.config().timeout_connect(Some(Duration::from_secs(1))).timeout_global(Some(Duration::from_secs(5))).build()
    };
    let token = match quick(agent.put(format!("{base}/latest/api/token")))
        .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
        .send_empty()
    {
        Ok(r) if r.status() == 200 => Secret::new(read_text(r)?),
        // Nothing there: not an EC2 instance (or metadata turned off).
        Ok(_) | Err(_) => return Ok(None),
    };
    let get = |path: &str| -> Result<String, CredentialError> {
        let r = agent
            .get(format!("{base}/latest/meta-data/iam/security-credentials/{path}"))
            .config()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .header("x-aws-ec2-metadata-token", token.expose().trim())
            .call()
            .map_err(CredentialError::Imds)?;
        match r.status().as_u16() {
            200 => read_text(r),
            404 => Ok(String::new()),
            code => Err(CredentialError::ImdsStatus(code)),
        }
    };
    let role = get("")?;
    let Some(role) = role.lines().next().map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(None); // An instance without a role.
    };
    let body = get(role)?;
    let json: serde_json::Value = serde_json::from_str(&body).map_err(CredentialError::ImdsJson)?;
    let field = |k: &str| json.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let (Some(access_key), Some(secret_key)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err(CredentialError::ImdsKeys);
    };
    let keys = Keys { access_key, secret_key: Secret::new(secret_key), session_token: field("Token").map(Secret::new) };
    let expires = field("Expiration").and_then(|e| crate::time::parse_iso8601(&e));
    Ok(Some(Temporary { keys, expires, source: "the EC2 instance role (IMDSv2)".into() }))
}

/// The web identity token in `token_file`, read through the client's door.
pub fn token(files: &crate::files::Files, token_file: &str) -> Result<Secret, CredentialError> {
    let file = crate::url::display_text(token_file);
    match files.text(std::path::Path::new(token_file), 64 << 10) {
        Ok(Some(text)) => Ok(Secret::new(text)),
        Ok(None) => Err(CredentialError::NoToken { file }),
        Err(why) => Err(CredentialError::Token { file, why }),
    }
}

/// `AssumeRoleWithWebIdentity`: the token (see [`token`]) exchanged at STS for the role's
/// credentials (an unsigned request: the token is the proof).
pub fn web_identity(
    agent: &ureq::Agent,
    token: Secret,
    role_arn: &str,
    region: &str,
) -> Result<Temporary, CredentialError> {
    let session = env("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| format!("stagefs-{}", std::process::id()));
    let endpoint = env("AWS_ENDPOINT_URL_STS")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
    let form = [
        ("Action", "AssumeRoleWithWebIdentity"),
        ("Version", "2011-06-15"),
        ("RoleArn", role_arn),
        ("RoleSessionName", session.as_str()),
        ("WebIdentityToken", token.expose().trim()),
    ];
    let body = Secret::new(crate::sigv4::canonical_query(&form));
    let response = agent
        .post(endpoint.trim_end_matches('/').to_string() + "/")
        .config()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .header("content-type", "application/x-www-form-urlencoded")
        .send(body.expose().as_bytes())
        .map_err(CredentialError::Sts)?;
    let status = response.status().as_u16();
    let text = read_text(response)?;
    if status != 200 {
        let code = crate::xml::first(&text, "Code").unwrap_or_default();
        let message = crate::xml::first(&text, "Message").unwrap_or_default();
        return Err(CredentialError::StsRefused {
            role: crate::url::display_text(role_arn),
            status,
            code: crate::url::display_text(&code),
            message: crate::url::display_text(&message),
        });
    }
    let field = |k: &str| crate::xml::first(&text, k);
    let (Some(access_key), Some(secret_key)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err(CredentialError::StsKeys);
    };
    let keys =
        Keys { access_key, secret_key: Secret::new(secret_key), session_token: field("SessionToken").map(Secret::new) };
    let expires = field("Expiration").and_then(|e| crate::time::parse_iso8601(&e));
    Ok(Temporary { keys, expires, source: format!("web identity (role {})", crate::url::display_text(role_arn)) })
}

/// `credential_process` of a profile: a command that prints the credentials as JSON
/// (`{"Version": 1, "AccessKeyId": ..., "SecretAccessKey": ..., "SessionToken": ..., "Expiration": ...}`).
pub fn credential_process(command: &str) -> Result<Temporary, CredentialError> {
    let output = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(CredentialError::ProcessRun)?;
    if !output.status.success() {
        return Err(CredentialError::ProcessExit(output.status));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(CredentialError::ProcessJson)?;
    let field = |k: &str| json.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let (Some(access_key), Some(secret_key)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err(CredentialError::ProcessKeys);
    };
    let keys =
        Keys { access_key, secret_key: Secret::new(secret_key), session_token: field("SessionToken").map(Secret::new) };
    let expires = field("Expiration").and_then(|e| crate::time::parse_iso8601(&e));
    Ok(Temporary { keys, expires, source: "the profile's credential_process".into() })
}

/// A body read as text, at most 1 MiB (credential answers are a few hundred bytes).
fn read_text(response: ureq::http::Response<ureq::Body>) -> Result<String, CredentialError> {
    let mut body = response.into_body();
    body.with_config().limit(1 << 20).read_to_string().map_err(CredentialError::Answer)
}

/// When temporary credentials should be fetched again: 5 minutes before they expire.
pub fn stale(expires: Option<SystemTime>) -> bool {
    expires.is_some_and(|at| SystemTime::now() + Duration::from_secs(300) >= at)
}
