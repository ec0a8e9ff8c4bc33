//! The short commands: status and index (umount lives in `node/umount.rs`: `run` unmounts too).

use stagefs_archive::escape::Shown;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::control::{self, Request, Verb};
use crate::error::Failure;
use crate::mountpoint;
pub use crate::node::umount;
use stagefs_open::open::Indexing;
use stagefs_open::registry;
use stagefs_open::report;
use stagefs_open::OpenOptions;

/// `stagefs add`: the shards `specs` name (archives, patterns, lists) join the growing set
/// mounted at `mountpoint`. The daemon checks their owners (unless `trust`).
pub fn add(mountpoint: &Path, specs: &[std::path::PathBuf], trust: bool, timeout: Duration) -> Result<(), Failure> {
    let mountpoint = mountpoint::resolve(mountpoint)?;
    let mut paths = Vec::new();
    for spec in specs {
        // As named, links not followed: the daemon opens them, judging every link on the way.
        paths.extend(stagefs_open::shards::expand(spec, trust)?);
    }
    let request = Request { verb: Verb::Add, trust, paths };
    println!("{}", control::ask(&mountpoint, &request, timeout)?);
    Ok(())
}

/// `stagefs remove`: the shards at `paths` leave the growing set mounted at `mountpoint`.
pub fn remove(mountpoint: &Path, paths: &[std::path::PathBuf], timeout: Duration) -> Result<(), Failure> {
    let mountpoint = mountpoint::resolve(mountpoint)?;
    let absolute = |p: &std::path::PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let request = Request { verb: Verb::Remove, trust: false, paths: paths.iter().map(absolute).collect() };
    println!("{}", control::ask(&mountpoint, &request, timeout)?);
    Ok(())
}

/// `stagefs status`: this user's mounts on this node, one line each (or one JSON object
/// each with `json`), dead mounts (their daemon was killed) included with how to clear them.
pub fn status(json: bool) -> Result<(), Failure> {
    // Every daemon writes its counters within one refresh: waiting that long first makes
    // the numbers count every read served before `status` ran.
    if !registry::list()?.is_empty() {
        std::thread::sleep(crate::daemon::RECORD_REFRESH + Duration::from_millis(50));
    }
    let records = registry::list()?;
    // A stagefs mount without a record is dead only if it does not answer: a record can
    // be out of sight (a runtime directory this shell does not know). statfs always
    // reaches the daemon (stat may be answered from the kernel's attribute cache), and a
    // dead daemon's mount answers it with ENOTCONN.
    let (unrecorded, dead): (Vec<_>, Vec<_>) = mountpoint::stagefs_mounts_of(stagefs_open::places::my_uid())
        .into_iter()
        .filter(|m| !records.iter().any(|r| &r.mountpoint == m))
        .partition(|m| nix::sys::statvfs::statvfs(m).is_ok());
    if json {
        for r in &records {
            println!("{}", status_json(r));
        }
        for (mounts, state) in [(&unrecorded, "live"), (&dead, "dead")] {
            for m in mounts {
                println!("{}", serde_json::json!({ "mountpoint": m.to_string_lossy(), "state": state }));
            }
        }
        return Ok(());
    }
    if records.is_empty() && dead.is_empty() && unrecorded.is_empty() {
        println!("no stagefs mounts for this user on this node");
        return Ok(());
    }
    println!(
        "{:<40} {:<16} {:>10} {:>8} {:>9} {:>10} {:>7}  ARCHIVE",
        "MOUNTPOINT", "SERVED", "RAM", "PID", "UPTIME", "READ REQS", "ERRORS"
    );
    for r in records {
        let up = registry::now().saturating_sub(r.started);
        let archive = match &r.shards {
            Some(shards) => {
                format!("{} (growing: {} shard{} now)", r.archive.shown(), shards.len(), plural(shards.len()))
            }
            None => r.archive.shown().to_string(),
        };
        println!(
            "{:<40} {:<16} {:>10} {:>8} {:>9} {:>10} {:>7}  {archive}",
            r.mountpoint.shown(),
            served(&r),
            report::human(r.ram_bytes()),
            r.pid,
            format!("{}:{:02}:{:02}", up / 3600, up / 60 % 60, up % 60),
            r.reads,
            r.errors,
        );
        if let Some(dir) = &r.stage_dir {
            println!(
                "    staged to the local disk: {} in {} (a nameless file, gone with the mount)",
                report::human(r.disk_bytes),
                dir.shown()
            );
        }
        if let Some(shards) = &r.shards {
            const SHOWN: usize = 10;
            for shard in shards.iter().take(SHOWN) {
                println!("    shard: {}", shard.shown());
            }
            if shards.len() > SHOWN {
                println!("    ... and {} more shards (stagefs status --json lists them all)", shards.len() - SHOWN);
            }
        }
        if let Some(progress) = &r.staging_progress {
            println!("    staging: {}", staging_words(progress));
        }
        if let Some(last) = &r.last_error {
            println!("    last error: {}", stagefs_archive::escape::sanitize(last));
        }
    }
    for m in unrecorded {
        println!(
            "{:<40} LIVE: it answers, but its daemon's record is in no runtime directory this shell knows \
             (set STAGEFS_RUNTIME_DIR as in the shell that mounted it to see its numbers)",
            m.shown()
        );
    }
    for m in dead {
        println!(
            "{:<40} DEAD: its daemon is gone and reads fail; clear it with `stagefs umount {}`",
            m.shown(),
            m.shown()
        );
    }
    Ok(())
}

