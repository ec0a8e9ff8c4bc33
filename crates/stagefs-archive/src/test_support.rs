//! Helpers for the unit tests on top of the shared kit (`test_kit.rs`: temporary
//! directories, required tools): running the external tools some tests build their inputs
//! with. Deterministic bytes: `crate::test_rng`.

use std::ffi::OsStr;
use std::path::Path;

pub use crate::test_kit::TempDir;
use std::process::{Command, Stdio};

/// Runs `tool ARGS...` (stdin from `stdin`, else nothing) and returns its stdout; panics
/// with its stderr unless it succeeds, and with the package to install when it is missing.
pub fn run_tool<S: AsRef<OsStr>>(tool: &str, args: &[S], stdin: Option<&Path>) -> Vec<u8> {
    let mut command = Command::new(crate::test_kit::require_tool(tool));
    command.args(args).stdin(match stdin {
        Some(input) => Stdio::from(std::fs::File::open(input).unwrap()),
        None => Stdio::null(),
    });
    let output = match command.output() {
        Ok(output) => output,
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
pub fn python_tar(open_args: &str, script: &str) -> Vec<u8> {
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

/// A ustar archive of regular files (mode 0644), written by the crate's own tar writer.
pub fn ustar(members: &[(&str, &[u8])]) -> Vec<u8> {
    use crate::tar::write::{end, padding, ustar_header};
    let mut out = Vec::new();
    for (name, data) in members {
        out.extend_from_slice(&ustar_header(name, b'0', 0o644, data.len() as u64, ""));
        out.extend_from_slice(data);
        out.resize(out.len() + padding(data.len() as u64), 0);
    }
    out.extend_from_slice(&end());
    out
}
