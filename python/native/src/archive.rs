//! `stagefs.open`'s native half: an archive or shard set opened exactly as the daemon opens one, its tree and members served to Python in process, with no mount.

use crate::background;
use crate::errors::{open_error, MemberError, OpenFailure};
use crate::member::Member;
use crate::pybuf;
use crate::shared::Shared;
use crate::tree::{self, Described};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stagefs_archive::escape::Shown;
use stagefs_archive::index::InodeId;
use stagefs_open::open::{nesting_depth, Indexing};
use stagefs_open::remote::RemoteOptions;
use stagefs_open::shards;
use stagefs_open::stage::{StageMode, Staging};
use stagefs_open::OpenOptions;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How to open: the `stagefs mount` options that apply without a mount.
struct Options {
    mode: StageMode,
    max_ram: Option<u64>,
    stage_dir: Option<PathBuf>,
    recursive: bool,
    trust_shards: bool,
    remote: RemoteOptions,
}

/// Opens `spec` (an archive, a glob pattern, an `@list`, or an object's `s3://` or
/// `https://` URL, brace range or pattern) as `stagefs mount` does: the same trust rules,
/// client and credential chain, staging, saved indexes and scan.
fn open_spec(spec: &Path, o: &Options, stop: &AtomicBool) -> Result<Shared, OpenFailure> {
    if !stagefs_open::remote::is_url(spec) {
        return open_set(shards::resolve(spec, &[], o.trust_shards)?, o, stop);
    }
    // With the client of these options (another open may have used others).
    stagefs_open::remote::with_options(&o.remote, || {
        open_set(stagefs_open::remote::resolve(spec, &[], false)?, o, stop)
    })?
}

/// Opens the archives `set` names (one, or a shard set) as the daemon does.
fn open_set(set: stagefs_open::places::ArchiveSet, o: &Options, stop: &AtomicBool) -> Result<Shared, OpenFailure> {
    let indexing = Indexing { depth: nesting_depth(o.recursive, None), ..Indexing::default() };
    let options = OpenOptions::default()
        .stage(o.mode)
        .max_ram(o.max_ram)
        .stage_dir(o.stage_dir.clone())
        .indexing(indexing)
        // A copy in RAM that a mount of this user already holds is read from there.
        .take_a_shared_copy(true);
    let mut opened = stagefs_open::open(&set, options)?;
    // In process the copy is made before reading starts (a mount serves while it stages).
    opened.stage_now()?;
    if opened.staging == Staging::PageCache {
        // What the daemon's warm-up does for a mount: the archive's pages in the page
        // cache once, shared by every process of the node that opens it; read through the
        // descriptors opened and judged above, never by path again.
        let stop = || stop.load(Ordering::Relaxed);
        opened.archive.source_cache(stagefs_archive::SourceCache::Warm(&stop));
    }
    Ok(Shared::new(opened, set.label, set.shards.len()))
}

/// The stagefs mount of this user that holds `path`, when the copy in RAM it serves can be
/// read in this process (see `stagefs_open::share`): the archive read from that copy, the
/// mountpoint, and the directory of the archive that `path` is ("" for its root). `None`:
/// read through the mount (no such mount, or no complete copy to share). The GIL is
/// released meanwhile.
#[pyfunction]
pub fn open_mounted(py: Python<'_>, path: PathBuf) -> Option<(Archive, PathBuf, String)> {
    let (shared, mountpoint, root) = py.detach(|| mounted(&path))?;
    Some((Archive { shared: Arc::new(shared) }, mountpoint, root))
}

