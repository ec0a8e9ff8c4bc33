//! Records of running daemons (pid, archive, mountpoint), one small file per mountpoint.
//!
//! They live in a node-local, per-user directory so that `umount` can wait for the
//! right daemon and `status` can list mounts; a daemon removes its record on exit, and
//! a record whose pid is gone is treated as absent, except by `stagefs umount` of a mount
//! whose daemon was killed: the record then says what to clear up.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::places::{self, PlaceError};

/// A running daemon as recorded at mount time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub pid: u32,
    pub archive: PathBuf,
    pub mountpoint: PathBuf,
    pub started: u64,
    /// Bytes of the archive held in a private copy in RAM (`--stage copy`, compressed tars).
    pub staged_bytes: u64,
    /// How the archive reaches RAM: "copy", "page cache" or "in place".
    pub staging: String,
    /// Bytes the warm-up put into the page cache when mounting (0: not warmed).
    pub warmed_bytes: u64,
    /// Bytes staged to the local disk (`--stage disk`), and the directory holding them.
    pub disk_bytes: u64,
    pub stage_dir: Option<PathBuf>,
    /// FUSE read requests served, refreshed by the daemon every few seconds.
    pub reads: u64,
    /// Failures served (EIO) and the last one, refreshed soon after each.
    pub errors: u64,
    pub last_error: Option<String>,
    /// The shards a growing set serves now (refreshed as it changes); `None` for a mount
    /// whose content is fixed.
    pub shards: Option<usize>,
    /// The directories made for this mount (mountpoint included), outermost first, which
    /// the daemon removes on exit: after a `kill -9`, `stagefs umount` removes them.
    pub created: Vec<PathBuf>,
}

fn record_path(mountpoint: &Path) -> Result<PathBuf, PlaceError> {
    places::mountpoint_file(mountpoint, "mount")
}

pub fn write(record: &Record) -> std::io::Result<()> {
    let path = record_path(&record.mountpoint).map_err(std::io::Error::other)?;
    let mut text = format!(
        "pid={}\narchive={}\nmountpoint={}\nstarted={}\nstaged_bytes={}\nstaging={}\nwarmed_bytes={}\nreads={}\nerrors={}\n",
        record.pid,
        record.archive.display(),
        record.mountpoint.display(),
        record.started,
        record.staged_bytes,
        record.staging,
        record.warmed_bytes,
        record.reads,
        record.errors
    );
    if record.disk_bytes > 0 {
        text += &format!("disk_bytes={}\n", record.disk_bytes);
    }
    if let Some(dir) = &record.stage_dir {
        text += &format!("stage_dir={}\n", dir.display());
    }
    if let Some(last) = &record.last_error {
        text += &format!("last_error={}\n", last.replace('\n', " "));
    }
    if let Some(shards) = record.shards {
        text += &format!("shards={shards}\n");
    }
    for dir in &record.created {
        text += &format!("created={}\n", dir.display());
    }
    places::write_atomically(&path, text.as_bytes(), 0o600)
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The record for `mountpoint`, if its daemon is still alive.
pub fn read(mountpoint: &Path) -> Option<Record> {
    read_any(mountpoint).filter(|r| process_alive(r.pid))
}

/// The record for `mountpoint`, also when its daemon is gone (killed: it left the record).
/// Looked up in every runtime directory of this user ([`places::runtime_dirs`]), a live
/// daemon's record first: the shell asking may not be the one that mounted.
pub fn read_any(mountpoint: &Path) -> Option<Record> {
    let path = record_path(mountpoint).ok()?;
    let name = path.file_name()?;
    let found: Vec<Record> = places::runtime_dirs()
        .iter()
        .filter_map(|dir| parse_any(&std::fs::read_to_string(dir.join(name)).ok()?))
        .filter(|r| r.mountpoint == mountpoint)
        .collect();
    let alive = found.iter().position(|r| process_alive(r.pid)).unwrap_or(0);
    found.into_iter().nth(alive)
}

/// Every live daemon of this user on this node, by mountpoint, from every runtime
/// directory of this user.
pub fn list() -> Result<Vec<Record>, PlaceError> {
    places::runtime_dir()?;
    let mut records: Vec<Record> = places::runtime_dirs()
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.path().extension().is_some_and(|x| x == "mount"))
        .filter_map(|e| parse(&std::fs::read_to_string(e.path()).ok()?))
        .collect();
    records.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    records.dedup_by(|a, b| a.mountpoint == b.mountpoint);
    Ok(records)
}

