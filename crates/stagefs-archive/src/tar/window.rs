//! The bytes the header scan sees: the whole mapped archive, or a window sliding over a decoded stream (a compressed tar served in place).

use std::borrow::Cow;
use std::io::Read;

/// How far ahead of the scan a stream window reaches: the largest extension header or
/// sparse map a compressed tar can have when it is indexed as a stream.
pub(super) const LOOKAHEAD: usize = 8 << 20;

pub(super) struct Window<'a> {
    bytes: Cow<'a, [u8]>,
    /// Archive offset of `bytes[0]`.
    base: u64,
    /// The archive's length, once known (at once for a map; at the stream's end).
    end: Option<u64>,
    feed: Option<&'a mut dyn Read>,
}

impl<'a> Window<'a> {
    pub(super) fn whole(map: &'a [u8]) -> Window<'a> {
        Window { bytes: Cow::Borrowed(map), base: 0, end: Some(map.len() as u64), feed: None }
    }

    pub(super) fn stream(feed: &'a mut dyn Read) -> Window<'a> {
        Window { bytes: Cow::Owned(Vec::new()), base: 0, end: None, feed: Some(feed) }
    }

    /// The archive's length, or `u64::MAX` while a stream has not ended.
    pub(super) fn limit(&self) -> u64 {
        self.end.unwrap_or(u64::MAX)
    }

    /// Bytes `from..to` of the archive, if the window holds them.
    pub(super) fn get(&self, from: u64, to: u64) -> Option<&[u8]> {
        let from = usize::try_from(from.checked_sub(self.base)?).ok()?;
        let to = usize::try_from(to.checked_sub(self.base)?).ok()?;
        self.bytes.get(from..to)
    }

    /// The bytes held from `from` on (at least [`LOOKAHEAD`] of them, or to the end).
    pub(super) fn from(&self, from: u64) -> &[u8] {
        from.checked_sub(self.base).and_then(|at| self.bytes.get(usize::try_from(at).ok()?..)).unwrap_or(&[])
    }

    /// Makes a stream window hold `pos..pos + LOOKAHEAD` (or up to the stream's end),
    /// dropping what lies before `pos`. The scan only moves forward.
    pub(super) fn prepare(&mut self, pos: u64) -> std::io::Result<()> {
        let Some(feed) = self.feed.as_mut() else { return Ok(()) };
        let Cow::Owned(buf) = &mut self.bytes else { return Ok(()) };
        let held_end = self.base + buf.len() as u64;
        if held_end >= pos.saturating_add(LOOKAHEAD as u64) || self.end.is_some_and(|end| held_end >= end) {
            return Ok(());
        }
        if pos >= held_end {
            // Member data the scan steps over: decoded, not kept.
            let skip = pos - held_end;
            let skipped = discard(&mut **feed, skip, buf)?;
            buf.clear();
            self.base = held_end + skipped;
            if skipped < skip {
                self.end = Some(self.base);
                return Ok(());
            }
        } else {
            // Moves at most 2 × LOOKAHEAD bytes per LOOKAHEAD the scan advances.
            buf.drain(..(pos - self.base) as usize);
            self.base = pos;
        }
        // Zeroed once, then filled by as many reads as the decoder needs: a pass returns a
        // deflate block (tens of KiB) per read, and zeroing the 16 MiB again for each cost
        // more than the decoding.
        let target = 2 * LOOKAHEAD;
        let mut filled = buf.len();
        buf.resize(target, 0);
        while filled < target {
            match feed.read(&mut buf[filled..]) {
                Ok(0) => {
                    self.end = Some(self.base + filled as u64);
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    buf.truncate(filled);
                    return Err(e);
                }
            }
        }
        buf.truncate(filled);
        Ok(())
    }
}

/// Reads and drops `n` bytes of `feed` in large pieces (decoders run faster on large
/// output buffers than on `io::copy`'s 8 KiB), using `scratch`; returns how many there were.
fn discard(feed: &mut dyn Read, n: u64, scratch: &mut Vec<u8>) -> std::io::Result<u64> {
    scratch.resize(LOOKAHEAD, 0);
    let mut left = n;
    while left > 0 {
        let want = (left as usize).min(scratch.len());
        match feed.read(&mut scratch[..want]) {
            Ok(0) => break,
            Ok(got) => left -= got as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n - left)
}
