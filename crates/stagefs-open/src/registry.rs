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
///
/// Stored as JSON: its fields hold text from outside (an archive's path, a shard pattern,
/// an error message quoting a member name), and a format with quoting is one that such
/// text cannot extend with a line of its own (a path holding `\nmountpoint=...`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
// A field added later reads as its default in a record of an older daemon's.
#[serde(default)]
pub struct Record {
    pub pid: u32,
    #[serde(with = "path_json")]
    pub archive: PathBuf,
    #[serde(with = "path_json")]
    pub mountpoint: PathBuf,
    pub started: u64,
    /// Bytes of the archive held in a private copy in RAM (`--stage copy`, compressed tars).
    pub staged_bytes: u64,
    /// How the archive reaches RAM: "ram" (its files in the page cache), "copy" (a private
    /// copy), "local disk" or "in place".
    pub staging: String,
    /// The compression a tar served in place is decoded from piece by piece ("gzip"...).
    pub compressed: Option<String>,
    /// The daemon's resident memory, refreshed with the counters (it holds the pages of a
    /// staged memfd it touched: see [`Record::ram_bytes`]).
    pub rss_bytes: u64,
    /// The private part of it (RssAnon): the index, caches, buffers.
    pub private_bytes: u64,
    /// Bytes the warm-up put into the page cache when mounting (0: not warmed).
    pub warmed_bytes: u64,
    /// Bytes staged to the local disk (`--stage disk`), and the directory holding them.
    pub disk_bytes: u64,
    #[serde(with = "path_json::option")]
    pub stage_dir: Option<PathBuf>,
    /// FUSE read requests the daemon served, refreshed every few seconds (reads the
    /// kernel's page cache answers never reach it: this is no count of files read).
    pub reads: u64,
    /// Failures served (EIO) and the last one, refreshed soon after each.
    pub errors: u64,
    pub last_error: Option<String>,
    /// The shards a growing set serves now, in the order they win (refreshed as it
    /// changes); `None` for a mount whose content is fixed.
    #[serde(with = "path_json::option_list")]
    pub shards: Option<Vec<PathBuf>>,
    /// The directories made for this mount (mountpoint included), outermost first, which
    /// the daemon removes on exit: after a `kill -9`, `stagefs umount` removes them.
    #[serde(with = "path_json::list")]
    pub created: Vec<PathBuf>,
    /// Where the staging that goes on after the mount is ready stands (the copy, then the
    /// page-cache warm-up); `None` when there is none.
    pub staging_progress: Option<StagingProgress>,
    /// The directory of the archive shown as the mount's root (`--prefix`): where a path
    /// in the mount lies in the archive.
    #[serde(default, with = "path_json::option")]
    pub prefix: Option<PathBuf>,
}

/// The progress of a mount's background staging, as recorded (see `stage::Progress`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StagingProgress {
    /// "copying", "warming", "done" or "failed".
    pub state: String,
    /// Bytes of the current phase done, of `total_bytes`.
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Why it failed.
    pub error: Option<String>,
}

impl Record {
    /// The RAM the mount holds, each byte counted once: the daemon's private memory, its
    /// staged copy (a memfd: RAM whether mapped or not) and the page cache its warm-up
    /// filled. (The resident size would count the copy twice: its touched pages are in it.)
    pub fn ram_bytes(&self) -> u64 {
        self.private_bytes + self.staged_bytes + self.warmed_bytes
    }
}

/// Paths in JSON: a string when they are UTF-8, else the array of their bytes, so that any
/// path round-trips exactly (a directory to remove must be the very one that was made).
mod path_json {
    use std::os::unix::ffi::OsStringExt;
    use std::path::{Path, PathBuf};

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(untagged)]
    enum Json {
        Text(String),
        Bytes(Vec<u8>),
    }

    fn to_json(path: &Path) -> Json {
        match path.to_str() {
            Some(text) => Json::Text(text.to_owned()),
            None => Json::Bytes(path.as_os_str().as_encoded_bytes().to_vec()),
        }
    }

    fn from_json(json: Json) -> PathBuf {
        match json {
            Json::Text(text) => text.into(),
            Json::Bytes(bytes) => std::ffi::OsString::from_vec(bytes).into(),
        }
    }

    pub fn serialize<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&to_json(path), s)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        <Json as serde::Deserialize>::deserialize(d).map(from_json)
    }

    pub mod option {
        use super::*;
        pub fn serialize<S: serde::Serializer>(path: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
            serde::Serialize::serialize(&path.as_deref().map(to_json), s)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
            <Option<Json> as serde::Deserialize>::deserialize(d).map(|j| j.map(from_json))
        }
    }

    pub mod option_list {
        use super::*;
        pub fn serialize<S: serde::Serializer>(paths: &Option<Vec<PathBuf>>, s: S) -> Result<S::Ok, S::Error> {
            serde::Serialize::serialize(&paths.as_ref().map(|p| p.iter().map(|p| to_json(p)).collect::<Vec<_>>()), s)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<PathBuf>>, D::Error> {
            <Option<Vec<Json>> as serde::Deserialize>::deserialize(d)
                .map(|j| j.map(|j| j.into_iter().map(from_json).collect()))
        }
    }

    pub mod list {
        use super::*;
        pub fn serialize<S: serde::Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
            serde::Serialize::serialize(&paths.iter().map(|p| to_json(p)).collect::<Vec<_>>(), s)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
            <Vec<Json> as serde::Deserialize>::deserialize(d).map(|j| j.into_iter().map(from_json).collect())
        }
    }
}