/// Parses a record; `None` if malformed or its daemon is gone.
fn parse(text: &str) -> Option<Record> {
    parse_any(text).filter(|r| process_alive(r.pid))
}

/// Parses a record, alive or not. Fields added later are optional, so that a newer
/// `stagefs status` still lists the mounts of an older daemon.
fn parse_any(text: &str) -> Option<Record> {
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('='));
    Some(Record {
        pid: field("pid")?.parse().ok()?,
        archive: field("archive")?.into(),
        mountpoint: field("mountpoint")?.into(),
        started: field("started")?.parse().ok()?,
        staged_bytes: field("staged_bytes")?.parse().ok()?,
        // Records of daemons from before staging was recorded still parse.
        staging: field("staging").unwrap_or("in place").to_string(),
        warmed_bytes: field("warmed_bytes").and_then(|w| w.parse().ok()).unwrap_or(0),
        disk_bytes: field("disk_bytes").and_then(|b| b.parse().ok()).unwrap_or(0),
        stage_dir: field("stage_dir").map(PathBuf::from),
        reads: field("reads")?.parse().ok()?,
        errors: field("errors").and_then(|e| e.parse().ok()).unwrap_or(0),
        last_error: field("last_error").map(str::to_owned),
        shards: field("shards").and_then(|n| n.parse().ok()),
        created: text.lines().filter_map(|l| l.strip_prefix("created=")).map(PathBuf::from).collect(),
    })
}

/// Deletes the records in `dir` of daemons that died without removing their own (SIGKILL),
/// once their mount is gone too: while the dead mount is still there, `stagefs umount`
/// needs the record to remove what the daemon made (directories, the staging directory).
pub fn sweep_dead_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let uid = places::my_uid();
    for path in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "mount")) {
        let record = std::fs::read_to_string(&path).ok().and_then(|text| parse_any(&text));
        let needed = record.is_some_and(|r| {
            process_alive(r.pid) || crate::mountpoint::mount_at(&r.mountpoint).is_some_and(|m| m.is_stagefs_of(uid))
        });
        if !needed {
            crate::places::remove_file(&path);
        }
    }
}

pub fn remove(mountpoint: &Path) {
    if let Ok(path) = record_path(mountpoint) {
        crate::places::remove_file(&path);
    }
}

/// True while `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_die_with_their_process() {
        // The runtime dir comes from the environment of this test process (set once, in
        // one test, before any other test of this binary touches it).
        let mountpoint = PathBuf::from(format!("/some/where/{}", std::process::id()));
        let mine = Record {
            pid: std::process::id(),
            archive: "/a.tar".into(),
            mountpoint: mountpoint.clone(),
            started: 5,
            staged_bytes: 7,
            staging: "copy".into(),
            warmed_bytes: 8,
            disk_bytes: 10,
            stage_dir: Some("/local/stagefs-0".into()),
            reads: 9,
            errors: 2,
            last_error: Some("/x: corrupt data at archive byte 5: bad".into()),
            shards: Some(12),
            created: vec!["/some/where".into(), mountpoint.clone()],
        };
        write(&mine).unwrap();
        assert_eq!(read(&mountpoint), Some(mine.clone()));
        assert_eq!(read(Path::new("/other")), None);
        assert!(list().unwrap().contains(&mine));
        write(&Record { pid: u32::MAX - 1, ..mine.clone() }).unwrap();
        assert_eq!(read(&mountpoint), None, "a dead pid's record is ignored");
        assert_eq!(read_any(&mountpoint), Some(Record { pid: u32::MAX - 1, ..mine }), "unless asked for");
        // A record from before errors and created were kept still parses.
        let old = parse_any(
            "pid=1\narchive=/a\nmountpoint=/m\nstarted=1\nstaged_bytes=0\nstaging=copy\nwarmed_bytes=0\nreads=3\n",
        )
        .unwrap();
        assert_eq!((old.disk_bytes, old.stage_dir), (0, None));
        assert_eq!((old.reads, old.errors, old.last_error, old.created.len()), (3, 0, None, 0));
        remove(&mountpoint);
        assert!(!record_path(&mountpoint).unwrap().exists());
    }
}