fn mounted(path: &Path) -> Option<(Shared, PathBuf, String)> {
    // As named, made absolute (no lookup: a path through a link to the mount is read
    // through the mount); its `..` and `.` would not name what the mount's do.
    let path = std::path::absolute(path).ok()?;
    if path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return None;
    }
    // The innermost mount holding the path: a mount inside another's tree is its own.
    let record = stagefs_open::share::offering()
        .into_iter()
        .filter(|r| path.starts_with(&r.mountpoint))
        .max_by_key(|r| r.mountpoint.as_os_str().len())?;
    let inside = path.strip_prefix(&record.mountpoint).ok()?;
    let root = record.prefix.as_deref().unwrap_or(Path::new("")).join(inside);
    let root = root.to_str()?.trim_end_matches('/').to_owned();
    let opened = shards::open_shared(&record.archive, stagefs_open::places::Trust::Named).ok()??;
    Some((Shared::new(opened, record.archive, 1), record.mountpoint, root))
}

/// Runs `f` with what it logs (tracing, INFO and above) collected as (level, line): Python
/// hands WARN and above to `warnings` (an `ArchiveWarning`), INFO to `logging` (the logger
/// `stagefs`), instead of lines on stderr.
fn collecting_log<T>(f: impl FnOnce() -> T) -> (T, Vec<(String, String)>) {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_level(true)
        .with_writer(move || writer.clone())
        .finish();
    // As the CLI's: the HTTP and TLS crates' request dumps (credentials included) never pass.
    let no_request_dumps: tracing_subscriber::filter::Targets =
        stagefs_open::remote::LOG_FILTER.parse().expect("stagefs_remote::LOG_FILTER parses");
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(subscriber, no_request_dumps);
    let value = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&lines.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    let records = text
        .lines()
        .filter_map(|l| {
            let (level, line) = l.trim().split_once(' ')?;
            let line = line.trim();
            (!line.is_empty()).then(|| (level.to_string(), line.to_string()))
        })
        .collect();
    (value, records)
}

fn stage_mode(stage: &str) -> PyResult<StageMode> {
    Ok(match stage {
        "none" => StageMode::None,
        "ram" => StageMode::Ram,
        "copy" => StageMode::Copy,
        "auto" => StageMode::Auto,
        "disk" => StageMode::Disk,
        other => {
            return Err(PyValueError::new_err(format!("stage must be none, ram, copy, auto or disk, not {other:?}")))
        }
    })
}

