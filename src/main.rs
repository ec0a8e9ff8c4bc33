//! The `stagefs` command: parse arguments, run the command, exit with a code scripts can rely on.

use std::process::ExitCode;

use clap::Parser;
use stagefs::cli::{default_threads, Cli, Command};
use stagefs::commands;
use stagefs::daemon::MountRequest;
use stagefs::error::Failure;
use stagefs::node;

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| usage_error(e));
    // A daemon forked by these commands writes its log to a file: no colour codes there.
    let forks_daemon =
        matches!(cli.command, Command::Mount { foreground: false, .. } | Command::Run(_) | Command::Demo { .. });
    init_logging(cli.verbose, !forks_daemon);
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
        Command::Mount {
            archive,
            mountpoint,
            foreground,
            threads,
            log_file,
            stage,
            stage_dir,
            max_ram,
            warm,
            broadcast,
            broadcast_fallback,
            idle_timeout,
            json,
            more_archives,
            trust_shards,
        } => {
            if let Some(mountpoint) = &mountpoint {
                stagefs::shards::check_not_an_archive(mountpoint)?;
            }
            let mountpoint = mountpoint.unwrap_or_else(|| stagefs::shards::default_mountpoint(&archive));
            // A failure here (a mistyped ARCHIVE) is published for the mountpoint, so that
            // `stagefs wait` there fails at once with it instead of waiting for a mount.
            let published = |f: Failure| {
                node::publish_failure(&mountpoint, &f);
                f
            };
            let broadcast = match broadcast {
                true => stagefs::broadcast::plan(&archive, stage, stage_dir.as_deref(), broadcast_fallback)
                    .map_err(published)?,
                false => None,
            };
            let set = stagefs::shards::resolve(&archive, &more_archives, trust_shards).map_err(published)?;
            let request = MountRequest {
                archive: set.label,
                shards: set.shards,
                mountpoint,
                foreground,
                threads: threads.unwrap_or_else(default_threads),
                log_file,
                stage,
                stage_dir,
                max_ram,
                warm,
                broadcast,
            };
            // `--idle-timeout 0` means what "no timeout" means elsewhere, not "unmount at once".
            let idle_timeout = idle_timeout.filter(|t| !t.is_zero());
            let mounted = node::mount(&request, node::DEFAULT_WAIT, idle_timeout)?;
            let job = node::SlurmTask::from_env().job.filter(|j| !j.is_empty());
            if let (true, false, Some(job)) = (mounted, foreground, job) {
                // The detached daemon is no process of the job's steps: where SLURM's
                // proctrack does not kill escaped processes (proctrack/linuxproc), it and its
                // mount outlive the job.
                eprintln!(
                    "stagefs: note: this detached mount is not tied to SLURM job {job}: unmount it with `stagefs umount {}` \
                     before the job ends (a bash `trap ... EXIT`), or let `stagefs run ARCHIVE -- CMD` mount it for \
                     CMD's lifetime",
                    request.mountpoint.display()
                );
            }
            if !foreground {
                // So that `MNT=$(stagefs mount data.tar)` works, also for the default mountpoint.
                let mountpoint = stagefs::mountpoint::resolve(&request.mountpoint)?;
                if json {
                    let path = stagefs::commands::json_string(&mountpoint.to_string_lossy());
                    println!("{{\"mountpoint\":{path},\"mounted\":{mounted}}}");
                } else {
                    println!("{}", mountpoint.display());
                }
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
        Command::Index { archive, trust_shards } => commands::index(&archive, trust_shards),
        Command::Pack(args) => args.execute(),
        Command::Demo { files, readers, dir, keep } => stagefs::demo::run(files, readers, dir, keep),
    }
}

/// Prints clap's error and exits 2 (0 for --help and --version); `stagefs run` without `--`
/// also says where the command goes, since clap only sees an unexpected argument.
fn usage_error(error: clap::Error) -> ! {
    use clap::error::ErrorKind;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let subcommand = args.iter().find(|a| !a.to_string_lossy().starts_with('-'));
    let is_run = subcommand.is_some_and(|a| a == "run");
    let without_separator = !args.iter().any(|a| a == "--");
    let stray = matches!(error.kind(), ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument);
    if is_run && without_separator && stray {
        let _ = error.print();
        eprintln!(
            "\nstagefs run: put the command after `--`, e.g.\n  stagefs run data.tar -- python train.py --data-root '{{mount}}'"
        );
        std::process::exit(stagefs::error::code::USAGE.into());
    }
    // `stagefs mount shards/*.tar` unquoted: the shell passes every match, and clap sees
    // a third positional argument.
    let is_mount = subcommand.is_some_and(|a| a == "mount");
    let archives = args.iter().filter(|a| stagefs::shards::check_not_an_archive(std::path::Path::new(a)).is_err());
    if is_mount && error.kind() == ErrorKind::UnknownArgument && archives.count() >= 2 {
        let _ = error.print();
        eprintln!(
            "\nstagefs mount: several archives were given: the shell expanded an unquoted pattern. Quote it so \
             that stagefs reads it (stagefs mount 'shards/*.tar' MOUNTPOINT), or name each extra archive with \
             --archive"
        );
        std::process::exit(stagefs::error::code::USAGE.into());
    }
    error.exit()
}

fn init_logging(verbose: u8, colour: bool) {
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
        .with_ansi(colour && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
