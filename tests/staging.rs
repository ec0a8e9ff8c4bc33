//! RAM staging (a memfd `stagefs:<file name>`), compressed tars by the real CLI tools, the RAM
//! budget, corrupt streams and saved indexes: whatever ends a mount or refuses it, nothing stays.
//!
//! A memfd's pages show system-wide only in `Shmem:` (with tmpfs pages). Other tests run in
//! parallel: the checks stage 128 MiB, accept a change of half of it, and run one at a time.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::compare::{assert_trees_equal, count_entries, Options};
use crate::kit::*;

const MIB: usize = 1 << 20;
/// The zeros that make the staged archives stand out in Shmem from other tests' activity.
const PAD_LEN: u64 = 128 << 20;

// -- Trees and archives -----------------------------------------------------

/// As root, `data/` under `src` of a new temporary directory: 3 MiB random, 1.5 MiB of text,
/// a nested small file, a symlink, a hard link and an empty file (`seed` varies the content),
/// `more` added; packed into `name` there by GNU tar.
fn tree_tar(label: &str, seed: u64, name: &str, more: impl FnOnce(&Path)) -> (TempDir, PathBuf, PathBuf) {
    require_root();
    let lines = (0u64..).map(|i| format!("line {i:08} of seed {seed}: compressible text\n"));
    let text: String = lines.scan(0, |len, l| (*len < 3 * MIB / 2).then_some(l).inspect(|l| *len += l.len())).collect();
    let scene = Scene::new(label)
        .file("data/big.bin", pseudo_random(seed, 3 * MIB + 12345))
        .file("data/text.txt", text)
        .file("data/nested/deeper/small.txt", format!("small {seed}\n"))
        .file("data/empty", "")
        .symlink("data/link", "nested/deeper/small.txt");
    let src = scene.src().to_path_buf();
    fs::hard_link(src.join("data/text.txt"), src.join("data/text-hardlink.txt")).unwrap();
    more(&src);
    let tar = scene.join(name);
    fs::create_dir_all(tar.parent().unwrap()).unwrap();
    scene.tar_at(&tar);
    (scene.tmp, src, tar)
}

/// `tool ARGS... INPUT` (writing to stdout with `-c`) appended to `output`.
fn run_to_file(tool: &str, args: &[&str], input: &Path, output: &Path) {
    let out = fs::OpenOptions::new().create(true).append(true).open(output).unwrap();
    let mut cmd = Command::new(require_tool(tool));
    cmd.args(args).arg(input);
    run_cmd_into(&mut cmd, Duration::from_secs(300), Some(out)).assert_success();
}

/// How `compress` cuts the tar into separately compressed pieces: one member/stream/frame;
/// three pieces cut at unaligned offsets; the first tar header alone (the "data/" directory,
/// a valid tar prefix on its own), then the rest.
enum Split {
    Whole,
    Thirds,
    AfterFirstHeader,
}
use Split::*;

/// `tool ARGS -c` of `tar`, whole or in pieces compressed on their own and concatenated
/// (multi-member gzip, multi-stream bzip2/xz, multi-frame zstd/lz4, as parallel compressors
/// and `cat a.gz b.gz` make); `tool -dc` must give back the tar byte for byte.
fn compress(tool: &str, args: &[&str], tar: &Path, split: Split, scratch: &TempDir) -> PathBuf {
    let ext = match tool {
        "gzip" | "pigz" => "gz",
        "bzip2" => "bz2",
        "zstd" => "zst",
        xz_or_lz4 => xz_or_lz4,
    };
    let out = tar.with_file_name(format!("{}.{ext}", tar.file_name().unwrap().to_string_lossy()));
    let (bytes, c_args) = (read(tar), [&["-c"][..], args].concat());
    let n = bytes.len();
    let cuts = match split {
        Whole => vec![0, n],
        Thirds => vec![0, n / 3 + 17, n * 2 / 3 + 34, n],
        AfterFirstHeader => vec![0, 512, n],
    };
    let _ = fs::remove_file(&out);
    for (i, w) in cuts.windows(2).enumerate() {
        let piece = scratch.join(format!("piece{i}"));
        fs::write(&piece, &bytes[w[0]..w[1]]).unwrap();
        run_to_file(tool, &c_args, &piece, &out);
        fs::remove_file(&piece).unwrap();
    }
    let back = scratch.join("decompressed-by-the-tool.tar");
    run_to_file(tool, &["-dc"], &out, &back);
    assert!(read(&back) == bytes, "`{tool} -dc {}` does not give back the tar (test setup)", out.display());
    fs::remove_file(&back).unwrap();
    out
}

// -- Daemon, memory and status inspection -----------------------------------

/// The one daemon serving `mp`.
fn daemon_pid(mp: &Path) -> i32 {
    let pids = stagefs_pids(mp);
    assert_eq!(pids.len(), 1, "expected exactly one stagefs daemon for {}, found {pids:?}", mp.display());
    pids[0]
}

