//! Tests of the parallel gzip pass: streams from the real tools decoded exactly, restart points that resume, damage found with its offset, crafted streams that look like block starts everywhere.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use super::*;
use crate::codec::Compression;
use crate::seekable::pgzip_tuning::{CHUNK_CAP, PIECE};
use crate::seekable::{gzip, CodecPass, Points, Seekable};
use crate::source::Source;
use crate::test_rng::{pseudo_random, text_like, Rng};

/// `data` compressed by `tool ARGS` (gzip, pigz: on every test machine, see .ci/run).
fn compress(tool: &str, args: &[&str], data: &[u8]) -> Vec<u8> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool} is needed (see .ci/run): {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "{tool} {args:?} failed");
    out.stdout
}

/// The parallel pass over `compressed` with chunks of `chunk` bytes: its output, or
/// the error it failed with; and the pass itself (for its points and stats).
fn run(compressed: &[u8], tuning: Tuning) -> (Result<Vec<u8>, String>, Stats, Vec<Point>, u64) {
    let input = Source::memory(compressed);
    let mut pass = Pass::tuned(&input, tuning).unwrap();
    let mut out = Vec::new();
    let result = pass.read_to_end(&mut out).map(|_| out).map_err(|e| e.to_string());
    let stats = pass.stats();
    let total = pass.total();
    let points = std::mem::take(pass.points());
    (result, stats, points, total)
}

/// Decodes with the parallel pass and checks every byte, and that reads from each of
/// its restart points (through the read path) give the right bytes.
fn decodes(compressed: &[u8], data: &[u8], tuning: Tuning) -> Stats {
    let (result, stats, mut points, total) = run(compressed, tuning);
    let decoded = result.unwrap();
    assert!(decoded == data, "decoded {} bytes, expected {}", decoded.len(), data.len());
    assert_eq!(total, data.len() as u64);
    assert!(points.windows(2).all(|w| w[0].out < w[1].out), "points in order");
    for point in &mut points {
        if let Some(window) = &mut point.window {
            *window = zstd::bulk::compress(window, 1).unwrap();
        }
    }
    let points = Points { codec: Compression::Gzip, list: points, total };
    let file = Seekable::new(Source::memory(compressed), points, &crate::Caches::default());
    for (i, point) in file.points().list.iter().enumerate() {
        let n = (data.len() as u64 - point.out).min(100_000) as usize;
        let got = file.read_at(point.out, n).unwrap();
        assert!(got == data[point.out as usize..point.out as usize + n], "point {i} at {}", point.out);
    }
    let mut rng = Rng::new(3);
    for _ in 0..20 {
        let at = rng.below(data.len() as u64);
        let n = (data.len() as u64 - at).min(super::SPAN + 7) as usize;
        assert!(file.read_at(at, n).unwrap() == data[at as usize..at as usize + n], "{n} bytes at {at}");
    }
    stats
}

/// The sequential pass (`gzip.rs`) over `compressed`: its output or error.
fn sequential(compressed: &[u8]) -> Result<Vec<u8>, String> {
    let input = Source::memory(compressed);
    let mut out = Vec::new();
    gzip::Pass::new(&input).unwrap().read_to_end(&mut out).map(|_| out).map_err(|e| e.to_string())
}

/// Small chunks, every worker kept: the guessing and joining are what is tested.
fn small(chunk_bytes: usize) -> Tuning {
    Tuning { chunk_bytes, cap: CHUNK_CAP, workers: None, wait: Wait::Always, piece: PIECE }
}

/// Raw deflate of `data` (level `level`, flushed with `flush`), with a preset dictionary.
fn raw_deflate(data: &[u8], level: u32, dictionary: Option<&[u8]>, flush: flate2::FlushCompress) -> Vec<u8> {
    let mut compress = flate2::Compress::new(flate2::Compression::new(level), false);
    if let Some(dictionary) = dictionary {
        compress.set_dictionary(dictionary).unwrap();
    }
    let mut out = Vec::with_capacity(data.len() + (data.len() >> 4) + 1024);
    compress.compress_vec(data, &mut out, flush).unwrap();
    assert_eq!(compress.total_in(), data.len() as u64, "the output had room");
    out
}

/// A gzip member: `header`, the deflate stream, and a trailer for `data`.
fn member(header: &[u8], deflate: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = [header, deflate].concat();
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

const PLAIN_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];

