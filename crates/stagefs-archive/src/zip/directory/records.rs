//! The central directory's records, decoded one by one, and the little-endian fields every zip record is read with.

use std::borrow::Cow;

use crate::fault::Fault;

pub(super) const CENTRAL_SIG: &[u8; 4] = b"PK\x01\x02";
pub(super) const CENTRAL_LEN: usize = 46;
/// General purpose flag bit 11: the name is UTF-8.
const FLAG_UTF8: u16 = 1 << 11;
/// "Version made by" host (high byte) for Unix.
const HOST_UNIX: u16 = 3;

/// One central directory entry, with zip64 sizes and the Unicode name already applied.
#[derive(Debug)]
pub(in crate::zip) struct Entry<'a> {
    /// Archive offset of this central directory record (for error messages).
    pub at: u64,
    pub name: Cow<'a, [u8]>,
    /// Length of the name as stored; the local header must repeat it.
    pub stored_name_len: u16,
    pub made_by: u16,
    pub flags: u16,
    pub method: u16,
    pub dos_time: u16,
    pub dos_date: u16,
    pub crc: u32,
    pub compressed: u64,
    pub size: u64,
    /// Archive offset of the local header (prefix shift applied).
    pub local: u64,
    pub external: u32,
    /// Modification time from the extended-timestamp extra field (0x5455).
    pub unix_mtime: Option<i64>,
}

/// The central directory: every entry, in the order the archive lists them.
#[derive(Debug)]
pub(in crate::zip) struct Directory<'a> {
    pub entries: Vec<Entry<'a>>,
    /// Where the central directory starts (members' data lies before it).
    pub start: u64,
}

pub(super) fn entry(map: &[u8], at: u64, shift: u64, n: u64, count: u64) -> Result<(Entry<'_>, u64), Fault> {
    let len = map.len() as u64;
    let fixed = at.checked_add(CENTRAL_LEN as u64).filter(|&e| e <= len);
    if fixed.is_none() || !sig_at(map, at, CENTRAL_SIG) {
        return Err(Fault::corrupt(
            at,
            format!("central directory entry {n} of {count}: expected a record (PK\\x01\\x02) inside the file"),
        ));
    }
    let p = at as usize;
    let name_len = u16le(map, p + 28);
    let extra_len = u16le(map, p + 30) as usize;
    let comment_len = u16le(map, p + 32) as usize;
    let var = p + CENTRAL_LEN;
    let end = var + name_len as usize + extra_len + comment_len;
    if end > map.len() {
        return Err(Fault::truncated(
            at,
            format!("central directory entry {n} needs {} bytes past its start", end - p),
        ));
    }
    let raw_name = &map[var..var + name_len as usize];
    let extra = &map[var + name_len as usize..var + name_len as usize + extra_len];
    let flags = u16le(map, p + 8);
    let mut e = Entry {
        at,
        name: Cow::Borrowed(raw_name),
        stored_name_len: name_len,
        made_by: u16le(map, p + 4),
        flags,
        method: u16le(map, p + 10),
        dos_time: u16le(map, p + 12),
        dos_date: u16le(map, p + 14),
        crc: u32le(map, p + 16),
        compressed: u64::from(u32le(map, p + 20)),
        size: u64::from(u32le(map, p + 24)),
        local: u64::from(u32le(map, p + 42)),
        external: u32le(map, p + 38),
        unix_mtime: None,
    };
    // Without the UTF-8 flag, a name written on MS-DOS or Windows is code page 437 (a
    // name from a Unix host is its bytes); the Unicode path field, applied next, wins.
    if flags & FLAG_UTF8 == 0 && e.made_by >> 8 != HOST_UNIX && !raw_name.is_ascii() {
        e.name = Cow::Owned(super::super::cp437::to_utf8(raw_name));
    }
    apply_extra(&mut e, raw_name, extra, u16le(map, p + 34))?;
    e.local = e.local.checked_add(shift).ok_or_else(|| Fault::corrupt(at, "local header offset overflows".into()))?;
    Ok((e, end as u64))
}

/// Applies the extra fields stagefs uses: zip64 sizes (0x0001), the extended timestamp
/// (0x5455), Info-ZIP's old Unix field (0x5855, whose mtime is used when no 0x5455
/// gives one) and Info-ZIP's Unicode path (0x7075). Others are skipped.
fn apply_extra<'a>(e: &mut Entry<'a>, raw_name: &[u8], mut extra: &'a [u8], disk: u16) -> Result<(), Fault> {
    let mut zip64_seen = false;
    let mut ux_mtime = None;
    let at = e.at;
    while extra.len() >= 4 {
        let id = u16::from_le_bytes([extra[0], extra[1]]);
        let size = u16::from_le_bytes([extra[2], extra[3]]) as usize;
        let Some(body) = extra.get(4..4 + size) else { break };
        extra = &extra[4 + size..];
        match id {
            0x0001 => {
                zip64_seen = true;
                let mut fields = body.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
                let mut take = |value: &mut u64, what: &str| -> Result<(), Fault> {
                    if *value == 0xffff_ffff {
                        *value = fields.next().ok_or_else(|| {
                            Fault::corrupt(at, format!("zip64 extra field has no {what} for {}", show(raw_name)))
                        })?;
                    }
                    Ok(())
                };
                let (mut size, mut compressed, mut local) = (e.size, e.compressed, e.local);
                take(&mut size, "uncompressed size")?;
                take(&mut compressed, "compressed size")?;
                take(&mut local, "local header offset")?;
                (e.size, e.compressed, e.local) = (size, compressed, local);
            }
            // Flags, then the times they announce, modification time first; the central
            // directory copy carries at most that one.
            0x5455 if body.len() >= 5 && body[0] & 1 != 0 => {
                e.unix_mtime = Some(i64::from(i32::from_le_bytes([body[1], body[2], body[3], body[4]])));
            }
            // Access time, then modification time (owner ids follow in local headers only).
            0x5855 if body.len() >= 8 => {
                ux_mtime = Some(i64::from(i32::from_le_bytes([body[4], body[5], body[6], body[7]])));
            }
            // Version 1, CRC-32 of the stored name (a stale field names an older name), UTF-8 name.
            0x7075 if body.len() >= 5 && body[0] == 1 => {
                let crc = u32::from_le_bytes([body[1], body[2], body[3], body[4]]);
                if crc == crc32fast::hash(raw_name) && std::str::from_utf8(&body[5..]).is_ok() {
                    e.name = Cow::Borrowed(&body[5..]);
                }
            }
            _ => {}
        }
    }
    e.unix_mtime = e.unix_mtime.or(ux_mtime);
    if disk != 0 && disk != 0xffff {
        return Err(Fault::unsupported("multi-disk (split or spanned) zip archives are not supported".into()));
    }
    if e.local == 0xffff_ffff && !zip64_seen {
        return Err(Fault::corrupt(
            at,
            format!("{}: local header offset defers to zip64, but no zip64 extra field", show(raw_name)),
        ));
    }
    Ok(())
}

/// A name for messages.
pub(in crate::zip) fn show(name: &[u8]) -> String {
    stagefs_text::escape(name)
}

pub(super) fn sig_at(map: &[u8], at: u64, sig: &[u8; 4]) -> bool {
    usize::try_from(at).ok().and_then(|at| map.get(at..at.checked_add(4)?)) == Some(sig.as_slice())
}

pub(in crate::zip) fn u16le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(super) fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(super) fn u64le(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}
