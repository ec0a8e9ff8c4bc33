//! The zip central directory: finds the end record (zip64 included) and decodes every entry.
//!
//! Offsets in the directory count from the start of the zip itself; a self-extracting
//! stub or any other prefix shifts them all, so the shift is measured once from where the
//! directory really is and added to every offset (as Info-ZIP `unzip` does).

mod headless;
mod records;

use crate::fault::Fault;
use records::{entry, sig_at, u32le, u64le, CENTRAL_LEN, CENTRAL_SIG};
pub(super) use records::{show, u16le, Directory, Entry};

const EOCD_SIG: &[u8; 4] = b"PK\x05\x06";
const EOCD_LEN: usize = 22;
const LOCATOR_SIG: &[u8; 4] = b"PK\x06\x07";
const LOCATOR_LEN: usize = 20;
const EOCD64_SIG: &[u8; 4] = b"PK\x06\x06";
const EOCD64_LEN: usize = 56;
/// The end record is 22 bytes plus a comment of at most 65,535 bytes.
pub const TAIL_SEARCH: usize = EOCD_LEN + u16::MAX as usize;

/// Where the end-of-central-directory record starts in `bytes`, if it has one: searched
/// backwards over the last 64 KiB + 22 bytes. A record whose comment ends exactly at the
/// end of the file wins; else the last one whose comment fits (some tools append bytes).
pub fn find_end(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < EOCD_LEN {
        return None;
    }
    let from = bytes.len().saturating_sub(TAIL_SEARCH);
    let mut fitting = None;
    for pos in (from..=bytes.len() - EOCD_LEN).rev() {
        if &bytes[pos..pos + 4] != EOCD_SIG {
            continue;
        }
        let comment = u16le(bytes, pos + 20) as usize;
        let end = pos + EOCD_LEN + comment;
        if end == bytes.len() {
            return Some(pos);
        }
        if end < bytes.len() && fitting.is_none() {
            fitting = Some(pos);
        }
    }
    fitting
}

