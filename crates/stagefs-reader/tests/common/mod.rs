//! Temporary file trees with index-derived contents for the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 37 + j * 11) as u8).collect()
}

/// Checks every file of a batch against its index-derived content (files are named
/// `f{i}`); returns the indices seen, in batch order.
pub fn check_batch(batch: &stagefs_reader::Batch, bytes: &[u8]) -> Vec<usize> {
    let mut seen = Vec::new();
    for ((p, &off), &len) in batch.paths().zip(batch.offsets()).zip(batch.lengths()) {
        let i: usize = p.file_stem().unwrap().to_str().unwrap()[1..].parse().unwrap();
        assert_eq!(&bytes[off as usize..][..len as usize], content(i, len as usize).as_slice(), "{}", p.display());
        seen.push(i);
    }
    seen
}

pub struct Tree {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
}

impl Tree {
    /// Files `d{i/10}/f{i}` of the given sizes, so directory walks recurse.
    pub fn new(sizes: &[usize]) -> Tree {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "stagefs-reader-it-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let files = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let sub = dir.join(format!("d{}", i / 10));
                std::fs::create_dir_all(&sub).unwrap();
                let p = sub.join(format!("f{i:04}.bin"));
                std::fs::write(&p, content(i, len)).unwrap();
                p
            })
            .collect();
        Tree { dir, files }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn sizes(n: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 613) % 5000 + 1).collect()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
