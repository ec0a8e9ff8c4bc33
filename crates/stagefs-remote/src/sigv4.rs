//! AWS Signature Version 4 for S3 requests, by hand on ring's HMAC-SHA256 (about 100 lines; the `aws-sigv4` crate would bring the SDK's runtime crates along).

use ring::{digest, hmac};

use crate::secret::Secret;

/// SHA-256 of an empty payload, in hex: what GET, HEAD and listings send.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A credential: the key id (not secret, but shown nowhere either), the secret key and
/// the session token of temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub access_key: String,
    pub secret_key: Secret,
    pub session_token: Option<Secret>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys { .. }")
    }
}

/// One request to sign.
pub struct Request<'a> {
    pub method: &'a str,
    /// The path as sent, already URI-encoded (`/bucket/key`).
    pub encoded_path: &'a str,
    /// Query parameters, not encoded.
    pub query: &'a [(&'a str, &'a str)],
    /// Headers to sign (`host` and every `x-amz-*` sent), any case.
    pub headers: &'a [(&'a str, &'a str)],
    pub payload_sha256: &'a str,
}

/// The `Authorization` header for `request`, signed at `amz_date` (`20130524T000000Z`):
/// a secret (with the request, it is good for 15 minutes).
pub fn authorization(request: &Request, keys: &Keys, region: &str, amz_date: &str) -> Secret {
    let date = &amz_date[..8];
    let mut headers: Vec<(String, String)> =
        request.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), collapse_spaces(v))).collect();
    headers.sort();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed}\n{}",
        request.method,
        request.encoded_path,
        canonical_query(request.query),
        request.payload_sha256
    );
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", sha256_hex(canonical.as_bytes()));
    let mut key = hmac_sha256(format!("AWS4{}", keys.secret_key.expose()).as_bytes(), date.as_bytes());
    for part in [region, "s3", "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex(&hmac_sha256(&key, to_sign.as_bytes()));
    Secret::new(format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        keys.access_key
    ))
}

/// The query string as sent and as signed: sorted, every key and value encoded.
pub fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(String, String)> =
        query.iter().map(|(k, v)| (uri_encode(k, true), uri_encode(v, true))).collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// SigV4's URI encoding: unreserved characters kept, everything else `%XX`; `/` kept in
/// paths (`encode_slash` false), encoded in query values.
pub fn uri_encode(text: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b'/' if !encode_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data).as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn collapse_spaces(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_keys() -> Keys {
        Keys {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            session_token: None,
        }
    }

    /// The examples of AWS's "Signature Calculations for the Authorization Header" page
    /// for S3 (GET Object with a Range, and ListObjects with a query).
    #[test]
    fn signs_as_aws_documents() {
        let get = Request {
            method: "GET",
            encoded_path: "/test.txt",
            query: &[],
            headers: &[
                ("Host", "examplebucket.s3.amazonaws.com"),
                ("Range", "bytes=0-9"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_sha256: EMPTY_SHA256,
        };
        let auth = authorization(&get, &example_keys(), "us-east-1", "20130524T000000Z");
        assert_eq!(format!("{auth} {auth:?}"), "*** ***");
        assert_eq!(
            auth.expose(),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        let list = Request {
            method: "GET",
            encoded_path: "/",
            query: &[("max-keys", "2"), ("prefix", "J")],
            headers: &[
                ("host", "examplebucket.s3.amazonaws.com"),
                ("x-amz-content-sha256", EMPTY_SHA256),
                ("x-amz-date", "20130524T000000Z"),
            ],
            payload_sha256: EMPTY_SHA256,
        };
        let auth = authorization(&list, &example_keys(), "us-east-1", "20130524T000000Z");
        assert!(
            auth.expose().ends_with("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
            "{}",
            auth.expose()
        );
        assert!(!format!("{:?}", example_keys()).contains("EXAMPLEKEY"));
    }

    #[test]
    fn encoding_keeps_unreserved_and_slashes_in_paths() {
        assert_eq!(uri_encode("a b/c~d+é", false), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", true), "a%2Fb");
        assert_eq!(canonical_query(&[("prefix", "x y"), ("list-type", "2")]), "list-type=2&prefix=x%20y");
    }
}
