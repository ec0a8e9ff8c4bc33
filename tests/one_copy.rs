//! `--stage ram` holds the files in RAM once: no private copy, no page cache of the source
//! left behind, and every byte stays right when the kernel evicts pages (drop_caches, a
//! memory cgroup's limit), or EIO, never wrong bytes, when the archive changed meanwhile.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::kit::*;
use crate::memory::in_page_cache;
use crate::staging::MemoryCgroup;

const FILES: u64 = 40;
const FILE_LEN: usize = 1 << 20;

/// Drops the page cache of one file (what `vmtouch -e` does).
fn evict(path: &Path) {
    let file = fs::File::open(path).unwrap();
    // SAFETY: a hint about a descriptor we own.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn drop_all_caches() {
    let cache = page_cache_guard();
    drop_caches(&cache);
}

#[test]
fn stage_ram_holds_the_files_once_and_every_byte_survives_eviction() {
    require_root();
    let scene = Scene::new("one-copy").files((0..FILES).map(|i| (format!("f{i:02}"), pseudo_random(i, FILE_LEN))));
    // The archive alone in its directory, whose page cache is measured.
    let (tmp, src, archive_dir) = (&scene.tmp, scene.src(), scene.join("archive"));
    fs::create_dir(&archive_dir).unwrap();
    let tar = scene.tar_at(&archive_dir.join("a.tar"));
    // A just-written archive has dirty pages, which the kernel cannot drop; datasets are old.
    fs::File::open(&tar).unwrap().sync_all().unwrap();
    let log = tmp.join("daemon.log");
    let mnt = tmp.join("mnt");
    let m = Mounted::staged(&["--stage", "ram", "--log-file", log.to_str().unwrap()], &tar, &mnt);

    // One copy: the mount's page cache. No memfd, and the source's pages are gone.
    let pid = stagefs_pids(&mnt)[0];
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("memfd:stagefs"), "--stage ram made a private copy:\n{maps}");
    let left = in_page_cache(&archive_dir) as u64;
    assert!(left <= (FILES * FILE_LEN as u64) / 10, "{} KiB of the archive stay in the page cache", left >> 10);
    let status = stagefs(["status", "--json"]);
    let line = status.stdout.lines().find(|l| l.contains(&*mnt.to_string_lossy())).unwrap().to_string();
    for field in ["\"staging\":\"ram\"", "\"staged_bytes\":0", "\"warmed_bytes\":41943040"] {
        assert!(line.contains(field), "{field} in {line}");
    }

    // Evicted mid-epoch: the rest comes from the archive again, byte for byte.
    for i in 0..FILES / 2 {
        read(&mnt.join(format!("f{i:02}")));
    }
    drop_all_caches();
    assert_tree_matches(&mnt, &scene);

    // A memory cgroup far smaller than the data forces eviction while a reader checks it.
    drop_all_caches();
    let cgroup = MemoryCgroup::new("one-copy", 8 << 20);
    let sums = cgroup.run(Path::new("/bin/sh"), &osargs!["-c", "cd \"$0\" && sha256sum f*", mnt]);
    sums.assert_success();
    let expected =
        run_cmd(std::process::Command::new("sh").arg("-c").arg("cd \"$0\" && sha256sum f*").arg(src), CMD_TIMEOUT);
    assert_eq!(sums.stdout, expected.stdout, "bytes read under a 8 MiB cgroup limit differ");
    drop(cgroup);

    // The archive changes while mounted: evicted pages are EIO (never wrong bytes), one
    // log line names the archive, and the daemon lives on.
    let mut bytes = fs::read(&tar).unwrap();
    bytes[512] ^= 0xff; // the first byte of f00's data
    fs::write(&tar, &bytes).unwrap();
    evict(&tar);
    drop_all_caches();
    let err = fs::read(mnt.join("f00")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(process_alive(pid), "the daemon died when its archive changed");
    let logged = fs::read_to_string(&log).unwrap();
    assert!(logged.contains("changed since it was mounted"), "no log line about the changed archive:\n{logged}");
    m.unmount().assert_success();
}

#[test]
fn stage_copy_is_immune_to_the_archive_changing() {
    require_root();
    let scene = Scene::new("copy-immune").file("f", pseudo_random(7, FILE_LEN));
    let (src, tar) = (scene.src(), scene.tar());
    let m = Mounted::staged(&["--stage", "copy"], &tar, &scene.join("mnt"));
    fs::remove_file(&tar).unwrap();
    drop_all_caches();
    assert!(read(&m.path().join("f")) == read(&src.join("f")), "a copied archive must survive its file's removal");
    m.unmount().assert_success();
}

#[test]
fn mounting_again_says_it_is_mounted_and_how_it_is_staged() {
    require_root();
    let scene = Scene::new("mount-again").file("f", b"x");
    let (tar, mnt) = (scene.tar(), scene.join("mnt"));
    let m = Mounted::with_args(&["--stage", "none"], &tar, &mnt);
    let again = stagefs(osargs!["mount", "--stage", "ram", tar, mnt]);
    again.assert_success();
    assert_eq!(again.stdout.trim(), mnt.to_str().unwrap(), "the mountpoint is printed for scripts");
    for words in ["already mounted with this archive", "served in place, not staged", "stagefs umount"] {
        again.assert_stderr_has(&[words]);
    }
    m.unmount().assert_success();
}
