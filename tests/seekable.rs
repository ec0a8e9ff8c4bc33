//! Compressed tars served in place from restart points (issue 24, section 2), from gzip, pigz,
//! bgzip, pzstd, bzip2, pbzip2 and `xz -T`, each compared with its tree: reads anywhere, memory
//! bounded by the chunk cache, not the archive; restart points saved with the index.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

/// `files` (path, bytes) written under `tmp/name` and packed by GNU tar: (what `tar -x` extracts, `name.tar`).
fn tree_tar(tmp: &TempDir, name: &str, files: impl IntoIterator<Item = (String, Vec<u8>)>) -> (PathBuf, PathBuf) {
    let (src, tar, extracted) =
        (tmp.join(name), tmp.join(format!("{name}.tar")), tmp.join(format!("{name}-extracted")));
    for (path, bytes) in files {
        fs::create_dir_all(src.join(&path).parent().unwrap()).unwrap();
        fs::write(src.join(path), bytes).unwrap();
    }
    pack_tar(&src, &tar, &["."]);
    extract_tar(&tar, &extracted);
    (extracted, tar)
}

/// `files` files `d/NNNN.bin` made by `content(i)`, as [`tree_tar`].
fn numbered_tar(tmp: &TempDir, name: &str, files: u64, content: impl Fn(u64) -> Vec<u8>) -> (PathBuf, PathBuf) {
    tree_tar(tmp, name, (0..files).map(|i| (format!("d/{i:04}.bin"), content(i))))
}

/// A tree of 300 small text and binary files and one 24 MiB file (text with random runs), as [`tree_tar`].
fn dataset(tmp: &TempDir) -> (PathBuf, PathBuf) {
    let mut files = Vec::new();
    for (d, f) in (0..6u64).flat_map(|d| (0..50u64).map(move |f| (d, f))) {
        let (seed, n) = (d * 100 + f, f as usize);
        let bytes = if f % 3 == 0 { pseudo_random(seed, 3000 + n * 97) } else { text_like(seed, 20_000 + n * 1013) };
        files.push((format!("class{d}/{f:03}.bin"), bytes));
    }
    let mut big = text_like(7, 24 << 20);
    for (i, run) in big.chunks_mut(1 << 20).enumerate() {
        run[..4096].copy_from_slice(&pseudo_random(i as u64, 4096));
    }
    files.push(("big.bin".to_string(), big));
    tree_tar(tmp, "data", files)
}

/// `tool ARGS` reading the tar on stdin, writing `out`: what it wrote.
fn compress(tool: &str, args: &[&str], tar: &Path, out: &Path) -> Vec<u8> {
    let script =
        format!("{} {} < '{}' > '{}'", require_tool(tool).display(), args.join(" "), tar.display(), out.display());
    run_tool("sh", ["-c", script.as_str()]);
    read(out)
}

/// Reads of `len` bytes at offsets around the 4 MiB chunk boundaries of `big.bin`, compared with the source.
fn assert_reads_anywhere(src: &Path, mnt: &Path) {
    let want = read(&src.join("big.bin"));
    let f = fs::File::open(mnt.join("big.bin")).unwrap();
    let mut rng = Rng::new(9);
    let mut probes: Vec<u64> = (1..6).map(|k| (k << 22) - 100).collect();
    probes.extend((0..40).map(|_| rng.below(want.len() as u64 - 1)));
    for at in probes {
        let mut buf = vec![0u8; 300_000];
        let n = f.read_at(&mut buf, at).unwrap();
        assert!(n > 0 && buf[..n] == want[at as usize..at as usize + n], "big.bin: {n} bytes at {at} differ");
    }
}

/// `names` read under `mnt` by 4 readers at once, each compared with the same name under `want`.
fn read_by_four(mnt: &Path, want: &Path, names: &[String]) {
    std::thread::scope(|s| {
        for reader in 0..4 {
            s.spawn(move || {
                for name in names.iter().skip(reader).step_by(4) {
                    assert!(read(&mnt.join(name)) == read(&want.join(name)), "{name} differs");
                }
            });
        }
    });
}

