//! `stagefs-reader`: benchmark the loader on a directory, or generate a test tree.

mod args;
mod bench;
mod gen;

use clap::Parser;
use std::process::ExitCode;

/// Minimal stderr logger so the library's backend choice is visible without
/// pulling a logging framework into a small tool.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{}] {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() -> ExitCode {
    // Usage errors, --help and --version exit here (usage errors with code 2).
    let cli = args::Cli::parse();
    let _ = log::set_logger(&StderrLog).map(|()| log::set_max_level(log::LevelFilter::Info));
    let result: Result<(), Box<dyn std::error::Error>> = match &cli.command {
        args::Command::Bench(a) => bench::run(a).map_err(Into::into),
        args::Command::Gen(a) => gen::run(a).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stagefs-reader: {e}");
            ExitCode::FAILURE
        }
    }
}
