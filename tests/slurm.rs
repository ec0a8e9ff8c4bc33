//! The slurm/ job-script templates on a real one-node SLURM (started by .ci/slurm-setup.sh
//! if none answers; a SLURM that cannot start fails the test). Every template runs with 4
//! training processes per node (4 tasks, or for the torchrun template one task whose fake
//! `torchrun` starts 4) and ends three ways: normally, by scancel, and at its time limit.
//! Each time all 4 must read the right bytes through exactly one daemon, and afterwards
//! no mount, no daemon, and no lock, status or record file may remain. Jobs are submitted
//! as on the three-node cluster (cluster.rs): GPUs and CPUs per task overridden on the
//! sbatch command line (this SLURM has no GPUs), SCRATCH unset (ARCHIVE alone must do).
//!
//! The broadcast template (6) runs with `STAGEFS_BROADCAST_ALWAYS=1`, so that `sbcast`
//! really copies the archive on this one node; its copy in /dev/shm/$USER must be gone
//! too after each of the three ends. A second test broadcasts into a 4 MiB tmpfs: every
//! task must fail with sbcast's own message, and nothing may stay in that directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::TASKS_PER_NODE as TASKS;
use crate::cluster::{assert_sbcast_said, entries, submit_file, template, tree_and_tar, Cluster, Job, POLL};
use crate::kit::{euid, mounts_at, pseudo_random, require_root, require_tool, run_cmd, stagefs_bin, stagefs_pids};
use crate::kit::{osargs, run_tool, wait_until_every, CmdOutput, Scene, TempDir, UnmountOnDrop};

const TEMPLATES: [&str; 6] =
    ["1-mount-wait-train", "2-run-one-liner", "3-multi-node", "4-stage-from-scratch", "5-torchrun", "6-broadcast"];

/// The one-node SLURM of .ci/slurm-setup.sh, which runs if the node answers, idle or busy:
/// busy with another test run's jobs is running too, and restarting it would kill those
/// jobs (the setup script kills every process of the cluster).
fn one_node() -> Cluster {
    const DIR: &str = "/tmp/stagefs-slurm";
    Cluster::start(DIR, 0, "slurm-setup.sh", DIR, |c| {
        // A suffix (`*` not responding yet, `~` powered down) still means a cluster is there.
        let state = run_cmd(c.cmd("sinfo").args(["-h", "-o", "%t"]), Duration::from_secs(60)).stdout;
        ["idle", "mix", "alloc", "comp"].iter().any(|s| state.trim().starts_with(s))
    })
}

/// The three ends of a job, by the state it must end in: its time limit and how long its
/// tasks sleep (normally, cancelled by scancel, at its time limit).
const ENDS: [(&str, &str, &str); 3] =
    [("COMPLETED", "--time=5", "1"), ("CANCELLED", "--time=5", "600"), ("TIMEOUT", "--time=1", "600")];

#[test]
fn slurm_templates_mount_once_per_node_and_clean_up() {
    require_root();
    require_tool("python3");
    let templates: Vec<PathBuf> = TEMPLATES.iter().map(|t| template(t)).collect();
    let out = run_cmd(Command::new(require_tool("shellcheck")).args(&templates), Duration::from_secs(60));
    assert!(out.success(), "the templates must be shellcheck clean:\n{}", out.describe());

    let cluster = one_node();
    let tmp = TempDir::new("slurm");
    let (tree, base) = tree_and_tar(tmp.path(), "base", 1 << 20);
    // A distinct archive name per job: distinct default mountpoints, so jobs run side by
    // side. All made before the first job starts: a link moves the file's ctime, and a
    // mount refuses to serve an archive whose ctime moved (it may have been rewritten).
    let runs: Vec<_> = TEMPLATES
        .iter()
        .zip(&templates)
        .flat_map(|(template, file)| ENDS.map(|end| (format!("{template}-{}", end.0.to_lowercase()), file, end)))
        .collect();
    for (name, ..) in &runs {
        fs::hard_link(&base, tmp.join(format!("{name}.tar"))).unwrap();
    }
    let started = Instant::now();
    let mut jobs = Vec::new();
    for (name, file, (end, time, sleep)) in runs {
        let runtime = tmp.join(format!("rt-{name}"));
        let runtime = runtime.to_str().unwrap();
        let env = [("STAGEFS_RUNTIME_DIR", runtime), ("STAGEFS_TEST_SLEEP", sleep), ("STAGEFS_BROADCAST_ALWAYS", "1")];
        let args = ["--nodes=1", "--ntasks-per-node=4", time];
        jobs.push((submit_file(&cluster, tmp.path(), file, &args, &name, &tree, &env), end));
    }

    // Cancel the scancel jobs once all their tasks have read the archive.
    for (job, _) in jobs.iter().filter(|(_, end)| *end == "CANCELLED") {
        let ok = wait_until_every(Duration::from_secs(90), POLL, || job.results().len() >= TASKS);
        assert!(ok, "tasks of a job to cancel did not all report:\n{}", job.context());
        run_cmd(cluster.cmd("scancel").arg(&job.id), Duration::from_secs(30)).assert_success();
    }
    // Time limits are enforced by slurmctld's periodic check: up to ~1.5 min after the minute.
    let states: Vec<String> = jobs.iter().map(|(job, _)| cluster.wait_end(job, Duration::from_secs(240))).collect();

    // Check every job before failing, so one run shows all problems.
    let mut problems = Vec::new();
    for ((job, expected), state) in jobs.iter().zip(&states) {
        let results = job.results();
        let root = results.first().and_then(|r| r.split_whitespace().find_map(|w| w.strip_prefix("root=")));
        let left = |root: &str| leftovers(&cluster, &tmp, job, Path::new(root));
        let clean = root.is_some_and(|root| wait_until_every(Duration::from_secs(20), POLL, || left(root).is_empty()));
        let mut wrong = Vec::new();
        if state != expected {
            wrong.push(format!("state {state} instead of {expected}"));
        }
        if results.len() != TASKS || !results.iter().all(|l| l.contains(" ok ") && l.contains(" daemons=1 ")) {
            wrong.push(format!("want {TASKS} tasks reading the right bytes through exactly one daemon"));
        }
        if !clean {
            wrong.push(format!("left behind: {:?}", root.map(left)));
        }
        if !wrong.is_empty() {
            problems.push(format!("{}\n{}", wrong.join("; "), job.context()));
        }
    }
    assert!(problems.is_empty(), "{} of {} jobs went wrong:\n\n{}", problems.len(), jobs.len(), problems.join("\n\n"));
    eprintln!("slurm: {} jobs checked in {:.0?}", jobs.len(), started.elapsed());
    drop(cluster);
}

