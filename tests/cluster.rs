//! The slurm/ templates and `--broadcast` on a real SLURM of three nodes on this machine (.ci/cluster.sh: each
//! node has its own network, hostname, mount and PID namespace, /dev/shm and /tmp), jobs run as root. Archives lie
//! in the shared directory (the "parallel filesystem"); a fanotify watcher on the host names the node of each read
//! by the reader's UTS namespace. After each job every node is checked from the host: nothing may be left.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::kit::{
    chmod, pseudo_random, require_root, require_tool, run_cmd, stagefs_bin, wait_until, wait_until_every, KillOnDrop,
};

pub(crate) const POLL: Duration = Duration::from_millis(250);
const NODES: usize = 3;
pub(crate) const TASKS_PER_NODE: usize = 4;
const ENDED: [&str; 7] = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"];

/// A SLURM on this machine (the three-node cluster, or slurm.rs's one node), held by one test at a time
/// (`slurm_guard`); stopped on drop (a failed test too) only if this test started it: never under another's jobs.
pub(crate) struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    /// How many nodes of namespaces it has (node1...); 0 for slurm.rs's node, this machine.
    nodes: usize,
    stop: Option<Command>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    pub(crate) fn up() -> Cluster {
        let running = |c: &Cluster| {
            let states = run_cmd(c.cmd("sinfo").args(["-h", "-N", "-o", "%t"]), Duration::from_secs(30)).stdout;
            states.lines().filter(|l| l.trim() == "idle").count() == NODES && node_pids(&c.dir, NODES).is_some()
        };
        let cluster = Cluster::start("/tmp/stagefs-cluster", NODES, "cluster.sh", "3", running);
        // Runtime directories an earlier test run left on a reused cluster (by name: rt-JOB).
        for entry in entries(cluster.dir.join("nodes")).flat_map(|node| entries(node.path().join("tmp"))) {
            if entry.file_name().to_string_lossy().starts_with("rt-") {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        cluster
    }

    /// The SLURM of `dir` with `nodes` nodes: started by `.ci/SCRIPT start ARG` (this test never skips) unless it wrote
    /// its `env` and `running` says it answers, and then stopped on drop by `.ci/SCRIPT stop ARG`.
    pub(crate) fn start(dir: &str, nodes: usize, script: &str, arg: &str, running: fn(&Cluster) -> bool) -> Cluster {
        require_root();
        let serial = crate::kit::slurm_guard();
        let dir = PathBuf::from(dir);
        let mut cluster = Cluster { conf: dir.join("slurm.conf"), dir, nodes, stop: None, _serial: serial };
        if !(cluster.dir.join("env").exists() && running(&cluster)) {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci").join(script);
            let out = run_cmd(Command::new(&script).args(["start", arg]), Duration::from_secs(300));
            assert!(out.success(), "SLURM could not be started (this test never skips):\n{}", out.describe());
            let mut stop = Command::new(script);
            stop.args(["stop", arg]).stdout(Stdio::null());
            cluster.stop = Some(stop);
        }
        cluster
    }

    /// `program` (which must be installed) for this cluster.
    pub(crate) fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(require_tool(program));
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// Host pid of each node's PID 1, by node name.
    fn nodes(&self) -> BTreeMap<String, i32> {
        node_pids(&self.dir, self.nodes).expect("the cluster's nodes are running")
    }

    /// A node's /tmp (its local disk) as the host sees it.
    fn local_disk(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node).join("tmp")
    }

    /// Runs `argv` in `node`'s namespaces as user `uid`.
    fn enter(&self, node: &str, uid: u32, gid: u32, argv: &[&str]) -> crate::kit::CmdOutput {
        let pid = self.nodes()[node];
        let mut c = Command::new(require_tool("nsenter"));
        c.args(["-t", &pid.to_string(), "-m", "-u", "-n", "-p", "-S", &uid.to_string(), "-G", &gid.to_string(), "--"]);
        c.args(argv);
        run_cmd(&mut c, Duration::from_secs(30))
    }

    /// Waits for `job` to end: its final state. One that does not is cancelled, what it was doing said first.
    pub(crate) fn wait_end(&self, job: &Job, timeout: Duration) -> String {
        let mut state = String::new();
        let ended = wait_until_every(timeout, POLL, || {
            state = crate::kit::slurm_job_state(&mut self.cmd("scontrol"), &job.id);
            ENDED.contains(&state.as_str())
        });
        if !ended {
            // What it was doing: its log, what its tasks have on each node (runtime files, with the text of status and
            // log files), its processes.
            let mut doing = job.context();
            for line in self.leftovers(&job.archive) {
                doing.push_str(&format!("\n{line}"));
                let Some(path) = line.split_once(": file ").map(|(_, p)| PathBuf::from(p)) else { continue };
                if path.extension().is_some_and(|e| e == "status" || e == "log") {
                    let text = fs::read(&path).unwrap_or_default();
                    doing.push_str(&format!("\n    {}", String::from_utf8_lossy(&text[..text.len().min(4000)])));
                }
            }
            let _ = run_cmd(self.cmd("scancel").arg(&job.id), Duration::from_secs(30));
            panic!("job {} did not end within {timeout:?} (state {state}); cancelled it\n{doing}", job.id);
        }
        state
    }

    /// What `archive`'s jobs left on any node: FUSE mounts, files in /dev/shm or on the
    /// local disk (runtime and staging dirs live there), processes naming the archive.
    pub(crate) fn leftovers(&self, archive: &Path) -> Vec<String> {
        let mut found = Vec::new();
        for (node, pid) in self.nodes() {
            let table = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
            found.extend(table.lines().filter(|l| l.contains(" - fuse")).map(|l| format!("{node}: mount {l}")));
            for root in [PathBuf::from(format!("/proc/{pid}/root/dev/shm")), self.local_disk(&node)] {
                found.extend(files_under(&root).iter().map(|f| format!("{node}: file {}", f.display())));
            }
        }
        let needle = archive.as_os_str().as_encoded_bytes();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if cmdline.windows(needle.len()).any(|w| w == needle) && !cmdline.starts_with(b"/usr/bin/python3\0-c\0") {
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                found.push(format!("process {}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
        found
    }

    /// Waits up to 30 s for nothing to be left; what is left then.
    pub(crate) fn wait_clean(&self, archive: &Path) -> Vec<String> {
        wait_until_every(Duration::from_secs(30), POLL, || self.leftovers(archive).is_empty());
        self.leftovers(archive)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop.as_mut().map(Command::status);
    }
}

fn node_pids(dir: &Path, count: usize) -> Option<BTreeMap<String, i32>> {
    let mut nodes = BTreeMap::new();
    for i in 1..=count {
        let name = format!("node{i}");
        let pid: i32 = fs::read_to_string(dir.join("run").join(format!("{name}.pid"))).ok()?.trim().parse().ok()?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let tag = format!("stagefs-cluster-node\0{name}\0");
        cmdline.windows(tag.len()).any(|w| w == tag.as_bytes()).then_some(())?;
        nodes.insert(name, pid);
    }
    Some(nodes)
}

/// The entries of `dir` that can be read (none if it cannot be).
pub(crate) fn entries(dir: impl AsRef<Path>) -> impl Iterator<Item = fs::DirEntry> {
    fs::read_dir(dir).into_iter().flatten().flatten()
}

/// Files under `root`, not following links, but for the node's view of the cluster dir (mounted into its /tmp).
fn files_under(root: &Path) -> Vec<PathBuf> {
    let entries = entries(root).filter(|e| e.file_name() != "stagefs-cluster");
    entries
        .flat_map(|e| if e.file_type().is_ok_and(|t| t.is_dir()) { files_under(&e.path()) } else { vec![e.path()] })
        .collect()
}

/// The jobs' training script: reads the tree through the mount, records its verdict, its node's daemons and mounts of
/// the archive and the node's /dev/shm in use, then holds a file open for STAGEFS_TEST_SLEEP seconds.
const READER: &str = r#"
import os, sys, time
root = sys.argv[sys.argv.index('--data-root') + 1]
expect, out, archive = os.environ['STAGEFS_TEST_EXPECT'], os.environ['STAGEFS_TEST_OUT'], os.environ['ARCHIVE']
rels = [os.path.relpath(os.path.join(d, f), expect) for d, _, files in os.walk(expect) for f in files]
bad = []
for rel in rels:
    try:
        if open(os.path.join(root, rel), 'rb').read() != open(os.path.join(expect, rel), 'rb').read():
            bad.append(rel)
    except OSError as e:
        bad.append(f'{rel}: {e}')
daemons = 0
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if archive.encode() in open(f'/proc/{pid}/cmdline', 'rb').read() and any(
                os.readlink(f'/proc/{pid}/fd/{fd}') == '/dev/fuse' for fd in os.listdir(f'/proc/{pid}/fd')):
            daemons += 1
    except OSError:
        pass
# Mounts at the mount point this task sees: its node's alone (all nodes use the same path).
mounts = sum(1 for l in open('/proc/self/mountinfo') if l.split()[4] == os.path.realpath(root))
st = os.statvfs('/dev/shm')
shm = (st.f_blocks - st.f_bfree) * st.f_frsize
verdict = 'ok' if rels and not bad else 'bad:' + ';'.join(bad[:3])
node, task = os.uname().nodename, os.environ.get('SLURM_LOCALID', '?') + '.' + os.environ.get('LOCAL_RANK', '-')
with open(os.path.join(out, f'{node}.{task}.{os.getpid()}'), 'w') as fh:
    fh.write(f'{node} {verdict} files={len(rels)} daemons={daemons} mounts={mounts} root={root} shm={shm}\n')
held = open(os.path.join(root, rels[-1]), 'rb')
time.sleep(float(os.environ.get('STAGEFS_TEST_SLEEP', '0')))
sys.exit(0 if verdict == 'ok' else 1)
"#;

/// Records the bytes of each watched archive each node reads: fanotify's pre-content events (Linux 6.14) carry the
/// reader's pid, whose UTS namespace names its node, and the range (mmap makes none: stagefs and sbcast read(2)).
/// Prints `READY` once the marks are set, then `PATH NODE COMM OFFSET COUNT` per read.
const WATCHER: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
FAN_CLASS_PRE_CONTENT, FAN_MARK_ADD, FAN_PRE_ACCESS, AT_FDCWD, FAN_ALLOW = 8, 1, 0x100000, -100, 1
fd = libc.fanotify_init(FAN_CLASS_PRE_CONTENT, os.O_RDONLY)
if fd < 0:
    sys.exit(f'fanotify_init: {os.strerror(ctypes.get_errno())}')
nodes = {}
for arg in sys.argv[1:]:
    kind, value = arg.split('=', 1)
    if kind == 'node':
        name, pid = value.split(':')
        nodes[os.readlink(f'/proc/{pid}/ns/uts')] = name
    elif libc.fanotify_mark(fd, FAN_MARK_ADD, ctypes.c_uint64(FAN_PRE_ACCESS), AT_FDCWD, value.encode()) < 0:
        sys.exit(f'fanotify_mark {value}: {os.strerror(ctypes.get_errno())}')
print('READY', flush=True)
while True:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        length, _, _, meta, _, efd, pid = struct.unpack_from('IBBHQii', buf, i)
        ranges, j = [], i + meta
        while j < i + length:
            kind, _, size = struct.unpack_from('BBH', buf, j)
            if kind == 6:  # FAN_EVENT_INFO_TYPE_RANGE
                ranges.append(struct.unpack_from('QQ', buf, j + 8))
            j += size
        try:
            path = os.readlink(f'/proc/self/fd/{efd}')
            node = nodes.get(os.readlink(f'/proc/{pid}/ns/uts'), 'host')
            comm = open(f'/proc/{pid}/comm').read().strip()
        except OSError:
            node, comm = 'gone', '?'
        finally:
            # Answer first: the reader waits for it.
            os.write(fd, struct.pack('iI', efd, FAN_ALLOW))
            os.close(efd)
        for offset, count in ranges:
            print(path, node, comm, offset, count, flush=True)
        i += length
"#;

/// The fanotify watcher, killed on drop.
struct Watcher {
    _child: KillOnDrop,
    lines: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Watcher {
    fn start(cluster: &Cluster, archives: &[&Path]) -> Watcher {
        let mut cmd = Command::new("/usr/bin/python3");
        cmd.arg("-c").arg(WATCHER).args(cluster.nodes().iter().map(|(node, pid)| format!("node={node}:{pid}")));
        cmd.args(archives.iter().map(|a| format!("file={}", a.display())));
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start the fanotify watcher");
        let (stdout, lines) = (child.stdout.take().unwrap(), std::sync::Arc::new(Mutex::new(Vec::new())));
        let sink = lines.clone();
        std::thread::spawn(move || {
            BufReader::new(stdout).lines().map_while(Result::ok).for_each(|l| sink.lock().unwrap().push(l))
        });
        let watcher = Watcher { _child: KillOnDrop(child), lines };
        let ready = wait_until(Duration::from_secs(30), || watcher.lines.lock().unwrap().iter().any(|l| l == "READY"));
        assert!(ready, "the fanotify watcher did not start");
        watcher
    }

    /// Bytes of `archive` each node (or `host`, `gone`) read so far, overlaps counted once, and which programs read.
    fn bytes_read(&self, archive: &Path) -> (BTreeMap<String, u64>, BTreeSet<String>) {
        let prefix = format!("{} ", archive.display());
        let mut pages: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let mut who = BTreeSet::new();
        for line in self.lines.lock().unwrap().iter().filter_map(|l| l.strip_prefix(&prefix)) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [node, comm, offset, count] = f[..] else { continue };
            let (offset, count): (u64, u64) = (offset.parse().unwrap_or(0), count.parse().unwrap_or(0));
            who.insert(format!("{node}:{comm}"));
            pages.entry(node.to_owned()).or_default().extend(offset / 4096..(offset + count).div_ceil(4096));
        }
        (pages.into_iter().map(|(node, p)| (node, p.len() as u64 * 4096)).collect(), who)
    }
}

/// A test's working directory in the shared dir (visible on every node), removed on drop.
pub(crate) struct Work {
    path: PathBuf,
}

impl Work {
    pub(crate) fn new(cluster: &Cluster, label: &str) -> Work {
        let path = cluster.dir.join("shared").join(format!("{label}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Work { path }
    }

    pub(crate) fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }

    pub(crate) fn archive(&self, name: &str, big: usize) -> (PathBuf, PathBuf) {
        tree_and_tar(&self.path, name, big)
    }
}

/// A tree of `big` bytes spread over a few files in `dir`, and its tar `dir/name.tar`.
pub(crate) fn tree_and_tar(dir: &Path, name: &str, big: usize) -> (PathBuf, PathBuf) {
    let tree = dir.join(format!("{name}-tree"));
    for (i, size) in [0usize, 1, 4096, 100_000, big].iter().enumerate() {
        fs::create_dir_all(tree.join(format!("class{}", i % 2))).unwrap();
        fs::write(tree.join(format!("class{}/f{i}.bin", i % 2)), pseudo_random(i as u64 + 7, *size)).unwrap();
    }
    let tar = dir.join(format!("{name}.tar"));
    crate::kit::run_tool("tar", crate::kit::osargs!["-C", tree, "-cf", tar, "."]);
    (tree, tar)
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Logs the node and arguments of every sbcast, then runs the real one (the log's path follows). stagefs hands sbcast
/// the archive it opened and checked as `/dev/fd/N`: the file it is open on is logged after the arguments.
const SBCAST_WRAPPER: &str =
    "#!/bin/sh\necho \"$(hostname) $* $(for a; do case $a in (/dev/fd/*) readlink \"$a\";; esac; done)\" >> ";

/// The nodes that ran sbcast with `archive` as its source, one entry per run.
fn sbcast_calls(work: &Work, archive: &Path) -> Vec<String> {
    let log = fs::read_to_string(work.join("sbcast.log")).unwrap_or_default();
    let needle = format!(" {} ", archive.display());
    log.lines().filter(|l| format!("{l} ").contains(&needle)).map(|l| l.split(' ').next().unwrap().to_owned()).collect()
}

/// One template job and what it reported.
pub(crate) struct Job {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) archive: PathBuf,
    out: PathBuf,
    log: PathBuf,
}

impl Job {
    pub(crate) fn results(&self) -> Vec<String> {
        crate::kit::task_results(&self.out)
    }

    pub(crate) fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn context(&self) -> String {
        format!("job {} ({})\nresults: {:#?}\nlog:\n{}", self.id, self.name, self.results(), self.log())
    }
}

pub(crate) fn template(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm").join(format!("{name}.sbatch"))
}

/// Submits `template` on three nodes, 4 training processes per node, with `env` added.
fn submit(cluster: &Cluster, work: &Work, template: &str, name: &str, tree: &Path, env: &[(&str, &str)]) -> Job {
    let tasks = format!("--ntasks-per-node={}", if template == "5-torchrun" { 1 } else { TASKS_PER_NODE });
    let args = ["--nodes=3", "--time=5", &tasks];
    submit_file(cluster, &work.path, &self::template(template), &args, name, tree, env)
}

/// Submits a job script of ours (bash, `body` after the shebang) like a template.
pub(crate) fn submit_script(
    cluster: &Cluster,
    work: &Work,
    name: &str,
    tree: &Path,
    body: &str,
    env: &[(&str, &str)],
) -> Job {
    let script = work.join(&format!("{name}.sh"));
    fs::write(&script, format!("#!/bin/bash\n{body}\n")).unwrap();
    submit_file(cluster, &work.path, &script, &["--nodes=3", "--time=5", "--ntasks-per-node=4"], name, tree, env)
}

/// Stands in for torchrun: starts `--nproc-per-node` copies of the script with its
/// arguments, passes SIGTERM on to them as torchrun does, and exits with the worst status.
const FAKE_TORCHRUN: &str = r#"#!/usr/bin/env python3
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

/// Submits `file` by `sbatch ARGS` from `dir` (where its output, log and helpers go): no GPUs,
/// a CPU per task, SCRATCH unset, 4 "GPUs" for the templates to start 4 training processes
/// on, the helpers (reader, fake torchrun, sbcast wrapper) on PATH, `env` added.
pub(crate) fn submit_file(
    cluster: &Cluster,
    dir: &Path,
    file: &Path,
    args: &[&str],
    name: &str,
    tree: &Path,
    env: &[(&str, &str)],
) -> Job {
    let archive = dir.join(format!("{name}.tar"));
    let (out, log) = (dir.join(format!("out-{name}")), dir.join(format!("{name}.log")));
    fs::create_dir_all(&out).unwrap();
    let fake_bin = dir.join("bin");
    // The helpers are written once per directory: the jobs submitted before run them.
    if fs::create_dir(&fake_bin).is_ok() {
        fs::write(dir.join("reader.py"), READER).unwrap();
        let (log, sbcast) = (dir.join("sbcast.log"), require_tool("sbcast"));
        let sbcast = format!("{SBCAST_WRAPPER}{}\nexec {} \"$@\"\n", log.display(), sbcast.display());
        for (tool, text) in [("torchrun", FAKE_TORCHRUN), ("sbcast", &sbcast)] {
            fs::write(fake_bin.join(tool), text).unwrap();
            chmod(&fake_bin.join(tool), 0o755);
        }
    }
    let bin_dir = stagefs_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}:{}", bin_dir.display(), fake_bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut sbatch = cluster.cmd("sbatch");
    sbatch
        .args(["--parsable", "--gpus-per-node=0", "--cpus-per-task=1"])
        .args(args)
        .args([OsStr::new("--output"), log.as_os_str(), file.as_os_str()])
        .current_dir(dir)
        .env("PATH", &path)
        .env("ARCHIVE", &archive)
        .env_remove("SCRATCH")
        .env_remove("XDG_RUNTIME_DIR")
        .env("GPUS", TASKS_PER_NODE.to_string())
        .env("TRAIN_SCRIPT", dir.join("reader.py"))
        // Each node's /tmp is its own: one runtime directory per node, as on a real cluster.
        .env("STAGEFS_RUNTIME_DIR", format!("/tmp/rt-{name}"))
        .env("STAGEFS_TEST_EXPECT", tree)
        .env("STAGEFS_TEST_OUT", &out)
        .env("STAGEFS_TEST_SLEEP", "1")
        .envs(env.iter().copied());
    let submitted = run_cmd(&mut sbatch, Duration::from_secs(30));
    assert!(submitted.success(), "sbatch {name}:\n{}", submitted.describe());
    let id = submitted.stdout.trim().split(';').next().unwrap().to_string();
    Job { name: name.into(), id, archive, out, log }
}

/// How a template job must have read its archive.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Source {
    /// Every node reads the shared archive itself (into its own memory).
    EveryNode,
    /// One node reads it, sbcast fans it out into every node's /dev/shm.
    BroadcastRam,
    /// One node reads it, sbcast fans it out onto every node's local disk.
    BroadcastDisk,
}

type Spec<'a> = (&'a str, &'a str, Source, &'a [(&'a str, &'a str)]);

/// Runs the jobs (template, job name, how it reads the archive, extra environment) one at a time and checks each: it
/// completes, its 12 training processes read the right bytes through their node's one daemon, the nodes that read the
/// shared archive are the ones `Source` says, a RAM broadcast holds one copy per node, nothing is left anywhere.
fn run_templates(specs: &[Spec]) {
    let cluster = Cluster::up();
    let work = Work::new(&cluster, "templates");
    let (tree, base) = work.archive("base", 8 << 20);
    let size = fs::metadata(&base).unwrap().len();
    let archives: Vec<PathBuf> = specs.iter().map(|(_, name, ..)| work.join(&format!("{name}.tar"))).collect();
    for a in &archives {
        // Copies, not links: fanotify watches the inode.
        fs::copy(&base, a).unwrap();
    }
    let watcher = Watcher::start(&cluster, &archives.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    let started = Instant::now();
    let mut problems = Vec::new();
    // One job at a time: each measures its nodes' /dev/shm, which a job beside it would fill.
    for (template, name, source, env) in specs {
        let job = submit(&cluster, &work, template, name, &tree, env);
        let state = cluster.wait_end(&job, Duration::from_secs(180));
        let results = job.results();
        let mut wrong = Vec::new();
        let mut check = |ok: bool, what: String| wrong.extend((!ok).then_some(what));
        check(state == "COMPLETED", format!("state {state}"));
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for line in &results {
            let node = line.split_whitespace().next().unwrap_or("?");
            *per_node.entry(node).or_default() += 1;
            let ok = line.contains(" ok ") && line.contains(" daemons=1 ") && line.contains(" mounts=1 ");
            check(ok, format!("want the right bytes through exactly one daemon and mount: {}", line.trim()));
            let shm: u64 = line.rsplit_once("shm=").and_then(|(_, v)| v.trim().parse().ok()).unwrap_or(u64::MAX);
            // One copy: at least the archive, less than two (tmpfs counts whole pages).
            let copies_ok = if *source == Source::BroadcastRam { shm >= size && shm < 2 * size } else { shm < size };
            check(copies_ok, format!("/dev/shm held {shm} bytes, archive {size} ({source:?}): {}", line.trim()));
        }
        let want_nodes = BTreeMap::from(["node1", "node2", "node3"].map(|node| (node, TASKS_PER_NODE)));
        check(per_node == want_nodes, format!("want {TASKS_PER_NODE} training processes per node, got {per_node:?}"));
        // Every node reads the start of the shared archive to check its format (256 KiB
        // here); staging reads all of it. With broadcast only the sender's sbcast reads it all.
        let (read, who) = watcher.bytes_read(&job.archive);
        let full: BTreeSet<&str> = read.iter().filter(|(_, b)| **b >= size / 2).map(|(n, _)| n.as_str()).collect();
        let sbcasts = sbcast_calls(&work, &job.archive);
        let (want_full, want_sbcasts): (BTreeSet<&str>, Vec<String>) = match source {
            Source::EveryNode => (["node1", "node2", "node3"].into(), vec![]),
            // The sender is the task with SLURM_PROCID 0: on the job's first node.
            Source::BroadcastRam | Source::BroadcastDisk => (["node1"].into(), vec!["node1".into()]),
        };
        let got = format!("the shared archive ({size} bytes) was read by {read:?} ({who:?}), sbcast from {sbcasts:?}");
        let want = format!("want full reads on {want_full:?} and sbcast from {want_sbcasts:?}");
        check(full == want_full && sbcasts == want_sbcasts, format!("{got}; {want}"));
        let left = cluster.wait_clean(&job.archive);
        check(left.is_empty(), format!("left behind: {left:#?}"));
        if !wrong.is_empty() {
            problems.push(format!("{}\n{}", wrong.join("\n"), job.context()));
        }
    }
    drop(watcher);
    assert!(problems.is_empty(), "{} of {} jobs went wrong:\n\n{}", problems.len(), specs.len(), problems.join("\n\n"));
    eprintln!("cluster: {} jobs on {NODES} nodes checked in {:.0?}", specs.len(), started.elapsed());
}

/// Templates 3 (multi-node), 5 (torchrun) and 6 (broadcast to RAM) as written, on 3 nodes.
#[test]
fn cluster_templates_on_three_nodes() {
    run_templates(&[
        ("3-multi-node", "multi", Source::EveryNode, &[]),
        ("5-torchrun", "torchrun", Source::EveryNode, &[]),
        ("6-broadcast", "bcast-ram", Source::BroadcastRam, &[("STAGE", "ram")]),
    ]);
}

/// `--broadcast --stage disk`: the copy goes to each node's own disk ($TMPDIR, its /tmp); one node reads the archive.
#[test]
fn cluster_broadcast_to_local_disk() {
    run_templates(&[("6-broadcast", "bcast-disk", Source::BroadcastDisk, &[("STAGE", "disk"), ("TMPDIR", "/tmp")])]);
}

/// Node2's /dev/shm/root was made by another user before the job: stagefs must not use it (that user could read or swap
/// the copy), so node2's tasks fail with the exit-4 message naming it, and nothing lands in it. The other nodes fail
/// too, with sbcast's message: sbcast delivers to every node of the job or fails, and node2 has no inbox.
#[test]
fn cluster_a_node_with_a_foreign_shm_dir() {
    let cluster = Cluster::up();
    let other = crate::kit::User::get("sfs-mallory");
    let work = Work::new(&cluster, "foreign-shm");
    let (tree, _) = work.archive("foreign", 1 << 20);
    let foreign = PathBuf::from(format!("/proc/{}/root/dev/shm/root", cluster.nodes()["node2"]));
    // Root's own, left by an earlier broadcast on a reused cluster (empty: checked by those tests).
    let _ = fs::remove_dir_all(&foreign);
    cluster.enter("node2", other.uid, other.gid, &["mkdir", "-m", "0777", "/dev/shm/root"]).assert_success();
    let job = submit(&cluster, &work, "6-broadcast", "foreign", &tree, &[("STAGE", "ram")]);
    let state = cluster.wait_end(&job, Duration::from_secs(180));
    let inside = files_under(&foreign);
    let _ = fs::remove_dir_all(&foreign);
    let log = job.log();
    assert_eq!(state, "FAILED", "{}", job.context());
    assert!(inside.is_empty(), "written into the other user's directory: {inside:?}\n{}", job.context());
    assert!(job.results().is_empty(), "no task may train:\n{}", job.context());
    let sbcast = "REQUEST_FILE_BCAST(node2): No such file or directory";
    let mallory = "stagefs: error: /dev/shm/root: belongs to sfs-mallory";
    for (node, tasks, code, said) in
        [("node1", "0-3", 1, sbcast), ("node2", "4-7", 4, mallory), ("node3", "8-11", 1, sbcast)]
    {
        let exited = format!("srun: error: {node}: tasks {tasks}: Exited with exit code {code}");
        let ok = log.contains(&exited) && log.contains(said);
        assert!(ok, "{node}'s tasks must fail: want {exited:?} and {said:?}:\n{}", job.context());
    }
    assert_clean_but_known(&cluster, &job, &state);
}

/// Panics unless nothing of `job` (ended in `state`) is left but what a failed mount is known to leave in its node's
/// runtime directory (its lock file, at times its log, and on a node whose leader failed before the broadcast ended,
/// the broadcast's status file): said on stderr, left for a change to stagefs to remove.
fn assert_clean_but_known(cluster: &Cluster, job: &Job, state: &str) {
    let (known, left): (Vec<String>, Vec<String>) = cluster.wait_clean(&job.archive).into_iter().partition(|l| {
        let name = l.rsplit('/').next().unwrap_or("");
        let bcast_status = name.starts_with(".stagefs-bcast-") && name.ends_with(".status");
        l.contains("/tmp/rt-") && (name.ends_with(".lock") || name.ends_with(".log") || bcast_status)
    });
    if !known.is_empty() {
        eprintln!("cluster: known leftovers of a failed mount (runtime dirs): {known:#?}");
    }
    assert!(left.is_empty(), "left behind (state {state}): {left:#?}\n{}", job.context());
}

/// Panics unless each of the first `tasks` tasks said stagefs's error with sbcast's own
/// message, which names `request` (REQUEST_FILE_BCAST and the node that failed), in `log`.
pub(crate) fn assert_sbcast_said(log: &str, tasks: usize, request: &str, context: &str) {
    for task in 0..tasks {
        // srun -l pads the label: " 8: ".
        let prefix = format!("{task}: stagefs: error:");
        let said =
            log.lines().any(|l| l.trim_start().starts_with(&prefix) && l.contains("sbcast") && l.contains(request));
        assert!(said, "task {task} must report sbcast's own message:\n{context}");
    }
}

/// The job's tasks run `stagefs run` with these options and the reader, labelled by task.
pub(crate) fn run_line(options: &str) -> String {
    format!(
        "srun -l --export=ALL {} run {options} \"$ARCHIVE\" -- python3 \"$TRAIN_SCRIPT\" --data-root '{{mount}}'",
        stagefs_bin().display()
    )
}

/// sbcast fails on one node only (node3's --stage-dir is a 4 MiB tmpfs, the archive 8 MiB):
/// every task of every node fails with sbcast's message, nothing is left on any node.
#[test]
fn cluster_broadcast_failing_on_one_node() {
    let cluster = Cluster::up();
    let work = Work::new(&cluster, "bcast-one-fails");
    let (tree, _) = work.archive("onefails", 8 << 20);
    for node in ["node1", "node2"] {
        fs::create_dir_all(cluster.local_disk(node).join("small")).unwrap();
    }
    let small = "mkdir -p /tmp/small && mount -t tmpfs -o size=4m small /tmp/small";
    cluster.enter("node3", 0, 0, &["sh", "-c", small]).assert_success();
    let node3_small = PathBuf::from(format!("/proc/{}/root/tmp/small", cluster.nodes()["node3"]));
    let line = run_line("--broadcast --stage disk --stage-dir /tmp/small");
    let job = submit_script(&cluster, &work, "onefails", &tree, &line, &[]);
    let state = cluster.wait_end(&job, Duration::from_secs(180));
    let in_small = files_under(&node3_small);
    let _ = cluster.enter("node3", 0, 0, &["umount", "/tmp/small"]);
    assert_eq!(state, "FAILED", "{}", job.context());
    assert!(job.results().is_empty(), "no task may train:\n{}", job.context());
    assert_sbcast_said(&job.log(), NODES * TASKS_PER_NODE, "REQUEST_FILE_BCAST(node3)", &job.context());
    assert!(in_small.is_empty(), "left in node3's stage dir: {in_small:?}");
    assert_clean_but_known(&cluster, &job, &state);
}

/// Node2's daemon is SIGKILLed while its tasks read: the tasks of node1 and node3 are not
/// affected, and when the job ends nothing is left on any node (node2's dead mount included).
#[test]
fn cluster_a_daemon_killed_mid_job() {
    let cluster = Cluster::up();
    let work = Work::new(&cluster, "daemon-killed");
    let (tree, _) = work.archive("killed", 1 << 20);
    let job = submit_script(&cluster, &work, "killed", &tree, &run_line(""), &[("STAGEFS_TEST_SLEEP", "8")]);
    let all = wait_until_every(Duration::from_secs(120), POLL, || job.results().len() == NODES * TASKS_PER_NODE);
    assert!(all, "the tasks did not all read:\n{}", job.context());
    let node2_uts = fs::read_link(format!("/proc/{}/ns/uts", cluster.nodes()["node2"])).unwrap();
    let daemons: Vec<i32> = crate::kit::stagefs_pids(&job.archive)
        .into_iter()
        .filter(|pid| fs::read_link(format!("/proc/{pid}/ns/uts")).ok().as_ref() == Some(&node2_uts))
        .filter(|pid| {
            entries(format!("/proc/{pid}/fd"))
                .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
        })
        .collect();
    assert_eq!(daemons.len(), 1, "want node2's one daemon:\n{}", job.context());
    crate::kit::signal(daemons[0], crate::kit::Signal::SIGKILL).unwrap();
    let state = cluster.wait_end(&job, Duration::from_secs(180));
    for node in ["node1", "node3"] {
        let ok = job.results().iter().filter(|l| l.starts_with(&format!("{node} ok "))).count();
        assert_eq!(ok, TASKS_PER_NODE, "{node}'s tasks must be unaffected (state {state}):\n{}", job.context());
        assert!(!job.log().contains(&format!("{node}: tasks")), "{node}'s tasks failed:\n{}", job.context());
    }
    assert_clean_but_known(&cluster, &job, &state);
}

/// `scancel` while sbcast is still copying a large archive to the nodes: no mount, process, runtime file or broadcast
/// copy is left on any node (each node's leader, stopped while its copy arrived, takes back what arrived; these copies
/// stayed until the next `--broadcast` swept them before).
#[test]
fn cluster_scancel_mid_broadcast() {
    let cluster = Cluster::up();
    let work = Work::new(&cluster, "scancel-bcast");
    let (tree, _) = work.archive("cancelled", 200 << 20);
    let job = submit_script(&cluster, &work, "cancelled", &tree, &run_line("--broadcast --stage ram"), &[]);
    let inbox = format!(".stagefs-bcast-{}-", job.id);
    let nodes = cluster.nodes();
    let staging = wait_until_every(Duration::from_secs(120), Duration::from_millis(50), || {
        nodes.values().any(|pid| {
            let mut inboxes = entries(format!("/proc/{pid}/root/dev/shm/root"));
            inboxes.any(|e| e.file_name().to_string_lossy().starts_with(&inbox) && files_under(&e.path()).len() == 1)
        })
    });
    assert!(staging, "no node began receiving the broadcast:\n{}", job.context());
    run_cmd(cluster.cmd("scancel").arg(&job.id), Duration::from_secs(30)).assert_success();
    let state = cluster.wait_end(&job, Duration::from_secs(180));
    assert_eq!(state, "CANCELLED", "{}", job.context());
    assert!(job.results().is_empty(), "cancelled while staging, yet a task read:\n{}", job.context());
    assert_clean_but_known(&cluster, &job, &state);
}
