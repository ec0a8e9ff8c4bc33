//! Objects in S3-compatible stores and on HTTP(S) servers, read the way stagefs needs them: pinned to one version, fetched with many range requests into a file descriptor, or read in place with a bounded read-ahead cache.
//!
//! Blocking (threads, no async runtime): the stagefs daemon serves FUSE requests on
//! threads, and a fetch is a handful of threads each streaming one range at a time.
//! No FUSE, no command line here; see doc/remote.md for the choices and their measurements.

mod client;
pub mod credentials;
mod error;
mod fetch;
pub mod list;
mod netrc;
mod range;
mod secret;
pub mod sigv4;
mod stream;
mod time;
pub mod url;
mod xml;

pub use client::{Client, Config, Object, Version};
pub use error::RemoteError;
pub use fetch::{fetch_into, Hooks};
pub use range::RangeReader;
pub use secret::Secret;
pub use stream::ObjectStream;
pub use url::{is_url, ObjectUrl};
