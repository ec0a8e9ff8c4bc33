//! The first passes and reads of every codec, on streams made by the codecs' own encoders.

use std::io::Write;

use super::*;
use crate::seekable;
use crate::source::Source;
use crate::test_rng::{text_like, Rng};

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Runs the first pass over `compressed`, checks it decodes to `data`, and returns
/// the file served by the points it noted.
fn served(compressed: &[u8], data: &[u8]) -> Seekable {
    let codec = seekable::restartable(compressed).expect("seekable");
    let input = Source::memory(compressed);
    let mut pass = FirstPass::new(codec, &input).unwrap();
    let mut decoded = Vec::new();
    pass.read_to_end(&mut decoded).unwrap();
    assert!(decoded == data, "the first pass decodes the stream");
    assert_eq!(pass.consumed(), compressed.len() as u64);
    let points = pass.finish();
    assert_eq!(points.total, data.len() as u64);
    Seekable::with_own_cache(input, points, 256 << 20)
}

fn reads_match(file: &Seekable, data: &[u8]) {
    let mut rng = Rng::new(5);
    let len = data.len() as u64;
    let mut probes: Vec<(u64, usize)> = vec![(0, 1), (len - 1, 1), (0, data.len()), (read::PIECE - 10, 20)];
    for _ in 0..200 {
        let at = rng.below(len);
        probes.push((at, rng.below((len - at).min(3 << 20) + 1) as usize));
    }
    for (at, n) in probes {
        let got = file.read_at(at, n).unwrap();
        assert!(got == data[at as usize..at as usize + n], "{n} bytes at {at}");
    }
    assert!(file.read_at(len, 1).is_err(), "a read past the end fails");
}

#[test]
fn gzip_reads_anywhere_from_restart_points() {
    let data = text_like(1, 40 << 20);
    let file = served(&gzip(&data), &data);
    let points = &file.points().list;
    assert!(points.len() >= 8, "a point every ~4 MiB of 40 MiB: {}", points.len());
    assert!(points[1..].iter().all(|p| p.window.as_ref().is_some_and(|w| !w.is_empty())));
    assert!(points.iter().any(|p| p.bits != 0), "some points start inside a byte");
    reads_match(&file, &data);
}

#[test]
fn gzip_members_restart_through_member_boundaries() {
    // Members of 3 MiB: points fall at member starts and inside members, and chunks
    // decode across member ends (trailer, next header).
    let data = text_like(2, 20 << 20);
    let compressed: Vec<u8> = data.chunks(3 << 20).flat_map(gzip).collect();
    let file = served(&compressed, &data);
    assert!(file.points().list.iter().any(|p| p.out > 0 && p.window.is_none()), "member starts are points");
    reads_match(&file, &data);
}

/// `data` as bgzip writes it: members of 60 KiB input, each stating its size in a
/// `BC` extra subfield, then the empty end-of-file member.
fn bgzf(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in data.chunks(60 << 10).chain([&[][..]]) {
        let mut encoder = flate2::GzBuilder::new()
            .extra(vec![b'B', b'C', 2, 0, 0, 0])
            .write(Vec::new(), flate2::Compression::default());
        encoder.write_all(piece).unwrap();
        let mut member = encoder.finish().unwrap();
        let bsize = (member.len() - 1) as u16;
        member[16..18].copy_from_slice(&bsize.to_le_bytes());
        out.extend_from_slice(&member);
    }
    out
}

#[test]
fn bgzf_members_decode_in_parallel_runs_and_restart_there() {
    let data = text_like(7, 21 << 20);
    let compressed = bgzf(&data);
    assert!(bgzf::Pass::new(&Source::memory(&compressed)).is_some(), "taken for BGZF");
    assert!(bgzf::Pass::new(&Source::memory(&gzip(&data))).is_none(), "one plain member is not BGZF");
    // A trailer stating more than BGZF's 64 KiB makes no BGZF member: nothing is sized by it.
    let mut lying = compressed.clone();
    let first_end = usize::from(u16::from_le_bytes([compressed[16], compressed[17]])) + 1;
    lying[first_end - 4..first_end].copy_from_slice(&(1u32 << 30).to_le_bytes());
    assert!(bgzf::Pass::new(&Source::memory(&lying)).is_none(), "a member stating 1 GiB");
    let file = served(&compressed, &data);
    let points = &file.points().list;
    assert!(points.len() >= 10 && points.iter().all(|p| p.window.is_none() && p.bits == 0), "{}", points.len());
    reads_match(&file, &data);
    // A damaged member fails the pass, naming where its run starts.
    let mut damaged = compressed.clone();
    let at = compressed.len() / 2;
    damaged[at] ^= 0x55;
    let err = FirstPass::new(Compression::Gzip, &Source::memory(&damaged)).unwrap().read_to_end(&mut Vec::new());
    assert!(err.unwrap_err().to_string().contains("in the members at byte"));
}

