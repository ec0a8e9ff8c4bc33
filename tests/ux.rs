//! What users see when they get something wrong or something goes wrong: usage errors with
//! the fix in them, mountpoint versus FUSE failures, errors served while mounted (the
//! daemon's log and `stagefs status`), nothing left behind after `kill -9`, and the demo.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::kit::*;

#[test]
fn an_empty_archive_is_called_empty() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-empty");
    let empty = put(&tmp, "empty.tar", b"");
    let out = stagefs(osargs!["mount", empty, mp]);
    out.assert_mount_failed(&mp, 3, &["is empty (0 bytes)"]).assert_stderr_lacks(&["first bytes"]);
}

#[test]
fn run_without_a_separator_says_to_put_the_command_after_it() {
    for args in [&["run", "data.tar", "python", "train.py", "--data", "x"][..], &["run", "data.tar"]] {
        stagefs(args).assert_code(2).assert_stderr_has(&["put the command after `--`"]);
    }
}

#[test]
fn counts_out_of_range_are_usage_errors() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-ranges");
    let (archive, demo) = (fixture("gnu.tar"), tmp.join("demo"));
    for threads in ["0", "1000", "100000"] {
        stagefs(osargs!["mount", "--threads", threads, archive, mp]).assert_mount_failed(&mp, 2, &["1..=256"]);
    }
    stagefs(osargs!["run", "--threads", "1000", archive, "--", "true"]).assert_code(2);
    for (flag, value) in [("--files", "0"), ("--readers", "0")] {
        stagefs(osargs!["demo", flag, value, "--dir", demo]).assert_code(2).assert_stderr_has(&["at least 1"]);
    }
    assert!(!demo.exists(), "a refused demo writes nothing");
    assert_nothing_left(&mp, "refused --threads");
}

