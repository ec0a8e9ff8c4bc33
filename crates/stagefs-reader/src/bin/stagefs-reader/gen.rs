//! `gen`: write a reproducible tree of random-sized files for benchmarking.

use crate::args::GenArgs;
use stagefs_reader::order::SplitMix64;
use stagefs_text::Shown;
use std::io::Write;

pub fn run(a: &GenArgs) -> Result<(), String> {
    let (files, min, max) = (a.files, a.min_bytes, a.max_bytes);
    if min > max {
        return Err("--min-bytes exceeds --max-bytes".into());
    }
    let mut rng = SplitMix64::new(a.seed);
    let mut total = 0u64;
    // 100 files per subdirectory, like a sharded dataset layout.
    for i in 0..files {
        let sub = a.dir.join(format!("{:04}", i / 100));
        std::fs::create_dir_all(&sub).map_err(|e| format!("{}: {e}", sub.shown()))?;
        let len = min + rng.below(max - min + 1);
        let data: Vec<u8> =
            (0..len.div_ceil(8)).flat_map(|_| rng.next_u64().to_le_bytes()).take(len as usize).collect();
        let path = sub.join(format!("{i:07}.bin"));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .map_err(|e| format!("{}: {e}", path.shown()))?;
        total += len;
    }
    println!("wrote {files} files, {:.1} MB, under {}", total as f64 / 1e6, a.dir.shown());
    Ok(())
}
