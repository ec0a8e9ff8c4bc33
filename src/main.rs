//! The `stagefs` command: parse arguments, run the command, exit with a code scripts can rely on.

use std::process::ExitCode;

use clap::Parser;
use stagefs::cli::{default_threads, Cli, Command};
use stagefs::commands;
use stagefs::daemon::MountRequest;
use stagefs::error::Failure;
use stagefs::node;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, message }) => {
            eprintln!("stagefs: error: {message}");
            ExitCode::from(code)
        }
    }
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Mount { archive, mountpoint, foreground, threads, log_file, stage, max_ram, warm, idle_timeout } => {
            let mountpoint = mountpoint.unwrap_or_else(|| stagefs::places::default_mountpoint(&archive));
            let request = MountRequest {
                archive,
                mountpoint,
                foreground,
                threads: threads.unwrap_or_else(default_threads),
                log_file,
                stage,
                max_ram,
                warm,
            };
            node::mount(&request, node::DEFAULT_WAIT, idle_timeout)?;
            if !foreground {
                // So that `MNT=$(stagefs mount data.tar)` works, also for the default mountpoint.
                println!("{}", stagefs::mountpoint::resolve(&request.mountpoint)?.display());
            }
            Ok(())
        }
        Command::Run(args) => {
            let code = args.execute()?;
            std::process::exit(code.into())
        }
        Command::Wait(args) => args.execute(),
        Command::Umount { mountpoint, lazy } => commands::umount(&mountpoint, lazy),
        Command::Status { json } => commands::status(json),
        Command::Index { archive } => commands::index(&archive),
        Command::Demo { files, readers, dir } => stagefs::demo::run(files, readers, dir),
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