fn size_of(value: Option<Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(value) = value.filter(|v| !v.is_none()) else { return Ok(None) };
    if let Ok(n) = value.extract::<u64>() {
        return Ok(Some(n));
    }
    let text: String = value
        .extract()
        .map_err(|_| PyTypeError::new_err("max_ram must be bytes (an int) or a size such as \"64G\""))?;
    stagefs_open::report::parse_size(&text).map(Some).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Opens an archive; returns it and what opening it logged, (level, line). `remote`: the
/// remote options (`endpoint_url`, `profile`, ...) named as the command line's flags;
/// `progress`: progress bars on stderr while staging and indexing (drawn on a terminal).
#[pyfunction]
#[pyo3(signature = (spec, *, stage="none", max_ram=None, stage_dir=None, recursive=false, trust_shards=false, remote=None, progress=false))]
#[allow(clippy::too_many_arguments)]
pub fn open(
    py: Python<'_>,
    spec: PathBuf,
    stage: &str,
    max_ram: Option<Bound<'_, PyAny>>,
    stage_dir: Option<PathBuf>,
    recursive: bool,
    trust_shards: bool,
    remote: Option<Bound<'_, PyDict>>,
    progress: bool,
) -> PyResult<(Archive, Vec<(String, String)>)> {
    let remote = remote_options(remote)?;
    let options =
        Options { mode: stage_mode(stage)?, max_ram: size_of(max_ram)?, stage_dir, recursive, trust_shards, remote };
    let what = spec.clone();
    let (opened, logged) = background::run(py, "open", move |stop| {
        // Summaries go to Python's logging; bars only where asked for (on a terminal).
        stagefs_open::report::lines_to_log(progress, || collecting_log(|| open_spec(&what, &options, stop)))
    })?;
    let shared = opened.map_err(|e| open_error(py, e, &spec))?;
    Ok((Archive { shared: Arc::new(shared) }, logged))
}

/// The remote options of `stagefs.open(..., endpoint_url=..., profile=..., ...)`, named as
/// `stagefs mount`'s flags (`--endpoint-url` is `endpoint_url`); durations in seconds or as
/// the command line writes them ("30s", "5m").
fn remote_options(given: Option<Bound<'_, PyDict>>) -> PyResult<RemoteOptions> {
    let mut o = RemoteOptions::default();
    let Some(given) = given else { return Ok(o) };
    let duration = |v: &Bound<'_, PyAny>| -> PyResult<std::time::Duration> {
        if let Ok(seconds) = v.extract::<f64>() {
            return std::time::Duration::try_from_secs_f64(seconds).map_err(|e| PyValueError::new_err(e.to_string()));
        }
        let text: String = v.extract()?;
        stagefs_open::duration::parse_duration(&text).map_err(|e| PyValueError::new_err(e.to_string()))
    };
    for (key, value) in given.iter() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        match key.as_str() {
            "endpoint_url" => o.endpoint_url = Some(value.extract()?),
            "profile" => o.profile = Some(value.extract()?),
            "no_sign_request" => o.no_sign_request = value.extract()?,
            "allow_http" => o.allow_http = value.extract()?,
            "bearer_token_file" => o.bearer_token_file = Some(value.extract()?),
            "remote_concurrency" => {
                let n: u16 = value.extract()?;
                if !(1..=256).contains(&n) {
                    return Err(PyValueError::new_err(format!("remote_concurrency must be 1 to 256, not {n}")));
                }
                o.remote_concurrency = n;
            }
            "remote_tries" => o.remote_tries = value.extract::<u32>()?.clamp(1, 100),
            "remote_timeout" => o.remote_timeout = duration(&value)?,
            "remote_deadline" => o.remote_deadline = duration(&value)?,
            other => return Err(PyTypeError::new_err(format!("unknown remote option {other:?}"))),
        }
    }
    Ok(o)
}

/// The bytes of a path given by Python (str, bytes or os.PathLike).
fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// A name for Python: the bytes decoded as the file system's names are (undecodable
/// bytes kept as surrogates, as `os.fsdecode` does).
pub fn py_name<'py>(py: Python<'py>, name: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    Ok(OsStr::from_bytes(name).into_pyobject(py)?.into_any())
}

/// fsspec's description of an entry (plus what `os.stat` shows).
fn info_dict<'py>(py: Python<'py>, name: &[u8], d: &Described<'_>) -> PyResult<Bound<'py, PyDict>> {
    let a = &d.inode.attrs;
    let dict = PyDict::new(py);
    dict.set_item("name", py_name(py, name)?)?;
    dict.set_item("size", d.size)?;
    dict.set_item("type", d.kind)?;
    dict.set_item("mode", a.mode)?;
    dict.set_item("uid", a.uid)?;
    dict.set_item("gid", a.gid)?;
    dict.set_item("mtime", a.mtime as f64 + a.mtime_nsec as f64 * 1e-9)?;
    dict.set_item("nlink", d.inode.nlink.max(1))?;
    dict.set_item("ino", d.ino)?;
    dict.set_item("islink", d.link_target.is_some())?;
    if let Some(target) = d.link_target {
        dict.set_item("destination", py_name(py, target)?)?;
    }
    Ok(dict)
}

/// An open archive: its tree and members (`stagefs.open` wraps it in an fsspec filesystem).
#[pyclass(module = "stagefs._native", frozen, weakref)]
pub struct Archive {
    pub shared: Arc<Shared>,
}

