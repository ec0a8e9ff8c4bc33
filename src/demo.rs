//! `stagefs demo`: builds an ImageNet-like tar, mounts it in place and staged in RAM, reads both and a plain directory of the same files, reports throughput side by side.

use stagefs_archive::escape::Shown;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::error::Failure;
use crate::request::MountRequest;
use stagefs_archive::hash::hash;
use stagefs_archive::tar::ustar_header;
use stagefs_open::stage::StageMode;

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

/// Average member size (20-200 KB, uniform) plus its tar header and padding.
const MEAN_MEMBER: u64 = 110_000 + 1_024;

pub fn run(files: usize, readers: usize, dir: Option<PathBuf>, keep: bool) -> Result<(), Failure> {
    let io = |what: &str, e: std::io::Error| Failure::other(format!("demo: {what}: {e}"));
    let work = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("stagefs-demo-{}", std::process::id())));
    // The archive, and the same files again as a plain directory: say so before writing.
    let archive_bytes = files as u64 * MEAN_MEMBER;
    let needed = 2 * archive_bytes;
    println!(
        "stagefs demo: writing {} into {}: a tar of {files} files (20-200 KB, {CLASSES} classes) and the same \
         files as a plain directory to compare with; {} at the end (--dir chooses the place, --files the size)",
        mb(needed),
        work.shown(),
        if keep { "the archive is kept, the rest removed" } else { "all removed" }
    );
    let free_in = work.ancestors().find(|d| d.exists()).unwrap_or(Path::new("/"));
    if let Ok(stat) = nix::sys::statvfs::statvfs(free_in) {
        let free = stat.blocks_available().saturating_mul(stat.fragment_size());
        if free < needed + needed / 10 {
            return Err(Failure::other(format!(
                "demo: {} has {} free, the demo needs about {}; choose another place with --dir or fewer --files",
                free_in.shown(),
                mb(free),
                mb(needed)
            )));
        }
    }
    // Ctrl-C (or SIGTERM) only sets a flag from here on: the demo stops at its next check
    // and removes everything it wrote (the default action would leave ~0.9 GB in /tmp).
    stagefs_open::cancel::arm().map_err(|e| io("cannot install signal handlers", e))?;
    // In /tmp anyone could have made that path first: it must be ours alone.
    let created = stagefs_open::places::own_dir(&work, "choose another directory with --dir")?;
    let archive = work.join("imagenet-like.tar");
    let plain = work.join("plain");
    let result = compare(&archive, &plain, &work, files, readers);
    let _ = std::fs::remove_dir_all(&plain);
    if keep {
        println!("kept the archive: {} (list it with tar -tvf)", archive.shown());
    } else {
        let _ = std::fs::remove_file(&archive);
        stagefs_open::places::remove_created(&created);
    }
    // Interrupted: say so (exit 128+N), whichever step noticed the signal.
    stagefs_open::cancel::check()?;
    result.map_err(|e| match e {
        Step::Io(what, e) => io(what, e),
        Step::Failed(f) => f,
    })
}