fn record_path(mountpoint: &Path) -> Result<PathBuf, PlaceError> {
    places::mountpoint_file(mountpoint, "mount")
}

pub fn write(record: &Record) -> std::io::Result<()> {
    let path = record_path(&record.mountpoint).map_err(std::io::Error::other)?;
    let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    places::write_atomically(&path, &text, 0o600)
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
        .filter_map(|dir| parse_any(&read_record(&dir.join(name))?))
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
        .filter_map(|e| parse(&read_record(&e.path())?))
        .collect();
    records.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    records.dedup_by(|a, b| a.mountpoint == b.mountpoint);
    Ok(records)
}

/// Parses a record; `None` if malformed or its daemon is gone.
fn parse(text: &str) -> Option<Record> {
    parse_any(text).filter(|r| process_alive(r.pid))
}

/// A record file's text (a few KiB; a growing set of 100,000 shards lists them: 64 MiB is
/// no record).
fn read_record(path: &Path) -> Option<String> {
    String::from_utf8(places::read_own(path, 64 << 20)?).ok()
}

/// Parses a record, alive or not.
fn parse_any(text: &str) -> Option<Record> {
    serde_json::from_str(text).ok()
}

/// Deletes the records in `dir` of daemons that died without removing their own (SIGKILL),
/// once their mount is gone too: while the dead mount is still there, `stagefs umount`
/// needs the record to remove what the daemon made (directories, the staging directory).
/// `still_mounted`: whether a stagefs mount of this user's is still at a mountpoint.
pub fn sweep_dead_in(dir: &Path, still_mounted: impl Fn(&Path) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "mount")) {
        let record = read_record(&path).and_then(|text| parse_any(&text));
        let needed = record.is_some_and(|r| process_alive(r.pid) || still_mounted(&r.mountpoint));
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
            shards: Some(vec!["/s/1.tar".into(), "/s/2.tar".into()]),
            compressed: Some("gzip".into()),
            rss_bytes: 1 << 20,
            private_bytes: 1 << 19,
            created: vec!["/some/where".into(), mountpoint.clone()],
            staging_progress: Some(StagingProgress {
                state: "failed".into(),
                done_bytes: 3,
                total_bytes: 7,
                error: Some("changed".into()),
            }),
            prefix: Some("train/\nimages".into()),
        };
        write(&mine).unwrap();
        assert_eq!(read(&mountpoint), Some(mine.clone()));
        assert_eq!(read(Path::new("/other")), None);
        assert!(list().unwrap().contains(&mine));
        write(&Record { pid: u32::MAX - 1, ..mine.clone() }).unwrap();
        assert_eq!(read(&mountpoint), None, "a dead pid's record is ignored");
        assert_eq!(read_any(&mountpoint), Some(Record { pid: u32::MAX - 1, ..mine.clone() }), "unless asked for");
        // Text from outside cannot add a record or a field of its own.
        let forged = PathBuf::from("/x\npid=1\nmountpoint=/fake\nstage_dir=/home/fake-stage\n\u{1b}[2J");
        let odd = Record { archive: forged.clone(), last_error: Some("a\nmountpoint=/m".into()), ..mine.clone() };
        write(&odd).unwrap();
        let back = read(&mountpoint).unwrap();
        assert_eq!(
            (back.archive, back.mountpoint, back.stage_dir),
            (forged, mountpoint.clone(), mine.stage_dir.clone())
        );
        // A path that is not UTF-8 round-trips exactly.
        let bytes =
            PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(b"/d\xff/x".to_vec()));
        write(&Record { created: vec![bytes.clone()], ..mine.clone() }).unwrap();
        assert_eq!(read(&mountpoint).unwrap().created, [bytes]);
        assert_eq!(parse_any("pid=1\narchive=/a\nmountpoint=/m\n"), None, "the old text format is no record");
        remove(&mountpoint);
        assert!(!record_path(&mountpoint).unwrap().exists());
    }
}
