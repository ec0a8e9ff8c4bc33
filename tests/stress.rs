//! Stress: a few hundred files of random sizes (some sparse) in a tar and a SquashFS-zstd image, read at random
//! offsets by many threads and child processes, every byte compared with the source; then the mount goes away
//! (lazy `stagefs umount` for the tar, SIGTERM to the daemon for SquashFS) under the readers. No read may return a
//! wrong byte; after the unmount reads may fail (EIO, ENOTCONN, ENOENT, ECONNABORTED) but never hang; the daemon
//! must exit and the mount leave the mount table.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::kit::*;

const FILES: usize = 300;
const MIB: u64 = 1 << 20;
/// The mount goes away once the reader threads of this process have made this many verified reads together, and each
/// reader process as many again: an amount of work, not a time, so a slow machine runs longer instead of testing less.
const READS_BEFORE_UNMOUNT: u64 = 20_000;
/// Hang guard only: a reader still reading successfully this long after it started was
/// never reached by the unmount; the parent waits as long for the readers' progress.
const HANG_GUARD: Duration = Duration::from_secs(300);
const THREADS: usize = 6;
const PROCESSES: usize = 3;
const THREADS_PER_PROCESS: usize = 2;
const CHILD_ENV: &str = "STAGEFS_STRESS_CHILD";

/// The source file `i`, relative to the tree.
fn name(i: usize) -> String {
    format!("d{}/f{i:03}.bin", i % 10)
}

/// The source tree: mostly small files, some up to 3 MiB, every tenth sparse (random runs of data between holes).
fn make_tree(root: &Path) {
    let mut rng = Rng::new(7);
    for i in 0..FILES {
        let size = match rng.below(100) {
            0..=79 => rng.below(64 << 10),
            80..=94 => rng.below(512 << 10),
            _ => rng.below(3 * MIB),
        };
        let path = root.join(name(i));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        if i % 10 == 3 {
            let size = size.max(256 << 10);
            let f = fs::File::create(&path).unwrap();
            f.set_len(size).unwrap();
            for run in 0..4u64 {
                let at = rng.below(size / 4096) * 4096;
                let len = (rng.below(20_000) + 1).min(size - at);
                f.write_all_at(&pseudo_random(i as u64 * 16 + run, len as usize), at).unwrap();
            }
        } else {
            fs::write(&path, pseudo_random(i as u64, size as usize)).unwrap();
        }
    }
}

/// What one reader saw.
#[derive(Default, Debug)]
struct Tally {
    reads: u64,
    bytes: u64,
    /// Errors after the unmount began (allowed).
    errors_after: u64,
    /// Wrong bytes, or errors before the unmount / of an unexpected kind.
    failures: Vec<String>,
}

