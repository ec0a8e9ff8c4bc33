//! Compressed tars that must be decoded whole (one zstd frame, one xz block, lz4): onto the
//! local disk with `--stage disk`, or by `--stage auto` once RAM is short; with no room
//! anywhere, a refusal that says why, the size needed and the two ways out. And `--stage ram`
//! of a gzip tar whose decoded files exceed the budget: staged compressed, as `--help` says.

use std::fs;
use std::path::{Path, PathBuf};

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

/// As root, a temporary directory `name` with a 24 MiB tar of text files (GNU tar), its
/// extraction and an empty `local` to decode onto: (directory, extraction, tar, local).
fn dataset(name: &str) -> (TempDir, PathBuf, PathBuf, PathBuf) {
    require_root();
    let scene = Scene::new(name).files((0..24).map(|i| (format!("f{i:02}.txt"), text_like(i, 1 << 20))));
    let tar = scene.tar_dot_at(&scene.join("data.tar"));
    let (extracted, disk) = (scene.join("extracted"), scene.join("local"));
    extract_tar(&tar, &extracted);
    fs::create_dir(&disk).unwrap();
    (scene.tmp, extracted, tar, disk)
}

/// `command < tar > tmp/name`.
fn compressed(tmp: &TempDir, tar: &Path, name: &str, command: &str) -> PathBuf {
    let out = tmp.join(name);
    let script = format!("{command} < '{}' > '{}'", tar.display(), out.display());
    run_tool("sh", ["-c", script.as_str()]);
    out
}

/// No SLURM_TMPDIR or TMPDIR for `stagefs mount`: no local disk unless `--stage-dir` names one.
const NO_DISK: &[(&str, Option<&str>)] = &[("TMPDIR", None), ("SLURM_TMPDIR", None)];

/// Mounts `archive` with `args` (it must succeed), checks every byte against `expected`,
/// that it was decoded onto the local disk in `dir` (a nameless file: nothing there has a
/// name), and that nothing is left after the unmount.
fn assert_decoded_to_disk(args: &[&str], archive: &Path, expected: &Path, dir: &Path, mp: &Path) {
    let m = Mounted::with_env(NO_DISK, args, archive, mp);
    assert_trees_equal(expected, mp, &Options::default().nanos(false).xattrs(false));
    let record = status_record(mp);
    assert!(record["staging"] == "local disk", "decoded onto the local disk: {record}");
    let staged = dir.join(format!("stagefs-{}", euid()));
    let names: Vec<_> = fs::read_dir(&staged).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(names.is_empty(), "the decoded tar has no name in {}: {names:?}", staged.display());
    m.unmount().assert_success();
    assert_nothing_left(mp, "after the unmount");
    assert!(!staged.exists(), "the staging directory goes with the last mount");
}

#[test]
fn a_single_frame_zstd_larger_than_ram_is_decoded_onto_the_local_disk() {
    let (tmp, extracted, tar, disk) = dataset("whole-zstd");
    // `zstd FILE` states the decoded size in the frame header; from a pipe it does not.
    let sized = tmp.join("sized.tar.zst");
    run_tool("zstd", osargs!["-q", tar, "-o", sized]);
    let piped = compressed(&tmp, &tar, "piped.tar.zst", "zstd -q -c");
    let dir = disk.to_str().unwrap();

    // No RAM and no local disk: why, how much, and the two ways out; no option the
    // user did not pass is hinted at as something to drop.
    for archive in [&sized, &piped] {
        let mp = tmp.join("refused");
        let out = mount_env(NO_DISK, &["--max-ram", "8M"], archive, &mp);
        let size = if archive == &sized { "needs 24.0 MiB" } else { "needs more than 8." };
        out.assert_code(8).assert_stderr_has(&[
            "it is one zstd frame",
            "decoded whole",
            size,
            "the RAM budget is 8.0 MiB (--max-ram)",
            "no local disk to decode onto",
            "pzstd",
            "stagefs pack --compress zstd",
            "--stage disk --stage-dir",
        ]);
        out.assert_stderr_lacks(&["--stage copy"]);
        assert_nothing_left(&mp, "after the refusal");
    }
    // `--stage copy` was asked for: the message says so, and what dropping it does.
    let out = mount_env(NO_DISK, &["--stage", "copy", "--max-ram", "8M"], &sized, &tmp.join("copy"));
    out.assert_code(8)
        .assert_stderr_has(&["--stage copy keeps a private decompressed copy", "mount without --stage copy"]);

    // --stage disk decodes onto the local disk; --stage auto does once RAM is short, at
    // once when the header states the size, else when the budget is reached.
    assert_decoded_to_disk(&["--stage", "disk", "--stage-dir", dir], &sized, &extracted, &disk, &tmp.join("m1"));
    assert_decoded_to_disk(&["--max-ram", "8M", "--stage-dir", dir], &sized, &extracted, &disk, &tmp.join("m2"));
    assert_decoded_to_disk(&["--max-ram", "8M", "--stage-dir", dir], &piped, &extracted, &disk, &tmp.join("m3"));
}

#[test]
fn single_block_xz_and_lz4_are_refused_with_their_fix_or_decoded_onto_disk() {
    let (tmp, extracted, tar, disk) = dataset("whole-xz-lz4");
    let xz = compressed(&tmp, &tar, "data.tar.xz", "xz -1 -c");
    let lz4 = compressed(&tmp, &tar, "data.tar.lz4", "lz4 -q -c");
    for (archive, words) in
        [(&xz, ["it is one xz block", "xz -T0 --block-size"]), (&lz4, ["lz4, which has no restart points", "pzstd"])]
    {
        let out = mount_env(NO_DISK, &["--stage", "ram", "--max-ram", "8M"], archive, &tmp.join("refused"));
        out.assert_code(8).assert_stderr_has(&words).assert_stderr_has(&["decoded whole", "--stage disk --stage-dir"]);
        out.assert_stderr_lacks(&["--stage copy"]);
    }
    for (archive, mp) in [(&xz, "m-xz"), (&lz4, "m-lz4")] {
        let args = ["--stage", "disk", "--stage-dir", disk.to_str().unwrap()];
        assert_decoded_to_disk(&args, archive, &extracted, &disk, &tmp.join(mp));
    }
}

/// `--stage ram` on a .tar.gz whose files decode past `--max-ram` but whose compressed
/// bytes fit: staged compressed (the archive in the page cache), served whole and right.
#[test]
fn stage_ram_keeps_a_gzip_tar_compressed_when_its_files_do_not_fit() {
    let (tmp, extracted, tar, _) = dataset("whole-gzip-ram");
    let gz = compressed(&tmp, &tar, "data.tar.gz", "gzip -c");
    let compressed_len = fs::metadata(&gz).unwrap().len();
    assert!(compressed_len < 12 << 20, "text compresses: {compressed_len}");
    let mp = tmp.join("mnt");
    let log = tmp.join("daemon.log");
    let m = Mounted::staged(&["--stage", "ram", "--max-ram", "16M", "--log-file", log.to_str().unwrap()], &gz, &mp);
    // The warm-up runs once the mount serves; its summary is in the log.
    let log = fs::read_to_string(&log).unwrap();
    for words in ["warmed the compressed archive", "the files are decoded from it as read"] {
        assert!(log.contains(words), "no {words:?} in the log:\n{log}");
    }
    assert_trees_equal(&extracted, &mp, &Options::default().nanos(false).xattrs(false));
    m.unmount().assert_success();
}