#[test]
fn compressed_tars_from_the_real_tools_are_served_from_restart_points() {
    require_root();
    let tmp = TempDir::new("seekable-tools");
    let (src, tar) = dataset(&tmp);
    let cases: [(&str, &str, &[&str]); 8] = [
        ("gzip.tar.gz", "gzip", &["-6", "-c"]),
        ("pigz.tar.gz", "pigz", &["-p", "2", "-c"]),
        ("pigz-i.tar.gz", "pigz", &["-p", "2", "-i", "-c"]),
        ("bgzip.tar.gz", "bgzip", &["-@", "2", "-c"]),
        ("pzstd.tar.zst", "pzstd", &["-p", "2", "-q", "-c"]),
        ("bzip2.tar.bz2", "bzip2", &["-9", "-c"]),
        ("pbzip2.tar.bz2", "pbzip2", &["-p2", "-c"]),
        ("xz.tar.xz", "xz", &["-T2", "--block-size=4MiB", "-c"]),
    ];
    let mnt = tmp.join("mnt");
    for (name, tool, args) in cases {
        let archive = tmp.join(name);
        compress(tool, args, &tar, &archive);
        let fg = Foreground::start(&archive, &mnt, &tmp.join("mount.log"), &[]);
        assert_trees_equal(&src, &mnt, &Options::default().root(false));
        assert_reads_anywhere(&src, &mnt);
        let status = stagefs(["status"]);
        let log = fg.finish();
        assert!(log.contains("indexed") && !log.contains("decompressed ("), "{name}: not scanned compressed:\n{log}");
        status.assert_stdout_has(&[name]);
    }
}

/// 384 MiB of tar in a 10× smaller .tar.gz, read whole by 4 readers at once: every byte right, and the daemon's peak
/// memory far below the decompressed size (the chunk cache is 128 MiB) although `--max-ram` is 64 MiB, nothing staged.
#[test]
fn a_compressed_tar_larger_than_the_ram_budget_reads_in_bounded_memory() {
    require_root();
    let tmp = TempDir::new("seekable-big");
    let src = tmp.join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..48u64 {
        fs::write(src.join(format!("part{i:02}.txt")), text_like(100 + i, 8 << 20)).unwrap();
    }
    let (tar, gz) = (tmp.join("big.tar"), tmp.join("big.tar.gz"));
    pack_tar(&src, &tar, &["."]);
    compress("pigz", &["-p", "2", "-1", "-c"], &tar, &gz);
    fs::remove_file(&tar).unwrap();
    let decoded = 48u64 << 23;
    let m = Mounted::with_args(&["--max-ram", "64M"], &gz, &tmp.join("mnt"));
    read_by_four(m.path(), &src, &(0..48).map(|i| format!("part{i:02}.txt")).collect::<Vec<_>>());
    let peak = m.daemon_peak();
    eprintln!("daemon peak {} MiB for {} MiB decompressed", peak >> 20, decoded >> 20);
    assert!(peak < decoded / 2, "daemon peak {} MiB: memory follows the archive ({} MiB)", peak >> 20, decoded >> 20);
    m.unmount().assert_success();
}

/// `stagefs index` saves the restart points: the next mount uses them and decodes only what is read. A `--stage copy`
/// mount (decompressed whole) has an index of its own and leaves the restart points' alone.
#[test]
fn restart_points_are_saved_with_the_index() {
    require_root();
    let tmp = TempDir::new("seekable-index");
    let (src, tar) = dataset(&tmp);
    let gz = tmp.join("data.tar.gz");
    compress("gzip", &["-c"], &tar, &gz);
    stagefs(osargs!["index", gz]).assert_success();
    let index = tmp.join("data.tar.gz.stagefs-index");
    assert!(index.is_file());
    let mnt = tmp.join("mnt");
    let fg = Foreground::start(&gz, &mnt, &tmp.join("remount.log"), &[]);
    assert_trees_equal(&src, &mnt, &Options::default().root(false));
    let log = fg.finish();
    assert!(log.contains("using saved index") && !log.contains("indexed archive"), "{log}");

    let copy = stagefs(osargs!["-v", "mount", "--stage", "copy", gz, mnt]);
    let _guard = UnmountOnDrop(mnt.clone());
    // Decoded whole, it has an index of its own: the restart points' stays (issue 35, item 11).
    copy.assert_success().assert_stderr_lacks(&["ignoring saved index"]);
    assert!(index.is_file(), "the restart points' index stays");
    assert!(read(&mnt.join("big.bin")) == read(&src.join("big.bin")));
}