/// Where a mount's background staging stands, in words.
fn staging_words(p: &registry::StagingProgress) -> String {
    let of = |verb: &str| {
        let percent = (p.done_bytes as f64 * 100.0 / p.total_bytes.max(1) as f64).min(100.0);
        format!("{verb} {} of {} ({percent:.0} %)", report::human(p.done_bytes), report::human(p.total_bytes))
    };
    match p.state.as_str() {
        "copying" => of("copying the archive:") + "; reads of the rest are served from the archive in place",
        "warming" => of("warming the page cache:"),
        "done" => format!("done ({}); `stagefs wait --staged` returns at once", report::human(p.total_bytes)),
        _ => {
            format!("FAILED: {}", stagefs_archive::escape::sanitize(p.error.as_deref().unwrap_or("no reason recorded")))
        }
    }
}

/// How a mount is served, in a few words: in RAM (its files in the page cache, or a
/// private copy), on the local disk, or in place; a compressed tar decoded piece by piece.
fn served(r: &registry::Record) -> String {
    let how = match r.staging.as_str() {
        "ram" | "page cache" => "RAM",
        "copy" => "RAM copy",
        "local disk" => "local disk",
        _ => "in place",
    };
    match &r.compressed {
        Some(codec) => format!("{how}, {codec}"),
        None => how.to_string(),
    }
}

/// One mount as `stagefs status --json` prints it, its fields in this order.
#[derive(serde::Serialize)]
struct StatusLine<'a> {
    mountpoint: String,
    archive: String,
    state: &'static str,
    pid: u32,
    started: u64,
    staging: &'a str,
    served: String,
    compressed: Option<&'a str>,
    staged_bytes: u64,
    warmed_bytes: u64,
    rss_bytes: u64,
    private_bytes: u64,
    ram_bytes: u64,
    disk_bytes: u64,
    stage_dir: Option<String>,
    read_requests: u64,
    reads: u64,
    errors: u64,
    last_error: Option<&'a str>,
    staging_progress: Option<&'a registry::StagingProgress>,
    shards: Option<Vec<String>>,
    shard_count: Option<usize>,
}

fn status_json(r: &registry::Record) -> String {
    let text = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let line = StatusLine {
        mountpoint: text(&r.mountpoint),
        archive: text(&r.archive),
        state: "live",
        pid: r.pid,
        started: r.started,
        staging: &r.staging,
        served: served(r),
        compressed: r.compressed.as_deref(),
        staged_bytes: r.staged_bytes,
        warmed_bytes: r.warmed_bytes,
        rss_bytes: r.rss_bytes,
        private_bytes: r.private_bytes,
        ram_bytes: r.ram_bytes(),
        disk_bytes: r.disk_bytes,
        stage_dir: r.stage_dir.as_deref().map(text),
        read_requests: r.reads,
        reads: r.reads,
        errors: r.errors,
        last_error: r.last_error.as_deref(),
        staging_progress: r.staging_progress.as_ref(),
        shards: r.shards.as_ref().map(|s| s.iter().map(|p| text(p)).collect()),
        shard_count: r.shards.as_ref().map(Vec::len),
    };
    serde_json::to_string(&line).unwrap_or_default()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `stagefs index`: builds and saves an archive's index ahead of time (on a login node).
pub fn index(path: &Path, trust_shards: bool, indexing: Indexing, stats: bool) -> Result<(), Failure> {
    let started = Instant::now();
    let indexing = Indexing { force_save: true, ..indexing };
    // Saved indexes are keyed by the canonical path, which is what mounts look up.
    let set = stagefs_open::shards::resolve(path, &[], trust_shards)?;
    let opened = stagefs_open::open(&set, OpenOptions::default().indexing(indexing))?;
    if let Some(set_stats) = &opened.set {
        let index = &opened.archive.index;
        println!(
            "indexed {} shards in {:.2} s: {} entries, {} merged ({} bytes per entry); saved {} indexes \
             (SquashFS shards carry their own)",
            set_stats.shards,
            started.elapsed().as_secs_f64(),
            index.entry_count(),
            report::human(index_bytes(index)),
            index_bytes(index) / index.entry_count().max(1) as u64,
            set_stats.saved
        );
        if stats {
            crate::listing::print_stats(&opened);
        }
        return Ok(());
    }
    let path = set.label;
    let index = &opened.archive.index;
    let entries = index.entry_count();
    let saved = match &opened.saved_index {
        Some(saved) => format!("saved to {}", saved.shown()),
        None => format!("nothing to save: a {:?} archive carries its own index", opened.archive.format),
    };
    println!(
        "indexed {} in {:.2} s: {entries} entries, index of {} ({} bytes per entry); {saved}",
        path.shown(),
        started.elapsed().as_secs_f64(),
        report::human(index_bytes(index)),
        index_bytes(index) / entries.max(1) as u64
    );
    if stats {
        crate::listing::print_stats(&opened);
    }
    Ok(())
}

/// Bytes of an index, in the heap or mapped.
fn index_bytes(index: &stagefs_archive::index::Index) -> u64 {
    let memory = index.memory();
    memory.heap + memory.mapped
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(super::json_string("a\"b\\c\nd"), r#""a\"b\\c\u000ad""#);
    }
}
