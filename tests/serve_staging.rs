//! A staged mount (`--stage copy|disk|ram`) serves while it stages: `stagefs mount` returns
//! once the index is ready, and reads, `status`, `wait --staged`, a change of the archive
//! meanwhile and an unmount mid-staging are checked while the copy is under way.
//!
//! `STAGEFS_TEST_STAGE_CHUNK_DELAY_MS` slows the copy (a pause before each 4 MiB chunk, four
//! in flight; before each file of a warm-up), so that the tests act while it is under way
//! without racing it; they check it still was where it matters, and say so when it was not.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::kit::*;

const MIB: u64 = 1 << 20;
/// The copier's chunk (`stage::copier::CHUNK`).
const CHUNK: u64 = 4 * MIB;
/// A generous bound for waits on the background work: a hang guard, never a measure.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A tar of `count` random files of `len` bytes each (`f00`, `f01`, ...), its files beside
/// it, where to mount it, and an empty `local` to stage to.
struct Data {
    tmp: TempDir,
    tar: PathBuf,
    src: PathBuf,
    names: Vec<String>,
    mp: PathBuf,
    local: PathBuf,
}

fn data(name: &str, count: usize, len: usize, seed: u64) -> Data {
    let names: Vec<String> = (0..count).map(|i| format!("f{i:02}")).collect();
    let scene = Scene::new(name).files(names.iter().enumerate().map(|(i, n)| (n, pseudo_random(seed + i as u64, len))));
    let (tar, src, local) = (scene.tar_at(&scene.join("data.tar")), scene.src().to_path_buf(), scene.join("local"));
    // Datasets are old files: their pages are clean.
    fs::File::open(&tar).unwrap().sync_all().unwrap();
    fs::create_dir(&local).unwrap();
    Data { mp: scene.join("mnt"), local, tar, src, names, tmp: scene.tmp }
}

impl Data {
    /// Panics unless each of `names` reads through the mount as in the archive (`when`: the moment).
    fn assert_reads<'a>(&self, names: impl IntoIterator<Item = &'a String>, when: &str) {
        for name in names {
            let got = read_member(&self.mp, name).unwrap_or_else(|e| panic!("{name}: errno {e} {when}"));
            assert!(got == read(&self.src.join(name)), "{name} differs from the archive {when}");
        }
    }
}

/// `stagefs mount ARGS ARCHIVE MP` with the copy slowed down by `delay_ms` per chunk.
fn mount_slowly(delay_ms: u64, args: &[&str], archive: &Path, mp: &Path) -> Mounted {
    Mounted::with_env(&[("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS", Some(&delay_ms.to_string()))], args, archive, mp)
}

/// This mount's `staging_progress` in `stagefs status --json`: (state, done, total, error).
fn progress(mp: &Path) -> (String, u64, u64, String) {
    let p = &status_record(mp)["staging_progress"];
    (
        p["state"].as_str().unwrap_or("none").to_string(),
        p["done_bytes"].as_u64().unwrap_or(0),
        p["total_bytes"].as_u64().unwrap_or(0),
        p["error"].as_str().unwrap_or("").to_string(),
    )
}

fn field(mp: &Path, name: &str) -> u64 {
    status_record(mp)[name].as_u64().unwrap()
}

fn wait_staged(mp: &Path, extra: &[&str]) -> CmdOutput {
    StagefsCmd::new(["wait", "--staged"]).args(extra).args([mp]).run_within(HANG_GUARD)
}

