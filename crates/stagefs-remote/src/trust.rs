//! Which CA certificates the client trusts, in one stated order (`AWS_CA_BUNDLE`, then `SSL_CERT_FILE`, then the system bundle, then Mozilla's roots built in), and where that choice came from, for every message about a certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The trust of one client.
pub(crate) struct Trust {
    pub config: ureq::tls::TlsConfig,
    /// Where the CA certificates came from, in words for messages:
    /// "CA bundle from $AWS_CA_BUNDLE=/etc/x.pem (over $SSL_CERT_FILE=/y.pem)".
    pub source: String,
    /// A bundle named by a variable that cannot be used: every TLS request fails with
    /// this, rather than trusting other CAs than the ones the user named.
    pub problem: Option<String>,
}

/// Where clusters' distributions keep the system bundle (with the site's own CAs added).
const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu
    "/etc/pki/tls/certs/ca-bundle.crt",   // RHEL, Rocky, Alma
    "/etc/ssl/ca-bundle.pem",             // SUSE
];

/// The variables that name a bundle, the first set one winning: `AWS_CA_BUNDLE` first, as
/// aws-cli reads it (a machine-wide setting for S3 that also covers https:// URLs here:
/// one client, one trust), then `SSL_CERT_FILE` (curl's, OpenSSL's).
const VARIABLES: [&str; 2] = ["AWS_CA_BUNDLE", "SSL_CERT_FILE"];

pub(crate) fn load(files: &crate::files::Files) -> Trust {
    let set: Vec<(&str, PathBuf)> = VARIABLES
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()).map(|v| (*k, PathBuf::from(v))))
        .collect();
    if let Some((name, path)) = set.first() {
        let mut source = format!("CA bundle from ${name}={}", crate::url::display_text(&path.to_string_lossy()));
        if let Some((other, other_path)) = set.get(1).filter(|(_, p)| p != path) {
            let other_path = crate::url::display_text(&other_path.to_string_lossy());
            source += &format!(" (it takes precedence over ${other}={other_path})");
        }
        return match certificates(files, path) {
            Ok(certs) => Trust { config: specific(certs), source, problem: None },
            Err(why) => Trust {
                config: webpki(),
                problem: Some(format!("{source}: {why}; fix the path or unset {name}")),
                source,
            },
        };
    }
    for path in SYSTEM_BUNDLES.iter().map(Path::new) {
        if let Ok(certs) = certificates(files, path) {
            let source = format!("CA bundle of the system ({})", crate::url::display_text(&path.to_string_lossy()));
            return Trust { config: specific(certs), source, problem: None };
        }
    }
    let source = "Mozilla's CA certificates built into stagefs (no system bundle found)".into();
    Trust { config: webpki(), source, problem: None }
}

/// The certificates of a PEM file, read through `files`, or why there are none.
fn certificates(files: &crate::files::Files, path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    let pem = match files.read(path, 64 << 20) {
        Ok(Some(file)) => file.bytes,
        Ok(None) => return Err("cannot read it (it does not exist)".into()),
        Err(why) => return Err(format!("cannot read it ({why})")),
    };
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err("it holds no PEM certificate".into());
    }
    Ok(certs)
}

fn specific(certs: Vec<ureq::tls::Certificate<'static>>) -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs))).build()
}

fn webpki() -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::WebPki).build()
}
