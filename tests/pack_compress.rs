//! `stagefs pack --compress zstd|gzip`: what every zstd and gzip tool reads back, the
//! same bytes whatever the thread count, served by stagefs from its saved index or its
//! seek table; a seek table that lies is refused with its offset.

use std::fs;

use crate::kit::*;
use crate::pack::{assert_same_tree, hard_tree, pack, write};

/// `pack --compress zstd|gzip` of the hard tree: the same bytes for 1 and 64 threads;
/// `zstd -d`/`gzip -d` give back the tar `pack` writes uncompressed, which GNU tar extracts
/// to the source; the first mount uses the saved restart points, and without the index a
/// mount indexes the zstd file from its seek table. Every byte is compared with the source.
#[test]
fn compressed_packs_are_read_by_every_tool_and_by_stagefs_from_the_start() {
    require_root();
    let tmp = TempDir::new("pack-compress");
    let src = tmp.join("src");
    hard_tree(&src);
    for i in 0..300 {
        write(&src.join(format!("text/{i:03}.txt")), &text_like(i, 2_000 + (i as usize * 977) % 90_000));
    }
    let plain = tmp.join("plain.tar");
    pack(&osargs![src, plain]).assert_success();
    for (codec, ext, decompress) in [("zstd", "tar.zst", "zstd -dc"), ("gzip", "tar.gz", "gzip -dc")] {
        let mut outputs = Vec::new();
        for threads in ["1", "64"] {
            let archive = tmp.join(format!("{threads}.{ext}"));
            pack(&osargs!["--compress", codec, "--threads", threads, src, archive]).assert_success();
            outputs.push(archive);
        }
        assert!(read(&outputs[0]) == read(&outputs[1]), "{codec}: the same bytes for 1 and 64 threads");
        let archive = &outputs[0];
        let tar = tmp.join(format!("{codec}.tar"));
        let script = format!("{decompress} '{}' > '{}'", archive.display(), tar.display());
        run_tool("sh", ["-c", script.as_str()]);
        assert!(read(&tar) == read(&plain), "{codec}: decompresses to the tar pack writes");
        let gnu = tmp.join(format!("gnu-{codec}"));
        extract_tar(&tar, &gnu);
        assert_same_tree(&src, &gnu);
        // The saved index: a mount decodes nothing up front.
        let mp = tmp.join(format!("mnt-{codec}"));
        let fg = Foreground::start(archive, &mp, &tmp.join(format!("{codec}.log")), &[]);
        assert_same_tree(&gnu, &mp);
        let log = fg.finish();
        assert!(log.contains("using saved index") && !log.contains("indexed"), "{codec}: {log}");
    }
    // Without the index, the zstd file is indexed from its seek table; its frames are
    // its restart points (more than one per MiB of tar here: members end frames).
    let zst = tmp.join("1.tar.zst");
    fs::remove_file(tmp.join("1.tar.zst.stagefs-index")).unwrap();
    let mp = tmp.join("mnt-table");
    let fg = Foreground::start(&zst, &mp, &tmp.join("table.log"), &[]);
    assert_same_tree(&src, &mp);
    let log = fg.finish();
    assert!(log.contains("indexed"), "{log}");
    let table = read(&zst);
    let frames = u32::from_le_bytes(table[table.len() - 9..table.len() - 5].try_into().unwrap());
    assert!(frames as usize > read(&plain).len() >> 20, "{frames} frames");
}

/// A seek table that lies about a frame's size, or the number of frames, is refused
/// with the offset it lies at; nothing is served from it.
#[test]
fn a_seek_table_that_lies_is_refused_with_its_offset() {
    require_root();
    let tmp = TempDir::new("pack-lying-table");
    let src = tmp.join("src");
    for i in 0..40 {
        write(&src.join(format!("{i:02}.bin")), &text_like(i, 150_000));
    }
    let archive = tmp.join("good.tar.zst");
    pack(&osargs!["--compress", "zstd", src, archive]).assert_success();
    let good = read(&archive);
    let count = u32::from_le_bytes(good[good.len() - 9..good.len() - 5].try_into().unwrap()) as usize;
    let table = good.len() - (count * 8 + 17);
    let entry = |i: usize| table + 8 + i * 8;
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    // Frame 3 one byte longer, frame 4 one shorter: the total still tiles the file.
    let mut sizes = good.clone();
    let (a, b) = (u32_at(&good, entry(3)), u32_at(&good, entry(4)));
    sizes[entry(3)..entry(3) + 4].copy_from_slice(&(a + 1).to_le_bytes());
    sizes[entry(4)..entry(4) + 4].copy_from_slice(&(b - 1).to_le_bytes());
    let frame3: usize = (0..3).map(|i| u32_at(&good, entry(i)) as usize).sum();
    // A decoded size one more than the frame holds.
    let mut decoded = good.clone();
    let d = u32_at(&good, entry(2) + 4);
    decoded[entry(2) + 4..entry(2) + 8].copy_from_slice(&(d + 1).to_le_bytes());
    let frame2: usize = (0..2).map(|i| u32_at(&good, entry(i)) as usize).sum();
    // A count of a billion frames.
    let mut many = good.clone();
    let footer = many.len() - 9;
    many[footer..footer + 4].copy_from_slice(&1_000_000_000u32.to_le_bytes());
    let cases = [
        ("sizes", sizes, format!("the frame at byte {frame3} takes {} bytes; it takes {a}", a + 1)),
        ("decoded", decoded, format!("the frame at byte {frame2} decodes to {} bytes; it decodes to {d}", d + 1)),
        ("count", many, format!("at byte {footer} lists 1000000000 frames")),
    ];
    for (name, bytes, words) in cases {
        let path = tmp.join(format!("{name}.tar.zst"));
        fs::write(&path, bytes).unwrap();
        let mp = tmp.join(format!("mnt-{name}"));
        let out = mount_must_fail(&osargs!["--stage", "none", path, mp], 3, name);
        out.assert_stderr_has(&[words.as_str(), "seek table"]);
    }
}
