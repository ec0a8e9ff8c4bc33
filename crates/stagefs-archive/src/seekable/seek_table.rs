//! The zstd seekable format's seek table (facebook/zstd contrib/seekable_format): a skippable frame at the end of the file listing every frame's compressed and decoded size, written by `stagefs pack --compress zstd` and read instead of walking the frames' headers.
//!
//! Layout, little-endian: the skippable frame header (magic 0x184D2A5E, the size of what
//! follows), one entry per frame (compressed size u32, decoded size u32, and a checksum
//! u32 when the descriptor's bit 7 says so), then a 9-byte footer (frame count u32,
//! descriptor u8, magic 0x8F92EAB1). A table is only believed as far as it can be
//! checked here: it must end the file, its frames must tile the file before it and be
//! no more than [`super::points::max_points`] allows; the first pass then checks each frame's
//! real compressed and decoded size against it (see `frames`).

/// The seek table's skippable frame magic.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// The magic ending the footer.
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
const FOOTER: usize = 9;
/// The most a frame may decode to in this format.
pub const MAX_FRAME_DECODED: u32 = 1 << 30;

/// One frame as the table lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Where the frame starts in the file.
    pub at: u64,
    /// Its compressed size.
    pub compressed: u32,
    /// Its decoded size.
    pub decoded: u32,
}

/// The seek table for frames of (compressed, decoded) sizes, without checksums.
pub fn encode(frames: &[(u32, u32)]) -> Vec<u8> {
    let body = frames.len() * 8 + FOOTER;
    let mut out = Vec::with_capacity(8 + body);
    out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(body as u32).to_le_bytes());
    for &(compressed, decoded) in frames {
        out.extend_from_slice(&compressed.to_le_bytes());
        out.extend_from_slice(&decoded.to_le_bytes());
    }
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// A seek table that cannot be true of the file that ends with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the zstd seek table at byte {at} {what}")]
pub struct SeekTableError {
    /// Where in the file the table (or the entry at fault) starts.
    pub at: usize,
    /// What it says that cannot be.
    pub what: String,
}

/// The frames `input` lists in its seek table: `None` if it ends with none, an error
/// naming the table's offset if the table cannot be true of this file.
pub fn parse(input: &[u8]) -> Option<Result<Vec<Entry>, SeekTableError>> {
    let len = input.len();
    if len < 8 + FOOTER || u32_at(input, len - 4) != SEEKABLE_MAGIC {
        return None;
    }
    Some(parse_table(input))
}

fn parse_table(input: &[u8]) -> Result<Vec<Entry>, SeekTableError> {
    let len = input.len();
    let footer = len - FOOTER;
    let count = u64::from(u32_at(input, footer));
    let descriptor = input[footer + 4];
    let lie = |at: usize, what: String| Err(SeekTableError { at, what });
    if descriptor & 0x7c != 0 {
        return lie(footer, format!("has reserved bits set ({descriptor:#04x}): not a seek table this reader knows"));
    }
    let entry = if descriptor & 0x80 != 0 { 12 } else { 8 };
    if count > super::points::max_points(len as u64) as u64 {
        return lie(footer, format!("lists {count} frames, more than a file of {len} bytes can hold"));
    }
    let Some(table) = (count * entry + FOOTER as u64 + 8).try_into().ok().filter(|&t: &usize| t <= len) else {
        return lie(footer, format!("lists {count} frames, more than the file holds"));
    };
    let start = len - table;
    if u32_at(input, start) != SKIPPABLE_MAGIC || u64::from(u32_at(input, start + 4)) != (table - 8) as u64 {
        return lie(start, format!("lists {count} frames, but no skippable frame of that size starts there"));
    }
    let mut frames = Vec::with_capacity(count as usize);
    let mut at = 0u64;
    for i in 0..count as usize {
        let e = start + 8 + i * entry as usize;
        let (compressed, decoded) = (u32_at(input, e), u32_at(input, e + 4));
        if compressed == 0 || decoded > MAX_FRAME_DECODED {
            return lie(e, format!("says frame {i} takes {compressed} bytes and decodes to {decoded}"));
        }
        frames.push(Entry { at, compressed, decoded });
        at += u64::from(compressed);
    }
    if at != start as u64 {
        return lie(
            start,
            format!("lists frames of {at} compressed bytes in all, but {start} bytes of frames come before it"),
        );
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(frames: &[(u32, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(c, _) in frames {
            out.extend(std::iter::repeat_n(7u8, c as usize));
        }
        out.extend(encode(frames));
        out
    }

    #[test]
    fn a_table_reads_back_and_lies_are_refused() {
        let frames = [(10, 100), (20, 200), (5, 50)];
        let good = file(&frames);
        let read = parse(&good).unwrap().unwrap();
        assert_eq!(
            read.iter().map(|e| (e.at, e.compressed, e.decoded)).collect::<Vec<_>>(),
            [(0, 10, 100), (10, 20, 200), (30, 5, 50)]
        );
        assert!(parse(b"no table here, just bytes").is_none());
        // Frames that do not tile the bytes before the table.
        let mut short = file(&frames);
        short.insert(0, 1);
        assert!(parse(&short).unwrap().unwrap_err().to_string().contains("35 compressed bytes in all, but 36"));
        // A count past the table.
        let mut count = good.clone();
        let n = count.len() - 9;
        count[n..n + 4].copy_from_slice(&4_000_000u32.to_le_bytes());
        let err = parse(&count).unwrap().unwrap_err().to_string();
        assert!(err.contains("lists 4000000 frames") && err.contains(&format!("at byte {n}")), "{err}");
        // A count inside the file but not matching the skippable frame.
        let mut two = good.clone();
        two[n..n + 4].copy_from_slice(&2u32.to_le_bytes());
        assert!(parse(&two).unwrap().unwrap_err().to_string().contains("no skippable frame of that size"));
        // Reserved bits, a frame decoding past the format's limit.
        let mut reserved = good.clone();
        reserved[n + 4] = 0x04;
        assert!(parse(&reserved).unwrap().unwrap_err().to_string().contains("reserved bits"));
        let huge = file(&[(10, u32::MAX)]);
        assert!(parse(&huge).unwrap().unwrap_err().to_string().contains("decodes to 4294967295"));
    }
}
