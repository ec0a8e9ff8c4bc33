//! Running stagefs and other tools with time limits, capturing their output.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;

use super::{require_tool, TempDir};

/// How long one `stagefs mount`/`stagefs umount` may take before the test
/// fails (instead of hanging the suite).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);

/// The `stagefs` binary Cargo built for this test run.
pub fn stagefs_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stagefs"))
}

/// Exit status and captured output of a finished command.
#[derive(Debug)]
pub struct CmdOutput {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// For assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.status, self.stdout, self.stderr
        )
    }

    /// Panics with the full output unless the command succeeded.
    pub fn assert_success(&self) -> &Self {
        assert!(self.success(), "command failed:\n{}", self.describe());
        self
    }

    /// Panics with the full output unless the command exited with exactly `code`
    /// (scripts branch on stagefs's exit codes: "some failure" is not enough).
    pub fn assert_code(&self, code: i32) -> &Self {
        match self.status.code() {
            Some(c) if c == code => self,
            Some(c) => panic!("expected exit code {code}, got {c}:\n{}", self.describe()),
            None => panic!("expected exit code {code}, but the command was killed by a signal:\n{}", self.describe()),
        }
    }

    /// Panics unless stderr contains every needle.
    pub fn assert_stderr_has(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(self.stderr.contains(needle), "stderr lacks {needle:?}:\n{}", self.describe());
        }
        self
    }

    /// Panics if stderr contains any needle.
    pub fn assert_stderr_lacks(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(!self.stderr.contains(needle), "stderr has {needle:?}:\n{}", self.describe());
        }
        self
    }
}

pub fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push_str(&format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Runs a command to completion with a time limit, capturing stdout and
/// stderr. Output goes through files, not pipes, so that a daemon child
/// which keeps them open cannot make this hang (a separate test checks that
/// `stagefs mount` does not do that).
pub fn run_cmd(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    run_cmd_into(cmd, timeout, None)
}

/// Like `run_cmd`, with stdout written to `stdout` when given (the output's `stdout` is
/// then empty): for tools whose output is a file, such as a compressor's `-c`.
pub fn run_cmd_into(cmd: &mut Command, timeout: Duration, stdout: Option<fs::File>) -> CmdOutput {
    let scratch = TempDir::new("cmd-output");
    let out_path = scratch.join("stdout");
    let err_path = scratch.join("stderr");
    let out = stdout.unwrap_or_else(|| fs::File::create(&out_path).unwrap());
    let err = fs::File::create(&err_path).unwrap();
    let command = describe_command(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
    let status = wait_timeout(&mut child, timeout);
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap()).into_owned();
    match status {
        Some(status) => CmdOutput { command, status, stdout, stderr },
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{command}` did not finish within {timeout:?}; killed it\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            );
        }
    }
}

/// Waits for a child up to `timeout`; `None` if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `stagefs ARGS...` with the default time limit.
pub fn stagefs<I, S>(args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    StagefsCmd::new(args).run()
}

/// `stagefs ARGS...` with an environment of its own, run to completion, spawned, or taken
/// as the mount it makes: `StagefsCmd::new(osargs!["mount", a, mp]).runtime(&rt).run()`.
pub struct StagefsCmd(pub Command);

impl StagefsCmd {
    pub fn new<I, S>(args: I) -> StagefsCmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(stagefs_bin());
        cmd.args(args);
        StagefsCmd(cmd)
    }

    pub fn args<I, S>(mut self, args: I) -> StagefsCmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.0.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> StagefsCmd {
        self.0.env(key, value);
        self
    }

    /// Each of `vars` removed from the environment.
    pub fn env_remove(mut self, vars: &[&str]) -> StagefsCmd {
        for var in vars {
            self.0.env_remove(var);
        }
        self
    }

    /// Locks, records and logs in `dir` (`STAGEFS_RUNTIME_DIR`), so a test sees only its own.
    pub fn runtime(self, dir: &Path) -> StagefsCmd {
        self.env("STAGEFS_RUNTIME_DIR", dir)
    }

    /// None of SLURM's variables: as run outside any job.
    pub fn outside_slurm(self) -> StagefsCmd {
        self.env_remove(&["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_LOCALID", "SLURM_PROCID"])
    }

    /// As a task of SLURM job `job`, step `step`, node-local task 0.
    pub fn slurm_step(self, job: &str, step: &str) -> StagefsCmd {
        self.env("SLURM_JOB_ID", job).env("SLURM_STEP_ID", step).env("SLURM_LOCALID", "0")
    }

    /// Runs it to completion within [`CMD_TIMEOUT`].
    pub fn run(self) -> CmdOutput {
        self.run_within(CMD_TIMEOUT)
    }

    /// Runs it to completion within `timeout`.
    pub fn run_within(mut self, timeout: Duration) -> CmdOutput {
        run_cmd(&mut self.0, timeout)
    }

    /// Starts it with its output discarded, killed on drop.
    pub fn spawn(self) -> KillOnDrop {
        self.spawn_to(Stdio::null())
    }

    /// Starts it with its stderr (the log of `-v`) going to `stderr`, killed on drop.
    pub fn spawn_to(mut self, stderr: impl Into<Stdio>) -> KillOnDrop {
        let child = self.0.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn();
        KillOnDrop(child.unwrap_or_else(|e| panic!("cannot start `{}`: {e}", describe_command(&self.0))))
    }
}

/// Runs an external tool (checked with `require_tool`) and panics unless it
/// succeeds.
pub fn run_tool<I, S>(tool: &str, args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let path = require_tool(tool);
    let mut cmd = Command::new(path);
    cmd.args(args);
    let out = run_cmd(&mut cmd, Duration::from_secs(300));
    out.assert_success();
    out
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `cond` every 20 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(20), cond)
}

/// Polls `cond` every `interval` (for conditions that run commands) until it is true
/// or `timeout` passes.
pub fn wait_until_every(timeout: Duration, interval: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(interval);
    }
}

/// A SLURM job's state (`RUNNING`, `COMPLETED`, ...) as `scontrol show job -o ID` (run by
/// `scontrol`, a command set up for the right cluster) prints it; `UNKNOWN` if it does not.
pub fn slurm_job_state(scontrol: &mut Command, id: &str) -> String {
    let out = run_cmd(scontrol.args(["show", "job", "-o", id]), Duration::from_secs(60)).stdout;
    out.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("UNKNOWN").to_string()
}

/// What a job's tasks reported, one file each in `dir`: their contents, sorted.
pub fn task_results(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| fs::read_to_string(e.path()).ok()).collect())
        .unwrap_or_default();
    lines.sort();
    lines
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Sends `sig` to process `pid` (Err: it is gone, or not ours to signal).
pub fn signal(pid: i32, sig: Signal) -> nix::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
}

/// Arguments of mixed types (`&str`, paths, `OsString`s) as one array of `&OsStr`, for a
/// call: `stagefs(osargs!["mount", archive, mp])`.
macro_rules! osargs {
    ($($arg:expr),* $(,)?) => { [$(::std::ffi::OsStr::new(&$arg)),*] };
}
pub(crate) use osargs;

/// One `#[test] fn` per line, its name and its body: `cases! { tar_gnu => full_tar("gnu.tar", GNU); }`.
macro_rules! cases {
    ($($name:ident => $body:expr;)*) => {$(
        #[test]
        fn $name() {
            $body;
        }
    )*};
}
pub(crate) use cases;
