//! Faults between stagefs and the server, each made real: connections reset midway (retried, bytes right), the object replaced during the copy (refused, never mixed), a server that stops answering (a timeout, not a hang), a server gone while mounted in place (EIO per read, the mount stays up), Ctrl-C during a fetch.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{proxy, silent, trickle, Fault};
use super::servers::Nginx;
use super::{command_with, contents, mount_fails, mount_url, scene, stagefs_with};
use crate::kit::{extract_tar, is_mounted, pack_tar, pseudo_random, wait_timeout, wait_until, StagefsCmd, TempDir};
use crate::kit::{signal, Signal};

/// A tar of a few large random files (`MiB` MiB in all) in nginx's root as `name`.
fn big_tar(nginx: &Nginx, tmp: &TempDir, name: &str, mib: usize) -> PathBuf {
    let src = tmp.join(format!("src-{name}"));
    fs::create_dir_all(&src).unwrap();
    for i in 0..4 {
        fs::write(src.join(format!("part{i}.bin")), pseudo_random(i as u64 + 7, mib << 18)).unwrap();
    }
    pack_tar(&src, &nginx.root.join(name), &["."]);
    src
}

/// Every third request is reset after 64 KiB: each range is resumed where it broke, and
/// the mount serves exactly the archive's bytes.
#[test]
fn connections_reset_midway_are_resumed_and_the_bytes_are_right() {
    let (tmp, env) = scene("remote-reset");
    let nginx = Nginx::start("reset");
    let src = big_tar(&nginx, &tmp, "big.tar", 48);
    let proxy = proxy(nginx.port, Fault::ResetEvery(3));
    let mnt =
        mount_url(&env, &["--stage", "ram", "--remote-concurrency", "4"], &proxy.url("big.tar"), &tmp.join("mnt"));
    assert_eq!(contents(&src), contents(mnt.path()));
    // 48 MiB in 8 MiB ranges, a third of them broken: retries happened.
    assert!(proxy.requests() >= 9, "{} requests", proxy.requests());
    mnt.unmount().assert_success();
}

/// The object is replaced (same size, new bytes, a later mtime) after the first requests
/// of the copy: the mount fails saying so (exit 3), and nothing is mounted.
#[test]
fn an_object_replaced_during_the_copy_is_refused_never_mixed() {
    let (tmp, env) = scene("remote-replaced");
    let nginx = Nginx::start("replaced");
    big_tar(&nginx, &tmp, "big.tar", 32);
    let (object, staged) = (nginx.root.join("big.tar"), tmp.join("new.tar"));
    let mut other = fs::read(&object).unwrap();
    // Bytes in the middle of members' data: still a tar, with other file contents.
    let len = other.len();
    for at in [len / 3, len / 2, len * 2 / 3] {
        other[at] ^= 0xff;
    }
    fs::write(&staged, &other).unwrap();
    let new_tree = tmp.join("new-tree");
    extract_tar(&staged, &new_tree);
    let (from, to) = (staged.clone(), object.clone());
    let replace = Arc::new(move || {
        let later = fs::metadata(&to).unwrap().modified().unwrap() + Duration::from_secs(100);
        fs::File::options().write(true).open(&from).unwrap().set_modified(later).unwrap();
        fs::rename(&from, &to).unwrap();
    });
    let proxy = proxy(nginx.port, Fault::HookBefore(3, replace));
    mount_fails(&env, &["--stage", "ram", "--remote-concurrency", "2"], &proxy.url("big.tar"), 3, &["replaced"]);
    // Mounting again reads the new version, whole.
    let mnt = mount_url(&env, &["--stage", "ram"], &nginx.url("big.tar"), &tmp.join("mnt"));
    assert_eq!(contents(&new_tree), contents(mnt.path()), "the new version, whole");
    mnt.unmount().assert_success();
}

/// A server that accepts and never answers, and one that stops sending midway: each
/// ends in a timeout error (exit 1) after the configured tries, never a hang.
#[test]
fn a_server_that_stops_answering_ends_in_a_timeout_not_a_hang() {
    let (tmp, env) = scene("remote-silent");
    let opts = ["--remote-timeout", "1s", "--remote-tries", "2"];
    mount_fails(&env, &opts, &silent().url("x.tar"), 1, &["timed out", "gave up after 2 tries"]);
    let nginx = Nginx::start("stall");
    big_tar(&nginx, &tmp, "big.tar", 8);
    let proxy = proxy(nginx.port, Fault::StallAfter(100 << 10));
    mount_fails(&env, &opts, &proxy.url("big.tar"), 1, &["timed out"]);
}

