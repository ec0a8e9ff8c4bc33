//! Credentials as each link of the chain yields them: the keys, where they came from and when they expire.

use std::time::SystemTime;

use crate::sigv4::Keys;

/// Credentials with where they came from and when they expire.
#[derive(Clone, Debug)]
pub struct Temporary {
    pub keys: Keys,
    pub expires: Option<SystemTime>,
    /// Where they came from, in words for messages ("AWS_ACCESS_KEY_ID", "profile lab in
    /// ~/.aws/credentials").
    pub source: String,
}