#[test]
fn zstd_frames_are_restart_points() {
    let data = text_like(3, 12 << 20);
    let mut compressed = Vec::new();
    for piece in data.chunks(5 << 20) {
        // A skippable frame before each, as pzstd writes.
        compressed.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4]);
        compressed.extend_from_slice(&zstd::bulk::compress(piece, 3).unwrap());
    }
    let file = served(&compressed, &data);
    assert_eq!(file.points().list.len(), 3);
    reads_match(&file, &data);
    // One frame has no restart point inside it: not served this way.
    assert_eq!(seekable::restartable(&zstd::bulk::compress(&data, 3).unwrap()), None);
}

#[test]
fn zstd_frames_larger_than_the_look_ahead_are_decoded_streaming() {
    // 20 MiB in one frame (past the 16 MiB a worker decodes ahead), between small
    // ones; and a frame that is damaged fails the pass with its offset.
    let data = text_like(6, 23 << 20);
    let cuts = [0, 1 << 20, 21 << 20, data.len()];
    let frames: Vec<Vec<u8>> = cuts.windows(2).map(|w| zstd::bulk::compress(&data[w[0]..w[1]], 1).unwrap()).collect();
    let compressed = frames.concat();
    let file = served(&compressed, &data);
    assert_eq!(file.points().list.iter().map(|p| p.out).collect::<Vec<_>>(), [0, 1 << 20, 21 << 20]);
    reads_match(&file, &data);
    let mut damaged = compressed.clone();
    let at = frames[0].len() + frames[1].len() / 2;
    damaged[at] ^= 0xff;
    let input = Source::memory(&damaged);
    let err = FirstPass::new(Compression::Zstd, &input).unwrap().read_to_end(&mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains(&format!("in the frame at byte {}", frames[0].len())), "{err}");
}

