//! Writing tar headers: `stagefs demo` writes its archive with them, and tests craft archives with them.

use super::header::BLOCK;

/// Encodes one ustar header (names and link targets up to 100 bytes, owner 0:0, a fixed
/// mtime): `stagefs demo` writes its archive with it, and tests craft archives with it.
pub fn ustar_header(name: &str, typeflag: u8, mode: u32, size: u64, link: &str) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let (name, link) = (name.as_bytes(), link.as_bytes());
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[100..107].copy_from_slice(format!("{:07o}", mode & 0o7777).as_bytes());
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    if size < 1 << 33 {
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    } else {
        h[124] = 0x80; // GNU base-256 for sizes octal cannot hold.
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    h[136..147].copy_from_slice(b"14700000000");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// Encodes one pax record, `"LEN KEY=VALUE\n"` (LEN counts the whole record, itself
/// included): tests craft pax headers with it.
pub fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}