/// A header with every optional field: extra, name, comment and its own CRC.
fn full_header() -> Vec<u8> {
    let mut header = vec![0x1f, 0x8b, 8, 4 | 8 | 16 | 2, 1, 2, 3, 4, 0, 3, 6, 0, b'S', b'F', 2, 0, 7, 7];
    header.extend_from_slice(b"name.tar\0a comment\0");
    let crc = crc32fast::hash(&header) as u16;
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

#[test]
fn streams_of_the_real_tools_decode_exactly_in_chunks_that_fit() {
    let text = text_like(11, 6 << 20);
    let mut mixed = text_like(12, 4 << 20);
    for (i, run) in mixed.chunks_mut(1 << 20).enumerate() {
        run[..200_000].copy_from_slice(&pseudo_random(i as u64, 200_000));
    }
    let random = pseudo_random(13, 4 << 20);
    let cases: [(&str, &[&str], &[u8]); 6] = [
        ("gzip", &["-1", "-c"], &text),
        ("gzip", &["-9", "-c"], &text),
        ("pigz", &["-p", "2", "-c"], &text),
        ("pigz", &["-p", "2", "-c"], &mixed),
        ("pigz", &["-p", "2", "-c"], &random),
        ("gzip", &["-6", "-c"], &random),
    ];
    for (tool, args, data) in cases {
        let compressed = compress(tool, args, data);
        // (Chunks large enough to hold a block start: gzip -9 blocks of text are ~50 KB.)
        let stats = decodes(&compressed, data, small(128 << 10));
        let chunks = compressed.len().div_ceil(128 << 10) as u32;
        // The guesses meet the chain: most chunks are used as the workers decoded them.
        assert!(stats.accepted * 4 >= chunks * 3, "{tool} {args:?}: {stats:?} of {chunks} chunks");
    }
}

#[test]
fn members_of_every_shape_are_checked_and_restart_points() {
    // gzip, an empty member, pigz, a member with every optional header field, pigz -i
    // (independent blocks), an empty member last.
    let parts = [
        text_like(21, 700_000),
        Vec::new(),
        pseudo_random(22, 300_000),
        text_like(23, 500_000),
        text_like(24, 900_000),
    ];
    let mut compressed = compress("gzip", &["-c"], &parts[0]);
    compressed.extend(compress("gzip", &["-c"], &parts[1]));
    compressed.extend(compress("pigz", &["-p", "2", "-c"], &parts[2]));
    compressed.extend(member(
        &full_header(),
        &raw_deflate(&parts[3], 6, None, flate2::FlushCompress::Finish),
        &parts[3],
    ));
    compressed.extend(compress("pigz", &["-p", "2", "-i", "-c"], &parts[4]));
    compressed.extend(compress("gzip", &["-c"], b""));
    let data = parts.concat();
    for chunk in [8 << 10, 100 << 10, 1 << 20] {
        decodes(&compressed, &data, small(chunk));
        // The pass decodes chunks itself (in pieces that often end inside a block), and
        // meets the workers' chunks of the same places after.
        for wait in [Wait::ForFast, Wait::Never] {
            decodes(&compressed, &data, Tuning { wait, piece: 10_000, ..small(chunk) });
        }
    }
    // Trailing zeros are ignored, as gzip does; other trailing bytes are refused by both
    // passes, and so are zeros or junk with members after them (never served without them).
    let padded = [&compressed[..], &[0u8; 1000]].concat();
    assert!(run(&padded, small(64 << 10)).0.unwrap() == data);
    assert!(sequential(&padded).unwrap() == data);
    let last = compress("gzip", &["-c"], b"after the gap");
    for (tail, says) in [
        (b"not gzip".to_vec(), "the first nonzero at byte"),
        ([&[0u8; 512][..], &last].concat(), "another gzip member starts at byte"),
        ([&b"junk"[..], &last].concat(), "another gzip member starts at byte"),
    ] {
        let bad = [&compressed[..], &tail].concat();
        for e in [run(&bad, small(64 << 10)).0.unwrap_err(), sequential(&bad).unwrap_err()] {
            assert!(e.contains(says) && e.contains(&format!("compressed byte {}", compressed.len())), "{e}");
        }
    }
}

#[test]
fn damage_fails_with_the_compressed_byte_as_the_sequential_pass_does() {
    let text = text_like(31, 3 << 20);
    let random = pseudo_random(32, 1 << 20);
    let stream = [compress("gzip", &["-c"], &text), compress("gzip", &["-c"], &random)].concat();
    let first = stream.len() - compress("gzip", &["-c"], &random).len();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut in the deflate data", stream[..first / 2].to_vec(), "truncated"),
        ("cut in the trailer", stream[..stream.len() - 3].to_vec(), "truncated"),
        ("cut in the second header", stream[..first + 5].to_vec(), "truncated"),
    ];
    let mut garbled = stream.clone();
    garbled[first / 2..first / 2 + 64].fill(0xff);
    cases.push(("64 bytes of 0xff", garbled, "compressed byte"));
    // The random member is stored blocks: a flipped byte there is only seen by its CRC.
    let mut flipped = stream.clone();
    flipped[first + 500_000] ^= 1;
    cases.push(("a flipped stored byte", flipped, "incorrect data check"));
    let mut size = stream.clone();
    let at = size.len() - 4;
    size[at] ^= 1;
    cases.push(("a wrong size", size, "incorrect length check"));
    for (what, damaged, says) in cases {
        assert!(sequential(&damaged).is_err(), "{what}: the sequential pass fails too");
        for tuning in
            [small(16 << 10), small(256 << 10), Tuning { wait: Wait::Never, piece: 10_000, ..small(64 << 10) }]
        {
            let err = run(&damaged, tuning).0.expect_err(what);
            assert!(err.contains(says), "{what}: {err}");
        }
    }
}

