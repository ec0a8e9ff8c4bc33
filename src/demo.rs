//! `stagefs demo`: builds an ImageNet-like tar, mounts it, reads it with parallel readers, reports throughput.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::archive::tar::ustar_header;
use crate::daemon::{self, MountRequest};
use crate::error::Failure;
use crate::hash::hash;

const CLASSES: usize = 20;

/// A tiny deterministic generator (xorshift64*): the demo needs repeatable, incompressible bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
}

pub fn run(files: usize, readers: usize, dir: Option<PathBuf>, _keep: bool) -> Result<(), Failure> {
    let io = |what: &str, e: std::io::Error| Failure::other(format!("demo: {what}: {e}"));
    let work = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("stagefs-demo-{}", std::process::id())));
    // In /tmp anyone could have made that path first: it must be ours alone.
    let created = crate::places::own_dir(&work, "choose another directory with --dir")?;
    let archive = work.join("imagenet-like.tar");
    let mountpoint = work.join("mnt");

    let started = Instant::now();
    let expected = write_archive(&archive, files).map_err(|e| io("cannot write the archive", e))?;
    let total: u64 = expected.iter().map(|(_, len, _)| *len).sum();
    println!(
        "built {} ({} files in {CLASSES} classes, {:.1} MB) in {:.2} s",
        archive.display(),
        files,
        total as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    // Mounting forks the daemon; no thread of ours exists yet, as fork requires.
    daemon::mount(&MountRequest {
        archive: archive.clone(),
        mountpoint: mountpoint.clone(),
        foreground: false,
        threads: crate::cli::default_threads(),
        log_file: None,
        stage: crate::stage::StageMode::Auto,
        max_ram: None,
        warm: crate::warm::WarmMode::Auto,
    })?;
    println!("mounted at {} in {:.3} s", mountpoint.display(), started.elapsed().as_secs_f64());

    let result = (|| {
        for epoch in 1..=2 {
            let (secs, bad) = read_epoch(&mountpoint, &expected, readers, epoch);
            if bad > 0 {
                return Err(Failure::other(format!("demo: {bad} files read back wrong bytes")));
            }
            println!(
                "epoch {epoch} ({}): {} files by {readers} readers in {:.3} s = {:.0} files/s, {:.0} MB/s",
                if epoch == 1 { "first read" } else { "page cache warm" },
                files,
                secs,
                files as f64 / secs,
                total as f64 / 1e6 / secs
            );
        }
        Ok(())
    })();
    crate::commands::umount(&mountpoint, false)?;
    println!("unmounted; all bytes verified");
    let _ = std::fs::remove_file(&archive);
    let _ = std::fs::remove_dir(&mountpoint);
    crate::places::remove_created(&created);
    result
}

/// Writes `files` members of 20-200 KB in class folders; returns (path, size, hash) of each.
fn write_archive(path: &Path, files: usize) -> std::io::Result<Vec<(String, u64, u64)>> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut rng = Rng(0x5eed);
    let mut expected = Vec::with_capacity(files);
    for class in 0..CLASSES {
        out.write_all(&ustar_header(&format!("train/n{class:08}/"), b'5', 0o755, 0, ""))?;
    }
    let mut data = Vec::new();
    for i in 0..files {
        let name = format!("train/n{:08}/img_{i:07}.JPEG", i % CLASSES);
        let len = 20_000 + (rng.next() % 180_000) as usize;
        data.clear();
        data.extend((0..len.div_ceil(8)).flat_map(|_| rng.next().to_le_bytes()));
        data.truncate(len);
        out.write_all(&ustar_header(&name, b'0', 0o644, len as u64, ""))?;
        out.write_all(&data)?;
        out.write_all(&vec![0; len.next_multiple_of(512) - len])?;
        expected.push((name, len as u64, hash(&data)));
    }
    out.write_all(&[0; 1024])?;
    out.flush()?;
    Ok(expected)
}

/// Reads every file once in a shuffled order with `readers` threads; returns seconds and
/// the number of files whose bytes differed.
fn read_epoch(mountpoint: &Path, expected: &[(String, u64, u64)], readers: usize, epoch: u64) -> (f64, usize) {
    let mut order: Vec<usize> = (0..expected.len()).collect();
    let mut rng = Rng(0x9e3779b97f4a7c15 ^ epoch);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let next = AtomicUsize::new(0);
    let bad = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..readers.max(1) {
            s.spawn(|| {
                let mut buf = Vec::with_capacity(256 * 1024);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&file) = order.get(i) else { break };
                    let (name, len, expected_hash) = &expected[file];
                    buf.clear();
                    let read = std::fs::File::open(mountpoint.join(name)).and_then(|mut f| f.read_to_end(&mut buf));
                    if !matches!(read, Ok(n) if n as u64 == *len && hash(&buf) == *expected_hash) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    (started.elapsed().as_secs_f64(), bad.load(Ordering::Relaxed))
}
