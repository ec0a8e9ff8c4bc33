//! The fuzz targets' shared code; `exercise.rs` is also compiled into the integration
//! tests (tests/hostile.rs), which replay `fuzz/regressions/` through it without cargo-fuzz.

#[path = "exercise.rs"]
pub mod exercise;
