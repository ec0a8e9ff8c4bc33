//! The `stagefs` command: parse arguments, run the command, exit with a code scripts can rely on.

use stagefs_archive::escape::Shown;
use std::process::ExitCode;

mod argv;

use clap::Parser;
use stagefs::cli::{Cli, Command};
use stagefs::commands;
use stagefs::error::Failure;
use stagefs::node;

fn main() -> ExitCode {
    // Copied first: `ps` shows the original memory, whose secrets are then overwritten.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    argv::hide_secrets();
    let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| usage_error(e, &args));
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
        Command::Mount { archive, mountpoint, foreground, options, idle_timeout, json } => {
            let archive = archive_or_stdin(archive)?;
            if let Some(mountpoint) = &mountpoint {
                stagefs_open::shards::check_not_an_archive(mountpoint)?;
            }
            let mountpoint = mountpoint.unwrap_or_else(|| stagefs::options::default_mountpoint(&archive));
            // A failure here (a mistyped ARCHIVE) is published for the mountpoint, so that
            // `stagefs wait` there fails at once with it instead of waiting for a mount.
            let published = |f: Failure| {
                node::publish_failure(&mountpoint, &f);
                f
            };
            let request = options.request(&archive, mountpoint.clone(), foreground).map_err(published)?;
            // `--idle-timeout 0` means what "no timeout" means elsewhere, not "unmount at once".
            let idle_timeout = idle_timeout.filter(|t| !t.is_zero());
            let task = node::SlurmTask::from_env();
            // Mounted from a job's batch script (the README's first example): the daemon
            // unmounts when the job's batch step ends, even where SLURM's proctrack lets
            // escaped processes live on (proctrack/linuxproc).
            let job_step = task.job_lifetime_process().filter(|_| !foreground);
            stagefs::daemon::watch::set_owner(job_step);
            let mounted = node::mount(&request, node::DEFAULT_WAIT, idle_timeout)?;
            if let (true, false, Some(job)) = (mounted, foreground, task.job.as_deref()) {
                match job_step {
                    Some(_) => tracing::info!(
                        "tied to SLURM job {job}: {} is unmounted when the job ends",
                        request.mountpoint.shown()
                    ),
                    // An srun step's detached daemon is no process of the job's steps:
                    // where proctrack does not kill escaped processes, it and its mount
                    // outlive the job.
                    None => eprintln!(
                        "stagefs: note: this detached mount is not tied to SLURM job {job}: unmount it with `stagefs \
                         umount {}` before the job ends (a bash `trap ... EXIT`), or let `stagefs run ARCHIVE -- CMD` \
                         mount it for CMD's lifetime",
                        request.mountpoint.shown()
                    ),
                }
            }
            if !foreground {
                // So that `MNT=$(stagefs mount data.tar)` works, also for the default mountpoint.
                let mountpoint = &request.mountpoint;
                if json {
                    let path = stagefs::commands::json_string(&mountpoint.to_string_lossy());
                    println!("{{\"mountpoint\":{path},\"mounted\":{mounted}}}");
                } else {
                    println!("{}", mountpoint.shown());
                }
            }
            Ok(())
        }
        Command::Run(args) => {
            let code = args.execute()?;
            std::process::exit(code.into())
        }
        Command::Wait(args) => args.execute(),
        Command::ReapFailure { lock, at_ms } => {
            node::reap_failure(&lock, at_ms);
            Ok(())
        }
        Command::Umount { mountpoint, lazy } => commands::umount(&mountpoint, lazy),
        Command::Add { mountpoint, shards, trust_shards, timeout } => {
            commands::add(&mountpoint, &shards, trust_shards, timeout)
        }
        Command::Remove { mountpoint, shards, timeout } => commands::remove(&mountpoint, &shards, timeout),
        Command::Status { json } => {
            quiet_broken_pipe();
            commands::status(json)
        }
        Command::Index {
            archive,
            trust_shards,
            recursive,
            recursion_depth,
            index_dir,
            print_stats,
            upload,
            remote,
        } => {
            stagefs_open::remote::configure(&remote)?;
            let depth = stagefs_open::open::nesting_depth(recursive, recursion_depth);
            let indexing = stagefs_open::open::Indexing { depth, index_dir, ..Default::default() };
            match stagefs_open::remote::is_url(&archive) {
                true => {
                    let set = stagefs_open::remote::resolve(&archive, &[], false)?;
                    Ok(stagefs_open::remote::index_command(&set, &indexing, upload)?)
                }
                false if upload => Err(Failure::new(
                    stagefs::error::code::USAGE,
                    "--upload saves the index beside an object (s3:// or https://); a local archive's index is \
                     saved beside it anyway"
                        .into(),
                )),
                false => commands::index(&archive, trust_shards, indexing, print_stats),
            }
        }
        Command::Ls { archive, path, long, recursive, json, index_dir } => {
            quiet_broken_pipe();
            let style = stagefs::listing::Style { long, recursive, json };
            let indexing = stagefs_open::open::Indexing { index_dir, ..Default::default() };
            stagefs::listing::ls(&archive, path.as_deref(), style, indexing)
        }
        Command::Pack(args) => args.execute(),
        Command::Demo { files, readers, dir, keep } => stagefs::demo::run(files, readers, dir, keep),
    }
}

