//! Objects in S3-compatible stores and on HTTP(S) servers, read the way stagefs needs them: pinned to one version, fetched with many range requests into a file descriptor, or read in place with a bounded read-ahead cache.
//!
//! Blocking (threads, no async runtime): the stagefs daemon serves FUSE requests on
//! threads, and a fetch is a handful of threads each streaming one range at a time.
//! No FUSE, no command line here; see doc/remote.md for the choices and their measurements.

mod client;
mod config;
pub mod credentials;
mod error;
mod failure;
mod fetch;
mod files;
pub mod list;
mod netrc;
mod range;
mod refusal;
mod retry;
mod secret;
pub mod sigv4;
mod stream;
mod time;
mod trust;
pub mod url;
mod xml;

pub use client::{Client, Object, Version};
pub use config::{Config, RetryHook};
pub use error::RemoteError;
pub use fetch::{fetch_into, Hooks};
pub use files::{FileError, Files, ReadFile};
pub use range::{BlockCache, RangeReader};
pub use secret::Secret;
pub use stream::ObjectStream;
pub use url::{is_url, ObjectUrl};

/// What every tracing subscriber of a process using this crate must filter out, at every
/// verbosity: the crates under it (ureq, ureq-proto, rustls) dump raw requests at debug and
/// trace level, bearer tokens, Basic credentials, session tokens and signed `Authorization`
/// headers included. In the directive syntax of `tracing_subscriber`'s `Targets` and
/// `EnvFilter`: apply it as a filter of its own beside the user's (`RUST_LOG`, `-v`), never
/// merged into it, where a more specific directive (`ureq::unversioned=trace`) would win.
pub const LOG_FILTER: &str = "trace,ureq=off,ureq_proto=off,rustls=off";