/// The compressed file rewritten in place under a mount (same size, new bytes): a read
/// that has to decode gets EIO naming the change, never other bytes, and the mount stays.
#[test]
fn a_compressed_tar_changed_under_the_mount_gives_eio() {
    require_root();
    let tmp = TempDir::new("seekable-changed");
    let (_, tar) = dataset(&tmp);
    let gz = tmp.join("data.tar.gz");
    compress("gzip", &["-c"], &tar, &gz);
    let m = Mounted::new(&gz, &tmp.join("mnt"));
    let mut bytes = read(&gz);
    let middle = bytes.len() / 2;
    bytes[middle..middle + 4096].iter_mut().for_each(|b| *b ^= 0x5a);
    fs::OpenOptions::new().write(true).open(&gz).unwrap().write_all_at(&bytes, 0).unwrap();
    let err = fs::read(m.path().join("big.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(m.path().join("class0").is_dir(), "the mount stays up");
    m.unmount().assert_success();
}

/// An extension header larger than the stream scan's look-ahead (a 17 MiB pax record) in
/// a .tar.gz: the mount fails with exit 3 and says to use --stage copy, which mounts it.
#[test]
fn a_compressed_tar_with_a_huge_extension_header_says_what_to_do() {
    require_root();
    let tmp = TempDir::new("seekable-huge-pax");
    let script = r#"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    info = tarfile.TarInfo("big-xattr.txt")
    info.pax_headers = {"SCHILY.xattr.user.big": "x" * (17 << 20)}
    info.size = 5
    t.addfile(info, io.BytesIO(b"hello"))
"#;
    let (tar, gz, mnt) = (tmp.join("pax.tar"), tmp.join("pax.tar.gz"), tmp.join("mnt"));
    run_tool("python3", osargs!["-c", script, tar]);
    compress("gzip", &["-c"], &tar, &gz);
    mount_must_fail(&osargs![gz, mnt], 3, "a header past the look-ahead").assert_stderr_has(&["--stage copy"]);
    let m = Mounted::with_args(&["--stage", "copy"], &gz, &mnt);
    assert_eq!(read(&m.path().join("big-xattr.txt")), b"hello");
    m.unmount().assert_success();
}

/// A `.tar.zst` of `zstd` runs concatenated, one of them a 48 MiB frame (past the 32 MiB a read decodes whole): the
/// large file inside it read front to back in 128 KiB reads (kept decoders, not one decode per piece from the frame's
/// start), then the small files around it by 4 readers at once; every byte compared with GNU tar's extraction.
#[test]
fn a_large_zstd_frame_reads_front_to_back_and_its_neighbours_read_at_once() {
    require_root();
    let tmp = TempDir::new("seekable-big-frame");
    let names: Vec<String> = (0..200).map(|i| format!("small/{i:03}.txt")).collect();
    let mut files: Vec<_> =
        (0..200).map(|i| (names[i].clone(), text_like(1000 + i as u64, 10_000 + i * 331 % 40_000))).collect();
    // big.bin made after the directory small/, before the rest of its files.
    files.insert(1, ("big.bin".to_string(), text_like(21, 48 << 20)));
    let (extracted, tar) = tree_tar(&tmp, "data", files);
    // Three tars: the small files, the big file, the small files again under another
    // name order; each run of `zstd` makes a frame, concatenated into one tar stream.
    let bytes = read(&tar);
    let big_at = bytes.windows(7).position(|w| w == b"big.bin").expect("big.bin's header") as u64 / 512 * 512;
    let cuts = [0, big_at as usize, (big_at as usize + 512 + (48 << 20)).min(bytes.len()), bytes.len()];
    let mut zst = Vec::new();
    for w in cuts.windows(2).filter(|w| w[0] < w[1]) {
        let part = tmp.join("part");
        fs::write(&part, &bytes[w[0]..w[1]]).unwrap();
        let out = tmp.join("part.zst");
        run_tool("zstd", osargs!["-q", "-f", part, "-o", out]);
        zst.extend(read(&out));
    }
    let archive = tmp.join("data.tar.zst");
    fs::write(&archive, zst).unwrap();
    let m = Mounted::new(&archive, &tmp.join("mnt"));
    let want = read(&extracted.join("big.bin"));
    let f = fs::File::open(m.path().join("big.bin")).unwrap();
    let mut buf = vec![0u8; 128 << 10];
    for at in (0..want.len()).step_by(buf.len()) {
        let n = f.read_at(&mut buf, at as u64).unwrap();
        assert!(buf[..n] == want[at..at + n], "big.bin differs at {at}");
    }
    drop(f);
    read_by_four(m.path(), &extracted, &names);
    m.unmount().assert_success();
}

/// Chunks of 256 KiB for the parallel gzip pass (a test hook; 4 MiB otherwise), so that
/// these archives have dozens of chunk ends, and the parallel pass even on one core.
const SMALL_CHUNKS: &str = "262144";

/// Bytes that look like deflate block starts at almost every offset once stored verbatim (`pigz -0`): chains
/// of empty stored blocks (`00 | 00 00 ff ff`, which decode without error and can run into the true chain)
/// and copies of a dynamic-Huffman block with a valid header, flushed with a sync marker.
fn lookalikes(seed: u64, len: usize) -> Vec<u8> {
    let mut compress = flate2::Compress::new(flate2::Compression::best(), false);
    let mut dynamic = Vec::with_capacity(8192);
    compress.compress_vec(&text_like(seed, 3000), &mut dynamic, flate2::FlushCompress::Sync).unwrap();
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 300_000);
    while out.len() < len {
        match rng.below(3) {
            0 => (0..rng.below(4000)).for_each(|_| out.extend_from_slice(&[0, 0, 0, 0xff, 0xff])),
            1 => (0..rng.below(40)).for_each(|_| out.extend_from_slice(&dynamic)),
            _ => out.extend(pseudo_random(rng.next(), rng.below(3000) as usize)),
        }
    }
    out.truncate(len);
    out
}

/// `tool ARGS` over `input`, written to `out` (several inputs: their outputs concatenated).
fn compress_parts(tool: &str, args: &[&str], inputs: &[&Path], out: &Path) {
    let all: Vec<u8> =
        inputs.iter().flat_map(|input| compress(tool, args, input, &out.with_extension("part"))).collect();
    fs::write(out, all).unwrap();
}

/// gzip tars from the real tools and crafted ones, each mounted with `--stage none`: the parallel first pass
/// (in small chunks) indexes them, and every file matches what GNU tar extracts.
#[test]
fn gzip_tars_decoded_in_parallel_chunks_match_gnu_tar() {
    require_root();
    let tmp = TempDir::new("seekable-pgzip");
    let (data_src, data_tar) = dataset(&tmp);
    let (random_src, random_tar) =
        numbered_tar(&tmp, "random", 60, |i| pseudo_random(i, 50_000 + (i as usize % 7) * 40_000));
    let (text_src, text_tar) = numbered_tar(&tmp, "text", 40, |i| text_like(i, 300_000 + (i as usize % 5) * 100_000));
    let (crafted_src, crafted_tar) = numbered_tar(&tmp, "crafted", 12, |i| lookalikes(i, 1 << 20));
    // The dataset's tar cut into three pieces at odd offsets, with an empty piece between.
    let bytes = fs::read(&data_tar).unwrap();
    let cuts = [0, 1_234_567, 1_234_567, 9_999_999, bytes.len()];
    let pieces: Vec<PathBuf> = (0..cuts.len() - 1).map(|i| tmp.join(format!("piece{i}"))).collect();
    pieces.iter().zip(cuts.windows(2)).for_each(|(piece, w)| fs::write(piece, &bytes[w[0]..w[1]]).unwrap());
    let piece_refs: Vec<&Path> = pieces.iter().map(PathBuf::as_path).collect();
    // (archive, the tree it holds, compressor, its options, what it compresses)
    type Case<'a> = (&'a str, &'a Path, &'a str, &'a [&'a str], &'a [&'a Path]);
    let cases: [Case; 8] = [
        ("gzip-1.tar.gz", &data_src, "gzip", &["-1", "-c"], &[&data_tar]),
        ("gzip-9.tar.gz", &data_src, "gzip", &["-9", "-c"], &[&data_tar]),
        ("pigz.tar.gz", &data_src, "pigz", &["-p", "2", "-c"], &[&data_tar]),
        ("members.tar.gz", &data_src, "gzip", &["-c"], &piece_refs),
        ("random.tar.gz", &random_src, "pigz", &["-p", "2", "-c"], &[&random_tar]),
        ("text.tar.gz", &text_src, "gzip", &["-6", "-c"], &[&text_tar]),
        ("crafted-stored.tar.gz", &crafted_src, "pigz", &["-0", "-c"], &[&crafted_tar]),
        ("crafted.tar.gz", &crafted_src, "gzip", &["-1", "-c"], &[&crafted_tar]),
    ];
    let (mnt, env) = (tmp.join("mnt"), [("STAGEFS_TEST_GZIP_CHUNK", Path::new(SMALL_CHUNKS))]);
    for (name, src, tool, args, inputs) in cases {
        let archive = tmp.join(name);
        compress_parts(tool, args, inputs, &archive);
        let fg = Foreground::start_with(&["--stage", "none"], &archive, &mnt, &tmp.join("mount.log"), &env);
        assert_trees_equal(src, &mnt, &Options::default().root(false));
        let log = fg.finish();
        assert!(log.contains("gzip decoded in parallel chunks"), "{name}: the parallel pass indexed it:\n{log}");
    }
}

