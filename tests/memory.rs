//! The daemon's private memory: what a shuffled read of every file leaves behind.

use std::fs;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::util::*;

/// `RssAnon` of a process in bytes: its private memory.
fn anon_bytes(pid: i32) -> u64 {
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
    let tmp = TempDir::new("memory");
    let src = tmp.join("src");
    const FILES: usize = 12_000;
    let sizes: Vec<usize> = pseudo_random(7, FILES * 2).chunks(2).map(|b| 1024 + (b[0] as usize) * 12).collect();
    for (i, &len) in sizes.iter().enumerate() {
        let dir = src.join(format!("d{:02}", i % 20));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i:05}.txt")), text(i, len)).unwrap();
    }
    let image = tmp.join("small.sqsh");
    run_tool("mksquashfs", [src.as_os_str(), image.as_os_str(), "-quiet".as_ref(), "-no-progress".as_ref()]);
    let mp = tmp.join("mnt");
    let m = Mounted::with_args(&["--stage", "none"], &image, &mp);
    let pid = m.daemon_pids()[0];
    let after_mount = anon_bytes(pid);

    // A seeded permutation, like a DataLoader's shuffled epoch.
    let mut order: Vec<usize> = (0..FILES).collect();
    let noise = pseudo_random(11, FILES * 8);
    for i in (1..FILES).rev() {
        let r = u64::from_le_bytes(noise[i * 8..i * 8 + 8].try_into().unwrap());
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    let path = |i: usize| m.path().join(format!("d{:02}/f{i:05}.txt", i % 20));
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