#[test]
fn a_reference_before_its_member_start_is_refused() {
    // The second member's deflate stream was made with a preset dictionary (the first
    // member's tail): its references reach before its start, which gzip forbids; a
    // chunk starting inside it must not resolve them from the first member's bytes.
    let a = text_like(41, 400_000);
    let b = text_like(42, 600_000);
    let deflate = raw_deflate(&b, 6, Some(&a[a.len() - 32768..]), flate2::FlushCompress::Finish);
    let stream = [compress("gzip", &["-c"], &a), member(&PLAIN_HEADER, &deflate, &b)].concat();
    assert!(sequential(&stream).is_err());
    for chunk in [4 << 10, 32 << 10, 1 << 20] {
        // (zlib-rs 0.6 reports this as "repeated call with bad state".)
        let err = run(&stream, small(chunk)).0.expect_err("refused");
        assert!(err.contains("compressed byte"), "{err}");
    }
}

/// Stored blocks (gzip -0 style) whose content looks like block starts at almost every
/// byte: chains of empty stored blocks (`00 | 00 00 ff ff`, a false chain that decodes
/// without error and can merge into the true one) and copies of a dynamic block with a
/// valid header ending in a sync marker.
fn crafted_lookalikes() -> Vec<u8> {
    let dynamic = raw_deflate(&text_like(51, 3000), 9, None, flate2::FlushCompress::Sync);
    let mut content = Vec::new();
    let mut rng = Rng::new(52);
    while content.len() < 3 << 20 {
        match rng.below(3) {
            0 => (0..rng.below(4000)).for_each(|_| content.extend_from_slice(&[0, 0, 0, 0xff, 0xff])),
            1 => (0..rng.below(40)).for_each(|_| content.extend_from_slice(&dynamic)),
            _ => content.extend(pseudo_random(rng.next(), rng.below(3000) as usize)),
        }
    }
    content
}

#[test]
fn a_stream_that_looks_like_block_starts_everywhere_decodes_exactly_in_bounded_work() {
    let data = crafted_lookalikes();
    let stored = member(&PLAIN_HEADER, &raw_deflate(&data, 0, None, flate2::FlushCompress::Finish), &data);
    for compressed in [stored, compress("gzip", &["-1", "-c"], &data)] {
        for chunk in [4 << 10, 64 << 10] {
            let stats = decodes(&compressed, &data, small(chunk));
            let chunks = compressed.len().div_ceil(chunk) as u64;
            // Each chunk's failed guesses stop at their budget (4 chunks' bits, 64 bits
            // at least a guess): at most that many each.
            assert!(u64::from(stats.false_starts) <= chunks * (4 * 8 * chunk as u64 / 64 + 1), "{stats:?}");
        }
    }
}

#[test]
fn a_chunk_at_its_memory_cap_is_cut_and_the_pass_decodes_on() {
    // Text compressing ~10:1 in chunks of 64 KiB, each allowed 128 KiB of output.
    let data = text_like(61, 4 << 20);
    let compressed = compress("gzip", &["-9", "-c"], &data);
    let stats = decodes(&compressed, &data, Tuning { cap: 128 << 10, ..small(64 << 10) });
    assert!(stats.sequential > 0 && stats.accepted > 1, "{stats:?}");
}

#[test]
fn workers_are_given_up_where_markers_outweigh_them() {
    // A small vocabulary: every match refers back through earlier ones, so the markers
    // never die out; with two workers, decoding in order alone is faster.
    let data = text_like(71, 6 << 20);
    let compressed = compress("gzip", &["-6", "-c"], &data);
    let stats = decodes(&compressed, &data, Tuning { workers: Some(2), ..small(64 << 10) });
    assert!(stats.gave_up && stats.sequential > data.len() as u64 / 2, "{stats:?}");
    // Random data leaves no markers past each chunk's first 32 KiB: the workers stay.
    let data = pseudo_random(72, 4 << 20);
    let compressed = compress("gzip", &["-6", "-c"], &data);
    let stats = decodes(&compressed, &data, Tuning { workers: Some(2), ..small(256 << 10) });
    assert!(!stats.gave_up && stats.marked * 4 < stats.guessed, "{stats:?}");
}
