//! `gen`: write a reproducible tree of random-sized files for benchmarking.

use crate::args::GenArgs;
use stagefs_reader::order::SplitMix64;
use stagefs_text::Shown;
use std::io::Write;
use std::path::PathBuf;

/// Why `gen` stopped.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("--min-bytes exceeds --max-bytes")]
    Sizes,
    /// Creating the directory or writing the file `path` failed.
    #[error("{}: {source}", path.shown())]
    Write { path: PathBuf, source: std::io::Error },
}

pub fn run(a: &GenArgs) -> Result<(), GenError> {
    let (files, min, max) = (a.files, a.min_bytes, a.max_bytes);
    if min > max {
        return Err(GenError::Sizes);
    }
    let mut rng = SplitMix64::new(a.seed);
    let mut total = 0u64;
    // 100 files per subdirectory, like a sharded dataset layout.
    for i in 0..files {
        let sub = a.dir.join(format!("{:04}", i / 100));
        std::fs::create_dir_all(&sub).map_err(|source| GenError::Write { path: sub.clone(), source })?;
        let len = min + rng.below(max - min + 1);
        let data: Vec<u8> =
            (0..len.div_ceil(8)).flat_map(|_| rng.next_u64().to_le_bytes()).take(len as usize).collect();
        let path = sub.join(format!("{i:07}.bin"));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .map_err(|source| GenError::Write { path, source })?;
        total += len;
    }
    println!("wrote {files} files, {:.1} MB, under {}", total as f64 / 1e6, a.dir.shown());
    Ok(())
}
