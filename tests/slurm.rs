//! The slurm/ job-script templates on a real one-node SLURM (started by .ci/slurm-setup.sh
//! if none answers; a SLURM that cannot start fails the test). Every template runs with 4
//! training processes per node (4 tasks, or for the torchrun template one task whose fake
//! `torchrun` starts 4) and ends three ways: normally, by scancel, and at its time limit.
//! Each time all 4 must read the right bytes through exactly one daemon, and afterwards
//! no mount, no daemon, and no lock, status or record file may remain. The templates ask
//! for GPUs and CPUs per task; this SLURM has no GPUs, so the test overrides both on the
//! sbatch command line, and it leaves SCRATCH unset (ARCHIVE alone must do).
//!
//! The broadcast template (6) runs with `STAGEFS_BROADCAST_ALWAYS=1`, so that `sbcast`
//! really copies the archive on this one node; its copy in /dev/shm/$USER must be gone
//! too after each of the three ends. A second test broadcasts into a 4 MiB tmpfs: every
//! task must fail with sbcast's own message, and nothing may stay in that directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kit::euid;
use crate::kit::{mounts, pseudo_random, require_root, require_tool, run_cmd, stagefs_bin, wait_until_every, TempDir};

/// How often the waits below run their (command-running) checks.
const POLL: Duration = Duration::from_millis(250);

const TEMPLATES: [&str; 6] =
    ["1-mount-wait-train", "2-run-one-liner", "3-multi-node", "4-stage-from-scratch", "5-torchrun", "6-broadcast"];
const TASKS: usize = 4;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A SLURM cluster for this test; stops its daemons on drop if this test started them.
/// Held by one test at a time (see `kit::slurm_guard`): a test that started it stops it,
/// which must not kill another test's jobs.
struct Cluster {
    dir: PathBuf,
    conf: String,
    started_here: bool,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    fn up() -> Cluster {
        let serial = crate::kit::slurm_guard();
        let dir = PathBuf::from("/tmp/stagefs-slurm");
        let script = repo().join(".ci/slurm-setup.sh");
        let running = dir.join("env").exists() && sinfo_up(&dir.join("slurm.conf"));
        if !running {
            let out = run_cmd(Command::new(&script).arg("start").arg(&dir), Duration::from_secs(300));
            assert!(
                out.success(),
                "SLURM could not be started by {} (this test never skips):\n{}",
                script.display(),
                out.describe()
            );
        }
        let conf = dir.join("slurm.conf").to_string_lossy().into_owned();
        Cluster { dir, conf, started_here: !running, _serial: serial }
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started_here {
            let _ = Command::new(repo().join(".ci/slurm-setup.sh")).arg("stop").arg(&self.dir).status();
        }
    }
}

/// The node answers, idle or busy: busy with another test run's jobs is running too, and
/// restarting it would kill those jobs (the setup script kills every process of the cluster).
fn sinfo_up(conf: &Path) -> bool {
    let mut cmd = Command::new(require_tool("sinfo"));
    cmd.args(["-h", "-o", "%t"]).env("SLURM_CONF", conf);
    // A suffix (`*` not responding yet, `~` powered down) still means a cluster is there.
    let state = run_cmd(&mut cmd, Duration::from_secs(60)).stdout;
    ["idle", "mix", "alloc", "comp"].iter().any(|s| state.trim().starts_with(s))
}

/// Reads every file of the source tree through the mount, records the verdict and how many
/// daemons serve this archive, then keeps a file open while it sleeps (scancel/timeout jobs).
const READER: &str = r#"
import os, sys, time
root = sys.argv[sys.argv.index('--data-root') + 1]
expect, out, archive = os.environ['STAGEFS_TEST_EXPECT'], os.environ['STAGEFS_TEST_OUT'], os.environ['ARCHIVE']
bad, n, last = [], 0, None
for d, _, files in os.walk(expect):
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), expect)
        n += 1
        last = os.path.join(root, rel)
        try:
            if open(last, 'rb').read() != open(os.path.join(expect, rel), 'rb').read():
                bad.append(rel)
        except OSError as e:
            bad.append(f'{rel}: {e}')
def daemons():
    count = 0
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if archive.encode() in open(f'/proc/{pid}/cmdline', 'rb').read() and any(
                    os.readlink(f'/proc/{pid}/fd/{fd}') == '/dev/fuse' for fd in os.listdir(f'/proc/{pid}/fd')):
                count += 1
        except OSError:
            pass
    return count
verdict = 'ok' if n and not bad else 'bad:' + ';'.join(bad[:3])
node, task = os.environ.get('SLURMD_NODENAME', '?'), os.environ.get('SLURM_LOCALID', '?')
with open(os.path.join(out, f'{node}.{task}.{os.getpid()}'), 'w') as fh:
    fh.write(f'{verdict} files={n} daemons={daemons()} root={root}\n')
