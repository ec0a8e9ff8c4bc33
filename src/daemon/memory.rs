//! The daemon's allocator, kept near what it serves from: one arena, a fixed mmap threshold, free pages handed back.

/// Keeps the daemon's private memory near what it serves from. By default glibc gives each
/// request thread its own arena and, once the index build has freed large blocks, raises
/// its mmap threshold up to 32 MiB: every thread then keeps its largest read buffer
/// resident, and fuser's 16 MiB receive buffers (of which the kernel writes only the first
/// page) land in those arenas. One arena lets a freed buffer serve the next request on any
/// thread (small allocations stay lock-free in glibc's per-thread cache); a fixed threshold
/// just above the largest read keeps read buffers in the heap and gives larger blocks
/// mappings of their own that are returned when freed.
pub(super) fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before any request thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, (crate::fuse::MAX_READ + 4096) as libc::c_int);
    }
}

/// Hands memory the allocator holds but no longer uses back to the system, so a daemon
/// that lives for the whole job keeps only what it serves from.
pub(super) fn return_free_memory() {
    // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}

/// This process's resident memory (VmRSS) and the private part of it (RssAnon: the heap,
/// the index, caches and buffers, without the staged memfd's pages, which RssShmem counts,
/// nor the archive's mapped page cache, RssFile), for `stagefs status`.
pub fn resident_bytes() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        let kib =
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse().ok());
        kib.unwrap_or(0) * 1024
    };
    (field("VmRSS:"), field("RssAnon:"))
}
