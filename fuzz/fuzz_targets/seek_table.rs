#![no_main]
//! See doc/fuzzing.md; the code path is stagefs_fuzz::exercise::seek_table.

use std::path::PathBuf;
use std::sync::OnceLock;

static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let scratch =
        SCRATCH.get_or_init(|| std::env::temp_dir().join(format!("stagefs-fuzz-seek-table-{}", std::process::id())));
    let _ = stagefs_fuzz::exercise::seek_table(data, scratch);
});
