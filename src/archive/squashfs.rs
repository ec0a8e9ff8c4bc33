//! SquashFS 4.0 reader (placeholder until the real reader lands).

use std::path::Path;

use super::{Backing, Bytes, OpenError, ReadError};
use crate::index::Index;

pub struct SquashReader;

pub fn open(path: &Path, _backing: Backing) -> Result<(Index, SquashReader), OpenError> {
    Err(OpenError::Unsupported { path: path.to_owned(), what: "SquashFS not yet supported".into() })
}

impl SquashReader {
    pub fn backing_len(&self) -> u64 {
        0
    }

    pub fn read(&self, _handle: u32, _size: u64, offset: u64, _len: usize) -> Result<Bytes<'_>, ReadError> {
        Err(ReadError { offset, what: "unsupported".into() })
    }
}
