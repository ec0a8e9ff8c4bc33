//! Letting go of a file's pages in the page cache, once read.

/// Drops `len` bytes of `file` at `offset` (0: to the end) from the page cache; clean pages
/// go at once, so a file read once leaves no copy behind.
pub fn drop_file_cache(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only gives the kernel a hint about a descriptor we own.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED)
    };
}