/// The daemon's mapping of the staging memfd of `archive`: (line of /proc/PID/maps, size in bytes).
fn memfd_mapping(pid: i32, archive: &Path) -> Option<(String, u64)> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let wanted = format!("/memfd:stagefs:{} (deleted)", archive.file_name()?.to_string_lossy());
    let line = maps.lines().find(|l| l.ends_with(&wanted))?;
    let (a, b) = line.split(' ').next()?.split_once('-')?;
    Some((line.to_string(), u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?))
}

/// Panics unless the daemon maps a memfd named after the archive, of `len` bytes (in pages).
fn assert_memfd_mapped(pid: i32, archive: &Path, len: u64) {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let (line, size) = memfd_mapping(pid, archive).unwrap_or_else(|| {
        panic!("daemon {pid} maps no memfd `stagefs:` of {}; its /proc/{pid}/maps:\n{maps}", archive.display())
    });
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 };
    assert_eq!(size, len.next_multiple_of(page), "the memfd mapping must hold the {len} staged bytes: {line}");
}

/// `Shmem:` of /proc/meminfo in bytes: all memfd and tmpfs pages of the system.
fn shmem_bytes() -> u64 {
    proc_kb_field("/proc/meminfo", "Shmem")
}

/// /dev/shm entries (name, size).
fn dev_shm() -> BTreeSet<(OsString, u64)> {
    fs::read_dir("/dev/shm")
        .map(|rd| rd.flatten().map(|e| (e.file_name(), e.metadata().map(|m| m.len()).unwrap_or(0))).collect())
        .unwrap_or_default()
}

/// Panics if /dev/shm gained an entry named like stagefs or of half `staged` bytes or more
/// (other programs may create small files there meanwhile).
fn assert_nothing_new_in_dev_shm(before: &BTreeSet<(OsString, u64)>, staged: u64, context: &str) {
    let ours_or_big = |(n, len): &&(OsString, u64)| n.to_string_lossy().contains("stagefs") || *len >= staged / 2;
    let new: Vec<_> = dev_shm().difference(before).filter(ours_or_big).cloned().collect();
    assert!(new.is_empty(), "{context}: new files in /dev/shm: {new:?}");
}

/// Panics unless `stagefs status --json` reports the private copy in RAM `expected` for `mp`: "-" for
/// none, else its size as status shows sizes; "DEAD" if its daemon is gone; None if not listed.
fn assert_status_staged(mp: &Path, expected: Option<&str>) {
    let got = status_record_in(&stagefs(["status", "--json"]), mp).map(|r| match r["staged_bytes"].as_u64() {
        _ if r["state"] == "dead" => "DEAD".to_string(),
        Some(0) => "-".to_string(),
        bytes => bytes.map_or("?".to_string(), stagefs_open::report::human),
    });
    let status = stagefs(["status"]).stdout;
    assert_eq!(got.as_deref(), expected, "{} must show STAGED {expected:?} in:\n{status}", mp.display());
}

/// Waits up to 10 s for the system's Shmem to drop to `at_most` bytes.
fn assert_shmem_drops_to(at_most: u64, context: &str) {
    let ok = wait_until(Duration::from_secs(10), || shmem_bytes() <= at_most);
    let (now, at_most) = (shmem_bytes() >> 20, at_most >> 20);
    assert!(ok, "{context}: Shmem stays at {now} MiB, expected at most {at_most} MiB: the staging memfd was not freed");
}

// -- 1. Compressed tars -----------------------------------------------------