/// A server that answers at once and then trickles a byte every 200 ms: no read waits
/// the 1 s `--remote-timeout`, yet each try ends at the 2 s `--remote-deadline` (resuming
/// where it stopped), and the mount fails saying so. Before the deadline existed, this
/// fetch of 1 MiB would have taken 58 hours.
#[test]
fn a_server_that_trickles_ends_at_the_request_deadline_not_in_days() {
    let (_tmp, env) = scene("remote-trickle");
    let trickle = trickle(1 << 20);
    let opts = ["--stage", "ram", "--remote-timeout", "1s", "--remote-deadline", "2s", "--remote-tries", "2"];
    let said = ["took longer than its deadline (2 s, --remote-deadline)", "gave up after 2 tries"];
    let err = mount_fails(&env, &opts, &trickle.url("x.tar"), 1, &said);
    assert!(err.contains("reading at byte "), "the body trickled, not the headers: {err}");
    // A deadline shorter than the timeout is refused: it would make the timeout pointless.
    let short = ["--remote-timeout", "10s", "--remote-deadline", "5s"];
    mount_fails(&env, &short, &trickle.url("x.tar"), 2, &["--remote-deadline", "must not be shorter"]);
}

/// In place, the server goes away: reads fail with EIO, the tree is still listed, the
/// mount stays up and counts the errors; once the server is back, reads work again.
#[test]
fn in_place_with_the_server_gone_reads_fail_with_eio_and_the_mount_stays_up() {
    let (tmp, env) = scene("remote-gone");
    let mut nginx = Nginx::start("gone");
    let src = big_tar(&nginx, &tmp, "big.tar", 8);
    let mnt = mount_url(&env, &["--stage", "none"], &nginx.url("big.tar"), &tmp.join("mnt"));
    assert_eq!(fs::read(mnt.path().join("part0.bin")).unwrap(), fs::read(src.join("part0.bin")).unwrap());
    nginx.stop();
    for _ in 0..2 {
        let err = fs::read(mnt.path().join("part3.bin")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    assert_eq!(fs::read_dir(mnt.path()).unwrap().count(), 4, "the tree is still served");
    let status = stagefs_with(&env, &["status"]);
    assert!(status.stdout.contains(&nginx.url("big.tar")), "{}", status.describe());
    let error = status.stdout.contains("last error") && status.stdout.contains("connection refused");
    assert!(error, "{}", status.describe());
    nginx.restart();
    assert_eq!(fs::read(mnt.path().join("part3.bin")).unwrap(), fs::read(src.join("part3.bin")).unwrap());
    mnt.unmount().assert_success();
}

/// Ctrl-C while the fetch waits on a stalled server: the foreground mount stops (exit
/// 130) well before any read timeout, with nothing mounted.
#[test]
fn ctrl_c_ends_a_fetch_at_once() {
    let (tmp, env) = scene("remote-ctrl-c");
    let nginx = Nginx::start("ctrl-c");
    big_tar(&nginx, &tmp, "big.tar", 16);
    let proxy = proxy(nginx.port, Fault::StallAfter(256 << 10));
    let mp = tmp.join("mnt");
    let cmd = command_with(&env, &["mount", "-f", "--stage", "ram", &proxy.url("big.tar"), mp.to_str().unwrap()]);
    let mut child = StagefsCmd(cmd).spawn_to(Stdio::piped());
    assert!(wait_until(Duration::from_secs(30), || proxy.requests() >= 3), "the fetch began");
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    let _ = signal(child.id() as i32, Signal::SIGINT);
    // A hang guard, far below the 30 s read timeout the stalled requests would need.
    let status = wait_timeout(&mut child.0, Duration::from_secs(10)).expect("Ctrl-C ended the fetch");
    eprintln!("Ctrl-C to exit: {:?}", sent.elapsed());
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(!is_mounted(&mp) && !Path::new(&mp).join("part0.bin").exists());
}
