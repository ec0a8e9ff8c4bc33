//! Sparse members: GNU old-style maps and pax 0.0, 0.1 and 1.0, turned into extents the reader fills holes between.

use super::header::{round_up, BLOCK};
use super::member::{Member, Scan, MAX_FILE_SIZE};
use super::reader::{Extent, SparseFile};
use crate::error::OpenError;
use crate::index::Data;
use stagefs_text::escape;

impl Scan<'_> {
    /// Reads the pax 1.0 sparse map at the start of a member's data; returns it and the
    /// bytes it occupies (rounded to a block).
    pub(super) fn sparse_map_v1(&self, at: u64, stored_size: u64) -> Result<(Vec<(u64, u64)>, u64), OpenError> {
        let data = self.window.from(at);
        let data = &data[..data.len().min(stored_size as usize)];
        let mut lines = data.split(|&b| b == b'\n');
        let mut used = 0u64;
        let mut next = |what: &str| -> Result<u64, OpenError> {
            // Lines starting with '#' are comments (`#!gnu-sparse-format`), skipped as
            // libarchive skips them; GNU tar writes none. Each is bytes of `data`: bounded.
            let line = loop {
                let line =
                    lines.next().ok_or_else(|| self.truncated(at, format!("sparse map ends before its {what}")))?;
                used += line.len() as u64 + 1;
                if !line.starts_with(b"#") {
                    break line;
                }
            };
            std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.corrupt(at, format!("sparse map {what} is not a number")))
        };
        let count = next("count")?;
        // Each entry takes at least 4 bytes of text, which bounds the count by the data
        // actually present (the size field may claim more than the archive holds).
        if count > data.len() as u64 / 4 {
            return Err(self.corrupt(at, format!("sparse map claims {count} extents in {} bytes", data.len())));
        }
        let mut map = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let offset = next("offset")?;
            let len = next("length")?;
            map.push((offset, len));
        }
        Ok((map, round_up(used) as u64))
    }

    /// Decodes an old GNU sparse member ('S'): up to 4 extents in the header, more in
    /// extension blocks, after which its data starts.
    pub(super) fn gnu_sparse(&mut self, header: &[u8], m: &mut Member) -> Result<(), OpenError> {
        let at = m.header_offset;
        let mut map = Vec::new();
        let mut push = |s: &Self, entry: &[u8]| -> Result<(), OpenError> {
            if entry.iter().all(|&b| b == 0) {
                return Ok(());
            }
            let off = s.number(&entry[0..12], at, "sparse offset")?;
            let len = s.number(&entry[12..24], at, "sparse length")?;
            map.push((off, len));
            Ok(())
        };
        for i in 0..4 {
            push(self, &header[386 + i * 24..386 + (i + 1) * 24])?;
        }
        let real_size = self.number(&header[483..495], at, "sparse real size")?;
        let mut extended = header[482] != 0;
        let mut pos = at as usize + BLOCK;
        while extended {
            let block = self
                .window
                .get(pos as u64, (pos + BLOCK) as u64)
                .ok_or_else(|| self.truncated(pos as u64, "sparse extension header"))?;
            for i in 0..21 {
                push(self, &block[i * 24..(i + 1) * 24])?;
            }
            extended = block[504] != 0;
            pos += BLOCK;
        }
        m.data_offset = pos as u64;
        if let Some(attrs) = m.attrs.as_mut() {
            attrs.size = real_size;
        }
        m.sparse = Some((map, real_size));
        Ok(())
    }

    /// Validates a sparse map against the stored data and records it. The declared real
    /// size may not exceed the largest file Linux allows, and the extents must lie inside
    /// it, in order, without overlapping, and within the data stored: a map that breaks
    /// any of these is damage (or a crafted archive), reported with the member's name.
    pub(super) fn sparse(&mut self, m: &Member, map: Vec<(u64, u64)>, real_size: u64) -> Result<Data, OpenError> {
        let at = m.header_offset;
        let name = escape(&m.path);
        let bad = |what: String| self.corrupt(at, format!("sparse member '{name}': {what}"));
        if real_size > MAX_FILE_SIZE {
            return Err(bad(format!("declares {real_size} bytes, more than the largest file ({MAX_FILE_SIZE})")));
        }
        let mut stored = 0u64;
        let mut last_end = 0u64;
        let mut extents = Vec::new();
        for (file_offset, len) in map.into_iter().filter(|&(_, len)| len > 0) {
            let Some(end) = file_offset.checked_add(len) else {
                return Err(bad(format!("sparse extent {file_offset}+{len} wraps past 2^64")));
            };
            if file_offset < last_end {
                return Err(bad(format!(
                    "sparse extent {file_offset}+{len} overlaps the one before (ending at {last_end})"
                )));
            }
            if end > real_size {
                return Err(bad(format!("sparse extent {file_offset}+{len} exceeds the file size {real_size}")));
            }
            // Inside the member's data, which lies inside the archive: cannot overflow.
            let archive_offset = m.data_offset + stored;
            stored = stored
                .checked_add(len)
                .filter(|&s| s <= m.stored_size)
                .ok_or_else(|| bad(format!("sparse map needs more data than the {} bytes stored", m.stored_size)))?;
            extents.push(Extent { file_offset, len, archive_offset });
            last_end = end;
        }
        let too_many = || self.index_err(crate::index::BuildError::TooManyEntries);
        let (first, count) = (u32::try_from(self.extents.len()).ok(), u32::try_from(extents.len()).ok());
        let (first, count) = first.zip(count).filter(|(f, c)| f.checked_add(*c).is_some()).ok_or_else(too_many)?;
        let handle = u32::try_from(self.sparse_files.len()).map_err(|_| too_many())?;
        self.extents.extend(extents);
        self.sparse_files.push(SparseFile { first, count });
        Ok(Data::Extern(handle))
    }
}