/// The tree's tar compressed by `tool`, mounted: compared with `tar -x` of the tar and with
/// the source files; the staging memfd, `stagefs status`, and nothing left after umount.
fn compressed_case(tool: &str, args: &[&str], split: Split) {
    let (tmp, src, tar) = tree_tar(&format!("compressed-{tool}"), 11, "archive.tar", |_| ());
    let several = !matches!(split, Whole);
    let (compressed, expected, mp) = (compress(tool, args, &tar, split, &tmp), tmp.join("expected"), tmp.join("mnt"));
    // GNU tar 1.34 does not detect lz4: extract the tar `compress` proved the tool gives back.
    extract_tar(&tar, &expected);
    assert_eq!(count_entries(&expected), 9, "reference extraction");
    let m = Mounted::new(&compressed, &mp);
    assert_trees_equal(&expected, m.path(), &Options::default().root(false));
    let pid = daemon_pid(m.path());
    // gzip restarts anywhere, bzip2 at each block, xz and zstd at each of several blocks or frames:
    // those are served from the compressed file by restart points, the others decompressed whole.
    let restarts = matches!(tool, "gzip" | "pigz" | "bzip2")
        || (tool == "zstd" && several)
        || (tool == "xz" && (several || args.iter().any(|a| a.starts_with("--block-size"))));
    if restarts {
        assert!(memfd_mapping(pid, &compressed).is_none(), "{tool}: served compressed, not decompressed into a memfd");
        assert_status_staged(m.path(), Some("-"));
    } else {
        assert_memfd_mapped(pid, &compressed, fs::metadata(&tar).unwrap().len());
        // The 4,741,120-byte GNU tar of `make_tree`, as `stagefs status` writes it.
        assert_status_staged(m.path(), Some("4.5 MiB"));
    }
    for rel in ["data/big.bin", "data/text.txt", "data/nested/deeper/small.txt"] {
        assert!(read(&src.join(rel)) == read(&m.path().join(rel)), "{rel}: the mount differs from the source file");
    }
    // Random access across the 1 MiB boundaries of the big file.
    let (big, f) = (read(&src.join("data/big.bin")), fs::File::open(m.path().join("data/big.bin")).unwrap());
    for off in [0, MIB - 1, 2 * MIB + 7, big.len() - 100] {
        let mut buf = vec![0u8; 70_000];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        assert!(n > 0 && buf[..n] == big[off..off + n], "read_at({off}) returned wrong bytes ({n})");
    }
    drop(f);
    m.unmount().assert_success();
    assert_nothing_left(&mp, &format!("{tool}: after umount"));
    assert!(!process_alive(pid), "{tool}: daemon {pid} still alive after umount");
}

cases! {
    compressed_gzip => compressed_case("gzip", &["-6"], Whole);
    // Members of different levels in one file (cat fast.gz best.gz).
    compressed_gzip_fast_and_best_members => {
        compressed_case("gzip", &["-1"], Thirds);
        compressed_case("gzip", &["-9"], Whole);
    };
    compressed_pigz => compressed_case("pigz", &["-p", "2", "-b", "128"], Whole);
    compressed_pigz_multi_member => compressed_case("pigz", &["-p", "2"], Thirds);
    compressed_pigz_independent_blocks => compressed_case("pigz", &["-p", "2", "-i", "-b", "64"], Whole);
    compressed_bzip2 => compressed_case("bzip2", &["-9"], Whole);
    compressed_bzip2_multi_stream => compressed_case("bzip2", &["-1"], Thirds);
    compressed_xz => compressed_case("xz", &["-1"], Whole);
    compressed_xz_multi_block_threads =>
        compressed_case("xz", &["-1", "-T2", "--block-size=1MiB", "--check=sha256"], Whole);
    compressed_xz_multi_stream_no_check => compressed_case("xz", &["-0", "--check=none"], Thirds);
    compressed_zstd => compressed_case("zstd", &["-q", "-3"], Whole);
    compressed_zstd_multi_frame => compressed_case("zstd", &["-q", "-1", "--no-check"], Thirds);
    compressed_zstd_threads_long => compressed_case("zstd", &["-q", "-T2", "-B1048576", "--long=24"], Whole);
    compressed_lz4 => compressed_case("lz4", &["-q"], Whole);
    compressed_lz4_linked_blocks_checksums_content_size =>
        compressed_case("lz4", &["-q", "-BD", "-BX", "-B4", "--content-size"], Whole);
    compressed_lz4_multi_frame => compressed_case("lz4", &["-q", "-9"], Thirds);
    // Should the first frame end where a tar header could start, stopping there would silently lack files.
    compressed_lz4_second_frame_at_a_member_boundary => compressed_case("lz4", &["-q"], AfterFirstHeader);
    compressed_gzip_second_member_at_a_member_boundary => compressed_case("gzip", &["-q"], AfterFirstHeader);
    compressed_zstd_second_frame_at_a_member_boundary => compressed_case("zstd", &["-q"], AfterFirstHeader);
}

// -- 2. --stage ram on a plain tar ------------------------------------------