enum Step {
    Io(&'static str, std::io::Error),
    Failed(Failure),
}

impl From<Failure> for Step {
    fn from(f: Failure) -> Step {
        Step::Failed(f)
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.0} MB", bytes as f64 / 1e6)
}

/// Builds the archive and the plain copy, mounts the archive twice (in place and staged in
/// RAM), reads all three with the same readers, and prints them side by side.
fn compare(archive: &Path, plain: &Path, work: &Path, files: usize, readers: usize) -> Result<(), Step> {
    let started = Instant::now();
    let expected = write_archive(archive, plain, files).map_err(|e| Step::Io("cannot write the archive", e))?;
    let total: u64 = expected.iter().map(|(_, len, _)| *len).sum();
    println!(
        "built {} ({files} files, {:.1} MB) and the plain directory {} in {:.2} s",
        archive.shown(),
        total as f64 / 1e6,
        plain.shown(),
        started.elapsed().as_secs_f64()
    );
    // Both mounts come first: mounting forks the daemon, which needs a process without
    // threads, and the readers are threads.
    let in_place = work.join("mnt-in-place");
    let staged = work.join("mnt-staged");
    let mut mounted = Vec::new();
    let mut result = Ok(());
    for (mountpoint, stage) in [(&in_place, StageMode::None), (&staged, StageMode::Ram)] {
        let started = Instant::now();
        let request = MountRequest {
            archive: archive.to_owned(),
            shards: vec![archive.to_owned()],
            trust: stagefs_open::places::Trust::Named,
            mountpoint: mountpoint.clone(),
            foreground: false,
            threads: crate::options::default_threads(),
            log_file: None,
            stage,
            stage_dir: None,
            max_ram: None,
            warm: crate::warm::WarmMode::Auto,
            recursion_depth: 0,
            index_dir: None,
            broadcast: None,
            growing: None,
            presentation: Default::default(),
        };
        // Not through the per-node election: the demo's mountpoints are its own, and under
        // srun a task with SLURM_LOCALID > 0 would wait for a leader that never comes.
        if let Err(e) = crate::daemon::mount(&request) {
            result = Err(e);
            break;
        }
        mounted.push(mountpoint.clone());
        println!(
            "mounted {} at {} in {:.2} s",
            if stage == StageMode::Ram { "staged in RAM (and warmed)" } else { "in place" },
            mountpoint.shown(),
            started.elapsed().as_secs_f64()
        );
    }
    if result.is_ok() {
        result = read_all(&expected, total, readers, [plain, &in_place, &staged]);
    }
    for mountpoint in mounted {
        let unmounted = crate::commands::umount(&mountpoint, false);
        result = result.and(unmounted);
    }
    if result.is_ok() {
        println!("unmounted; all bytes verified");
    }
    Ok(result?)
}

/// Two epochs over each tree; prints files/s and the ratio to the plain directory.
fn read_all(expected: &[(String, u64, u64)], total: u64, readers: usize, roots: [&Path; 3]) -> Result<(), Failure> {
    let names = ["plain directory", "stagefs, in place", "stagefs, staged in RAM"];
    let mut rates = [[0f64; 2]; 3];
    for (root, rate) in roots.iter().zip(&mut rates) {
        for (epoch, rate) in rate.iter_mut().enumerate() {
            let (secs, bad) = read_epoch(root, expected, readers, epoch as u64 + 1);
            if bad > 0 {
                let wrong = format!("demo: {bad} files under {} read back wrong bytes", root.shown());
                return Err(Failure::other(wrong));
            }
            *rate = expected.len() as f64 / secs.max(1e-9);
        }
    }
    println!(
        "\nshuffled whole-file reads by {readers} readers ({} files, {:.1} MB per epoch):",
        expected.len(),
        total as f64 / 1e6
    );
    println!("{:<24} {:>24} {:>24}", "", "epoch 1 (first read)", "epoch 2 (again)");
    for (i, name) in names.iter().enumerate() {
        let cell = |epoch: usize| {
            let ratio = rates[i][epoch] / rates[0][epoch].max(1e-9);
            format!("{:>9.0} files/s {:>5.2}x", rates[i][epoch], ratio)
        };
        println!("{name:<24} {:>24} {:>24}", cell(0), cell(1));
    }
    println!(
        "(x: files/s relative to the plain directory. It was just written, so it reads from the page cache, as a \
         copy untarred into /dev/shm would; stagefs saves making that copy, and its metadata load on a shared \
         filesystem)"
    );
    Ok(())
}

/// Writes `files` members of 20-200 KB in class folders, and the same files under `plain`;
/// returns (path, size, hash) of each.
fn write_archive(path: &Path, plain: &Path, files: usize) -> std::io::Result<Vec<(String, u64, u64)>> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut rng = Rng(0x5eed);
    let mut expected = Vec::with_capacity(files);
    for class in 0..CLASSES {
        let dir = format!("train/n{class:08}/");
        out.write_all(&ustar_header(&dir, b'5', 0o755, 0, ""))?;
        std::fs::create_dir_all(plain.join(&dir))?;
    }
    let mut data = Vec::new();
    for i in 0..files {
        // Ctrl-C while writing: stop here, and `run` removes what was written.
        if let Err(interrupted) = stagefs_open::cancel::check() {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, interrupted));
        }
        let name = format!("train/n{:08}/img_{i:07}.JPEG", i % CLASSES);
        let len = 20_000 + (rng.next() % 180_000) as usize;
        data.clear();
        data.extend((0..len.div_ceil(8)).flat_map(|_| rng.next().to_le_bytes()));
        data.truncate(len);
        out.write_all(&ustar_header(&name, b'0', 0o644, len as u64, ""))?;
        out.write_all(&data)?;
        out.write_all(&vec![0; len.next_multiple_of(512) - len])?;
        std::fs::write(plain.join(&name), &data)?;
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