held = open(last, 'rb')
time.sleep(float(os.environ.get('STAGEFS_TEST_SLEEP', '0')))
sys.exit(0 if verdict == 'ok' else 1)
"#;

/// Stands in for torchrun: starts `--nproc-per-node` copies of the script with its
/// arguments, passes SIGTERM on to them as torchrun does, and exits with the worst status.
pub(crate) const FAKE_TORCHRUN: &str = r#"#!/usr/bin/env python3
import os, signal, subprocess, sys
args, n = sys.argv[1:], 1
while args and args[0].startswith('--'):
    if args[0].startswith('--nproc-per-node='):
        n = int(args[0].split('=', 1)[1])
    args = args[1:]
procs = [subprocess.Popen([sys.executable] + args, env=dict(os.environ, LOCAL_RANK=str(r))) for r in range(n)]
signal.signal(signal.SIGTERM, lambda s, f: [p.send_signal(s) for p in procs])
sys.exit(max(p.wait() for p in procs))
"#;

#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Normal,
    Scancel,
    TimeLimit,
}

/// One submitted job and what it must leave behind.
struct Job {
    name: String,
    id: String,
    end: End,
    archive: PathBuf,
    out: PathBuf,
    runtime: PathBuf,
    log: PathBuf,
}

impl Job {
    fn results(&self) -> Vec<String> {
        crate::kit::task_results(&self.out)
    }

