//! A byte range of another archive's bytes, served as a source of its own: a compressed tar stored inside a tar (`--recursive`) is decoded from there.

use std::borrow::Cow;

use crate::error::ReadError;
use crate::source::{Backing, Derived, Source};

/// `len` bytes of `outer` from `start`; reads go through `outer`, so an archive served
/// in place is still read with `pread` and checked to be unchanged.
#[derive(Debug)]
pub(crate) struct Within {
    outer: Backing,
    start: u64,
    len: u64,
}

impl Derived for Within {
    fn len(&self) -> u64 {
        self.len
    }

    /// The source the range lies in.
    fn origin(&self) -> &Backing {
        &self.outer
    }

    /// The range's mapped bytes, for a first pass (none when `outer` has no map).
    fn mapped(&self) -> &[u8] {
        let end = self.start + self.len;
        self.outer.get(self.start as usize..end as usize).unwrap_or_default()
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, ReadError> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.len) {
            return Err(ReadError {
                offset: self.start.saturating_add(offset),
                what: format!("{len} bytes run past the end of the {}-byte member they are read from", self.len),
            });
        }
        self.outer.read_at(self.start + offset, len)
    }

    /// Lets go of the mapped pages of the range before `offset` (see `Source::unmap_scanned`).
    fn unmap_before(&self, offset: u64) {
        self.outer.unmap_range(self.start, self.start + offset.min(self.len));
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Source {
    /// The `len` bytes of `outer` from `start`, as a source of their own; `None` when they
    /// do not lie inside `outer`.
    pub fn within(outer: &Backing, start: u64, len: u64) -> Option<Backing> {
        start.checked_add(len).filter(|&end| end <= outer.len() as u64)?;
        let mut source = Source::empty().ok()?;
        source.derived = Some(Box::new(Within { outer: outer.clone(), start, len }));
        Some(std::sync::Arc::new(source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_reads_and_maps_its_own_bytes_only() {
        let outer = Source::memory(b"0123456789");
        let inner = Source::within(&outer, 3, 4).unwrap();
        assert_eq!((inner.len(), &inner[..]), (4, &b"3456"[..]));
        assert_eq!(&*inner.read_at(1, 3).unwrap(), b"456");
        assert!(inner.read_at(2, 3).is_err(), "past the range, although inside the outer bytes");
        assert!(Source::within(&outer, 8, 3).is_none());
        assert!(Source::within(&outer, u64::MAX, 2).is_none());
    }
}