/// A plain tar of the tree plus 128 MiB of zeros, its extraction, /dev/shm before, and the lock
/// that runs the Shmem tests one at a time (one's 128 MiB freed would show as another's not taken).
struct BigTar {
    tmp: TempDir,
    tar: PathBuf,
    len: u64,
    expected: PathBuf,
    mp: PathBuf,
    shm_before: BTreeSet<(OsString, u64)>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn big_tar(label: &str) -> BigTar {
    static SHMEM_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SHMEM_TESTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let pad = |src: &Path| fs::File::create(src.join("data/pad.bin")).unwrap().set_len(PAD_LEN).unwrap();
    let (tmp, src, tar) = tree_tar(label, 21, "big.tar", pad);
    fs::remove_dir_all(&src).unwrap();
    let len = fs::metadata(&tar).unwrap().len();
    assert!(len > PAD_LEN, "the tar must store the zeros (no --sparse)");
    let (expected, mp) = (tmp.join("expected"), tmp.join("mnt"));
    extract_tar(&tar, &expected);
    BigTar { tmp, tar, len, expected, mp, shm_before: dev_shm(), _serial }
}

/// Mounts with `--stage copy` and checks: memfd mapped, Shmem grew, status shows the staged
/// size, content right. Returns the guard, the daemon pid and Shmem while mounted.
fn mount_staged(b: &BigTar, shmem_before: u64) -> (Mounted, i32, u64) {
    let m = Mounted::staged(&["--stage", "copy"], &b.tar, &b.mp);
    let pid = daemon_pid(m.path());
    assert_memfd_mapped(pid, &b.tar, b.len);
    let during = shmem_bytes();
    let (before, now, staged) = (shmem_before >> 20, during >> 20, b.len >> 20);
    assert!(during >= shmem_before + b.len / 2, "Shmem grew {before} -> {now} MiB only while {staged} MiB are staged");
    // 4,741,120 bytes of `make_tree` plus the 128 MiB pad and its header.
    assert_status_staged(m.path(), Some("132.5 MiB"));
    assert_trees_equal(&b.expected, m.path(), &Options::default().root(false));
    (m, pid, during)
}

/// After the mount went (`how`): not in /proc/mounts, nothing left, not in `stagefs status`,
/// nothing new in /dev/shm, and Shmem down by half the archive from `during`.
fn assert_freed(b: &BigTar, during: u64, how: &str) {
    let proc_mounts = fs::read_to_string("/proc/mounts").unwrap();
    let listed: Vec<&str> = proc_mounts.lines().filter(|l| l.split(' ').nth(1) == b.mp.to_str()).collect();
    assert!(listed.is_empty(), "{how}: still in /proc/mounts: {listed:?}");
    assert_nothing_left(&b.mp, how);
    assert_status_staged(&b.mp, None);
    assert_nothing_new_in_dev_shm(&b.shm_before, b.len, how);
    assert_shmem_drops_to(during - b.len / 2, how);
}

#[test]
fn stage_ram_plain_tar_umount_frees_everything() {
    let b = big_tar("stage-ram-umount");
    let (m, pid, during) = mount_staged(&b, shmem_bytes());
    // The same archive served in place shows "-".
    let m2 = Mounted::with_args(&["--stage", "none"], &b.tar, &b.tmp.join("mnt-none"));
    assert_status_staged(m2.path(), Some("-"));
    assert!(memfd_mapping(daemon_pid(m2.path()), &b.tar).is_none(), "--stage none must not stage");
    m2.unmount().assert_success();
    m.unmount().assert_success();
    assert!(!process_alive(pid), "daemon {pid} still alive after `stagefs umount` returned");
    assert_freed(&b, during, "after umount");
}

#[test]
fn stage_ram_plain_tar_sigterm_unmounts_and_frees() {
    let b = big_tar("stage-ram-sigterm");
    let (m, pid, during) = mount_staged(&b, shmem_bytes());
    let (mp, sent) = (&b.mp, Instant::now());
    signal(pid, Signal::SIGTERM).unwrap();
    let gone = wait_until(Duration::from_secs(5), || !is_mounted(mp) && !process_alive(pid));
    assert!(gone, "5 s after SIGTERM: mounted={} daemon alive={}", is_mounted(mp), process_alive(pid));
    eprintln!("SIGTERM: mount gone and daemon exited after {:?}", sent.elapsed());
    m.disarm();
    assert_freed(&b, during, "after SIGTERM");
}

#[test]
fn stage_ram_plain_tar_sigkill_frees_memory_and_remount_recovers() {
    let b = big_tar("stage-ram-sigkill");
    let (m, pid, during) = mount_staged(&b, shmem_bytes());
    signal(pid, Signal::SIGKILL).unwrap();
    assert!(wait_until(Duration::from_secs(5), || !process_alive(pid)), "daemon {pid} survived SIGKILL");
    // The kernel frees the memfd with the dead process's mapping.
    assert_shmem_drops_to(during - b.len / 2, "after SIGKILL");
    assert_nothing_new_in_dev_shm(&b.shm_before, b.len, "after SIGKILL");
    // Nobody unmounted: the mount is stale, and status shows it as dead, not as staged.
    assert!(is_mounted(&b.mp), "a SIGKILLed daemon cannot unmount; the stale mount must still be listed");
    assert_status_staged(&b.mp, Some("DEAD"));

    let (again, pid2, during2) = mount_staged(&b, shmem_bytes());
    m.disarm();
    assert_ne!(pid, pid2);
    assert_eq!(mounts_at(&b.mp).len(), 1, "the stale mount must be replaced, not stacked: {:?}", mounts_at(&b.mp));
    again.unmount().assert_success();
    assert_freed(&b, during2, "after unmounting the recovered mount");
}

#[test]
fn stage_auto_stages_an_archive_on_a_fuse_filesystem() {
    // FUSE counts as remote for --stage auto: an inner tar read from another stagefs mount is
    // staged as `--stage ram` does: the files warmed into the page cache, no private copy.
    let (tmp, _, inner) = tree_tar("stage-auto-fuse", 31, "outer-src/inner.tar", |_| ());
    let (outer, expected) = (tmp.join("outer.tar"), tmp.join("expected"));
    pack_tar(&tmp.join("outer-src"), &outer, &["inner.tar"]);
    extract_tar(&inner, &expected);
    let outer_m = Mounted::with_args(&["--stage", "none"], &outer, &tmp.join("outer-mnt"));
    let inner_m = Mounted::new(&outer_m.path().join("inner.tar"), &tmp.join("inner-mnt"));
    assert!(memfd_mapping(daemon_pid(inner_m.path()), &inner).is_none(), "auto must not copy the archive");
    let record = status_record(inner_m.path());
    assert!(record["staging"] == "ram" && record["staged_bytes"] == 0, "{record}");
    assert!(record["warmed_bytes"] != 0, "auto staging must warm the page cache: {record}");
    assert_trees_equal(&expected, inner_m.path(), &Options::default().root(false));
    // Evicted pages come from the archive again: the inner mount needs the outer one.
    inner_m.unmount().assert_success();
    outer_m.unmount().assert_success();
}

// -- 3. RAM budget ----------------------------------------------------------

/// `stagefs mount EXTRA ARCHIVE MP` (MP new, beside ARCHIVE) must fail on the RAM budget:
/// exit 8, the message (with `more` in it), and nothing left.
fn expect_no_room(extra: &[&str], archive: &Path, more: &[&str]) {
    let mp = archive.with_file_name("new-mp");
    assert!(!mp.exists());
    let out = StagefsCmd::new(["mount"]).args(extra).args([archive, mp.as_path()]).run();
    let needles = ["not enough RAM to", &archive.to_string_lossy(), "budget is 1.0 KiB", "--max-ram"];
    out.assert_mount_failed(&mp, 8, &needles).assert_stderr_has(more);
    assert!(!mp.exists(), "the mountpoint created by the failed attempt must be removed again");
    assert!(stagefs_pids(archive).is_empty(), "a stagefs process for {} is still running", archive.display());
}

/// `--stage ram` of the tree's tar, `extra` first, with a budget of 1 KiB.
fn over_budget_case(label: &str, seed: u64, extra: &[&str]) {
    let (_tmp, _, tar) = tree_tar(label, seed, "a.tar", |_| ());
    assert_eq!(fs::metadata(&tar).unwrap().len(), 4_741_120, "the GNU tar of make_tree");
    expect_no_room(&[extra, &["--stage", "ram", "--max-ram", "1K"]].concat(), &tar, &["needs 4.5 MiB"]);
}

cases! {
    stage_ram_over_budget_fails_with_code_8 => over_budget_case("no-room", 41, &[]);
    stage_ram_over_budget_fails_with_code_8_in_foreground => over_budget_case("no-room-fg", 42, &["-f"]);
}

#[test]
fn compressed_over_budget_fails_with_code_8() {
    // `--stage copy` decompresses a tar whole into RAM, also one it could serve compressed.
    let (tmp, _, tar) = tree_tar("no-room-gz", 43, "a.tar", |_| ());
    let gz = compress("gzip", &[], &tar, Whole, &tmp);
    // The final size of a stream is unknown until its end: the message gives a lower bound.
    expect_no_room(&["--stage", "copy", "--max-ram", "1K"], &gz, &["not enough RAM to decompress", "needs more than"]);
}

// -- 4. Corrupt compressed streams ------------------------------------------

/// Expects exit 3 with "<archive>: corrupt <kind> stream at or before compressed byte N",
/// N within `range`, and nothing left.
fn expect_corrupt_stream(archive: &Path, kind: &str, range: std::ops::RangeInclusive<u64>) {
    let mp = archive.with_file_name("mnt");
    let out = mount_must_fail(&[archive, &mp], 3, &format!("a corrupt {kind} stream"));
    let prefix = format!("{}: corrupt {kind} stream at or before compressed byte ", archive.display());
    let n = number_after(&out.stderr, &prefix);
    let n = n.unwrap_or_else(|| panic!("the message must say {prefix:?}N (N a byte offset)\n{}", out.describe()));
    assert!(range.contains(&n), "offset {n} should be in {range:?}\n{}", out.describe());
    assert_nothing_left(&mp, "after a corrupt stream");
    assert!(!mp.exists(), "the mountpoint created by the failed attempt must be removed again");
    eprintln!("{kind}: reported {n} (accepted {range:?}): {}", out.stderr.trim());
}

/// A compressed archive of the tree (with 6 MiB more random data, so the stream spans
/// several 1 MiB reads); returns it and its length.
fn corrupt_source(label: &str, tool: &str, args: &[&str]) -> (TempDir, u64, PathBuf) {
    let more = |src: &Path| fs::write(src.join("data/more.bin"), pseudo_random(52, 6 * MIB)).unwrap();
    let (tmp, _, tar) = tree_tar(label, 51, "c.tar", more);
    let archive = compress(tool, args, &tar, Whole, &tmp);
    fs::remove_file(&tar).unwrap();
    (tmp, fs::metadata(&archive).unwrap().len(), archive)
}

/// Cuts off the last 2/5 of the compressed stream (`tool` names its kind in the message).
fn truncate_case(label: &str, tool: &str) {
    let (_tmp, len, archive) = corrupt_source(label, tool, &[]);
    let keep = len * 3 / 5;
    fs::OpenOptions::new().write(true).open(&archive).unwrap().set_len(keep).unwrap();
    expect_corrupt_stream(&archive, tool, keep.saturating_sub(2 << 20)..=keep);
}

/// Overwrites 64 bytes in the middle of the compressed stream.
fn flip_case(label: &str, tool: &str, args: &[&str]) {
    let (_tmp, len, archive) = corrupt_source(label, tool, args);
    let (mut bytes, at) = (read(&archive), len / 2);
    bytes[at as usize..at as usize + 64].iter_mut().for_each(|b| *b ^= 0xa5);
    fs::write(&archive, bytes).unwrap();
    expect_corrupt_stream(&archive, tool, at..=len);
}

cases! {
    corrupt_truncated_gzip => truncate_case("trunc-gz", "gzip");
    corrupt_truncated_bzip2 => truncate_case("trunc-bz2", "bzip2");
    corrupt_truncated_xz => truncate_case("trunc-xz", "xz");
    corrupt_truncated_zstd => truncate_case("trunc-zst", "zstd");
    corrupt_truncated_lz4 => truncate_case("trunc-lz4", "lz4");
    corrupt_flipped_bytes_zstd => flip_case("flip-zst", "zstd", &[]);
    corrupt_flipped_bytes_gzip => flip_case("flip-gz", "gzip", &[]);
    // lz4's CLI writes no content checksum unless asked: --content-size and -BX give the decoder one.
    corrupt_flipped_bytes_lz4 => flip_case("flip-lz4", "lz4", &["-BX", "--content-size"]);
}

// -- 5. Saved indexes -------------------------------------------------------

/// Runs `rewrite`, then gives `archive` its mtime back (`touch -r`, as `rsync --inplace -t` does).
fn keeping_mtime(archive: &Path, rewrite: impl FnOnce()) {
    let reference = archive.with_extension("mtime-ref");
    run_tool("touch", osargs!["-r", archive, reference]);
    rewrite();
    run_tool("touch", osargs!["-r", reference, archive]);
}

fn index_path(archive: &Path) -> PathBuf {
    archive.with_file_name(format!("{}.stagefs-index", archive.file_name().unwrap().to_string_lossy()))
}

/// Mounts `archive` at `mp` in the foreground with `env`, checks it serves `expected`,
/// unmounts; the -v log.
fn served_log(archive: &Path, mp: &Path, expected: &Path, env: &[(&str, &Path)]) -> String {
    let fg = Foreground::start(archive, mp, &mp.with_extension("log"), env);
    assert_trees_equal(expected, mp, &Options::default().root(false));
    fg.finish()
}

/// Panics unless the -v log says each of `has` and none of `lacks`.
fn assert_logged(log: &str, has: &[&str], lacks: &[&str], context: &str) {
    let wrong: Vec<_> =
        has.iter().filter(|n| !log.contains(*n)).chain(lacks.iter().filter(|n| log.contains(*n))).collect();
    assert!(wrong.is_empty(), "{context}: the -v log must say {has:?}, not {lacks:?}; wrong: {wrong:?}; log:\n{log}");
}

#[test]
fn saved_index_is_reused_and_rejected_when_stale_or_damaged() {
    require_root();
    let tmp = TempDir::new("index-reuse");
    let (archive, new_tar) = (tmp.join("ds.tar"), tmp.join("new.tar"));
    // Of the same size, but other content and layout (member sizes swapped).
    for (tar, seed, sizes) in [(&archive, 61u64, [10_000usize, 150_000, 300]), (&new_tar, 62, [150_000, 300, 10_000])] {
        Scene::new("same-size")
            .file("data/one.bin", pseudo_random(seed, sizes[0]))
            .file("data/sub/two.bin", pseudo_random(seed + 100, sizes[1]))
            .file("data/three.txt", vec![b'a' + seed as u8 % 26; sizes[2]])
            .tar_at(tar);
    }
    let idx = index_path(&archive);

    // stagefs index writes ARCHIVE.stagefs-index.
    let out = stagefs(osargs!["index", archive]);
    out.assert_success();
    assert!(idx.is_file(), "stagefs index must create {}\n{}", idx.display(), out.describe());
    let (mp, expected_a, expected_b) = (tmp.join("mnt"), tmp.join("expected-a"), tmp.join("expected-b"));
    extract_tar(&archive, &expected_a);
    let log = served_log(&archive, &mp, &expected_a, &[]);
    assert_logged(&log, &["using saved index", &idx.to_string_lossy()], &["ignoring saved index"], "matching index");

    // Same size, same mtime (nanoseconds included), other content and layout.
    let stamp = || fs::metadata(&archive).map(|m| (m.len(), m.mtime(), m.mtime_nsec())).unwrap();
    let (before, old_bytes) = (stamp(), read(&archive));
    keeping_mtime(&archive, || fs::write(&archive, read(&new_tar)).unwrap()); // in place, same inode
    assert_eq!(stamp(), before, "test setup: only the content may differ");
    assert!(read(&new_tar) != old_bytes, "test setup: the content must differ");
    extract_tar(&archive, &expected_b);
    assert!(read(&expected_b.join("data/one.bin")).len() == 150_000, "test setup: the layout changed");
    let log = served_log(&archive, &mp, &expected_b, &[]);
    assert_logged(&log, &["ignoring saved index", "changed"], &["using saved index"], "changed archive");

    // A fresh index for the new content, then damaged: one byte of its header flipped
    // (damage in its body fails what the block holds when read: tests/index.rs).
    stagefs(osargs!["index", archive]).assert_success();
    let mut bytes = read(&idx);
    bytes[100] ^= 0x01;
    fs::write(&idx, &bytes).unwrap();
    let log = served_log(&archive, &mp, &expected_b, &[]);
    assert_logged(&log, &["ignoring saved index", "damaged"], &["using saved index"], "damaged index");

    // A truncated index file too.
    fs::write(&idx, &bytes[..bytes.len() / 2]).unwrap();
    let log = served_log(&archive, &mp, &expected_b, &[]);
    assert_logged(&log, &["ignoring saved index"], &[], "truncated index");
    assert_nothing_left(&mp, "after the index tests");
}

/// An in-place rewrite that keeps the size, the mtime (`touch -r`, as `rsync --inplace -t`
/// does) and every byte the key samples, swapping two members' names: the saved index
/// would serve `x.txt` with `y.txt`'s bytes. The ctime gives the rewrite away: the mount
/// rescans and serves the new layout.
#[test]
fn saved_index_is_rejected_after_an_in_place_rewrite_that_restores_mtime_and_samples() {
    require_root();
    let tmp = TempDir::new("index-inplace");
    let (archive, swapped) = (tmp.join("ds.tar"), tmp.join("swapped.tar"));
    // Two tars that differ only in the two small headers, placed between the key's samples.
    let script = r#"
import io, sys, tarfile
for path, (a, b) in [(sys.argv[1], ("x.txt", "y.txt")), (sys.argv[2], ("y.txt", "x.txt"))]:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for name, data in [("pad-a", bytes(range(256)) * 1100), (a, b"X" * 1000), (b, b"Y" * 1000),
                           ("pad-b", bytes(range(255, -1, -1)) * 9000)]:
            info = tarfile.TarInfo(name); info.size = len(data); info.mtime = 1_600_000_000
            t.addfile(info, io.BytesIO(data))
"#;
    run_tool("python3", osargs!["-c", script, archive, swapped]);
    let (old, new) = (read(&archive), read(&swapped));
    assert_eq!(old.len(), new.len(), "test setup: same size");
    let size = old.len() as u64;
    let differ: Vec<u64> = (0..size).filter(|&i| old[i as usize] != new[i as usize]).collect();
    // The key samples 64 KiB at each end and 4 KiB at size / 17 * i for i in 1..=16.
    let mut samples = vec![0..64 << 10, size - (64 << 10)..size];
    samples.extend((1..=16).map(|i| size / 17 * i..size / 17 * i + 4096));
    let sampled = |at: &u64| samples.iter().any(|s| s.contains(at));
    assert!(!differ.is_empty() && !differ.iter().any(sampled), "test setup: the change avoids the samples");
    stagefs(osargs!["index", archive]).assert_success();
    assert!(index_path(&archive).is_file());

    let before = fs::metadata(&archive).unwrap();
    let (first, last) = (differ[0] as usize, differ[differ.len() - 1] as usize + 1);
    let file = || fs::OpenOptions::new().write(true).open(&archive).unwrap();
    keeping_mtime(&archive, || file().write_all_at(&new[first..last], first as u64).unwrap());
    assert_eq!(read(&archive), new, "test setup: rewritten in place");
    assert_eq!(fs::metadata(&archive).unwrap().mtime_nsec(), before.mtime_nsec(), "test setup: the mtime restored");

    let mp = tmp.join("mnt");
    let fg = Foreground::start(&archive, &mp, &tmp.join("mount.log"), &[]);
    // After the rewrite, x.txt is the member holding Y bytes.
    assert!(read(&mp.join("x.txt")) == b"Y".repeat(1000), "x.txt must be served with its own bytes");
    assert!(read(&mp.join("y.txt")) == b"X".repeat(1000), "y.txt must be served with its own bytes");
    assert_logged(&fg.finish(), &["ignoring saved index", "changed"], &["using saved index"], "rewritten archive");
}

#[test]
fn saved_index_of_a_compressed_tar_is_reused() {
    let (tmp, _, tar) = tree_tar("index-gz", 71, "ds.tar", |_| ());
    let (expected, zst) = (tmp.join("expected"), compress("zstd", &["-q"], &tar, Whole, &tmp));
    extract_tar(&tar, &expected);
    stagefs(osargs!["index", zst]).assert_success();
    let idx = index_path(&zst);
    assert!(idx.is_file(), "stagefs index must create {}", idx.display());
    let log = served_log(&zst, &tmp.join("mnt"), &expected, &[]);
    assert_logged(&log, &["using saved index", "decompressed (zstd)"], &[], "compressed archive with an index");
}

#[test]
fn saved_index_goes_to_xdg_cache_when_the_archive_dir_is_read_only() {
    let (tmp, _, tar) = tree_tar("index-xdg", 81, "archives/ds.tar", |_| ());
    let (expected, ro, cache) = (tmp.join("expected"), tmp.join("ro"), tmp.join("cache"));
    extract_tar(&tar, &expected);
    // Root may write anywhere but on a read-only mount.
    fs::create_dir_all(&ro).unwrap();
    run_tool("mount", osargs!["--bind", tmp.join("archives"), ro]);
    let _bind = UnmountOnDrop(ro.clone());
    run_tool("mount", osargs!["-o", "remount,bind,ro", ro]);
    let archive = ro.join("ds.tar");

    StagefsCmd::new(osargs!["index", archive]).env("XDG_CACHE_HOME", &cache).run().assert_success();
    assert!(!index_path(&archive).exists() && !index_path(&tar).exists());
    let saved = file_names(&cache.join("stagefs"));
    assert!(saved.len() == 1 && saved[0].ends_with("-ds.tar.index"), "one <hash>-ds.tar.index in the cache: {saved:?}");
    let index = cache.join("stagefs").join(&saved[0]);
    let log = served_log(&archive, &tmp.join("mnt"), &expected, &[("XDG_CACHE_HOME", &cache)]);
    assert_logged(&log, &["using saved index", &index.to_string_lossy()], &[], "index in the cache directory");
}

// -- 6. The job's cgroup memory limit ---------------------------------------

/// A memory cgroup (v2 where the machine has it, else v1, as on many SLURM clusters)
/// limited to `limit` bytes, removed on drop; commands run inside it.
pub(crate) struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    pub(crate) fn new(label: &str, limit: u64) -> MemoryCgroup {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let (root, file) =
            if v2 { ("/sys/fs/cgroup", "memory.max") } else { ("/sys/fs/cgroup/memory", "memory.limit_in_bytes") };
        let dir = Path::new(root).join(format!("stagefs-test-{label}-{}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create the memory cgroup {}: {e}", dir.display()));
        fs::write(dir.join(file), limit.to_string()).unwrap_or_else(|e| panic!("cannot limit {}: {e}", dir.display()));
        MemoryCgroup { dir }
    }

