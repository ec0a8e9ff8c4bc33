//! The daemon's private memory: what a shuffled read of every file leaves behind.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use crate::kit::*;

/// `RssAnon` of a process in bytes: its private memory.
pub fn anon_bytes(pid: i32) -> u64 {
    proc_kb_field(&format!("/proc/{pid}/status"), "RssAnon")
}

/// Compressible text of `len` bytes that differs per file.
fn text(i: usize, len: usize) -> Vec<u8> {
    format!("file {i} says hello to the page cache; ").bytes().cycle().take(len).collect()
}

/// A shuffled epoch over a SquashFS of small files decompresses each shared fragment
/// once and keeps it until its last file is read (tens of MiB here); once every file was
/// served, that memory must be back with the system, epoch after epoch.
#[test]
fn squashfs_fragments_are_released_once_every_file_was_served() {
    const FILES: usize = 12_000;
    let sizes: Vec<usize> = pseudo_random(7, FILES * 2).chunks(2).map(|b| 1024 + (b[0] as usize) * 12).collect();
    let name = |i: usize| format!("d{:02}/f{i:05}.txt", i % 20);
    let scene = Scene::new("memory").files(sizes.iter().enumerate().map(|(i, &len)| (name(i), text(i, len))));
    let image = scene.squashfs_at(&scene.join("small.sqsh"));
    let m = scene.mount(&image, &["--stage", "none"]);
    let pid = m.daemon_pids()[0];
    let after_mount = anon_bytes(pid);

    // A seeded permutation, like a DataLoader's shuffled epoch.
    let mut order: Vec<usize> = (0..FILES).collect();
    let noise = pseudo_random(11, FILES * 8);
    for i in (1..FILES).rev() {
        let r = u64::from_le_bytes(noise[i * 8..i * 8 + 8].try_into().unwrap());
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    let path = |i: usize| m.path().join(name(i));
    for &i in &order {
        assert!(read(&path(i)) == text(i, sizes[i]), "wrong bytes in {}", path(i).display());
    }
    // A second epoch after the kernel dropped the files' pages (as under memory
    // pressure) decompresses every fragment again, and must release it again.
    for &i in order.iter().rev() {
        let file = fs::File::open(path(i)).unwrap();
        // SAFETY: an advisory call on a file descriptor we own; it touches no memory.
        let dropped = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(dropped, 0, "fadvise DONTNEED on {}", path(i).display());
        assert!(read(&path(i)) == text(i, sizes[i]), "wrong bytes in {} (second epoch)", path(i).display());
    }
    let decompressed: usize = sizes.iter().sum();
    let limit = after_mount + (4 << 20);
    let released = wait_until(Duration::from_secs(10), || anon_bytes(pid) < limit);
    assert!(
        released,
        "daemon holds {} KiB private memory 10 s after reading every file ({} KiB after mounting, {} KiB of file data decompressed)",
        anon_bytes(pid) >> 10,
        after_mount >> 10,
        decompressed >> 10
    );
    m.unmount().assert_success();
}

/// Pages of `path` in the page cache (`mincore` over it, mapped, never read), and the
/// file's pages in total.
pub fn cached_pages(path: &Path) -> (usize, usize) {
    let file = fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let len = file.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    if pages == 0 {
        return (0, 0);
    }
    // SAFETY: a private read-only map of `len` bytes that is never dereferenced; mincore
    // only reports which of its pages are resident.
    unsafe {
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED, "mmap {}: {}", path.display(), std::io::Error::last_os_error());
        let mut vec = vec![0u8; pages];
        let rc = libc::mincore(map, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(map, len);
        assert_eq!(rc, 0, "mincore {}: {err}", path.display());
        (vec.iter().filter(|&&v| v & 1 != 0).count(), pages)
    }
}

/// The page cache a tree's files hold.
pub fn in_page_cache(dir: &Path) -> i64 {
    let mut total = 0;
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            total += in_page_cache(&path);
        } else if meta.is_file() {
            total += cached_pages(&path).0 as i64 * 4096;
        }
    }
    total
}

/// The memfds process `pid` holds (a staged copy: the daemon keeps its map, not its
/// descriptor), each once: the bytes allocated to them.
pub fn memfd_bytes(pid: i32) -> i64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    let maps = fs::read_dir(format!("/proc/{pid}/map_files")).unwrap();
    for entry in fds.chain(maps).flatten() {
        let target = fs::read_link(entry.path()).unwrap_or_default();
        if !target.to_string_lossy().starts_with("/memfd:") {
            continue;
        }
        if let Ok(meta) = fs::metadata(entry.path()) {
            if seen.insert((meta.dev(), meta.ino())) {
                total += meta.blocks() as i64 * 512;
            }
        }
    }
    total
}

/// The `ram_bytes` (the RAM column) and `staged_bytes` `stagefs status --json` gives `mp`.
pub fn status_ram(mp: &Path) -> (i64, i64) {
    let record = status_record(mp);
    (record["ram_bytes"].as_i64().unwrap(), record["staged_bytes"].as_i64().unwrap())
}

/// `stagefs status` counts each byte a mount holds once (it showed a 66.8 MiB `--stage
/// copy` mount as 206 MiB: the memfd counted as staged and again in the daemon's resident
/// size). Its RAM column must match what the mount really holds, counted from outside:
/// the daemon's private memory (RssAnon), the memfds it holds (their allocated pages) and
/// the page cache of the mounted files (`mincore`), for a private copy and for `--stage
/// ram`. The archive's own pages are dropped first, so that staging reads it anew. (The
/// same against MemAvailable is measured by `benches/ram.py`: other work on a shared
/// machine moves it by hundreds of MiB within a test.)
#[test]
fn status_counts_the_ram_of_a_mount_once() {
    let _cache = page_cache_guard();
    let scene = Scene::new("memory-status").files((0..48).map(|i| (format!("f{i:02}.bin"), pseudo_random(i, 4 << 20))));
    let (tmp, archive) = (&scene.tmp, scene.tar_dot_at(&scene.join("data.tar")));
    let size = fs::metadata(&archive).unwrap().len() as i64;
    for stage in ["ram", "copy"] {
        let file = fs::File::open(&archive).unwrap();
        stagefs_archive::drop_file_cache(&file, 0, 0);
        let mp = tmp.join(format!("mnt-{stage}"));
        let m = Mounted::staged(&["--stage", stage, "--warm", "yes"], &archive, &mp);
        let pid = m.daemon_pids()[0];
        // The counters are refreshed every few seconds; the record is written at mount.
        let (ram, staged) = status_ram(&mp);
        let held = anon_bytes(pid) as i64 + memfd_bytes(pid) + in_page_cache(&mp);
        let shown =
            format!("--stage {stage}: status says {ram} B (staged {staged} B), it holds {held} B, archive {size} B");
        eprintln!("{shown}");
        assert!(ram < size * 23 / 10, "counted more than once: {shown}");
        assert!((ram - held).abs() < held / 10 + (16 << 20), "{shown}");
        m.unmount().assert_success();
    }
}
