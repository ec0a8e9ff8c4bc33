#![no_main]
//! See doc/fuzzing.md; the code path is stagefs_fuzz::exercise::zip.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stagefs_fuzz::exercise::zip(data);
});
