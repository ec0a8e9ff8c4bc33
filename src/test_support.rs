//! Helpers for the unit tests: a temporary directory removed on drop (also when the test
//! panics), the external tools some tests build their inputs with (a missing one is a
//! panic naming its package: tests never skip). Deterministic bytes: `crate::test_rng`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the system's temp dir, removed with its content on drop.
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("stagefs-unit-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Debian package providing a tool, for the panic message.
fn package_of(tool: &str) -> &'static str {
    match tool {
        "mksquashfs" | "unsquashfs" => "squashfs-tools",
        "gensquashfs" | "tar2sqfs" | "sqfs2tar" => "squashfs-tools-ng",
        "setfattr" | "getfattr" => "attr",
        "python3" => "python3",
        "tar" => "tar",
        _ => "(unknown package)",
    }
}

/// Runs `tool ARGS...` (stdin from `stdin`, else nothing) and returns its stdout; panics
/// with its stderr unless it succeeds, and with the package to install when it is missing.
pub(crate) fn run_tool<S: AsRef<OsStr>>(tool: &str, args: &[S], stdin: Option<&Path>) -> Vec<u8> {
    let mut command = Command::new(tool);
    command.args(args).stdin(match stdin {
        Some(input) => Stdio::from(std::fs::File::open(input).unwrap()),
        None => Stdio::null(),
    });
    let output = match command.output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("`{tool}` is not installed (Debian package `{}`); these tests need it", package_of(tool))
        }
        Err(e) => panic!("cannot run `{tool}`: {e}"),
    };
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
    assert!(
        output.status.success(),
        "`{tool} {shown:?}` failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// A tar archive written by Python's `tarfile` module: `script` gets `tarfile`, `io`
/// and an open `tarfile.TarFile` named `t` writing to stdout (plus `add(name, data,
/// **attrs)` for a regular member); `open_args` are extra `tarfile.open` arguments.
pub(crate) fn python_tar(open_args: &str, script: &str) -> Vec<u8> {
    let program = format!(
        "import io, sys, tarfile\n\
         def add(name, data=b'', **attrs):\n    \
             info = tarfile.TarInfo(name)\n    \
             info.size = len(data)\n    \
             for k, v in attrs.items(): setattr(info, k, v)\n    \
             t.addfile(info, io.BytesIO(data))\n\
         with tarfile.open(fileobj=sys.stdout.buffer, mode='w|'{open_args}) as t:\n{}\n",
        script.lines().map(|l| format!("    {l}\n")).collect::<String>()
    );
    run_tool("python3", &["-c", &program], None)
}