impl Archive {
    fn described<'a>(&'a self, path: &[u8]) -> Result<Described<'a>, MemberError> {
        let index = &self.shared.archive.index;
        let shown = || String::from_utf8_lossy(path).into_owned();
        let (target, link) = tree::lookup(index, path).map_err(|source| MemberError::Path { path: shown(), source })?;
        tree::describe(index, target, link).map_err(|source| MemberError::Path { path: shown(), source })
    }
}

#[pymethods]
impl Archive {
    /// The archive's resolved path, an object's URL (no user, no query), or a shard set's
    /// label: text, not a path (a path would fold a URL's `//`).
    #[getter]
    fn label(&self) -> std::ffi::OsString {
        self.shared.label.clone().into_os_string()
    }

    /// "tar", "zip" or "squashfs" (a set's first shard's).
    /// Each file served, as it was when opened: (device, inode, size, mtime s, mtime ns,
    /// ctime s, ctime ns), the one file identity. A filesystem unpickled in another process
    /// opens the archive again and refuses it unless this is the same.
    #[getter]
    fn identity(&self) -> Vec<(u64, u64, u64, i64, i64, i64, i64)> {
        let id = |f: &stagefs_archive::FileId| (f.dev, f.ino, f.size, f.mtime.0, f.mtime.1, f.ctime.0, f.ctime.1);
        self.shared.identity.iter().map(id).collect()
    }

    /// What changed since `expected` (an [`Archive::identity`] of earlier) in words, or
    /// `None` when every file is the version it was: the one "same file?" rule.
    fn changed_since(&self, expected: Vec<(u64, u64, u64, i64, i64, i64, i64)>) -> Option<String> {
        let file_id = |(dev, ino, size, ms, mns, cs, cns): (u64, u64, u64, i64, i64, i64, i64)| {
            stagefs_archive::FileId { dev, ino, size, mtime: (ms, mns), ctime: (cs, cns), nlink: 1 }
        };
        if expected.len() != self.shared.identity.len() {
            return Some(format!("it served {} files, now {}", expected.len(), self.shared.identity.len()));
        }
        let label = &self.shared.label;
        expected.into_iter().map(file_id).zip(&self.shared.identity).enumerate().find_map(|(i, (before, now))| {
            let change = before.change_to(now)?;
            Some(match self.shared.identity.len() {
                1 => change,
                _ => format!("shard {} of {}: {change}", i + 1, label.shown()),
            })
        })
    }

    #[getter]
    fn format(&self) -> String {
        format!("{:?}", self.shared.archive.format).to_lowercase()
    }

