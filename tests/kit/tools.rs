//! Required tools and privileges, shared locks, and inspecting processes through /proc.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::euid;

/// Panics unless the tests run as root (they mount, chown, and extract with
/// the archived owners).
pub fn require_root() {
    let uid = euid();
    assert_eq!(
        uid, 0,
        "the integration tests must run as root (they mount FUSE file systems and extract archives with their owners)"
    );
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: the integration tests need FUSE");
}

/// Tests that empty the whole page cache ([`drop_caches`]) and tests that check what it
/// holds take this lock, so that one never empties the cache under the other's check.
pub fn page_cache_guard() -> PageCacheGuard {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PageCacheGuard { _held: LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) }
}

/// The page cache held for one test ([`page_cache_guard`]).
pub struct PageCacheGuard {
    _held: std::sync::MutexGuard<'static, ()>,
}

/// Empties the whole page cache, only under [`page_cache_guard`]: a check of what the
/// cache holds (`stagefs status`' RAM, the warm-up) never sees it emptied meanwhile.
pub fn drop_caches(_held: &PageCacheGuard) {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("write /proc/sys/vm/drop_caches");
}

/// Tests that run SLURM jobs (the one-node templates in `slurm`, the three-node cluster in
/// `cluster`) take this lock for their whole run: one at a time. A test that started the
/// one-node SLURM stops it when done, which would kill a concurrent test's jobs; and the
/// cluster tests measure their nodes' /dev/shm and time jobs on a 2-core machine.
pub fn slurm_guard() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// True if the process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some(Some('Z')) | Some(Some('X')) | None)
        }
        Err(_) => false,
    }
}

/// The live children of process `pid` (of any of its threads), as its threads list them.
pub fn children_of(pid: i32) -> Vec<i32> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let lists: String = tasks.filter_map(|t| fs::read_to_string(t.path().join("children")).ok()).collect();
    lists.split_whitespace().filter_map(|c| c.parse().ok()).filter(|c| process_alive(*c)).collect()
}

/// Live `stagefs` processes (other than this test binary) with `needle`
/// among their arguments: the daemon serving a mount point, found by the
/// mount point or archive path it was started with.
pub fn stagefs_pids(needle: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let needle = needle.as_os_str().as_bytes();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid: i32 = match entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            Some(p) => p,
            None => continue,
        };
        if pid == me {
            continue;
        }
        let cmdline = match fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(c) => c,
            Err(_) => continue,
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_stagefs = args
            .first()
            .map(|a0| Path::new(OsStr::from_bytes(a0)).file_name() == Some(OsStr::new("stagefs")))
            .unwrap_or(false);
        if is_stagefs && args.contains(&needle) && process_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// A `Key:   N kB` field of a /proc file (`/proc/meminfo`, `/proc/PID/status`), in bytes.
pub fn proc_kb_field(path: &str, key: &str) -> u64 {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let line = text.lines().find(|l| l.split(':').next() == Some(key));
    let kb = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse::<u64>().ok());
    kb.unwrap_or_else(|| panic!("no `{key}:` in kB in {path}")) * 1024
}