fn bzip2(data: &[u8]) -> Vec<u8> {
    let mut encoder = ::bzip2::write::BzEncoder::new(Vec::new(), ::bzip2::Compression::best());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn bzip2_blocks_are_restart_points_in_every_stream() {
    // Two streams (as pbzip2 and `cat` make), ~900 kB blocks.
    let data = text_like(6, 9 << 20);
    let compressed: Vec<u8> = [bzip2(&data[..5 << 20]), bzip2(&data[5 << 20..])].concat();
    let file = served(&compressed, &data);
    let points = &file.points().list;
    assert!(points.len() >= 8, "a point per block: {}", points.len());
    assert!(points.iter().any(|p| p.bits != 0), "blocks start at bit offsets");
    reads_match(&file, &data);
}

#[test]
fn bzip2_a_false_block_magic_is_merged_back() {
    // A block boundary where there is none (as a magic inside compressed data would
    // make): the block it cuts fails its CRC, and the pass merges the two pieces.
    let data = text_like(8, 3 << 20);
    let compressed = bzip2(&data);
    let input = Source::memory(&compressed);
    let mut blocks = bzip2::blocks(&input).unwrap();
    let (start, end) = blocks[1];
    let fake = start + (end - start) / 2;
    blocks.splice(1..2, [(start, fake), (fake, end)]);
    let mut pass = bzip2::Pass::with_blocks(&input, blocks.clone());
    let mut decoded = Vec::new();
    pass.read_to_end(&mut decoded).unwrap();
    assert!(decoded == data);
    assert_eq!(pass.points().len(), blocks.len() - 1, "the false boundary is no point");
    // A block that fails with its neighbours too is damage, named with its offset.
    let mut damaged = compressed.clone();
    let middle = (blocks[2].0 / 8) as usize + 200;
    damaged[middle..middle + 32].fill(0x55);
    let err = FirstPass::new(Compression::Bzip2, &Source::memory(&damaged))
        .unwrap()
        .read_to_end(&mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("compressed byte"), "{err}");
}

#[test]
fn xz_blocks_from_the_indexes_are_restart_points() {
    // Three streams of one block each (as `cat` makes), with stream padding between
    // two; `xz -T` writes several blocks in one stream (tests/seekable.rs).
    let data = text_like(9, 7 << 20);
    let xz = |piece: &[u8]| {
        let mut encoder = liblzma::write::XzEncoder::new(Vec::new(), 1);
        encoder.write_all(piece).unwrap();
        encoder.finish().unwrap()
    };
    let mut compressed = xz(&data[..3 << 20]);
    compressed.extend_from_slice(&[0; 8]);
    compressed.extend(xz(&data[3 << 20..5 << 20]));
    compressed.extend(xz(&data[5 << 20..]));
    let file = served(&compressed, &data);
    assert_eq!(file.points().list.len(), 3);
    reads_match(&file, &data);
    // One block has no restart point inside it: not served this way.
    assert_eq!(seekable::restartable(&xz(&data)), None);
    // A damaged index is no xz index.
    let mut damaged = compressed.clone();
    let at = damaged.len() - 20;
    damaged[at] ^= 1;
    assert_eq!(seekable::restartable(&damaged), None);
}

#[test]
fn a_file_of_back_to_back_markers_is_refused_not_listed() {
    // 70,000 bzip2 block magics (6 bytes each) and 70,000 empty zstd frames: more
    // restart points than max_points allows for files this small.
    let mut bz = b"BZh9".to_vec();
    for _ in 0..70_000 {
        bz.extend_from_slice(&[0x31, 0x41, 0x59, 0x26, 0x53, 0x59]);
    }
    let input = Source::memory(&bz);
    let err = FirstPass::new(Compression::Bzip2, &input).err().expect("refused");
    assert!(err.contains("restart points"), "{err}");
    let empty = zstd::bulk::compress(b"", 1).unwrap();
    let zst: Vec<u8> = (0..70_000).flat_map(|_| empty.clone()).collect();
    assert_eq!(seekable::restartable(&zst), Some(Compression::Zstd));
    let input = Source::memory(&zst);
    let err = FirstPass::new(Compression::Zstd, &input).err().expect("refused");
    assert!(err.contains("restart points"), "{err}");
}

#[test]
fn damaged_and_truncated_gzip_fail_with_the_offset() {
    let data = text_like(4, 4 << 20);
    let mut compressed = gzip(&data);
    let mut decoded = Vec::new();
    let cut = &compressed[..compressed.len() / 2];
    let err = FirstPass::new(Compression::Gzip, &Source::memory(cut)).unwrap().read_to_end(&mut decoded).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let middle = compressed.len() / 2;
    compressed[middle..middle + 64].fill(0xff);
    let err = FirstPass::new(Compression::Gzip, &Source::memory(&compressed))
        .unwrap()
        .read_to_end(&mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("compressed byte"), "{err}");
}

#[test]
fn a_frame_is_decoded_once_for_all_the_reads_inside_it() {
    // 8 MiB frames as pzstd writes them: 64 reads of 128 KiB inside one frame, from 8
    // threads at once, start one decoder; the next frame read after it is decoded ahead.
    let data = text_like(10, 40 << 20);
    let compressed: Vec<u8> = data.chunks(8 << 20).flat_map(|p| zstd::bulk::compress(p, 1).unwrap()).collect();
    let file = served(&compressed, &data);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (file, data) = (&file, &data);
            s.spawn(move || {
                for i in 0..8u64 {
                    let at = (8 << 20) + (t * 8 + i) * (128 << 10);
                    assert!(file.read_at(at, 128 << 10).unwrap() == data[at as usize..][..128 << 10]);
                }
            });
        }
    });
    assert_eq!(file.decoders_started(), 1, "one decode serves every read of the frame");
    // Frames read in file order: after frames 1 and 2, frame 3 is decoded ahead, unasked.
    assert!(file.read_at(16 << 20, 10).unwrap() == data[16 << 20..][..10]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while file.decoders_started() < 3 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(file.decoders_started(), 3, "frame 3 decoded ahead");
    // Served from that decode; reading it (in order again) decodes frame 4, the last,
    // ahead; reading that starts nothing more.
    assert!(file.read_at(24 << 20, 8 << 20).unwrap() == data[24 << 20..32 << 20]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while file.decoders_started() < 4 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(file.read_at(32 << 20, 8 << 20).unwrap() == data[32 << 20..]);
    assert_eq!(file.decoders_started(), 4, "each frame decoded once");
    reads_match(&file, &data);
}

#[test]
fn a_large_frame_read_front_to_back_is_decoded_once() {
    // One 96 MiB frame between two small ones (past WHOLE_UNIT: decoded in pieces by a
    // decoder kept where it stopped). Read in 1 MiB steps, front to back: one decoder,
    // not one per piece from the frame's start.
    let data = text_like(11, 98 << 20);
    let cuts = [0, 1 << 20, 97 << 20, data.len()];
    let compressed: Vec<u8> =
        cuts.windows(2).flat_map(|w| zstd::bulk::compress(&data[w[0]..w[1]], 1).unwrap()).collect();
    let file = served(&compressed, &data);
    let wait_until_cached = |at: u64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !file.is_cached(at) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        file.is_cached(at)
    };
    for at in (1u64 << 20..97 << 20).step_by(1 << 20) {
        assert!(file.read_at(at, 1 << 20).unwrap() == data[at as usize..][..1 << 20], "at {at}");
        // From the third piece on (the large frame starts at 1 MiB), each next piece is
        // decoded ahead; waiting for it makes the reader find it in the cache, and such
        // a read must go on reading ahead.
        let (next, frame) = (at + (1 << 20), 1u64 << 20);
        if next >= frame + 2 * read::PIECE && (next - frame) % read::PIECE == 0 {
            assert!(wait_until_cached(next), "the piece at {next} is decoded ahead");
        }
    }
    // One kept decoder for the large frame (its pieces decoded ahead of the reader by
    // that decoder), and the small frame after it decoded ahead once the reader got there.
    assert!(wait_until_cached(97 << 20), "the frame after the large one is decoded ahead");
    assert_eq!(file.decoders_started(), 2, "one decoder for the large frame, one for the next");
    reads_match(&file, &data);
}
