//! The header pass of one large tar on every core: the archive cut into pieces, each piece's headers read from the first block that checksums as a header, and joined where the pass from the start meets them (as the parallel gzip pass joins its chunks).
//!
//! Reading a header (checksum, octal fields, pax records, names) is most of a scan of tiny
//! members, and it depends only on where the header is: a piece read from a guessed
//! start gives, for every group of headers (a member and the extension headers before
//! it), exactly what the pass from the start would read there. So workers read pieces
//! ahead, from the first 512-byte block whose checksum is right, and the one pass that
//! builds the tree takes their members from the group where it arrives in the piece on.
//! A guess that was member data (a tar inside the tar) never lines up with where the pass
//! arrives: that piece is read again by the pass itself. A global pax header changes every
//! member after it, which a worker cannot know: from the first one on, the pass reads
//! alone. Memory: at most `AHEAD` pieces' members per worker wait to be taken.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::header::{checksum_ok, BLOCK};
use super::member::{Found, Member, Pending, Scan};
use crate::error::OpenError;

/// Bytes of archive per piece.
const PIECE: u64 = 16 << 20;
/// Pieces a worker may read ahead of the pass.
const AHEAD: u64 = 4;
/// Archives of fewer pieces are scanned by one pass: a piece is not worth a thread.
const MIN_PIECES: u64 = 4;

/// What a worker read of one piece.
#[derive(Default)]
struct Piece {
    /// Each group read: where its first header is, its member, where its data ends.
    groups: Vec<(u64, Member, u64)>,
    /// Where the worker stopped: the first group at or past the piece's end, the end of
    /// the archive, or a group it could not read.
    next: u64,
    ended: bool,
    failed: bool,
    /// A global pax header was among them.
    globals: bool,
}

/// The first 512-byte block at or after `from` (a multiple of 512), before `to`, that
/// could be a header: its checksum is right and it is not all zeros.
fn candidate(map: &[u8], from: u64, to: u64) -> Option<u64> {
    (from..to.min(map.len() as u64)).step_by(BLOCK).find(|&at| {
        let block = &map[at as usize..(at as usize + BLOCK).min(map.len())];
        block.len() == BLOCK && block.iter().any(|&b| b != 0) && checksum_ok(block) == Some(true)
    })
}

/// Reads the groups from `start` until one starts at or past `end` (`scan`: a pass of its
/// own over the same archive, whose tree is never used).
fn read_piece(mut scan: Scan, start: u64, end: u64) -> Piece {
    let mut piece = Piece::default();
    let mut pos = start as usize;
    while (pos as u64) < end {
        let group = pos as u64;
        match scan.next_member(&mut pos, &mut Pending::default()) {
            Ok(Found::Member { group, member, end }) => piece.groups.push((group, member, end)),
            Ok(Found::End) => {
                piece.ended = true;
                break;
            }
            Err(_) => {
                // Perhaps a wrong guess; if the pass arrives here, it reads the fault itself.
                piece.failed = true;
                pos = group as usize;
                break;
            }
        }
    }
    piece.next = pos as u64;
    piece.globals = scan.saw_globals;
    piece
}

/// Runs `scan` (a pass over the mapped `map`) with `threads - 1` workers reading pieces
/// ahead of it; the same result as `scan.run()`.
pub(super) fn run(scan: &mut Scan, map: &[u8], threads: usize) -> Result<(), OpenError> {
    run_pieces(scan, map, threads, PIECE).map(drop)
}

/// [`run`] with pieces of `piece_len` bytes (a multiple of 512); returns how many members
/// were taken from the workers.
fn run_pieces(scan: &mut Scan, map: &[u8], threads: usize, piece_len: u64) -> Result<u64, OpenError> {
    let len = map.len() as u64;
    let pieces = len.div_ceil(piece_len);
    if threads < 2 || pieces < MIN_PIECES {
        return scan.run().map(|()| 0);
    }
    let path = scan.path;
    let (next, applied, stop) = (AtomicU64::new(1), AtomicU64::new(0), AtomicBool::new(false));
    let read: Mutex<BTreeMap<u64, Piece>> = Mutex::new(BTreeMap::new());
    let changed = Condvar::new();
    let result = std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= pieces {
                    return;
                }
                // Wait until the pass is near: a bounded number of pieces wait for it.
                let mut held = read.lock().unwrap_or_else(|e| e.into_inner());
                while k > applied.load(Ordering::Acquire) + AHEAD && !stop.load(Ordering::Acquire) {
                    held = changed.wait(held).unwrap_or_else(|e| e.into_inner());
                }
                drop(held);
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let from = k * piece_len;
                let piece = match candidate(map, from, from + piece_len) {
                    Some(start) => read_piece(Scan::new(path, map), start, from + piece_len),
                    None => Piece { next: u64::MAX, ..Piece::default() },
                };
                read.lock().unwrap_or_else(|e| e.into_inner()).insert(k, piece);
                changed.notify_all();
            });
        }
        let result = join(scan, (pieces, piece_len), &read, &changed, &applied);
        stop.store(true, Ordering::Release);
        changed.notify_all();
        result
    });
    let taken = result?;
    scan.check_stream_end()?;
    Ok(taken)
}

