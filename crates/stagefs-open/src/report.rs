//! Words and bars for people: sizes (`1.5 GiB`, `8G`), progress bars on long work, and the one-line summary each long step leaves.

use stagefs_archive::escape::Shown;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle, WeakProgressBar};

thread_local! {
    /// Set on the threads that open the shards of a set (the set draws one progress bar and
    /// writes one summary, not one per shard), and by the Python module.
    static QUIET: std::cell::Cell<Quiet> = const { std::cell::Cell::new(Quiet { bars: false, lines: false }) };
}

/// What this thread keeps off stderr.
#[derive(Clone, Copy)]
struct Quiet {
    /// Progress bars.
    bars: bool,
    /// Summary and notice lines (they still go to the log, tracing).
    lines: bool,
}

/// Runs `f` with no per-archive progress bar, summary or notice line on this thread's
/// stderr: they go to the log (tracing) only (a set's shards).
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    with_quiet(Quiet { bars: true, lines: true }, f)
}

/// Runs `f` with its summary and notice lines in the log only (the Python module hands the
/// log to Python's `logging`); progress bars are drawn when `bars` (on a terminal).
pub fn lines_to_log<T>(bars: bool, f: impl FnOnce() -> T) -> T {
    with_quiet(Quiet { bars: !bars, lines: true }, f)
}

fn with_quiet<T>(quiet: Quiet, f: impl FnOnce() -> T) -> T {
    let before = QUIET.with(|q| q.replace(quiet));
    let result = f();
    QUIET.with(|q| q.set(before));
    result
}

/// The bar drawn last: [`notice`] prints its lines above it (a line printed under
/// indicatif's feet is erased at the bar's next redraw).
static DRAWN: std::sync::Mutex<Option<WeakProgressBar>> = std::sync::Mutex::new(None);

/// A progress bar for `len` bytes (a spinner when the length is unknown); hidden inside
/// [`quietly`], and drawn by indicatif only when stderr is a terminal.
pub fn progress(len: Option<u64>, verb: &str) -> ProgressBar {
    if QUIET.with(|q| q.get().bars) {
        return ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = match len {
        Some(len) => ProgressBar::new(len).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec}").expect("valid template"),
        ),
    };
    let bar = bar.with_message(verb.to_string());
    *DRAWN.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.downgrade());
    bar
}

/// A line for the person waiting on a terminal, from any thread (a failed try that will be
/// tried again): above the progress bar if one is drawn. Where stderr is no terminal (a
/// job's output, a daemon's log file) it goes to the log at info level instead.
pub fn notice(line: &str) {
    if QUIET.with(|q| q.get().lines) || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        tracing::info!("{line}");
        return;
    }
    let drawn = DRAWN.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(WeakProgressBar::upgrade);
    match drawn.filter(|bar| !bar.is_finished()) {
        Some(bar) => bar.suspend(|| eprintln!("stagefs: {line}")),
        None => eprintln!("stagefs: {line}"),
    }
}

/// "`verb` PATH into RAM: SIZE in S s (R MB/s)", as a summary (a debug line inside [`quietly`]).
pub fn summary(verb: &str, path: &Path, bytes: u64, started: Instant) {
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let line = format!(
        "{verb} {} into RAM: {} in {secs:.2} s ({:.0} MB/s)",
        path.shown(),
        human(bytes),
        bytes as f64 / 1e6 / secs
    );
    if QUIET.with(|q| q.get().bars) {
        tracing::debug!("{line}");
    } else {
        report_done(&line);
    }
}

/// The one line a long step leaves behind: in the log, and on stderr where no progress
/// bar was drawn (a job's output file), so a slow mount explains itself.
pub fn report_done(line: &str) {
    tracing::info!("{line}");
    if !QUIET.with(|q| q.get().lines) && !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!("stagefs: {line}");
    }
}

/// Sizes for people: 1.5 GiB, 12.0 MiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A size that does not parse (the text trimmed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("not a size: {text:?} (try 8G or 512M)")]
    NotASize { text: String },
    #[error("unknown size unit {unit:?} in {text:?} (use K, M, G or T)")]
    UnknownUnit { unit: String, text: String },
}

/// Parses sizes like `8G`, `512M`, `1.5T`, `1000000` (bytes); binary units.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| SizeError::NotASize { text: text.to_owned() })?;
    let scale = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => return Err(SizeError::UnknownUnit { unit: other.to_owned(), text: text.to_owned() }),
    };
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("42").unwrap(), 42);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").is_err());
        assert_eq!(parse_size(" lots ").unwrap_err().to_string(), "not a size: \"lots\" (try 8G or 512M)");
        assert_eq!(parse_size("5X").unwrap_err().to_string(), "unknown size unit \"X\" in \"5X\" (use K, M, G or T)");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
    }
}
