//! A shared node is hostile: another user squats stagefs's directories, plants symlinks and saved indexes; an
//! ordinary user's stagefs refuses or ignores them, never writing through them. A victim per test, for parallel runs.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::kit::*;
use stagefs_archive::index::{tamper, SectionId};

/// A victim with `a.tar` (a.txt, b.txt) in `~` or in a project directory everyone may
/// write (0777), `~/.bashrc` and the mountpoint `~/mnt`; and the attacker.
struct Scene {
    victim: User,
    mallory: User,
    archive: PathBuf,
    mnt: PathBuf,
    _project: Option<TempDir>,
}

const A: &[u8] = b"aaaaaaaaaaa";
const B: &[u8] = b"bbbbbbbbbbbbb";
const BASHRC: &[u8] = b"# the victim's shell settings\n";

fn scene(victim: &str, in_project: bool) -> Scene {
    let victim = User::get(victim);
    let project = in_project.then(|| TempDir::new("shared-project"));
    if let Some(project) = &project {
        chmod(project.path(), 0o777);
    }
    let archive = project.as_ref().map_or(victim.home.as_path(), |p| p.path()).join("a.tar");
    tar_of(&victim, &archive, &[("a.txt", A), ("b.txt", B)]);
    plant(&victim.home.join(".bashrc"), BASHRC, &victim, 0o644);
    let mnt = victim.home.join("mnt");
    remove_tree(&mnt); // left by an earlier failed run
    remove_tree(&victim.tmp_runtime_dir());
    remove_tree(&PathBuf::from("/dev/shm").join(&victim.name));
    Scene { victim, mallory: User::get("sfs-mallory"), archive, mnt, _project: project }
}

#[test]
fn squatted_runtime_dir_is_refused_and_nothing_is_written_through_it() {
    let s = scene("sfs-victim1", false);
    let runtime = s.victim.tmp_runtime_dir();
    s.mallory.sh(&format!("mkdir -m 0777 {0} && chmod 0777 {0}", runtime.display()));
    let bashrc = s.victim.home.join(".bashrc");
    let links = ["tmp", "mount", "lock", "users"].map(|ext| s.victim.runtime_file(&s.mnt, ext).display().to_string());
    s.mallory.sh(&format!("set -e; for l in {}; do ln -s {} $l; done", links.join(" "), bashrc.display()));
    let out = s.victim.stagefs(osargs!["mount", s.archive, s.mnt]);
    out.assert_code(4).assert_stderr_has(&[&runtime.display().to_string(), "sfs-mallory", "STAGEFS_RUNTIME_DIR"]);
    assert_eq!(read(&bashrc), BASHRC, "written through a planted symlink");
    assert!(!is_mounted(&s.mnt));
    assert!(!s.mnt.exists(), "the mountpoint was made although the mount was refused");
    s.victim.stagefs(["status"]).assert_code(4).assert_stderr_has(&["sfs-mallory"]);
    // Once the squatter's directory is gone, the victim's own is made private and works.
    remove_tree(&runtime);
    s.victim.stagefs(osargs!["mount", s.archive, s.mnt]).assert_success();
    let meta = fs::symlink_metadata(&runtime).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (s.victim.uid, 0o700));
    // Only the victim may look inside (no allow_other: not even root).
    assert_eq!(s.victim.sh(&format!("cat {}/a.txt", s.mnt.display())).stdout.as_bytes(), A);
    s.victim.umount(&s.mnt);
    assert_nothing_left(&s.mnt, "after umount");
    assert_eq!(fs::read_dir(&runtime).unwrap().count(), 0, "files left in the runtime dir");
}