/// Fills `buf` from `offset` until it is full or the file ends.
fn pread_full(f: &fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// What the readers of one process share: the mount, the source, the marker of the unmount, the verified reads.
struct Load {
    mp: PathBuf,
    src: PathBuf,
    marker: PathBuf,
    progress: AtomicU64,
}

impl Load {
    fn new(mp: impl Into<PathBuf>, src: impl Into<PathBuf>, marker: impl Into<PathBuf>) -> Arc<Load> {
        Arc::new(Load { mp: mp.into(), src: src.into(), marker: marker.into(), progress: AtomicU64::new(0) })
    }

    fn reads(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Starts `threads` readers seeded from `seed`; each sends its tally when done.
    fn spawn(self: &Arc<Load>, threads: usize, seed: u64) -> mpsc::Receiver<Tally> {
        let (tx, rx) = mpsc::channel();
        for t in 0..threads as u64 {
            let (load, tx) = (self.clone(), tx.clone());
            thread::spawn(move || tx.send(reader(seed + t, &load)));
        }
        rx
    }
}

/// Reads random pieces of random files of the mount until the first error after the unmount began (the marker exists),
/// comparing each with the same piece of the source file and counting verified reads.
fn reader(seed: u64, load: &Load) -> Tally {
    let deadline = Instant::now() + HANG_GUARD;
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let (mut buf, mut want) = (vec![0u8; 2 * MIB as usize], vec![0u8; 2 * MIB as usize]);
    let fail = |tally: &mut Tally, what: String| -> bool {
        let allowed = [libc::EIO, libc::ENOTCONN, libc::ENOENT, libc::ECONNABORTED];
        if load.marker.exists() && allowed.iter().any(|e| what.contains(&format!("(os error {e})"))) {
            tally.errors_after += 1;
            return true; // this reader is done
        }
        tally.failures.push(what);
        tally.failures.len() > 20
    };
    'files: loop {
        if Instant::now() >= deadline {
            tally.failures.push(format!("still reading {HANG_GUARD:?} after starting: the unmount never reached it"));
            break;
        }
        let name = &name(rng.below(FILES as u64) as usize);
        let expected = fs::File::open(load.src.join(name)).unwrap();
        let size = expected.metadata().unwrap().len();
        let file = match fs::File::open(load.mp.join(name)) {
            Ok(f) => f,
            Err(e) if fail(&mut tally, format!("open {name}: {e}")) => break,
            Err(_) => continue,
        };
        // Several reads per open, so that open files span the unmount.
        for _ in 0..rng.below(8) + 1 {
            let len = match rng.below(10) {
                0..=5 => rng.below(8192) + 1,
                6..=8 => rng.below(256 << 10) + 1,
                _ => rng.below(3 * MIB / 2) + 1,
            } as usize;
            let offset = match rng.below(10) {
                0 => size.saturating_sub(rng.below(4096)),
                1 => size + rng.below(100),
                _ => rng.below(size + 1),
            };
            let got = match pread_full(&file, &mut buf[..len], offset) {
                Ok(n) => n,
                Err(e) if fail(&mut tally, format!("pread {name} {len}@{offset}: {e}")) => break 'files,
                Err(_) => continue 'files,
            };
            let n = pread_full(&expected, &mut want[..len], offset).unwrap();
            tally.reads += 1;
            tally.bytes += got as u64;
            load.progress.fetch_add(1, Ordering::Relaxed);
            if got != n || buf[..got] != want[..n] {
                let first = buf[..got.min(n)].iter().zip(&want[..n]).position(|(a, b)| a != b);
                tally.failures.push(format!(
                    "WRONG BYTES: {name} (size {size}) {len}@{offset}: got {got} bytes, expected {n}; first difference at {first:?}"
                ));
            }
        }
    }
    tally
}

/// The child-process side, run by `stress` as `--ignored --exact stress::stress_reader_child` with its parameters in
/// the environment: runs `THREADS_PER_PROCESS` readers, creates the ready file once they made `READS_BEFORE_UNMOUNT`
/// verified reads, and reports one line per reader on stdout. Not a test by itself: run alone, it fails.
#[test]
#[ignore = "a reader process of the stress tests, which run it; it fails when run by itself"]
fn stress_reader_child() {
    let params = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!("not a test by itself: stress_tar_lazy_umount_under_load and stress_squashfs_zstd_sigterm_under_load run it with {CHILD_ENV} set")
    });
    let [mp, src, marker, ready, seed] = params.split('\n').collect::<Vec<_>>()[..] else { panic!("{params:?}") };
    let load = Load::new(mp, src, marker);
    let tallies = load.spawn(THREADS_PER_PROCESS, seed.parse::<u64>().unwrap() * 100);
    // Ready once they made their reads; not if they all stopped before.
    wait_until(HANG_GUARD, || load.reads() >= READS_BEFORE_UNMOUNT || Arc::strong_count(&load) == 1);
    if load.reads() >= READS_BEFORE_UNMOUNT {
        fs::write(ready, b"").unwrap();
    }
    let tallies: Vec<Tally> = tallies.iter().collect();
    assert_eq!(tallies.len(), THREADS_PER_PROCESS, "a reader thread of this process panicked");
    for t in tallies {
        let (reads, bytes, after, failures) = (t.reads, t.bytes, t.errors_after, t.failures.len());
        println!("STRESS-READER reads={reads} bytes={bytes} errors_after={after} failures={failures}");
        for f in &t.failures {
            println!("STRESS-FAILURE {f}");
        }
    }
}

enum Unmount {
    Lazy,
    Sigterm,
}

