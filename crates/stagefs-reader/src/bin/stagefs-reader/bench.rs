//! `bench`: pipeline throughput vs. the H2D ceiling of the same buffers, and optionally a plain read loop.

use crate::args::BenchArgs;
use stagefs_reader::order::{epoch_order, shard};
use stagefs_reader::{Backend, Config, FileList, Loader};
use stagefs_text::Shown;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why `bench` stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--rank {rank} is not below --world {world}")]
    Rank { rank: usize, world: usize },
    #[error(transparent)]
    Reader(#[from] stagefs_reader::Error),
    /// The baseline's read of `path` failed.
    #[error("{}: {source}", path.shown())]
    Read { path: PathBuf, source: std::io::Error },
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9) / 1e9
}

pub fn run(a: &BenchArgs) -> Result<(), BenchError> {
    let (shuffle, epochs, rank, world) = (a.shuffle, a.epochs, a.rank, a.world as usize);
    if rank >= world {
        return Err(BenchError::Rank { rank, world });
    }
    let mut cfg = Config::default()
        .slot_bytes(a.batch_bytes as usize)
        .depth(a.depth as usize)
        .shuffle(shuffle)
        .epochs(epochs)
        .shard(rank, world)
        .backend(a.backend);
    if let Some(n) = a.threads {
        cfg = cfg.io_threads(n as usize);
    }

    let t = Instant::now();
    let files = FileList::from_dir(&a.dir)?;
    println!(
        "listed {} files, {:.1} MB, in {:.3} s",
        files.len(),
        files.total_bytes() as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    let mut loader = Loader::new(files.clone(), cfg.clone())?;
    let host = loader.backend() == Backend::Host;
    println!(
        "backend: {}{}\nring: {} slots x {:.1} MiB, {} I/O threads",
        loader.backend(),
        if host { " (no usable GPU: 'uploads' are memcpys into host buffers)" } else { "" },
        cfg.get_depth(),
        cfg.get_slot_bytes() as f64 / (1 << 20) as f64,
        cfg.get_io_threads()
    );

    let (wall, per_epoch) = drain(&mut loader)?;
    let mut prev = Duration::ZERO;
    for (e, (n, bytes, end)) in per_epoch.iter().enumerate() {
        let dt = *end - prev;
        prev = *end;
        println!(
            "epoch {e}: {n} files, {:.1} MB in {:.3} s = {:.0} files/s, {:.2} GB/s",
            *bytes as f64 / 1e6,
            dt.as_secs_f64(),
            *n as f64 / dt.as_secs_f64(),
            gbps(*bytes, dt)
        );
    }
    let s = loader.stats();
    println!(
        "pipeline: {} files in {:.3} s = {:.0} files/s; read {:.2} GB/s, uploaded {:.2} GB/s (end to end, upload completed)",
        s.files,
        wall.as_secs_f64(),
        s.files as f64 / wall.as_secs_f64(),
        gbps(s.bytes_read, wall),
        gbps(s.bytes_uploaded, wall)
    );
    let threads = cfg.get_io_threads() as f64;
    println!(
        "  I/O threads busy {:.0}% of wall on average; upload engine busy {:.0}% ({:.2} GB/s while copying)",
        100.0 * s.read_busy.as_secs_f64() / threads / wall.as_secs_f64(),
        100.0 * s.upload_busy.as_secs_f64() / wall.as_secs_f64(),
        gbps(s.bytes_uploaded, s.upload_busy)
    );

    let reps = a.h2d_reps;
    let (bytes, t) = loader.measure_h2d(reps)?;
    let h2d = gbps(bytes, t);
    let label = if host {
        "host memcpy into the device-side host buffer (no GPU; not a PCIe/NVLink figure)"
    } else {
        "H2D from the pinned ring slot, alone"
    };
    println!("{label}: {:.2} GB/s ({reps} x {:.1} MiB)", h2d, cfg.get_slot_bytes() as f64 / (1 << 20) as f64);
    println!("  pipeline upload rate = {:.0}% of that", 100.0 * gbps(s.bytes_uploaded, wall) / h2d);

    if a.baseline {
        baseline(&files, shuffle, epochs, rank, world)?;
    }
    Ok(())
}

/// Per epoch: (files, bytes, time of its last batch since the start).
type EpochTally = Vec<(usize, u64, Duration)>;

/// Consumes every batch, waiting for each upload as a training step would.
/// Returns total wall time and the per-epoch tally.
fn drain(loader: &mut Loader) -> Result<(Duration, EpochTally), BenchError> {
    let t0 = Instant::now();
    let mut per_epoch: Vec<(usize, u64, Duration)> = Vec::new();
    while let Some(b) = loader.next_batch()? {
        b.synchronize()?;
        if per_epoch.len() <= b.epoch() {
            per_epoch.resize(b.epoch() + 1, (0, 0, Duration::ZERO));
        }
        let e = &mut per_epoch[b.epoch()];
        e.0 += b.len();
        e.1 += b.total_bytes();
        e.2 = t0.elapsed();
    }
    Ok((t0.elapsed(), per_epoch))
}

/// The same files in the same order through `std::fs::read`, one at a time.
fn baseline(
    files: &FileList,
    shuffle: Option<u64>,
    epochs: usize,
    rank: usize,
    world: usize,
) -> Result<(), BenchError> {
    let t0 = Instant::now();
    let (mut n, mut bytes) = (0u64, 0u64);
    for epoch in 0..epochs {
        for i in shard(&epoch_order(files.len(), shuffle, epoch), rank, world) {
            let p = &files.entries()[i].path;
            let data = std::fs::read(p).map_err(|source| BenchError::Read { path: p.clone(), source })?;
            bytes += std::hint::black_box(data).len() as u64;
            n += 1;
        }
    }
    let t = t0.elapsed();
    println!(
        "baseline std::fs::read loop: {n} files in {:.3} s = {:.0} files/s, {:.2} GB/s",
        t.as_secs_f64(),
        n as f64 / t.as_secs_f64(),
        gbps(bytes, t)
    );
    Ok(())
}