/// Reads `name` through the mount: its bytes, or the error's errno.
fn read_member(mp: &Path, name: &str) -> Result<Vec<u8>, i32> {
    fs::read(mp.join(name)).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// The staged copy the daemon `pid` holds (a memfd), read through /proc.
fn memfd_bytes(pid: i32) -> Vec<u8> {
    let mut fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten();
    let fd = fds.find(|e| fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:stagefs:")));
    fs::read(fd.expect("the daemon holds its staged memfd").path()).unwrap()
}

/// Waits until the mount's `record` in `status --json` says at least `bytes` are staged (or
/// staging ended); returns what was staged.
fn staged_at_least(record: impl Fn() -> serde_json::Value, bytes: u64) -> u64 {
    let mut seen = 0;
    let reached = wait_until(HANG_GUARD, || {
        let p = &record()["staging_progress"];
        seen = p["done_bytes"].as_u64().unwrap_or(0);
        seen >= bytes || p["state"] != "copying"
    });
    assert!(reached, "staging never reached {bytes} B");
    seen
}

/// `--stage copy` of a 96 MiB tar: reads during the copy are right (from the archive where the
/// copy has not reached); `status` and `wait --staged` follow it; then the copy is the archive.
#[test]
fn a_copy_serves_while_it_stages_byte_for_byte() {
    let d = data("serve-copy", 24, 4 << 20, 100);
    let size = fs::metadata(&d.tar).unwrap().len();
    // 25 chunks, four at a time, 1 s each: the copy takes 7 s.
    let m = mount_slowly(1000, &["--stage", "copy", "--warm", "no"], &d.tar, &d.mp);
    let (state, done, total, _) = progress(&d.mp);
    assert_eq!((state.as_str(), total), ("copying", size), "the mount returned while it copies");
    assert!(done < size, "nothing left to copy when the mount returned: the test did not test");
    // Readers go through half of the files, the last first: in place, and the copy jumps ahead.
    d.assert_reads(d.names.iter().rev().step_by(2), "during staging");
    let (state, done, ..) = progress(&d.mp);
    assert!(state == "copying" && done < size, "staging ended before the reads did: the test did not test");
    // The RAM the copy holds so far is what status counts as staged.
    assert!(field(&d.mp, "staged_bytes") < size);
    wait_staged(&d.mp, &[]).assert_success();
    let (state, done, total, error) = progress(&d.mp);
    assert_eq!((state.as_str(), done, total, error.as_str()), ("done", size, size, ""));
    assert_eq!(field(&d.mp, "staged_bytes"), size);
    stagefs(["status"]).assert_stdout_has(&["staging: done"]);
    // The copy is the archive, byte for byte; the other half is read from it.
    assert!(memfd_bytes(m.daemon_pids()[0]) == read(&d.tar), "the staged copy differs from the archive");
    d.assert_reads(d.names.iter().step_by(2), "from the copy");
    m.unmount().assert_success();
    assert_nothing_left(&d.mp, "after the unmount");
}

#[test]
fn a_copy_to_disk_serves_while_it_stages() {
    let d = data("serve-disk", 12, 3 << 20, 200);
    let args = ["--stage", "disk", "--warm", "no", "--stage-dir", d.local.to_str().unwrap()];
    let m = mount_slowly(700, &args, &d.tar, &d.mp);
    assert_eq!(progress(&d.mp).0, "copying", "the mount returned while it copies");
    d.assert_reads(&d.names, "during staging");
    wait_staged(&d.mp, &[]).assert_success();
    assert_eq!(progress(&d.mp).0, "done");
    let own = d.local.join(format!("stagefs-{}", euid()));
    assert_eq!(fs::read_dir(&own).unwrap().count(), 0, "the copy on disk has no name");
    m.unmount().assert_success();
    assert!(!own.exists(), "the staging directory goes with the mount");
}

/// The archive rewritten in place (same size, other bytes) while it is copied: staging stops and
/// says why, and neither the copy nor a read ever mixes in the new bytes; the daemon serves on.
#[test]
fn a_source_rewritten_while_it_is_copied_is_refused_never_mixed() {
    let d = data("serve-changed", 16, 4 << 20, 300);
    let (old, log) = (read(&d.tar), d.tmp.join("daemon.log"));
    let args = ["--stage", "copy", "--warm", "no", "--log-file", log.to_str().unwrap()];
    // 17 chunks, four at a time, 2 s each.
    let m = mount_slowly(2000, &args, &d.tar, &d.mp);
    // Two chunks at least: the first member (after its header) then lies in the copy.
    let staged = staged_at_least(|| status_record(&d.mp), 2 * CHUNK);
    assert!(staged < old.len() as u64, "staged whole before the change: the test did not test");
    // The same tar layout with other bytes, written over the archive in place.
    let other = data("serve-changed-new", 16, 4 << 20, 900);
    let new = fs::read(&other.tar).unwrap();
    assert_eq!(new.len(), old.len());
    fs::OpenOptions::new().write(true).open(&d.tar).unwrap().write_all_at(&new, 0).unwrap();
    let out = wait_staged(&d.mp, &[]);
    out.assert_code(9).assert_stderr_has(&["changed since it was mounted", "rather than mix two versions"]);
    let (state, done, _, error) = progress(&d.mp);
    assert_eq!(state, "failed");
    assert!(error.contains("changed since it was mounted"), "{error}");
    assert!(done >= staged && done < old.len() as u64, "staged {done} B");
    stagefs(["status"]).assert_stdout_has(&["staging: FAILED", "changed since it was mounted"]);
    // Never mixed: each chunk of the copy is the old one, or untouched (zeros).
    let pid = m.daemon_pids()[0];
    let copy = memfd_bytes(pid);
    let chunks: Vec<(&[u8], &[u8])> = copy.chunks(CHUNK as usize).zip(old.chunks(CHUNK as usize)).collect();
    let mixed = chunks.iter().position(|(have, was)| have != was && have.iter().any(|&b| b != 0));
    assert_eq!(mixed, None, "this chunk of the copy is neither the old bytes nor empty");
    let kept = chunks.iter().filter(|(have, was)| have == was).count();
    assert!(kept as u64 * CHUNK >= done && kept < chunks.len(), "{kept} of {} chunks kept", chunks.len());
    // Reads: the old bytes (from the copy) or EIO, never the new bytes.
    let mut served = 0;
    for (name, new_name) in d.names.iter().zip(&other.names) {
        match read_member(&d.mp, name) {
            Ok(bytes) => {
                assert!(bytes == fs::read(d.src.join(name)).unwrap(), "{name}: not the old bytes");
                assert!(bytes != fs::read(other.src.join(new_name)).unwrap());
                served += 1;
            }
            Err(errno) => assert_eq!(errno, libc::EIO, "{name}"),
        }
    }
    assert!(served > 0 && served < d.names.len(), "{served} of {} members served", d.names.len());
    assert!(process_alive(pid), "the daemon serves on");
    m.unmount().assert_success();
    let log = fs::read_to_string(&log).unwrap();
    assert!(log.contains("rather than mix two versions"), "the daemon's log says why staging stopped:\n{log}");
}

#[test]
fn wait_staged_returns_at_once_in_place_and_times_out_with_the_progress() {
    let d = data("serve-wait", 6, 3 << 20, 400);
    let m = Mounted::with_args(&["--stage", "none"], &d.tar, &d.mp);
    wait_staged(&d.mp, &[]).assert_success();
    assert_eq!(progress(&d.mp).0, "none", "a mount in place stages nothing");
    m.unmount().assert_success();
    let m = mount_slowly(3000, &["--stage", "copy"], &d.tar, &d.mp);
    wait_staged(&d.mp, &["--timeout", "1s"]).assert_code(6).assert_stderr_has(&["still staging", "copying"]);
    m.unmount().assert_success();
}

/// Neither the memfd nor the nameless file on disk, nor any process, mount or directory is left.
#[test]
fn unmounting_mid_staging_leaves_nothing() {
    let d = data("serve-unmount", 10, 4 << 20, 500);
    let own = d.local.join(format!("stagefs-{}", euid()));
    for args in [vec!["--stage", "copy"], vec!["--stage", "disk", "--stage-dir", d.local.to_str().unwrap()]] {
        let m = mount_slowly(5000, &args, &d.tar, &d.mp);
        let pid = m.daemon_pids()[0];
        assert_eq!(progress(&d.mp).0, "copying");
        m.unmount().assert_success();
        assert!(!process_alive(pid), "{args:?}: the daemon exits at the unmount, its copier with it");
        assert_nothing_left(&d.mp, &format!("{args:?}: unmounted mid-staging"));
        assert!(!own.exists(), "{args:?}: the staging directory goes with the mount");
    }
}

/// The page-cache warm-up goes on in the background: status says so, reads are right meanwhile.
#[test]
fn stage_ram_returns_before_the_warm_up_ends() {
    let _no_drop_caches_meanwhile = page_cache_guard();
    let d = data("serve-ram", 16, 1 << 20, 600);
    // 16 files, 1 s each, on up to 8 threads.
    let m = mount_slowly(1000, &["--stage", "ram"], &d.tar, &d.mp);
    let (state, done, total, _) = progress(&d.mp);
    assert_eq!(state, "warming", "the mount returned while it warms");
    assert!(done < total && total == 16 * MIB, "{done} of {total}");
    d.assert_reads(&d.names[..4], "while warming");
    wait_staged(&d.mp, &[]).assert_success();
    let (state, done, ..) = progress(&d.mp);
    assert_eq!((state.as_str(), done), ("done", 16 * MIB));
    assert_eq!(field(&d.mp, "warmed_bytes"), 16 * MIB);
    m.unmount().assert_success();
}

/// Another user's archive (named by alice, so trusted as named) truncated by its owner while it is
/// copied: alice's daemon lives, what was staged reads right, the rest gives EIO.
#[test]
fn another_users_archive_truncated_while_staged_leaves_staged_reads_right() {
    let users = two_users("serve-truncated");
    let (alice, eve) = (&users.alice, &users.eve);
    let (d, archive) = (data("serve-truncated", 12, 3 << 20, 700), users.tmp.join("eves.tar"));
    fs::copy(&d.tar, &archive).unwrap();
    eve.chown(&archive);
    chmod(&archive, 0o644);
    let mnt = users.mountpoint("mnt-eves");
    let cmd = alice.stagefs_cmd(&[("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS", "2000")], ["mount", "--stage", "copy"]);
    cmd.args(osargs!["--warm", "no", archive, mnt]).run_within(HANG_GUARD).assert_success();
    let alice_json = || status_record_in(&alice.stagefs(["status", "--json"]), &mnt).expect("in alice's status");
    let staged = staged_at_least(alice_json, 2 * CHUNK);
    let size = fs::metadata(&archive).unwrap().len();
    assert!(staged < size, "staged whole before the truncation: the test did not test");
    eve.sh(&format!("truncate -s 1M {}", archive.display()));
    let out = alice.stagefs_cmd(&[], osargs!["wait", "--staged", mnt]).run_within(HANG_GUARD);
    out.assert_code(9).assert_stderr_has(&["1048576 bytes"]);
    let pid = alice_json()["pid"].as_u64().unwrap() as i32;
    // Members wholly inside what was staged read right (from the copy), others right or EIO.
    let mut offset = 0;
    for name in &d.names {
        offset += 512; // its header
        let end = offset + 3 * MIB;
        let read = alice.try_sh(&format!("cat {}/{name} | md5sum", mnt.display()));
        let want = &run_tool("md5sum", [d.src.join(name)]).stdout[..32];
        if end <= staged {
            assert!(read.stdout.starts_with(want), "{name} was staged and must read right:\n{}", read.describe());
        } else {
            assert!(read.stdout.starts_with(want) || read.stderr.contains("Input/output error"), "{name}: {read:?}");
        }
        offset = end.next_multiple_of(512);
    }
    assert!(process_alive(pid), "alice's daemon lives");
    users.umount(&mnt);
}