    /// How its bytes reach RAM: "in place", "page cache", "copy" or "local disk".
    #[getter]
    fn staging(&self) -> &'static str {
        staging_name(self.shared.staging)
    }

    /// Bytes this process holds privately (a copy staged in RAM).
    #[getter]
    fn staged_bytes(&self) -> u64 {
        self.shared.staged_bytes
    }

    /// Archives merged in this one: 1, or a shard set's size.
    #[getter]
    fn shards(&self) -> usize {
        self.shared.shards
    }

    /// The description of the entry at `path` (links followed; `islink` says if it is one).
    fn info<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let bytes = path_bytes(&path);
        let described = self.described(bytes)?;
        info_dict(py, tree::trimmed(bytes), &described)
    }

    /// The entries of the directory at `path`, described; a file's own description.
    fn ls<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyList>> {
        let bytes = path_bytes(&path);
        let described = self.described(bytes)?;
        let list = PyList::empty(py);
        if described.kind != "directory" {
            list.append(info_dict(py, tree::trimmed(bytes), &described)?)?;
            return Ok(list);
        }
        let index = &self.shared.archive.index;
        let dir = index
            .resolve(bytes, true)
            .map_err(|source| MemberError::Path { path: path.shown().to_string(), source })?;
        let mut failed = None;
        tree::walk(index, bytes, dir, Some(1), |met| {
            if failed.is_some() {
                return;
            }
            if let Ok(d) = tree::describe(index, met.target, met.link) {
                if let Err(e) = info_dict(py, met.path, &d).and_then(|info| list.append(info)) {
                    failed = Some(e);
                }
            }
        })
        .map_err(crate::errors::index_error)?;
        failed.map_or(Ok(list), Err)
    }

    /// Every entry below the directory `path` (down to `maxdepth` levels), sorted by name:
    /// files only, or directories too with `withdirs`. Links to directories are followed.
    #[pyo3(signature = (path, maxdepth=None, withdirs=false))]
    fn find<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        maxdepth: Option<usize>,
        withdirs: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let bytes = path_bytes(&path);
        let index = &self.shared.archive.index;
        let described = self.described(bytes)?;
        let mut found: Vec<(Vec<u8>, Option<InodeId>, Option<InodeId>)> = Vec::new();
        if described.kind == "directory" {
            let dir = index
                .resolve(bytes, true)
                .map_err(|source| MemberError::Path { path: path.shown().to_string(), source })?;
            tree::walk(index, bytes, dir, maxdepth, |met| found.push((met.path.to_vec(), met.target, met.link)))
                .map_err(crate::errors::index_error)?;
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let list = PyList::empty(py);
        for (name, target, link) in found {
            let Ok(d) = tree::describe(index, target, link) else { continue };
            if d.kind != "directory" || withdirs {
                list.append(info_dict(py, &name, &d)?)?;
            }
        }
        Ok(list)
    }

    /// The regular file at `path`, opened for reading.
    fn open(&self, path: PathBuf) -> PyResult<Member> {
        let bytes = path_bytes(&path);
        let (id, inode) = self.shared.regular(bytes)?;
        let inode = &inode;
        let name = String::from_utf8_lossy(tree::trimmed(bytes)).into_owned();
        Ok(Member::new(Arc::clone(&self.shared), id, inode.attrs.size, name))
    }

    /// Bytes `start..end` of the file at `path` (Python slice rules: negative from the
    /// end, None for the ends).
    #[pyo3(signature = (path, start=None, end=None))]
    fn cat<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        start: Option<i64>,
        end: Option<i64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = path_bytes(&path);
        let (id, inode) = self.shared.regular(bytes)?;
        let inode = &inode;
        let size = inode.attrs.size as i64;
        let clamp = |v: i64| if v < 0 { (size + v).max(0) } else { v.min(size) };
        let (from, to) = (clamp(start.unwrap_or(0)), clamp(end.unwrap_or(size)));
        let len = (to - from).max(0) as usize;
        let name = path.shown().to_string();
        let shared = &self.shared;
        let first = py.detach(|| shared.first_piece((id, inode), &name, from as u64, len))?;
        PyBytes::new_with(py, len, |dst| {
            py.detach(|| shared.fill_after((id, inode), &name, from as u64, &first, dst)).map_err(PyErr::from)
        })
    }

    /// The whole file at `path` as a read-only memoryview: no copy where its bytes lie in
    /// memory (a staged copy's map, a cached block); they stay valid while the view lives.
    fn view<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
        let bytes = path_bytes(&path);
        let (id, inode) = self.shared.regular(bytes)?;
        let inode = &inode;
        let name = path.shown().to_string();
        let shared = &self.shared;
        let held = py.detach(|| shared.held(id, inode, &name, 0, inode.attrs.size))?;
        pybuf::memoryview(py, held)
    }

    fn __repr__(&self) -> String {
        let s = &self.shared;
        format!(
            "<stagefs archive {} ({}, {} entries, {})>",
            s.label.shown(),
            self.format(),
            s.archive.index.inode_count(),
            staging_name(s.staging)
        )
    }
}

/// How the bytes reach RAM, in the words `ArchiveFileSystem.staging` documents: the CLI's
/// `ram` (the page cache holds the one copy) is `page cache` here.
fn staging_name(staging: Staging) -> &'static str {
    match staging {
        Staging::PageCache => "page cache",
        other => other.name(),
    }
}
