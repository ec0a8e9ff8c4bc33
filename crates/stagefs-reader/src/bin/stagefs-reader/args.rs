//! Command-line interface (clap derive, like the `stagefs` binary): every option with its default.

use clap::{Args, Parser, Subcommand};
use stagefs_reader::BackendChoice;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "stagefs-reader",
    version,
    about = "Benchmark the stagefs-reader pipeline (files -> pinned ring -> GPU) on a directory, or generate a test tree",
    after_help = "Sizes accept K, M, G suffixes (powers of 1024). GB/s figures are 10^9 bytes per second.

Examples:
  stagefs-reader gen /dev/shm/$USER/tree --files 20000
  stagefs-reader bench /dev/shm/$USER/tree --shuffle 1 --epochs 2 --baseline"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream every file of DIR through the loader; report files/s, GB/s and the H2D ceiling
    Bench(BenchArgs),
    /// Write a reproducible tree of random-sized files (100 per subdirectory)
    Gen(GenArgs),
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Directory to read (walked once, recursively, sorted)
    pub dir: PathBuf,
    /// Capacity of one ring slot = the largest batch
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// I/O threads issuing preads (default: the CPUs this process may use, cgroup quota included)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Ring slots: 2 is double buffering, 3 triple
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=1024))]
    pub depth: u64,
    /// Shuffle each epoch with this seed (default: directory order)
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
    /// Epochs to stream
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub epochs: usize,
    /// Where batches go: auto (CUDA when usable, else host), host, cuda
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// Full-slot uploads for the H2D bandwidth measurement
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub h2d_reps: usize,
    /// This process's rank (reads files rank, rank+world, ...)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rank: usize,
    /// Number of ranks sharing the files
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub world: u64,
    /// Also time a plain std::fs::read loop over the same files in the same order
    #[arg(long)]
    pub baseline: bool,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    /// Directory to write into (created)
    pub dir: PathBuf,
    /// Number of files
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub files: u64,
    /// Smallest file size
    #[arg(long, value_name = "SIZE", default_value = "20K", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest file size
    #[arg(long, value_name = "SIZE", default_value = "200K", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Seed of the sizes and contents
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse().map_err(|e: stagefs_reader::Error| e.to_string())
}

/// A size that does not parse: the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {text:?} as a size (e.g. 4096, 64K, 64M, 1G)")]
pub struct SizeError {
    pub text: String,
}

/// A number with an optional K/M/G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(|| SizeError { text: s.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("20k"), Ok(20 << 10));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("x").is_err());
        assert_eq!(parse_size("x").unwrap_err().to_string(), "cannot parse \"x\" as a size (e.g. 4096, 64K, 64M, 1G)");
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_equals_form_and_switches() {
        let cli = Cli::try_parse_from(["stagefs-reader", "bench", "/d", "--threads=4", "--baseline", "--shuffle", "7"])
            .unwrap();
        let Command::Bench(b) = cli.command else { panic!("not bench") };
        assert_eq!(b.dir, PathBuf::from("/d"));
        assert_eq!(b.threads, Some(4));
        assert_eq!(b.batch_bytes, 64 << 20);
        assert_eq!(b.shuffle, Some(7));
        assert!(b.baseline);
    }

    #[test]
    fn usage_errors_are_exit_code_2() {
        for argv in [
            vec!["stagefs-reader", "bench", "/d", "--depth", "1"],
            vec!["stagefs-reader", "bench", "/d", "--nope"],
            vec!["stagefs-reader", "bench"],
            vec!["stagefs-reader", "gen", "/d", "--min-bytes", "lots"],
        ] {
            let e = Cli::try_parse_from(&argv).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}");
        }
    }
}
