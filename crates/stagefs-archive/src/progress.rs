//! How far the tar scan running in this process has got, for a progress bar to poll.

/// How far the tar scan running in this process has got, in bytes of the archive: a
/// progress bar polls it (the scan itself draws nothing; readers know nothing of terminals).
pub static SCAN_PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