/// Prints clap's error and exits 2 (0 for --help and --version); `stagefs run` without `--`
/// also says where the command goes, since clap only sees an unexpected argument.
/// `-` for the archive: its path or URL is the first line of standard input, where no
/// other user can read it (a URL with a password or a signature stays out of `ps`).
fn archive_or_stdin(archive: std::path::PathBuf) -> Result<std::path::PathBuf, Failure> {
    if archive.as_os_str() != "-" {
        return Ok(archive);
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::new(stagefs::error::code::USAGE, format!("cannot read the archive from stdin: {e}")))?;
    let line = line.trim_end_matches(['\n', '\r']);
    if line.is_empty() {
        return Err(Failure::new(
            stagefs::error::code::USAGE,
            "ARCHIVE is `-`, but standard input holds no line naming it (echo \"$URL\" | stagefs mount - DIR)".into(),
        ));
    }
    Ok(std::path::PathBuf::from(line))
}

fn usage_error(error: clap::Error, args: &[std::ffi::OsString]) -> ! {
    use clap::error::ErrorKind;
    let args = args.get(1..).unwrap_or_default();
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
    let archives = args.iter().filter(|a| stagefs_open::shards::check_not_an_archive(std::path::Path::new(a)).is_err());
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
    // Every field, the message included, is escaped: whatever text from outside a log line
    // quotes (a name another user chose, a path), it stays one line and drives no terminal.
    use tracing_subscriber::field::MakeExt;
    let escaped = tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let text = stagefs_archive::escape::sanitize(&format!("{value:?}"));
        match field.name() {
            "message" => write!(writer, "{text}"),
            name => write!(writer, "{name}={text}"),
        }
    })
    .delimited(" ");
    let ansi = colour && std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A filter of its own, after the user's: no `RUST_LOG` can let the HTTP and TLS crates'
    // request dumps (credentials included) through.
    let no_request_dumps: tracing_subscriber::filter::Targets =
        stagefs_remote::LOG_FILTER.parse().expect("stagefs_remote::LOG_FILTER parses");
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .fmt_fields(escaped)
        .event_format(Lines { log: tracing_subscriber::fmt::format().with_target(false).with_ansi(ansi) })
        .with_writer(std::io::stderr)
        .finish()
        .with(no_request_dumps)
        .init();
}

/// Log lines as a reader meets them: on a terminal, `stagefs: warning: ...` like every other
/// message stagefs prints; in a log file (a detached daemon's), with time and level.
struct Lines<F> {
    log: F,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Lines<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return self.log.format_event(ctx, writer, event);
        }
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        write!(writer, "stagefs: {level}: ")?;
        tracing_subscriber::fmt::FormatFields::format_fields(ctx, writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// A listing piped into `head` ends quietly when the reader goes, as `ls` does, instead of
/// panicking on the failed write (only for commands that print lists: the daemon must
/// survive a control client that hangs up).
fn quiet_broken_pipe() {
    // SAFETY: restores the default disposition of one signal, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