fn stress(label: &str, how: Unmount, build: impl FnOnce(&Path, &Path) -> CmdOutput) {
    require_root();
    let started = Instant::now();
    let tmp = TempDir::new(label);
    let load = Load::new(tmp.join("mnt"), tmp.join("src"), tmp.join("unmounting"));
    let (mp, marker) = (&load.mp, &load.marker);
    make_tree(&load.src);
    let archive = tmp.join("archive");
    build(&load.src, &archive);
    let m = Mounted::new(&archive, mp);
    let pids = m.daemon_pids();
    assert!(!pids.is_empty(), "no daemon for {}", mp.display());
    let size = fs::metadata(&archive).unwrap().len();
    eprintln!("{label}: {FILES} files, archive {size} bytes, set up in {:?}", started.elapsed());

    let rx = load.spawn(THREADS, 1);
    let mut children = Vec::new();
    for p in 0..PROCESSES {
        let (ready, out) = (tmp.join(format!("child{p}.ready")), tmp.join(format!("child{p}.out")));
        let params = [mp, &load.src, marker, &ready].map(|p| p.to_str().unwrap()).join("\n") + &format!("\n{}", p + 10);
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["stress::stress_reader_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, params)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        children.push((KillOnDrop(child), out, ready));
    }

    let ready = || children.iter().map(|(_, _, ready)| ready.exists()).collect::<Vec<_>>();
    let busy = wait_until(HANG_GUARD, || load.reads() >= READS_BEFORE_UNMOUNT && ready().iter().all(|&r| r));
    assert!(
        busy,
        "{label}: the readers did not make {READS_BEFORE_UNMOUNT} reads each (threads: {}; processes ready: {:?})",
        load.reads(),
        ready()
    );
    fs::write(marker, b"").unwrap();
    let unmounter = match how {
        Unmount::Lazy => Some(StagefsCmd::new(osargs!["umount", "--lazy", mp]).spawn()),
        Unmount::Sigterm => {
            pids.iter().for_each(|&pid| signal(pid, Signal::SIGTERM).unwrap());
            None
        }
    };
    m.disarm();
    // Every wait is bounded: a reader stuck in a request fails the test here.
    let limit = Instant::now() + HANG_GUARD;
    let left = || limit.saturating_duration_since(Instant::now());
    let hung = |_| panic!("{label}: a reader thread hung after the unmount");
    let tallies: Vec<Tally> = (0..THREADS).map(|_| rx.recv_timeout(left()).unwrap_or_else(hung)).collect();
    let mut child_lines = Vec::new();
    for (mut child, out, _) in children {
        let status = wait_timeout(&mut child.0, left())
            .unwrap_or_else(|| panic!("{label}: a reader process hung after the unmount"));
        let text = fs::read_to_string(&out).unwrap();
        assert!(status.success(), "{label}: reader process failed ({status}):\n{text}");
        // libtest prints "test ... " on the same line as the first report.
        child_lines.extend(text.lines().filter_map(|l| l.find("STRESS-").map(|i| l[i..].to_string())));
    }
    if let Some(mut u) = unmounter {
        let status = wait_timeout(&mut u.0, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{label}: stagefs umount --lazy hung"));
        assert!(status.success(), "{label}: stagefs umount --lazy failed: {status}");
    }

    let reads: u64 = tallies.iter().map(|t| t.reads).sum();
    let bytes: u64 = tallies.iter().map(|t| t.bytes).sum();
    let after: u64 = tallies.iter().map(|t| t.errors_after).sum();
    let failures: Vec<&String> = tallies.iter().flat_map(|t| &t.failures).collect();
    let child_failures: Vec<&String> = child_lines.iter().filter(|l| l.starts_with("STRESS-FAILURE")).collect();
    let child_readers: Vec<&String> = child_lines.iter().filter(|l| l.starts_with("STRESS-READER")).collect();
    eprintln!(
        "{label}: threads: {reads} reads, {} MiB, {after} errors after the unmount; processes: {child_readers:?}; total {:?}",
        bytes >> 20,
        started.elapsed()
    );
    assert!(failures.is_empty() && child_failures.is_empty(), "{label}: {failures:#?}\n{child_failures:#?}");
    assert_eq!(child_readers.len(), PROCESSES * THREADS_PER_PROCESS, "{label}: reader processes said {child_lines:#?}");
    assert!(reads >= READS_BEFORE_UNMOUNT, "{label}: {reads} reads before and during the unmount");
    assert!(
        after > 0 || child_lines.iter().any(|l| !l.contains("errors_after=0")),
        "{label}: no reader saw the unmount"
    );
    assert!(
        wait_until(Duration::from_secs(15), || pids.iter().all(|&p| !process_alive(p))),
        "{label}: the daemon (pids {pids:?}) is still running after the unmount"
    );
    let proc_mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(!proc_mounts.contains(mp.to_str().unwrap()), "{label}: {} still in /proc/mounts", mp.display());
    assert_nothing_left(mp, label);
}

#[test]
fn stress_tar_lazy_umount_under_load() {
    stress("stress-tar", Unmount::Lazy, |src, a| {
        run_tool("tar", osargs!["--sparse", "--format=posix", "-C", src, "-cf", a, "."])
    });
}

#[test]
fn stress_squashfs_zstd_sigterm_under_load() {
    stress("stress-sqfs", Unmount::Sigterm, |src, a| {
        run_tool("mksquashfs", osargs![src, a, "-comp", "zstd", "-noappend", "-quiet", "-no-progress"])
    });
}