#[test]
fn squatted_dev_shm_dir_is_refused_and_the_default_mountpoint_cannot_be_swapped() {
    let s = scene("sfs-victim2", false);
    let shm = PathBuf::from("/dev/shm").join(&s.victim.name);
    s.mallory.sh(&format!("mkdir -m 0777 {0} && chmod 0777 {0}", shm.display()));
    let out = s.victim.stagefs(osargs!["mount", s.archive]);
    out.assert_code(4).assert_stderr_has(&[&shm.display().to_string(), "sfs-mallory", "another mountpoint"]);
    assert!(!shm.join("stagefs").exists(), "stagefs wrote into the squatted directory");

    remove_tree(&shm);
    s.victim.stagefs(osargs!["mount", s.archive]).assert_success();
    let mnt = shm.join("stagefs/a");
    for dir in [&shm, &shm.join("stagefs")] {
        let meta = fs::symlink_metadata(dir).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (s.victim.uid, 0o700), "{}", dir.display());
    }
    // The attack of the report: rename the parent away and put a tree of one's own there.
    let swap = s.mallory.try_sh(&format!("mv {0}/stagefs {0}/x", shm.display()));
    assert!(!swap.success(), "another user could rename the mount's parent:\n{}", swap.describe());
    assert_eq!(s.victim.sh(&format!("cat {}/b.txt", mnt.display())).stdout.as_bytes(), B);
    assert!(fs::read(mnt.join("b.txt")).is_err(), "another user (root) could read the victim's mount");
    s.victim.umount(&mnt);
    assert_nothing_left(&mnt, "after umount");
    assert!(!shm.exists(), "the directories stagefs made for the default mountpoint were left");
}

/// A saved index of `archive` (made by root's `stagefs index`), as bytes to tamper with.
fn genuine_index(archive: &Path) -> Vec<u8> {
    stagefs(osargs!["index", archive]).assert_success();
    let bytes = read(&index_path(archive));
    fs::remove_file(index_path(archive)).unwrap();
    bytes
}

fn index_path(archive: &Path) -> PathBuf {
    archive.with_file_name(format!("{}.stagefs-index", archive.file_name().unwrap().to_str().unwrap()))
}

/// Swaps the data offsets of the tar's first two members (512 and 1536: each member is a 512-byte header and one
/// block of data) in a saved index (an inode's content locator is its record's bytes 32..40).
fn swap_offsets(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let at = |offset: u64| {
        let mut records = tamper::section(bytes, SectionId::Inodes).step_by(48); // at each 48-byte record
        records.find(|&r| bytes[r + 32..r + 40] == offset.to_le_bytes()).expect("a member's record") + 32
    };
    let (a, b) = (at(512), at(1536));
    out[a..a + 8].copy_from_slice(&1536u64.to_le_bytes());
    out[b..b + 8].copy_from_slice(&512u64.to_le_bytes());
    tamper::reseal(&mut out);
    out
}

/// Sets the nanoseconds of inode 1 (the first member) to 2·10⁹ (bytes 44..48 of its record).
fn bad_nanoseconds(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let at = tamper::section(bytes, SectionId::Inodes).step_by(48).nth(1).unwrap() + 44;
    out[at..at + 4].copy_from_slice(&2_000_000_000u32.to_le_bytes());
    tamper::reseal(&mut out);
    out
}

/// Mounts `archive` as `user`, checks both files read right and every entry stats, unmounts; the mount's stderr.
fn mount_and_check(user: &User, archive: &Path, mnt: &Path) -> String {
    let stderr = user.stagefs(osargs!["mount", archive, mnt]).assert_success().stderr.clone();
    let read = user.try_sh(&format!("cat {0}/a.txt; echo; cat {0}/b.txt; stat {0}/* >/dev/null", mnt.display()));
    user.umount(mnt);
    assert_eq!(read.stdout, format!("{}\n{}", String::from_utf8_lossy(A), String::from_utf8_lossy(B)));
    assert!(read.success(), "{}", read.describe());
    stderr
}