    /// `program ARGS...` run inside the cgroup (the shell moves itself in, then execs).
    pub(crate) fn run(&self, program: &Path, args: &[&OsStr]) -> CmdOutput {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo $$ > \"$1\"/cgroup.procs && shift && exec \"$@\"").arg("sh").arg(&self.dir);
        cmd.arg(program).args(args);
        run_cmd(&mut cmd, Duration::from_secs(120))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The processes have exited by now; an empty cgroup directory is removed with rmdir.
        let _ = wait_until(Duration::from_secs(5), || fs::remove_dir(&self.dir).is_ok());
    }
}

#[test]
fn staging_respects_the_cgroup_memory_limit() {
    let (tmp, src, tar) = tree_tar("cgroup-budget", 61, "a.tar", |_| ());
    let mp = tmp.join("mnt");
    // 256 MiB, less usage and the margin (512 MiB + 5 %), leaves no room at all.
    let cgroup = MemoryCgroup::new("budget", 256 << 20);
    // Staging beyond the job's cgroup limit is refused before copying, saying which limit applied.
    let out = cgroup.run(&stagefs_bin(), &osargs!["mount", "--stage", "ram", tar, mp]);
    out.assert_mount_failed(&mp, 8, &["cgroup memory limit"]);
    // The same mount outside the cgroup works: the limit, not the archive, refused it.
    let mounted = Mounted::with_args(&["--stage", "ram"], &tar, &mp);
    let file = "data/nested/deeper/small.txt";
    assert_eq!(read(&mounted.path().join(file)), read(&src.join(file)));
}