    fn context(&self) -> String {
        format!(
            "job {} ({}, {:?})\nresults: {:#?}\nlog:\n{}",
            self.id,
            self.name,
            self.end,
            self.results(),
            fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

#[test]
fn slurm_templates_mount_once_per_node_and_clean_up() {
    require_root();
    require_tool("python3");
    let shellcheck = require_tool("shellcheck");
    let templates: Vec<PathBuf> = TEMPLATES.iter().map(|t| repo().join("slurm").join(format!("{t}.sbatch"))).collect();
    let out = run_cmd(Command::new(shellcheck).args(&templates), Duration::from_secs(60));
    assert!(out.success(), "the templates must be shellcheck clean:\n{}", out.describe());

    let cluster = Cluster::up();
    let tmp = TempDir::new("slurm");
    let tree = tmp.join("tree");
    for (i, size) in [0usize, 1, 4096, 100_000, 1 << 20].iter().enumerate() {
        fs::create_dir_all(tree.join(format!("class{}", i % 2))).unwrap();
        fs::write(tree.join(format!("class{}/f{i}.bin", i % 2)), pseudo_random(i as u64, *size)).unwrap();
    }
    let base = tmp.join("base.tar");
    let out = run_cmd(Command::new("tar").arg("-C").arg(&tree).arg("-cf").arg(&base).arg("."), Duration::from_secs(60));
    out.assert_success();
    fs::write(tmp.join("reader.py"), READER).unwrap();
    let fake_bin = tmp.join("bin");
    fs::create_dir_all(&fake_bin).unwrap();
    fs::write(fake_bin.join("torchrun"), FAKE_TORCHRUN).unwrap();
    fs::set_permissions(fake_bin.join("torchrun"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bin_dir = stagefs_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}:{}", bin_dir.display(), fake_bin.display(), std::env::var("PATH").unwrap_or_default());

    // A distinct archive name per job: distinct default mountpoints, so jobs run side by
    // side. All made before the first job starts: a link moves the file's ctime, and a
    // mount refuses to serve an archive whose ctime moved (it may have been rewritten).
    let runs: Vec<(String, &PathBuf, End)> = TEMPLATES
        .iter()
        .zip(&templates)
        .flat_map(|(template, file)| {
            [End::Normal, End::Scancel, End::TimeLimit]
                .map(|end| (format!("{template}-{end:?}").to_lowercase(), file, end))
        })
        .collect();
    for (name, ..) in &runs {
        fs::hard_link(&base, tmp.join(format!("{name}.tar"))).unwrap();
    }
    let started = Instant::now();
    let mut jobs = Vec::new();
    for (name, file, end) in runs {
        let archive = tmp.join(format!("{name}.tar"));
        let (out, runtime, log) =
            (tmp.join(format!("out-{name}")), tmp.join(format!("rt-{name}")), tmp.join(format!("{name}.log")));
        fs::create_dir_all(&out).unwrap();
        let time = if end == End::TimeLimit { "1" } else { "5" };
        let sleep = if end == End::Normal { "1" } else { "600" };
        let mut sbatch = cluster.cmd("sbatch");
        sbatch
            .args(["--parsable", "--nodes=1", "--ntasks-per-node=4", "--gpus-per-node=0", "--cpus-per-task=1"])
            .args(["--time", time, "--output"])
            .arg(&log)
            .arg(file)
            .current_dir(tmp.path())
            .env("PATH", &path)
            .env("ARCHIVE", &archive)
            .env_remove("SCRATCH")
            .env("GPUS", TASKS.to_string())
            .env("TRAIN_SCRIPT", tmp.join("reader.py"))
            .env("STAGEFS_RUNTIME_DIR", &runtime)
            .env("STAGEFS_BROADCAST_ALWAYS", "1")
            .env("STAGEFS_TEST_EXPECT", &tree)
            .env("STAGEFS_TEST_OUT", &out)
            .env("STAGEFS_TEST_SLEEP", sleep);
        let submitted = run_cmd(&mut sbatch, Duration::from_secs(30));
        assert!(submitted.success(), "sbatch {name}:\n{}", submitted.describe());
        let id = submitted.stdout.trim().split(';').next().unwrap().to_string();
        jobs.push(Job { name, id, end, archive, out, runtime, log });
    }

    // Cancel the scancel jobs once all their tasks have read the archive.
    for job in jobs.iter().filter(|j| j.end == End::Scancel) {
        let ok = wait_until_every(Duration::from_secs(90), POLL, || job.results().len() >= TASKS);
        assert!(ok, "tasks of a job to cancel did not all report:\n{}", job.context());
        run_cmd(cluster.cmd("scancel").arg(&job.id), Duration::from_secs(30)).assert_success();
    }

    // Time limits are enforced by slurmctld's periodic check: up to ~1.5 min after the minute.
    let mut states = BTreeMap::new();
    for job in &jobs {
        let ok = wait_until_every(Duration::from_secs(240), POLL, || {
            let state = job_state(&cluster, &job.id);
            let done =
                ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"].contains(&state.as_str());
            states.insert(job.id.clone(), state);
            done
        });
        assert!(ok, "job did not end (state {:?}):\n{}", states.get(&job.id), job.context());
    }

    // Check every job before failing, so one run shows all problems.
    let mut problems = Vec::new();
    for job in &jobs {
        let expected = match job.end {
            End::Normal => "COMPLETED",
            End::Scancel => "CANCELLED",
            End::TimeLimit => "TIMEOUT",
        };
        let results = job.results();
        let root = results.first().and_then(|r| r.trim().rsplit_once("root=")).map(|(_, r)| PathBuf::from(r));
        let clean = root
            .as_ref()
            .is_some_and(|root| wait_until_every(Duration::from_secs(20), POLL, || leftovers(job, root).is_empty()));
        let mut wrong = Vec::new();
        if states[&job.id] != expected {
            wrong.push(format!("state {} instead of {expected}", states[&job.id]));
        }
        if results.len() != TASKS || !results.iter().all(|l| l.starts_with("ok ") && l.contains(" daemons=1 ")) {
            wrong.push(format!("want {TASKS} tasks reading the right bytes through exactly one daemon"));
        }
        if !clean {
            wrong.push(format!("left behind: {:?}", root.map(|r| leftovers(job, &r))));
        }
        if !wrong.is_empty() {
            problems.push(format!("{}\n{}", wrong.join("; "), job.context()));
        }
    }
    assert!(problems.is_empty(), "{} of {} jobs went wrong:\n\n{}", problems.len(), jobs.len(), problems.join("\n\n"));
    eprintln!("slurm: {} jobs checked in {:.0?}", jobs.len(), started.elapsed());
    drop(cluster);
}

/// Mounts, processes and coordination files a finished job must not leave.
fn leftovers(job: &Job, root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for m in mounts().iter().filter(|m| m.mount_point == root) {
        found.push(format!("mount {} ({})", m.mount_point.display(), m.fs_type));
    }
    let needle = job.archive.as_os_str().as_encoded_bytes();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.windows(needle.len()).any(|w| w == needle) {
            found.push(format!(
                "process {}: {}",
                entry.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
    }
    for entry in fs::read_dir(&job.runtime).into_iter().flatten().flatten() {
        found.push(format!("file {}", entry.path().display()));
    }
    found.extend(broadcast_copies(&shm_user_dir(), &job.id));
    found
}

/// `/dev/shm/<user>`, where broadcasts for RAM land.
fn shm_user_dir() -> PathBuf {
    let user = nix_user_name();
    Path::new("/dev/shm").join(user)
}

fn nix_user_name() -> String {
    // SAFETY: getpwuid returns a pointer into static storage, read at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() {
            return libc::geteuid().to_string();
        }
        std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned()
    }
}

/// Broadcast copies of job `id` in `dir`.
fn broadcast_copies(dir: &Path, id: &str) -> Vec<String> {
    let prefix = format!(".stagefs-bcast-{id}-");
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| format!("broadcast copy {}", e.path().display()))
        .collect()
}

#[test]
fn slurm_failed_broadcast_is_reported_on_every_task() {
    require_root();
    let cluster = Cluster::up();
    let tmp = TempDir::new("slurm-bcast-fail");
    let small = tmp.join("small");
    fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"]).arg(&small).status().unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs for the test");
    let _unmount = crate::kit::UnmountOnDrop(small.clone());
    fs::create_dir(tmp.join("tree")).unwrap();
    fs::write(tmp.join("tree/big.bin"), pseudo_random(3, 6 << 20)).unwrap();
    let archive = tmp.join("bcast.tar");
    let tar = Command::new("tar").arg("-C").arg(tmp.join("tree")).arg("-cf").arg(&archive).arg(".").status().unwrap();
    assert!(tar.success());
    let script = tmp.join("job.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/bash\nsrun -l {} run --broadcast --stage disk --stage-dir {} {} -- true\n",
            stagefs_bin().display(),
            small.display(),
            archive.display()
        ),
    )
    .unwrap();
    let log = tmp.join("job.log");
    let mut sbatch = cluster.cmd("sbatch");
    sbatch.args(["--wait", "--nodes=1", "--ntasks=4", "--time=5", "--output"]).arg(&log).arg(&script);
    sbatch.current_dir(tmp.path()).env("STAGEFS_BROADCAST_ALWAYS", "1").env("STAGEFS_RUNTIME_DIR", tmp.join("rt"));
    let out = run_cmd(&mut sbatch, Duration::from_secs(240));
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(!out.success(), "the job must fail:\n{}\n{text}", out.describe());
    for task in 0..TASKS {
        let said = text.lines().any(|l| {
            l.starts_with(&format!("{task}: stagefs: error:"))
                && l.contains("sbcast")
                && l.contains("REQUEST_FILE_BCAST")
        });
        assert!(said, "task {task} must report sbcast's own message:\n{text}");
    }
    let dir = small.join(format!("stagefs-{}", euid()));
    let left: Vec<_> = fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
}

/// The README's first example in a batch script: `stagefs mount` (detached), read, exit.
/// The test cluster's proctrack (linuxproc) lets the daemon outlive the job; stagefs ties
/// it to the job's batch step, so the mount and the daemon are gone once the job ends.
#[test]
fn slurm_a_mount_from_a_batch_script_ends_with_the_job() {
    require_root();
    let cluster = Cluster::up();
    let tmp = TempDir::new("slurm-batch-mount");
    fs::create_dir(tmp.join("tree")).unwrap();
    fs::write(tmp.join("tree/hello.txt"), b"hello from the archive\n").unwrap();
    let archive = tmp.join("batch.tar");
    let tar = Command::new("tar").arg("-C").arg(tmp.join("tree")).arg("-cf").arg(&archive).arg(".").status().unwrap();
    assert!(tar.success());
    let mp = tmp.join("mnt");
    let script = tmp.join("job.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/bash\nset -e\n{bin} mount {archive} {mp}\ncat {mp}/hello.txt > {out}\n",
            bin = stagefs_bin().display(),
            archive = archive.display(),
            mp = mp.display(),
            out = tmp.join("read.txt").display()
        ),
    )
    .unwrap();
    let log = tmp.join("job.log");
    let mut sbatch = cluster.cmd("sbatch");
    sbatch.args(["--wait", "--nodes=1", "--ntasks=1", "--time=5", "--output"]).arg(&log).arg(&script);
    sbatch.current_dir(tmp.path()).env("STAGEFS_RUNTIME_DIR", tmp.join("rt"));
    let out = run_cmd(&mut sbatch, Duration::from_secs(240));
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(out.success(), "the job must succeed:\n{}\n{text}", out.describe());
    assert_eq!(fs::read_to_string(tmp.join("read.txt")).unwrap(), "hello from the archive\n", "{text}");
    assert!(!text.contains("not tied to SLURM job"), "a batch-script mount is tied to its job:\n{text}");
    let gone = wait_until_every(Duration::from_secs(30), POLL, || {
        mounts().iter().all(|m| m.mount_point != mp) && crate::kit::stagefs_pids(&archive).is_empty()
    });
    assert!(gone, "the mount or its daemon outlived the job: {:?}", crate::kit::stagefs_pids(&archive));
}

fn job_state(cluster: &Cluster, id: &str) -> String {
    crate::kit::slurm_job_state(&mut cluster.cmd("scontrol"), id)
}
