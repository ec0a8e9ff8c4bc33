//! `stagefs-reader`: benchmark the loader on a directory, or generate a test tree.

mod args;
mod bench;
mod gen;

use std::process::ExitCode;

const USAGE: &str = "\
usage:
  stagefs-reader bench DIR [--batch-bytes N] [--threads N] [--depth N] [--shuffle SEED]
                           [--epochs N] [--backend auto|host|cuda] [--h2d-reps N] [--baseline]
  stagefs-reader gen DIR [--files N] [--min-bytes N] [--max-bytes N] [--seed N]

Sizes accept K, M, G suffixes (powers of 1024). GB/s figures are 10^9 bytes per second.";

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
    let _ = log::set_logger(&StderrLog).map(|()| log::set_max_level(log::LevelFilter::Info));
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = match argv.first().map(String::as_str) {
        Some("bench") => args::Args::parse(&argv[1..]).and_then(|a| bench::run(&a)),
        Some("gen") => args::Args::parse(&argv[1..]).and_then(|a| gen::run(&a)),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stagefs-reader: {e}");
            ExitCode::FAILURE
        }
    }
}