/// What a finished job must not leave: a mount at `root`, a process naming its archive, a
/// file in its runtime directory, its broadcast copies in /dev/shm/<user>.
fn leftovers(cluster: &Cluster, tmp: &TempDir, job: &Job, root: &Path) -> Vec<String> {
    let mut found = cluster.leftovers(&job.archive);
    found.extend(mounts_at(root).iter().map(|m| format!("mount {} ({})", m.mount_point.display(), m.fs_type)));
    found.extend(entries(tmp.join(format!("rt-{}", job.name))).map(|e| format!("file {}", e.path().display())));
    let user =
        nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map_or(euid().to_string(), |u| u.name);
    let copy = format!(".stagefs-bcast-{}-", job.id);
    let copies =
        entries(Path::new("/dev/shm").join(user)).filter(|e| e.file_name().to_string_lossy().starts_with(&copy));
    found.extend(copies.map(|e| format!("broadcast copy {}", e.path().display())));
    found
}

/// `sbatch --wait` of a bash script (`body` after the shebang) on the one node with `args`,
/// from `tmp`, its runtime directory `tmp/rt` and `env` added: its output and the job's log.
fn batch(cluster: &Cluster, tmp: &Path, args: &[&str], body: &str, env: &[(&str, &str)]) -> (CmdOutput, String) {
    let (script, log) = (tmp.join("job.sh"), tmp.join("job.log"));
    fs::write(&script, format!("#!/bin/bash\n{body}\n")).unwrap();
    let mut sbatch = cluster.cmd("sbatch");
    sbatch.args(["--wait", "--nodes=1", "--time=5"]).args(args).arg("--output").arg(&log).arg(&script);
    sbatch.current_dir(tmp).env("STAGEFS_RUNTIME_DIR", tmp.join("rt")).envs(env.iter().copied());
    (run_cmd(&mut sbatch, Duration::from_secs(240)), fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn slurm_failed_broadcast_is_reported_on_every_task() {
    require_root();
    let cluster = one_node();
    let scene = Scene::new("slurm-bcast-fail").file("big.bin", pseudo_random(3, 6 << 20));
    let (tmp, archive) = (&scene.tmp, scene.tar_dot_at(&scene.join("bcast.tar")));
    let small = tmp.join("small");
    fs::create_dir(&small).unwrap();
    run_tool("mount", osargs!["-t", "tmpfs", "-o", "size=4m", "tmpfs", small]);
    let _unmount = UnmountOnDrop(small.clone());
    let (bin, stage, archive) = (stagefs_bin(), small.display(), archive.display());
    let srun = format!("srun -l {} run --broadcast --stage disk --stage-dir {stage} {archive} -- true", bin.display());
    let (out, log) = batch(&cluster, tmp.path(), &["--ntasks=4"], &srun, &[("STAGEFS_BROADCAST_ALWAYS", "1")]);
    assert!(!out.success(), "the job must fail:\n{}\n{log}", out.describe());
    assert_sbcast_said(&log, TASKS, "REQUEST_FILE_BCAST", &log);
    let dir = small.join(format!("stagefs-{}", euid()));
    let left: Vec<_> = entries(&dir).map(|e| e.path()).collect();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
}

/// The README's first example in a batch script: `stagefs mount` (detached), read, exit.
/// The test cluster's proctrack (linuxproc) lets the daemon outlive the job; stagefs ties
/// it to the job's batch step, so the mount and the daemon are gone once the job ends.
#[test]
fn slurm_a_mount_from_a_batch_script_ends_with_the_job() {
    require_root();
    let cluster = one_node();
    let scene = Scene::new("slurm-batch-mount").file("hello.txt", b"hello from the archive\n");
    let (tmp, archive) = (&scene.tmp, scene.tar_dot_at(&scene.join("batch.tar")));
    let (mp, read) = (tmp.join("mnt"), tmp.join("read.txt"));
    let body = format!(
        "set -e\n{bin} mount {archive} {mp}\ncat {mp}/hello.txt > {out}",
        bin = stagefs_bin().display(),
        archive = archive.display(),
        mp = mp.display(),
        out = read.display()
    );
    let (out, log) = batch(&cluster, tmp.path(), &["--ntasks=1"], &body, &[]);
    assert!(out.success(), "the job must succeed:\n{}\n{log}", out.describe());
    assert_eq!(fs::read_to_string(&read).unwrap(), "hello from the archive\n", "{log}");
    assert!(!log.contains("not tied to SLURM job"), "a batch-script mount is tied to its job:\n{log}");
    let gone = wait_until_every(Duration::from_secs(30), POLL, || {
        mounts_at(&mp).is_empty() && stagefs_pids(&archive).is_empty()
    });
    assert!(gone, "the mount or its daemon outlived the job: {:?}", stagefs_pids(&archive));
}