#[test]
fn planted_and_damaged_indexes_are_ignored_never_served() {
    let s = scene("sfs-victim3", true);
    let genuine = genuine_index(&s.archive);
    let index = index_path(&s.archive);
    // Another user's index, data offsets swapped: it would serve a.txt with b.txt's bytes.
    plant(&index, &swap_offsets(&genuine), &s.mallory, 0o644);
    let log = mount_and_check(&s.victim, &s.archive, &s.mnt);
    assert!(log.contains("ignoring saved index") && log.contains("sfs-mallory"), "{log}");
    // The victim's own, but writable by everyone.
    plant(&index, &swap_offsets(&genuine), &s.victim, 0o666);
    let log = mount_and_check(&s.victim, &s.archive, &s.mnt);
    assert!(log.contains("may write"), "{log}");
    // The victim's own and private, with nanoseconds past a second (FUSE threads panicked): mapped, and that record
    // refused where it is read (EIO, naming the index); the other member is served and the mount stays up.
    plant(&index, &bad_nanoseconds(&genuine), &s.victim, 0o644);
    s.victim.stagefs(osargs!["mount", s.archive, s.mnt]).assert_success();
    let a = s.victim.try_sh(&format!("stat {}/a.txt", s.mnt.display()));
    assert!(!a.success() && a.stderr.contains("Input/output error"), "{}", a.describe());
    assert_eq!(s.victim.sh(&format!("cat {}/b.txt", s.mnt.display())).stdout.as_bytes(), B);
    s.victim.stagefs(["status"]).assert_stdout_has(&[&index.display().to_string(), "inode 1"]);
    s.victim.umount(&s.mnt);
    // A FIFO (the mount hung on it) and a symlink to an endless file.
    let _ = fs::remove_file(&index);
    nix::unistd::mkfifo(&index, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    s.victim.chown(&index);
    let log = mount_and_check(&s.victim, &s.archive, &s.mnt);
    assert!(log.contains("not a regular file"), "{log}");
    fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
    mount_and_check(&s.victim, &s.archive, &s.mnt);
    fs::remove_file(&index).unwrap();
    assert_nothing_left(&s.mnt, "after the planted indexes");
}

#[test]
fn saving_an_index_writes_nothing_through_planted_links_and_keeps_it_private() {
    let s = scene("sfs-victim4", true);
    chmod(&s.archive, 0o600);
    let precious = s.victim.home.join(".bashrc");
    let index = index_path(&s.archive);
    // The final name, and the temp names the next few hundred processes would have used.
    let last_pid: u32 = fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    let (to, dir, i) = (precious.display(), s.archive.parent().unwrap().display(), index.display());
    let (first, last) = (last_pid + 1, last_pid + 400);
    s.mallory.sh(&format!("ln -s {to} {i}; for p in $(seq {first} {last}); do ln -s {to} {dir}/a.tar.tmp$p; done"));
    let out = s.victim.stagefs(osargs!["index", s.archive]);
    out.assert_success().assert_stdout_has(&[&format!("saved to {}", index.display())]);
    assert_eq!(fs::read(&precious).unwrap(), BASHRC, "written through a planted symlink");
    let meta = fs::symlink_metadata(&index).unwrap();
    assert!(meta.is_file());
    assert_eq!((meta.uid(), meta.mode() & 0o777), (s.victim.uid, 0o600), "an index must not be more readable");
}

#[test]
fn an_ordinary_users_mount_lives_and_ends_with_exact_exit_codes() {
    let s = scene("sfs-victim5", false);
    s.victim.stagefs(osargs!["mount", s.archive, s.mnt]).assert_success();
    assert_eq!(s.victim.sh(&format!("cat {0}/a.txt {0}/b.txt", s.mnt.display())).stdout.as_bytes(), [A, B].concat());
    let status = s.victim.stagefs(["status", "--json"]);
    let line =
        format!("{{\"mountpoint\":\"{}\",\"archive\":\"{}\",\"state\":\"live\"", s.mnt.display(), s.archive.display());
    assert!(status.stdout.starts_with(&line), "{}", status.describe());
    // Busy: a process of the victim's works inside the mount.
    let busy = s.victim.spawn_sh(&format!("cd {} && exec sleep 60", s.mnt.display()));
    let cwd = format!("/proc/{}/cwd", busy.id());
    assert!(wait_until(Duration::from_secs(10), || fs::read_link(&cwd).is_ok_and(|cwd| cwd == s.mnt)));
    s.victim.stagefs(osargs!["umount", s.mnt]).assert_code(5).assert_stderr_has(&["busy", "--lazy"]);
    drop(busy);
    // Someone else's mount, or no stagefs mount at all: exit 6, saying what is there.
    let out = s.mallory.stagefs(osargs!["umount", s.mnt]);
    out.assert_code(6).assert_stderr_has(&["not a stagefs mount of yours", "sfs-victim5"]);
    s.victim.stagefs(["umount", "/proc"]).assert_code(6).assert_stderr_has(&["not a stagefs mount of yours", "proc"]);

    s.victim.umount(&s.mnt);
    s.victim.stagefs(osargs!["umount", s.mnt]).assert_code(6).assert_stderr_has(&["not mounted"]);
    assert_nothing_left(&s.mnt, "after umount");
    assert!(!s.mnt.exists(), "the mountpoint stagefs made was left");
    // A killed daemon leaves a dead mount: status shows it and how to clear it.
    s.victim.stagefs(osargs!["mount", s.archive, s.mnt]).assert_success();
    stagefs_pids(&s.mnt).into_iter().for_each(|pid| signal(pid, Signal::SIGKILL).unwrap());
    assert!(wait_until(Duration::from_secs(10), || stagefs_pids(&s.mnt).is_empty()));
    s.victim.stagefs(["status"]).assert_stdout_has(&["DEAD", &format!("stagefs umount {}", s.mnt.display())]);
    let json = s.victim.stagefs(["status", "--json"]);
    assert_eq!(json.stdout, format!("{{\"mountpoint\":\"{}\",\"state\":\"dead\"}}\n", s.mnt.display()));
    s.victim.umount(&s.mnt);
    assert_nothing_left(&s.mnt, "after clearing the dead mount");
}

#[test]
fn overlapping_default_mounts_leave_no_directory_whichever_ends_first() {
    let s = scene("sfs-victim6", false);
    let shm = PathBuf::from("/dev/shm").join(&s.victim.name);
    let second = s.victim.home.join("b.tar");
    fs::copy(&s.archive, &second).unwrap();
    s.victim.chown(&second);
    // The first mount makes /dev/shm/$USER/stagefs; the second finds it; the first ends first.
    s.victim.stagefs(osargs!["mount", s.archive]).assert_success();
    s.victim.stagefs(osargs!["mount", second]).assert_success();
    s.victim.umount(&shm.join("stagefs/a"));
    assert!(is_mounted(&shm.join("stagefs/b")), "the other mount went away with the first");
    s.victim.umount(&shm.join("stagefs/b"));
    assert!(wait_until(Duration::from_secs(5), || !shm.exists()), "left behind: {}", shm.display());
}

/// A mount made from a shell with `XDG_RUNTIME_DIR=/run/user/<uid>` seen from one without it (a batch step, an ssh
/// session): `status` lists it live with its numbers, `wait` returns, mounting again finds it, and `umount` ends it
/// and leaves nothing in either runtime directory. Its record is found wherever a shell of the user may have put it.
#[test]
fn a_mount_is_live_from_every_shell_whatever_its_runtime_dir() {
    let user = User::get("sfs-xdg");
    let run_user = PathBuf::from(format!("/run/user/{}", user.uid));
    fs::create_dir_all(&run_user).unwrap();
    user.chown(&run_user);
    chmod(&run_user, 0o700);
    let archive = user.home.join("xdg.tar");
    tar_of(&user, &archive, &[("x.txt", b"xdg bytes\n")]);
    let mnt = user.fresh_mountpoint("mnt-xdg");
    let xdg = format!("{}", run_user.display());
    user.stagefs_cmd(&[("XDG_RUNTIME_DIR", &xdg)], osargs!["mount", archive, mnt]).run().assert_success();
    assert!(fs::read_dir(run_user.join("stagefs")).unwrap().count() > 0, "the record went to XDG_RUNTIME_DIR");
    // Another shell of the same user, without XDG_RUNTIME_DIR.
    let status = user.stagefs(["status"]);
    status.assert_success().assert_stdout_has(&[&mnt.to_string_lossy()]);
    assert!(!status.stdout.contains("DEAD"), "{}", status.describe());
    assert!(status.stdout.contains("xdg.tar"), "status shows the record's numbers:\n{}", status.describe());
    user.stagefs(osargs!["wait", "--timeout", "10s", mnt]).assert_success();
    let again = user.stagefs(osargs!["mount", archive, mnt]);
    again.assert_success().assert_stderr_has(&["already mounted with this archive"]);
    assert_eq!(user.sh(&format!("cat {}/x.txt", mnt.display())).stdout, "xdg bytes\n");
    user.umount(&mnt);
    assert!(!is_mounted(&mnt));
    let left: Vec<_> = fs::read_dir(run_user.join("stagefs")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "files left in XDG_RUNTIME_DIR/stagefs: {left:?}");
    fs::remove_dir_all(&run_user).unwrap();
    fs::remove_file(&archive).unwrap();
    remove_tree(&mnt);
}

/// The restart points saved with the index of a compressed tar are trusted like the rest of it: another user's index
/// for the victim's `.tar.gz` (points moved, which would decode from the wrong place) is ignored, as is the victim's
/// own when everyone may write it; the files read right either way.
#[test]
fn planted_restart_points_of_a_compressed_tar_are_ignored() {
    let s = scene("sfs-victim7", true);
    let gz = s.archive.with_file_name("a.tar.gz");
    run_tool("gzip", osargs!["-k", s.archive]).assert_success();
    s.victim.chown(&gz);
    let genuine = genuine_index(&gz);
    // The points section: codec (4), decoded size (8), count (8), then each point's output
    // offset (8) and compressed offset (8). Move the first point's compressed offset.
    let mut moved = genuine.clone();
    let at = tamper::section(&genuine, SectionId::Points).start + 4 + 8 + 8 + 8;
    moved[at..at + 8].copy_from_slice(&10u64.to_le_bytes());
    tamper::reseal(&mut moved);
    let index = index_path(&gz);
    for (owner, mode, needle) in [(&s.mallory, 0o644, "sfs-mallory"), (&s.victim, 0o666, "may write")] {
        plant(&index, &moved, owner, mode);
        let log = mount_and_check(&s.victim, &gz, &s.mnt);
        assert!(log.contains("ignoring saved index") && log.contains(needle), "{log}");
    }
    fs::remove_file(&index).unwrap();
    assert_nothing_left(&s.mnt, "after the planted restart points");
}

/// A growing set in a shared sticky directory (as /tmp): a shard another user drops there is added neither by
/// `--watch` nor by `stagefs add`, and only the victim is answered on the mount's control socket, not even root.
#[test]
fn a_growing_set_takes_no_shard_and_no_order_from_another_user() {
    use std::io::Write;
    let s = scene("sfs-victim8", false);
    let shared = TempDir::new("shared-growing");
    chmod(shared.path(), 0o1777);
    let mine = shared.join("shard-1.tar");
    fs::copy(&s.archive, &mine).unwrap();
    s.victim.chown(&mine);
    let planted = shared.join("shard-2.tar");
    tar_of(&s.mallory, &planted, &[("evil.txt", b"planted\n")]);
    let pattern = shared.join("shard-*.tar");
    // Started with only the victim's shard (mallory's is made to appear later).
    fs::rename(&planted, shared.join("later")).unwrap();
    let log = s.victim.home.join("growing.log");
    let log_arg = format!("--log-file={}", log.display());
    s.victim.stagefs(osargs!["-v", "mount", "--watch=200ms", log_arg, pattern, s.mnt]).assert_success();
    fs::rename(shared.join("later"), &planted).unwrap();
    let refused =
        wait_until(Duration::from_secs(20), || fs::read_to_string(&log).unwrap_or_default().contains("not adding"));
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(refused && text.contains("sfs-mallory"), "--watch must refuse mallory's shard:\n{text}");
    assert_eq!(s.victim.sh(&format!("ls {}", s.mnt.display())).stdout, "a.txt\nb.txt\n");

    let out = s.victim.stagefs(osargs!["add", s.mnt, planted]);
    out.assert_code(4).assert_stderr_has(&["sfs-mallory", "--trust-shards"]);
    // Root reaches the socket (mallory cannot even see it); the daemon still refuses: the caller is not the victim.
    let socket = s.victim.runtime_file(&s.mnt, "control");
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let body = [b"stagefs-control-2\0add\x001\0".as_slice(), planted.as_os_str().as_encoded_bytes()].concat();
    // The daemon answers a caller of another uid before reading a byte: the write may find the connection closed.
    let _ = stream.write_all(&[(body.len() as u64).to_le_bytes().as_slice(), &body].concat());
    let answer = std::io::read_to_string(&stream).unwrap();
    assert!(answer.starts_with("04\0") && answer.contains("another user"), "{answer:?}");
    let out = s.mallory.stagefs(osargs!["add", "--trust-shards", s.mnt, planted]);
    assert!(!out.success(), "{}", out.describe());
    let out = s.mallory.try_sh(&format!("ls -l {}", socket.display()));
    assert!(!out.success(), "mallory can see the victim's socket:\n{}", out.describe());
    assert_eq!(s.victim.sh(&format!("ls {}", s.mnt.display())).stdout, "a.txt\nb.txt\n", "the tree changed");

    s.victim.umount(&s.mnt);
    assert!(!socket.exists(), "the control socket was left");
    let _ = fs::remove_file(&log);
    assert_nothing_left(&s.mnt, "after the growing mount");
}