/// The pass: piece by piece, the workers' groups from where it arrives, else its own.
fn join(
    scan: &mut Scan,
    (pieces, piece_len): (u64, u64),
    read: &Mutex<BTreeMap<u64, Piece>>,
    changed: &Condvar,
    applied: &AtomicU64,
) -> Result<u64, OpenError> {
    let (mut pos, mut taken) = (0usize, 0u64);
    for k in 0..pieces {
        let end = (k + 1) * piece_len;
        let piece = match k {
            0 => None,
            _ => {
                let mut held = read.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(piece) = held.remove(&k) {
                        break Some(piece);
                    }
                    held = changed.wait(held).unwrap_or_else(|e| e.into_inner());
                }
            }
        };
        applied.store(k, Ordering::Release);
        changed.notify_all();
        if (pos as u64) >= end {
            continue; // A member's data spans the whole piece.
        }
        if let Some(mut piece) = piece.filter(|p| !p.globals && !scan.saw_globals) {
            if let Some(first) = piece.groups.iter().position(|g| g.0 == pos as u64) {
                for (_, member, data_end) in piece.groups.drain(first..) {
                    scan.apply(member, data_end)?;
                    taken += 1;
                }
                pos = piece.next as usize;
                if piece.ended {
                    return Ok(taken);
                }
                if !piece.failed {
                    continue;
                }
            }
        }
        if scan.run_until(&mut pos, end)? {
            return Ok(taken);
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::write::{pax_record, ustar_header};
    use std::path::Path;

    /// A member `name` holding `data`, as ustar writes it (pax `records` before it).
    fn member(out: &mut Vec<u8>, name: &str, kind: u8, data: &[u8], records: &[u8]) {
        if !records.is_empty() {
            out.extend_from_slice(&ustar_header("pax", b'x', 0o644, records.len() as u64, ""));
            out.extend_from_slice(records);
            out.resize(out.len().next_multiple_of(BLOCK), 0);
        }
        out.extend_from_slice(&ustar_header(name, kind, 0o644, data.len() as u64, ""));
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }

    fn scanned(bytes: &[u8], threads: usize) -> (Scan<'_>, u64) {
        let mut scan = Scan::new(Path::new("t.tar"), bytes);
        let taken = run_pieces(&mut scan, bytes, threads, 4096).unwrap();
        (scan, taken)
    }

    /// Pieces read from guessed starts give the tree one pass gives: members of every size,
    /// pax names, a later member of a name, and a tar stored inside the tar (whose headers
    /// a guess takes for the archive's own).
    #[test]
    fn pieces_joined_give_what_one_pass_gives() {
        let mut inner = Vec::new();
        for i in 0..40 {
            member(&mut inner, &format!("inner/{i}"), b'0', b"inner bytes", &[]);
        }
        let mut tar = Vec::new();
        for i in 0..300 {
            let data = vec![b'a' + (i % 26) as u8; (i * 37) % 3000];
            let records =
                if i % 7 == 0 { pax_record("path", &format!("long/{}/{i}", "x".repeat(120))) } else { vec![] };
            member(&mut tar, &format!("d{}/f{i}", i / 50), b'0', &data, &records);
            if i == 150 {
                member(&mut tar, "nested.tar", b'0', &inner, &[]);
                member(&mut tar, "d0/f1", b'0', b"a later member of the name", &[]);
            }
        }
        tar.extend_from_slice(&[0; 1024]);
        let (one, none) = scanned(&tar, 1);
        let (many, taken) = scanned(&tar, 3);
        assert!(many.members == one.members && one.members > 300);
        assert!(none == 0 && taken > 200, "{taken} members came from the workers");
        let (a, b) = (one.builder.finish().unwrap(), many.builder.finish().unwrap());
        assert!(a == b, "the same tree");
        // A global pax header: from there on, the pass reads alone, and still agrees.
        let mut with_globals = tar[..tar.len() / 2].to_vec();
        let records = pax_record("uid", "4242");
        with_globals.extend_from_slice(&ustar_header("g", b'g', 0o644, records.len() as u64, ""));
        with_globals.extend_from_slice(&records);
        with_globals.resize(with_globals.len().next_multiple_of(BLOCK), 0);
        with_globals.extend_from_slice(&tar[tar.len() / 2..]);
        let (one, many) = (scanned(&with_globals, 1).0, scanned(&with_globals, 3).0);
        assert!(one.builder.finish().unwrap() == many.builder.finish().unwrap());
    }

    /// Damage after the middle fails the parallel pass with the error one pass gives.
    #[test]
    fn damage_is_found_where_one_pass_finds_it() {
        let mut tar = Vec::new();
        for i in 0..200 {
            member(&mut tar, &format!("f{i}"), b'0', &vec![b'z'; 700], &[]);
        }
        tar.extend_from_slice(&[0; 1024]);
        let at = 150 * 2048;
        tar[at + 10] ^= 0xff;
        let error = |threads| {
            let mut scan = Scan::new(Path::new("t.tar"), &tar);
            run_pieces(&mut scan, &tar, threads, 4096).err().map(|e| e.to_string())
        };
        let one = error(1).expect("a damaged header");
        assert!(one.contains(&format!("at byte {at}")), "{one}");
        assert_eq!(error(3), Some(one));
    }
}