#[test]
fn an_idle_timeout_of_zero_means_never() {
    let (_tmp, mp) = tmp_mnt("ux-idle-zero");
    let m = Mounted::with_args(&["--idle-timeout", "0"], &fixture("gnu.tar"), &mp);
    // The watchdog would unmount a zero timeout within its first 10 ms tick.
    std::thread::sleep(Duration::from_millis(500));
    assert!(is_mounted(&mp), "--idle-timeout 0 must not unmount");
    assert_eq!(read(&m.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    m.unmount().assert_success();
}

#[test]
fn a_mountpoint_fusermount3_refuses_is_a_mountpoint_problem_not_missing_fuse() {
    let user = User::get("sfs-ux");
    let (tmp, archive, mp) = gnu_copy("ux-no-write");
    chmod(tmp.path(), 0o755);
    chmod(&archive, 0o644);
    // Empty, but root's: fusermount3 refuses it ("no write access to mountpoint").
    fs::create_dir(&mp).unwrap();
    chmod(&mp, 0o755);
    let out = user.stagefs(osargs!["mount", archive, mp]);
    out.assert_mount_failed(&mp, 4, &[&mp.to_string_lossy()]).assert_stderr_lacks(&["FUSE"]);
}

#[test]
fn errors_served_reach_the_log_status_and_umount() {
    require_root();
    // Four 200 KB files, written by GNU tar.
    let scene = Scene::new("ux-errors").files((0..4u64).map(|i| (format!("f{i}.bin"), pseudo_random(40 + i, 200_000))));
    let (archive, mp, runtime) = (scene.tar(), scene.join("mnt"), scene.join("runtime"));
    let (guard, _) =
        StagefsCmd::new(osargs!["mount", "--stage", "none", archive, mp]).runtime(&runtime).mounts(&archive, &mp);
    let logs: Vec<_> = file_names(&runtime).into_iter().filter(|f| f.ends_with(".log")).collect();
    assert_eq!(logs.len(), 1, "the detached daemon logs to a file in the runtime dir: {:?}", file_names(&runtime));
    let log = runtime.join(&logs[0]);

    // Served in place, the archive is checked unchanged on every read: touching it is enough.
    run_tool("touch", osargs!["-m", "-d", "@1000000", archive]);
    let err = fs::read(mp.join("f1.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    let logged = wait_until(Duration::from_secs(10), || read_text(&log).contains("changed since it was mounted"));
    assert!(logged, "the log says why: {:?}", read_text(&log));
    // What changed (the mtime, the size being the same), with no byte offset to blame.
    let text = read_text(&log);
    let mtime =
        text.contains("same size, but its contents were modified: mtime") && text.contains(" 1000000.000000000 now");
    assert!(mtime, "{text}");
    assert!(!text.contains("corrupt data at archive byte"), "{text}");
    let mut status = String::new();
    let shown = wait_until(Duration::from_secs(10), || {
        status = StagefsCmd::new(["status"]).runtime(&runtime).run().stdout;
        status.contains("last error: /f1.bin: ")
    });
    assert!(shown, "status shows the last error:\n{status}");
    assert!(status.contains("ERRORS"), "{status}");
    let json = StagefsCmd::new(osargs!["status", "--json"]).runtime(&runtime).run().stdout;
    // The kernel may retry a failed read: one or more.
    let ours = json.lines().find(|l| l.contains(&*mp.to_string_lossy())).unwrap_or_default();
    assert!(!ours.contains("\"errors\":0,") && ours.contains("\"last_error\":\"/f1.bin: "), "{json}");

    let out = StagefsCmd::new(osargs!["umount", mp]).runtime(&runtime).run();
    guard.disarm();
    out.assert_success().assert_stderr_has(&[" failed read", "(EIO) while mounted; the last: /f1.bin: "]);
    assert_nothing_left(&mp, "after the umount");
    assert!(wait_until(Duration::from_secs(5), || file_names(&runtime).is_empty()), "{:?}", file_names(&runtime));
}

fn read_text(path: &Path) -> String {
    String::from_utf8_lossy(&fs::read(path).unwrap_or_default()).into_owned()
}

#[test]
fn a_log_file_that_cannot_be_written_is_refused_before_mounting() {
    require_root();
    let tmp = TempDir::new("ux-log-file");
    let (mp, log, archive) = (tmp.join("made/mnt"), tmp.join("no-such-dir/daemon.log"), fixture("gnu.tar"));
    let out = stagefs(osargs!["mount", "--log-file", log, archive, mp]);
    out.assert_mount_failed(&mp, 1, &["cannot write the log file", &log.to_string_lossy()]);
    assert!(!tmp.join("made").exists(), "nothing was made for the mount");
    // A writable one gets the daemon's log.
    let log = tmp.join("daemon.log");
    let (m, out) = StagefsCmd::new(osargs!["mount", "-v", "--log-file", log, archive, mp]).mounts(&archive, &mp);
    m.unmount().assert_success();
    assert!(read_text(&log).contains("mounted"), "{:?}", read_text(&log));
    // -v says why `--stage auto` (the default) chose what it did, before detaching.
    out.assert_stderr_has(&["--stage auto:", "on a local filesystem", "serving it in place"]);
}

#[test]
fn umount_after_kill_9_of_the_daemon_leaves_nothing() {
    require_root();
    let (tmp, archive, _) = gnu_copy("ux-kill-daemon");
    let (runtime, mp) = (tmp.join("runtime"), tmp.join("made/by/stagefs"));
    let (guard, _) = StagefsCmd::new(osargs!["mount", archive, mp]).runtime(&runtime).mounts(&archive, &mp);
    let pids = stagefs_pids(&mp);
    assert_eq!(pids.len(), 1, "{pids:?}");
    let _ = signal(pids[0], Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || !process_alive(pids[0])), "the daemon survived SIGKILL");
    guard.disarm();
    StagefsCmd::new(osargs!["umount", mp]).runtime(&runtime).run().assert_success();
    assert!(!is_mounted(&mp));
    assert!(!tmp.join("made").exists(), "the directories stagefs made for the mount stay: {}", mp.display());
    assert_eq!(file_names(&runtime), Vec::<String>::new(), "the killed daemon's files stay");
}

#[test]
fn kill_9_of_stagefs_run_takes_its_command_along_and_the_next_election_sweeps() {
    require_root();
    let (tmp, archive, mp) = gnu_copy("ux-kill-run");
    let (runtime, marker) = (tmp.join("runtime"), tmp.join("command-started"));
    let script = format!("touch {} && exec sleep 300", marker.display());
    let mut run =
        StagefsCmd::new(osargs!["run", "-m", mp, archive, "--", "sh", "-c", script]).runtime(&runtime).spawn();
    assert!(wait_until(Duration::from_secs(30), || marker.exists()), "the command never started");
    // Its children: the mount daemon, and the command.
    let is_sleep = |pid: &i32| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep");
    let command: Vec<i32> = children_of(run.id() as i32).into_iter().filter(is_sleep).collect();
    assert_eq!(command.len(), 1, "the command is a child of stagefs run: {command:?}");
    let _ = signal(run.id() as i32, Signal::SIGKILL);
    let _ = run.0.wait();
    assert!(wait_until(Duration::from_secs(10), || !process_alive(command[0])), "the command outlived stagefs run");
    // Its daemon unmounts by itself once its owner is gone; the users tally stays.
    assert_nothing_left(&mp, "after kill -9 of stagefs run");
    assert!(wait_until(Duration::from_secs(10), || file_names(&runtime).iter().all(|f| f.ends_with(".users"))));

    // The next election on the node (any mountpoint) sweeps it.
    let other = tmp.join("other");
    let (guard, _) = StagefsCmd::new(osargs!["mount", archive, other]).runtime(&runtime).mounts(&archive, &other);
    assert!(!file_names(&runtime).iter().any(|f| f.ends_with(".users")), "{:?}", file_names(&runtime));
    StagefsCmd::new(osargs!["umount", other]).runtime(&runtime).run().assert_success();
    guard.disarm();
    assert!(wait_until(Duration::from_secs(5), || file_names(&runtime).is_empty()), "{:?}", file_names(&runtime));
}

/// The README's first command, small: it says where it writes and how much, compares a plain
/// directory with both kinds of mount, and its archive is a real tar.
#[test]
fn the_demo_says_what_it_writes_and_compares_three_ways() {
    require_root();
    let tmp = TempDir::new("ux-demo");
    let work = tmp.join("demo");
    let out = stagefs(osargs!["demo", "--files", "60", "--readers", "2", "--dir", work, "--keep"]);
    out.assert_success();
    let (first, dir) = (out.stdout.lines().next().unwrap_or_default(), work.to_string_lossy());
    let told = first.starts_with("stagefs demo: writing ") && first.contains(&*dir) && first.contains(" MB");
    assert!(told, "where and how much, first: {}", out.describe());
    for row in ["plain directory", "stagefs, in place", "stagefs, staged in RAM"] {
        let line = out.stdout.lines().find(|l| l.starts_with(row));
        let line = line.unwrap_or_else(|| panic!("no {row} row: {}", out.describe()));
        assert_eq!(line.matches("files/s").count(), 2, "two epochs: {line}");
        assert_eq!(line.matches('x').count(), 2, "two ratios: {line}");
    }
    assert!(out.stdout.contains("all bytes verified"), "{}", out.describe());

    let archive = work.join("imagenet-like.tar");
    let listing = run_tool("tar", osargs!["-tvf", archive]).stdout;
    let (dirs, files): (Vec<&str>, Vec<&str>) = listing.lines().partition(|l| l.starts_with('d'));
    assert_eq!((dirs.len(), files.len()), (20, 60), "20 class folders and 60 files:\n{listing}");
    for line in files {
        // "-rw-r--r-- 0/0  123456 1970-01-01 00:00 train/n00000001/img_0000001.JPEG"
        let size: u64 = line.split_whitespace().nth(2).and_then(|s| s.parse().ok()).unwrap_or(0);
        assert!((20_000..200_000).contains(&size), "sizes are 20-200 KB: {line}");
        assert!(line.ends_with(".JPEG") && line.contains(" train/n"), "{line}");
    }
    assert_eq!(file_names(&work), ["imagenet-like.tar"], "only the kept archive stays");
    assert!(!mounts().iter().any(|m| m.mount_point.starts_with(&work)), "a demo mount stayed");
}

/// Ctrl-C while the demo writes its ~0.9 GB: it stops, removes everything it wrote and
/// exits 130 (128 + SIGINT), as a shell reports an interrupted command.
#[test]
fn an_interrupted_demo_leaves_nothing_behind() {
    require_root();
    let tmp = TempDir::new("ux-demo-int");
    let work = tmp.join("demo");
    let mut child = StagefsCmd::new(osargs!["demo", "--files", "20000", "--dir", work]).spawn_to(Stdio::piped());
    // Interrupt once it has written some files (the build takes far longer than this).
    let wrote = wait_until(Duration::from_secs(60), || file_names(&work.join("plain/train")).len() >= 5);
    assert!(wrote, "the demo wrote nothing within a minute");
    signal(child.id() as i32, Signal::SIGINT).unwrap();
    let status = wait_timeout(&mut child.0, Duration::from_secs(60)).expect("the demo must stop");
    let stderr = std::io::read_to_string(child.0.stderr.as_mut().unwrap()).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by SIGINT"), "{stderr}");
    assert!(!work.exists(), "the interrupted demo left {}", work.display());
}

/// Inside a SLURM job, a detached mount says it is not tied to the job, and how to make it so
/// (it would leak on clusters whose proctrack lets the daemon escape).
#[test]
fn a_detached_mount_inside_a_slurm_job_says_it_outlives_the_job() {
    require_root();
    let (_tmp, archive, mp) = gnu_copy("ux-slurm-note");
    let (m, out) = StagefsCmd::new(osargs!["mount", archive, mp]).env("SLURM_JOB_ID", "777").mounts(&archive, &mp);
    out.assert_stderr_has(&["not tied to SLURM job 777", "stagefs run"]);
    m.unmount().assert_success();
    // Outside a job, no such note.
    let (m, out) = StagefsCmd::new(osargs!["mount", archive, mp]).mounts(&archive, &mp);
    out.assert_stderr_lacks(&["SLURM"]);
    m.unmount().assert_success();
}

/// A file of zeros is a valid, empty tar: it mounts (exit 0) as an empty tree, and says so.
#[test]
fn an_archive_of_zeros_mounts_empty_and_says_so() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-zeros");
    let archive = put(&tmp, "zeros.tar", &[0; 1 << 20]);
    let (m, out) = StagefsCmd::new(osargs!["mount", archive, mp]).mounts(&archive, &mp);
    out.assert_stderr_has(&["holds no files or directories (1048576 bytes)"]);
    assert_eq!(fs::read_dir(&mp).unwrap().count(), 0);
    m.unmount().assert_success();
}

/// Template 1's typo (no such ARCHIVE): a `stagefs wait` in another step of the same job fails
/// at once with the mounter's code and message instead of waiting out its timeout.
#[test]
fn wait_sees_a_mount_that_failed_before_it_began() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-wait-failed");
    let (runtime, typo) = (tmp.join("runtime"), tmp.join("no-such-archive.tar"));
    let slurm = |step: &str, args: &[&OsStr]| StagefsCmd::new(args).runtime(&runtime).slurm_step("9191", step).run();
    slurm("0", &osargs!["mount", typo, mp]).assert_code(3);
    // Exit 3, the mounter's code: a wait that timed out would exit 6 after 40 s.
    slurm("1", &osargs!["wait", "--timeout", "40s", mp]).assert_code(3).assert_stderr_has(&["no-such-archive.tar"]);
}

/// The same outside SLURM, for a wait that starts half a second after the mounter failed; the
/// failure's status leaves the runtime directory by itself a little later.
#[test]
fn wait_outside_slurm_sees_a_failure_from_just_before_it_began_and_nothing_stays() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-wait-failed-plain");
    let (runtime, typo) = (tmp.join("runtime"), tmp.join("nonexist.sqsh"));
    let cmd = |args: &[&OsStr]| StagefsCmd::new(args).runtime(&runtime).outside_slurm().run();
    cmd(&osargs!["mount", "-f", typo, mp]).assert_code(3);
    std::thread::sleep(Duration::from_millis(500));
    // The mounter's code, not a timeout's 6.
    cmd(&osargs!["wait", "--timeout", "40s", mp]).assert_code(3).assert_stderr_has(&["nonexist.sqsh"]);
    let gone = wait_until(Duration::from_secs(40), || !file_names(&runtime).iter().any(|f| f.ends_with(".lock")));
    assert!(gone, "the failure's status stayed in {}", runtime.display());
}

/// Scanning a big tar draws a progress bar on a terminal (`script` gives the mount a pty),
/// as staging does; on a pipe it draws nothing.
#[test]
fn scanning_a_big_tar_shows_progress_on_a_terminal() {
    require_root();
    let (tmp, mp) = tmp_mnt("ux-scan-progress");
    let archive = tmp.join("many.tar");
    let script = r#"
import sys, tarfile, io
with tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT) as t:
    for i in range(200_000):
        info = tarfile.TarInfo(f"d{i // 1000:03d}/f{i:06d}")
        t.addfile(info, io.BytesIO(b""))
"#;
    run_tool("python3", osargs!["-c", script, archive]);
    let line = format!("{} mount {} {}", stagefs_bin().display(), archive.display(), mp.display());
    let out = run_tool("script", osargs!["-qec", &line, "/dev/null"]);
    let m = Mounted::adopt(&archive, &mp);
    assert!(out.stdout.contains("indexing"), "no progress while scanning:\n{}", out.describe());
    m.unmount().assert_success();
    // On a pipe: no bar.
    let (m, out) = StagefsCmd::new(osargs!["mount", archive, mp]).mounts(&archive, &mp);
    out.assert_stderr_lacks(&["indexing ["]);
    m.unmount().assert_success();
}
