//! Environment hooks the integration tests use to reach rare paths (hold a start-up phase, act as a filesystem without `O_TMPFILE`): compiled in only with the `test-hooks` feature, which `cargo test` turns on and release builds and wheels leave off.

/// The hook's value, `None` in builds without the `test-hooks` feature.
pub fn var(name: &str) -> Option<String> {
    #[cfg(feature = "test-hooks")]
    return std::env::var(name).ok();
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = name;
        None
    }
}
