//! The fields of a 512-byte tar header: numbers (octal, base-256), checksums, names.

pub(super) const BLOCK: usize = 512;

/// Whether a member of this type is followed by `size` bytes of content.
pub(super) fn stores_data(typeflag: u8) -> bool {
    !matches!(typeflag, b'1' | b'2' | b'3' | b'4' | b'5' | b'6')
}

pub(super) fn round_up(n: u64) -> usize {
    (n.div_ceil(BLOCK as u64) as usize).saturating_mul(BLOCK)
}

/// Splits a member name into components the way GNU tar extracts it: leading `/` and
/// `./` removed, `.` components dropped. `None` if a component is `..`, or holds a NUL
/// byte (a pax name can; no file name can).
pub fn normalise(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p if p.contains(&0) => return None,
            p => parts.push(p),
        }
    }
    Some(parts)
}

/// Checks the header checksum, accepting both the unsigned and the historic signed sum.
/// Sums written as plain loops over whole words, which the compiler turns into vector
/// adds: a byte-by-byte sum with the field skipped in the loop was a fifth of a scan of
/// tiny members.
pub(super) fn checksum_ok(header: &[u8]) -> Option<bool> {
    let stored = parse_number(header.get(148..156)?)?;
    let (mut unsigned, mut high) = (0u32, 0u32);
    for &b in header {
        unsigned += u32::from(b);
        high += u32::from(b >> 7);
    }
    let field = &header[148..156];
    let (field_sum, field_high) =
        field.iter().fold((0u32, 0u32), |(s, h), &b| (s + u32::from(b), h + u32::from(b >> 7)));
    // The checksum field counts as eight spaces.
    let unsigned = i64::from(unsigned - field_sum + 8 * u32::from(b' '));
    // The historic signed sum: every byte from 128 up counts 256 less.
    let signed = unsigned - 256 * i64::from(high - field_high);
    Some(stored as i64 == unsigned || stored as i64 == signed)
}

pub(super) fn trim_nul(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

pub(super) fn trim_field(field: &[u8]) -> &[u8] {
    let s = trim_nul(field);
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    let end = s.iter().rposition(|&b| b != b' ').map_or(start, |e| e + 1);
    &s[start..end]
}

/// Octal text (space or NUL padded), or base-256 (GNU) when the high bit is set.
pub(super) fn parse_number(field: &[u8]) -> Option<u64> {
    match field.first() {
        Some(0x80) => field[1..].iter().try_fold(0u64, |n, &b| n.checked_mul(256).map(|n| n | b as u64)),
        Some(0xff) => None, // Negative: not valid for sizes and ids.
        _ => {
            let text = trim_field(field);
            if text.is_empty() {
                return Some(0);
            }
            text.iter().try_fold(0u64, |n, &b| match b {
                b'0'..=b'7' => n.checked_mul(8).map(|n| n + (b - b'0') as u64),
                _ => None,
            })
        }
    }
}

/// Like `parse_number`, but allows negative base-256 values (mtimes before 1970).
pub(super) fn parse_signed(field: &[u8]) -> Option<i64> {
    if field.first() == Some(&0xff) {
        // Two's complement over the field: fits i64 when all but the last 8 bytes are 0xff.
        let (high, low) = field.split_at(field.len().saturating_sub(8));
        if !high.iter().all(|&b| b == 0xff) {
            return None;
        }
        let mut bytes = [0xff; 8];
        bytes[8 - low.len()..].copy_from_slice(low);
        return Some(i64::from_be_bytes(bytes));
    }
    parse_number(field).and_then(|n| i64::try_from(n).ok())
}

/// True if `head` starts with a plausible tar header (valid checksum, or the ustar magic),
/// or with an end-of-archive block (an empty tar).
pub(crate) fn looks_like_tar(head: &[u8]) -> bool {
    let Some(block) = head.get(..BLOCK) else { return false };
    block.get(257..262) == Some(b"ustar") || block.iter().all(|&b| b == 0) || checksum_ok(block).unwrap_or(false)
}