/// Truncated and damaged gzip tars fail the mount with exit 3, naming the compressed byte, whichever chunk it is in.
#[test]
fn damaged_gzip_tars_fail_the_parallel_pass_with_the_offset() {
    require_root();
    let tmp = TempDir::new("seekable-pgzip-damaged");
    let (_, tar) = numbered_tar(&tmp, "random", 30, |i| pseudo_random(i, 200_000));
    let (_, text_tar) = numbered_tar(&tmp, "text", 20, |i| text_like(i, 400_000));
    let stored = compress("pigz", &["-0", "-c"], &tar, &tmp.join("stored.tar.gz"));
    let text = compress("gzip", &["-c"], &text_tar, &tmp.join("text.tar.gz"));
    let middle = text.len() / 2;
    let garbled = [&text[..middle], &[0xff; 64], &text[middle + 64..]].concat();
    // Stored blocks hold the tar verbatim: a flipped byte there is found by the CRC-32.
    let mut flipped = stored.clone();
    flipped[stored.len() * 3 / 4] ^= 0x10;
    // Junk or zeros between members: refused, never served as the members before them.
    fs::write(tmp.join("after"), b"more").unwrap();
    let after = compress("gzip", &["-c"], &tmp.join("after"), &tmp.join("after.gz"));
    let junk = [&text[..], b"junk", &after].concat();
    let zeros = [&text[..], &[0u8; 4096], &after].concat();
    let cases = [
        ("truncated", text[..text.len() * 2 / 3].to_vec(), "truncated"),
        ("garbled", garbled, "at compressed byte"),
        ("flipped", flipped, "incorrect data check"),
        ("junk-between", junk, "another gzip member starts at byte"),
        ("zeros-between", zeros, "another gzip member starts at byte"),
    ];
    let mnt = tmp.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    for (name, bytes, says) in cases {
        let archive = tmp.join(format!("{name}.tar.gz"));
        fs::write(&archive, bytes).unwrap();
        let cmd = StagefsCmd::new(osargs!["mount", "--stage", "none", archive, mnt]);
        let out = cmd.env("STAGEFS_TEST_GZIP_CHUNK", SMALL_CHUNKS).run();
        out.assert_mount_failed(&mnt, 3, &["corrupt gzip stream at or before compressed byte", says]);
    }
}
