//! A zip whose end record is missing or damaged, but whose central directory follows its members whole: found by walking the local headers, as bsdtar's streaming reader reads such a zip.
//!
//! Only when nothing is missing: every local header is walked from byte 0 to the
//! central directory (so each member's size must be in its local header: a data
//! descriptor stops the walk), and the central directory must name exactly the local
//! headers walked. A zip cut short anywhere, in its data or in its directory, is still
//! refused as truncated; only the end record itself may be absent.

use super::records::{entry, sig_at, u16le, u32le, Directory, CENTRAL_SIG};

const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
const LOCAL_LEN: u64 = 30;
/// General purpose flag bit 3: sizes and CRC follow the data (a data descriptor).
const FLAG_DESCRIPTOR: u16 = 1 << 3;

/// The central directory after the members of the zip in `map`, or why there is none.
pub(super) fn read(map: &[u8]) -> Result<Directory<'_>, String> {
    if !map.starts_with(LOCAL_SIG) {
        return Err("it does not start with a local header either".into());
    }
    let len = map.len() as u64;
    let mut locals = Vec::new();
    let mut pos = 0u64;
    // Each step moves past a 30-byte header: at most len / 30 steps.
    while !sig_at(map, pos, CENTRAL_SIG) {
        if !sig_at(map, pos, LOCAL_SIG) || pos + LOCAL_LEN > len {
            return Err(format!("no local header or central directory at byte {pos}, where the members lead"));
        }
        let p = pos as usize;
        if u16le(map, p + 6) & FLAG_DESCRIPTOR != 0 {
            return Err(format!(
                "the member at byte {pos} gives its size only after its data (a data descriptor), so the members \
                 cannot be walked to the central directory"
            ));
        }
        let (name_len, extra_len) = (u64::from(u16le(map, p + 26)), u64::from(u16le(map, p + 28)));
        let extra_at = pos + LOCAL_LEN + name_len;
        let extra = map.get(extra_at as usize..(extra_at + extra_len) as usize).unwrap_or_default();
        let compressed = local_compressed(map, p, extra).ok_or_else(|| {
            format!("the member at byte {pos} defers its size to a zip64 field its local header does not have")
        })?;
        let end = (extra_at + extra_len).checked_add(compressed).filter(|&end| end <= len);
        let Some(end) = end else {
            return Err(format!("the member at byte {pos} runs past the end of the file"));
        };
        locals.push(pos);
        pos = end;
    }
    let start = pos;
    let mut entries = Vec::new();
    while sig_at(map, pos, CENTRAL_SIG) {
        let (e, next) = entry(map, pos, 0, entries.len() as u64, locals.len() as u64).map_err(|f| f.what)?;
        entries.push(e);
        pos = next;
    }
    let mut named: Vec<u64> = entries.iter().map(|e| e.local).collect();
    named.sort_unstable();
    if named != locals {
        return Err(format!(
            "the central directory at byte {start} names {} members, not the {} local headers before it",
            named.len(),
            locals.len()
        ));
    }
    tracing::warn!(
        "no end-of-central-directory record: serving the central directory found at byte {start}, after all {} \
         members (as bsdtar reads such a zip)",
        locals.len()
    );
    Ok(Directory { entries, start })
}

/// A local header's compressed size: 32 bits, or from its zip64 extra field (which in a
/// local header holds both sizes, uncompressed first).
fn local_compressed(map: &[u8], p: usize, mut extra: &[u8]) -> Option<u64> {
    let compressed = u32le(map, p + 18);
    if compressed != u32::MAX {
        return Some(u64::from(compressed));
    }
    let size_too = u32le(map, p + 22) == u32::MAX;
    while extra.len() >= 4 {
        let (id, size) =
            (u16::from_le_bytes([extra[0], extra[1]]), usize::from(u16::from_le_bytes([extra[2], extra[3]])));
        let body = extra.get(4..4 + size)?;
        if id == 1 {
            let at = if size_too { 8 } else { 0 };
            return body.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        }
        extra = &extra[4 + size..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::tests::python_zip;
    use super::*;

    /// `zip` with its end record's signature broken, as in libarchive's
    /// `test_read_format_zip_extra_padding.zip`.
    fn without_end(zip: &[u8]) -> Vec<u8> {
        let mut broken = zip.to_vec();
        let end = super::super::find_end(zip).unwrap();
        broken[end] = 0;
        broken
    }

    #[test]
    fn the_directory_after_the_members_is_found_only_when_nothing_is_missing() {
        let zip = python_zip("z.writestr('a', b'aaaa')\nz.writestr('d/b', b'bbbb' * 100, zipfile.ZIP_DEFLATED)");
        let broken = without_end(&zip);
        let whole = super::super::read(&zip).unwrap();
        let dir = read(&broken).unwrap();
        assert_eq!((dir.start, dir.entries.len()), (whole.start, 2));
        assert_eq!(&*dir.entries[1].name, b"d/b");
        // The directory cut at a record boundary: it names one of the two members.
        let cut = &broken[..whole.entries[1].at as usize];
        assert!(read(cut).unwrap_err().contains("names 1 members, not the 2"));
        // Cut inside the data, or inside a record: refused.
        assert!(read(&broken[..33]).unwrap_err().contains("runs past the end"));
        assert!(read(&broken[..40]).unwrap_err().contains("no local header or central directory at byte 35"));
        assert!(read(&broken[..whole.start as usize + 20]).is_err());
        // A member with a data descriptor cannot be walked past.
        let mut flagged = broken.clone();
        flagged[6] |= 8;
        assert!(read(&flagged).unwrap_err().contains("data descriptor"));
    }
}