/// Decodes the central directory of the zip in `map`.
pub(super) fn read(map: &[u8]) -> Result<Directory<'_>, Fault> {
    let len = map.len() as u64;
    let Some(eocd) = find_end(map) else {
        return headless::read(map).map_err(|why| {
            Fault::truncated(
                len,
                format!(
                    "no end-of-central-directory record (PK\\x05\\x06) in the last {} bytes; a zip ends with one \
                     (nor is its central directory whole after its members: {why})",
                    map.len().min(TAIL_SEARCH)
                ),
            )
        });
    };
    let mut count = u64::from(u16le(map, eocd + 10));
    let mut cd_size = u64::from(u32le(map, eocd + 12));
    let mut cd_offset = u64::from(u32le(map, eocd + 16));
    let disk = u16le(map, eocd + 4);
    // Where the directory must end: right before the (zip64) end records.
    let mut cd_end = eocd as u64;
    let wants64 = count == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff;
    let locator = eocd.checked_sub(LOCATOR_LEN).filter(|&at| &map[at..at + 4] == LOCATOR_SIG);
    if let Some(loc) = locator {
        let rec = u64le(map, loc + 8);
        // The locator's offset is unshifted too: try it as written, then shifted by
        // how far the record must really sit before the locator.
        let expected = (loc as u64).checked_sub(EOCD64_LEN as u64);
        let at = [Some(rec), expected]
            .into_iter()
            .flatten()
            .find(|&at| at.checked_add(EOCD64_LEN as u64).is_some_and(|e| e <= len) && sig_at(map, at, EOCD64_SIG));
        let Some(at) = at else {
            return Err(Fault::corrupt(
                loc as u64,
                format!("zip64 locator points at {rec}: expected a zip64 end record (PK\\x06\\x06) there"),
            ));
        };
        let at = at as usize;
        count = u64le(map, at + 32);
        cd_size = u64le(map, at + 40);
        cd_offset = u64le(map, at + 48);
        cd_end = at as u64;
    } else if wants64 {
        return Err(Fault::corrupt(
            eocd as u64,
            "end record defers to zip64 (a field is all ones) but no zip64 locator precedes it".into(),
        ));
    } else if disk != 0 || u16le(map, eocd + 6) != 0 {
        return Err(Fault::unsupported("multi-disk (split or spanned) zip archives are not supported".into()));
    }
    let Some(real_start) = cd_end.checked_sub(cd_size) else {
        return Err(Fault::corrupt(
            eocd as u64,
            format!("central directory of {cd_size} bytes does not fit before its end record at {cd_end}"),
        ));
    };
    // A prefix shifts the directory (and every offset) by the same amount.
    let shift = if sig_at(map, cd_offset, CENTRAL_SIG) || count == 0 {
        0
    } else if real_start > cd_offset && sig_at(map, real_start, CENTRAL_SIG) {
        real_start - cd_offset
    } else {
        return Err(Fault::corrupt(
            eocd as u64,
            format!(
                "central directory of {count} entries at {cd_offset} ({cd_size} bytes): expected a central \
                 directory record (PK\\x01\\x02) there or at {real_start}, inside the {len}-byte file"
            ),
        ));
    };
    let start = cd_offset + shift;
    // Each record is at least 46 bytes: a count beyond that is a lie, not a reason to reserve memory.
    let mut entries = Vec::with_capacity(count.min(cd_size / CENTRAL_LEN as u64) as usize);
    let mut pos = start;
    for n in 0..count {
        let entry = entry(map, pos, shift, n, count)?;
        pos = entry.1;
        entries.push(entry.0);
    }
    Ok(Directory { entries, start })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::test_support::run_tool;

    /// A zip written by Python's `zipfile`: `script` gets `z`, an open `ZipFile` writing to stdout.
    pub(crate) fn python_zip(script: &str) -> Vec<u8> {
        let program = format!(
            "import io, sys, zipfile\nbuf = io.BytesIO()\nwith zipfile.ZipFile(buf, 'w') as z:\n{}\nsys.stdout.buffer.write(buf.getvalue())\n",
            script.lines().map(|l| format!("    {l}\n")).collect::<String>()
        );
        run_tool("python3", &["-c", &program], None)
    }

    #[test]
    fn entries_come_in_directory_order_with_sizes_and_offsets() {
        let zip = python_zip(
            "z.writestr('a.txt', b'hello')\nz.writestr(zipfile.ZipInfo('d/'), b'')\n\
             z.writestr('d/b.bin', b'x' * 1000, compress_type=zipfile.ZIP_DEFLATED)",
        );
        let dir = read(&zip).unwrap();
        let names: Vec<&[u8]> = dir.entries.iter().map(|e| &*e.name).collect();
        assert_eq!(names, [&b"a.txt"[..], b"d/", b"d/b.bin"]);
        let (a, b) = (&dir.entries[0], &dir.entries[2]);
        assert_eq!((a.method, a.size, a.compressed, a.local), (0, 5, 5, 0));
        assert_eq!((b.method, b.size), (8, 1000));
        assert!(b.compressed < 1000 && b.local > a.local && b.local < dir.start);
        assert_eq!(&zip[b.local as usize..b.local as usize + 4], b"PK\x03\x04", "the local header is where it says");
    }

    #[test]
    fn a_prefix_shifts_every_offset_and_a_comment_hides_nothing() {
        let zip = python_zip("z.comment = b'PK\\x05\\x06 looks like an end record'\nz.writestr('f', b'data')");
        let mut prefixed = vec![b'#'; 1000];
        prefixed.extend_from_slice(&zip);
        let (plain, shifted) = (read(&zip).unwrap(), read(&prefixed).unwrap());
        assert_eq!(shifted.entries[0].local, plain.entries[0].local + 1000);
        assert_eq!(shifted.start, plain.start + 1000);
        assert_eq!(find_end(&prefixed), find_end(&zip).map(|at| at + 1000));
    }

    /// Replaces every occurrence of `from` (the name in the local and the central header).
    fn patch(bytes: &mut [u8], from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len());
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(from.len()).position(|w| w == from) {
            bytes[at + i..at + i + from.len()].copy_from_slice(to);
            at += i + from.len();
        }
    }

    #[test]
    fn names_without_the_utf8_flag_from_dos_are_code_page_437() {
        // Python writes ASCII names without the flag; the host byte says MS-DOS (0) or Unix (3).
        let script =
            |host: u8| format!("i = zipfile.ZipInfo('File 2 - X.txt')\ni.create_system = {host}\nz.writestr(i, b'x')");
        let mut dos = python_zip(&script(0));
        patch(&mut dos, b"File 2 - X", b"File 2 - \x94");
        assert_eq!(&*read(&dos).unwrap().entries[0].name, "File 2 - ö.txt".as_bytes());
        let mut unix = python_zip(&script(3));
        patch(&mut unix, b"File 2 - X", b"File 2 - \x94");
        assert_eq!(&*read(&unix).unwrap().entries[0].name, b"File 2 - \x94.txt", "a Unix name is its bytes");
    }

    #[test]
    fn the_old_unix_extra_field_gives_the_mtime() {
        // Info-ZIP's 0x5855 ("UX"): access time, then modification time.
        let script = "i = zipfile.ZipInfo('f', (1990, 1, 1, 0, 0, 0))\n\
                      i.extra = b'UX' + (8).to_bytes(2, 'little') + (1).to_bytes(4, 'little') + (1234567890).to_bytes(4, 'little')\n\
                      z.writestr(i, b'x')";
        let zip = python_zip(script);
        assert_eq!(read(&zip).unwrap().entries[0].unix_mtime, Some(1_234_567_890));
    }

    #[test]
    fn a_cut_directory_is_a_fault_naming_an_offset() {
        let zip = python_zip("z.writestr('f', b'data')\nz.writestr('g', b'more')");
        let dir = read(&zip).unwrap();
        // The second central record loses its signature: the directory no longer adds up.
        let mut broken = zip.clone();
        let second = dir.entries[1].at as usize;
        broken[second..second + 4].copy_from_slice(b"XXXX");
        let fault = read(&broken).expect_err("a damaged directory is refused");
        assert!(fault.offset >= dir.start, "the fault names where the damage is: {fault:?}");
        assert!(find_end(b"not a zip at all, just text").is_none());
        // Without its end record, a zip whose directory is cut short too is refused (one
        // whose directory is whole is read: see `headless`).
        assert!(read(&zip[..zip.len() - 30]).is_err(), "an end record and directory cut short");
    }
}
