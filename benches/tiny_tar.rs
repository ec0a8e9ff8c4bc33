//! Writes a plain tar of N tiny members fast, for benches/scale.sh: ustar headers written
//! directly (no files made first), 1,000 members per directory. Every EVERY-th member
//! holds its 16 bytes of text (one data block), the others are empty (a header alone):
//! the archive stays small enough for a disk shared with others at 16M members.
//! Built by the script with `rustc -O`; std only.
//!
//!     tiny_tar N OUT.tar [EVERY] [FIRST]   (EVERY: 1, every member holds its text;
//!                                          FIRST: 0, the number of the first member, so
//!                                          that the shards of a set name other members)
//!
//! Member `d0001234/f0001234567.txt` holds `member 1234567\n` when it holds anything: a
//! reader can check its bytes from its name. GNU tar lists the same names (`tar -tf`),
//! directories first, in the order written.

use std::io::{BufWriter, Write};

const BLOCK: usize = 512;
const PER_DIR: u64 = 1000;

/// A ustar header for `name` (at most 100 bytes), of type `kind`, `size` bytes.
fn header(name: &str, kind: u8, mode: u32, size: u64) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; BLOCK], at: usize, width: usize, v: u64| {
        let text = format!("{v:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(text.as_bytes());
    };
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(n), Some(out)) = (args.get(1).and_then(|n| n.parse::<u64>().ok()), args.get(2)) else {
        eprintln!("usage: tiny_tar N OUT.tar [EVERY]");
        std::process::exit(2);
    };
    let every = args.get(3).and_then(|e| e.parse::<u64>().ok()).unwrap_or(1).max(1);
    let first = args.get(4).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let mut w = BufWriter::with_capacity(8 << 20, std::fs::File::create(out)?);
    for i in first..first + n {
        let dir = i / PER_DIR;
        if i % PER_DIR == 0 || i == first {
            w.write_all(&header(&format!("d{dir:07}/"), b'5', 0o755, 0))?;
        }
        let body = if i % every == 0 { format!("member {i}\n") } else { String::new() };
        w.write_all(&header(&format!("d{dir:07}/f{i:010}.txt"), b'0', 0o644, body.len() as u64))?;
        if !body.is_empty() {
            let mut block = [0u8; BLOCK];
            block[..body.len()].copy_from_slice(body.as_bytes());
            w.write_all(&block)?;
        }
    }
    w.write_all(&[0u8; 2 * BLOCK])?;
    w.flush()
}
