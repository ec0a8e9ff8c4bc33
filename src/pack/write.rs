//! The one writer: takes members in path order from the readers and appends them to the current shard and its index.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::compress;
use super::errors::PackError;
use super::member::Member;
use super::output::Output;
use super::read::{self, Content, Window};
use super::shards::shard_path;
use super::sparse;
use super::walk::{full_path, Stat};
use stagefs_archive::index::Attrs;
use stagefs_archive::tar::write::{self as tar_writer, Header, Kind};

/// What the writer needs of the arguments.
pub struct Options {
    pub out: PathBuf,
    pub normalize: bool,
    /// The archives' final mode (0666 less the umask, as tar creates them).
    pub mode: u32,
    /// `--compress` and `--level`.
    pub compress: Option<(compress::Compression, Option<i32>)>,
}

/// Chunk size when streaming a large file.
const CHUNK: usize = 1 << 20;

/// Counters for the progress bar and the summary.
#[derive(Default)]
pub struct Totals {
    pub files: u64,
    pub bytes: u64,
}

pub struct Writer<'a> {
    root: &'a Path,
    members: &'a [Member],
    opts: &'a Options,
    /// Directory path -> its member, to repeat a shard's parent directories in the next.
    dirs: HashMap<&'a [u8], usize>,
    pub outputs: Vec<Output>,
    names: HashMap<(bool, u32), Vec<u8>>,
    buf: Vec<u8>,
    pub totals: Totals,
    bar: indicatif::ProgressBar,
    drawn: Instant,
    /// Regular files to write (hard links aside), for the bar.
    files: usize,
}

impl<'a> Writer<'a> {
    /// A writer whose first archive (shard 0) is `first`, already created.
    pub fn new(root: &'a Path, members: &'a [Member], opts: &'a Options, first: Output) -> Writer<'a> {
        let dirs = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.stat.file_type() == libc::S_IFDIR)
            .map(|(i, m)| (m.path.as_slice(), i))
            .collect();
        let total: u64 = members.iter().filter(|m| m.link_to.is_none()).map(|m| m.stat.size).sum();
        let bar = stagefs_open::report::progress(Some(total), "packing");
        Writer {
            root,
            members,
            opts,
            dirs,
            outputs: vec![first],
            names: HashMap::new(),
            buf: Vec::new(),
            totals: Totals::default(),
            bar,
            drawn: Instant::now(),
            files: members.iter().filter(|m| m.stat.file_type() == libc::S_IFREG && m.link_to.is_none()).count(),
        }
    }

    /// Writes every member, in order, as the readers deliver them.
    pub fn run(&mut self, window: &Window) -> Result<(), PackError> {
        let started = Instant::now();
        self.draw(started);
        let members = self.members;
        for (i, m) in members.iter().enumerate() {
            stagefs_open::cancel::check().map_err(PackError::Interrupted)?;
            let content = window.take(i)?;
            if m.shard as usize >= self.outputs.len() {
                self.outputs.last_mut().expect("shard 0 exists").finish(self.opts.mode)?;
                self.outputs.push(Output::create(&shard_path(&self.opts.out, m.shard), self.opts.compress)?);
            }
            self.parents(&m.path)?;
            if m.stat.file_type() != libc::S_IFDIR || !self.current().dirs.contains(&m.path) {
                self.member(i, content)?;
            }
            window.release(i);
            if i == 0 {
                // Tests hold this phase (STAGEFS_TEST_HOLD_PHASE) to signal a pack under way.
                stagefs_open::cancel::phase("packing").map_err(PackError::Interrupted)?;
            }
            if self.drawn.elapsed() > Duration::from_millis(200) {
                self.draw(started);
            }
        }
        self.bar.finish_and_clear();
        self.outputs.last_mut().expect("shard 0 exists").finish(self.opts.mode)
    }

    fn draw(&mut self, started: Instant) {
        self.drawn = Instant::now();
        let rate = self.totals.files as f64 / started.elapsed().as_secs_f64().max(1e-3);
        self.bar.set_message(format!("packing {}/{} files, {rate:.0} files/s", self.totals.files, self.files));
        self.bar.set_position(self.totals.bytes);
    }

    fn current(&mut self) -> &mut Output {
        self.outputs.last_mut().expect("shard 0 exists")
    }

    /// Writes the directories above `path` this shard lacks (a shard starting inside a
    /// directory repeats it, so that every shard stands alone), the root first.
    fn parents(&mut self, path: &[u8]) -> Result<(), PackError> {
        let mut ends: Vec<usize> = path.iter().enumerate().filter(|(_, &b)| b == b'/').map(|(i, _)| i).collect();
        if !path.is_empty() {
            ends.insert(0, 0);
        }
        for end in ends {
            let dir = &path[..end];
            if self.current().dirs.contains(dir) {
                continue;
            }
            if let Some(&i) = self.dirs.get(dir) {
                self.member(i, Content::None)?;
            }
        }
        Ok(())
    }

    fn name(&mut self, group: bool, id: u32) -> Vec<u8> {
        if self.opts.normalize {
            return Vec::new();
        }
        let name = self.names.entry((group, id)).or_insert_with(|| {
            let name = if group {
                nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id)).ok().flatten().map(|g| g.name)
            } else {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id)).ok().flatten().map(|u| u.name)
            };
            name.unwrap_or_default().into_bytes()
        });
        name.clone()
    }

    /// Writes member `i` (its header, then its content) and indexes it.
    fn member(&mut self, i: usize, content: Content) -> Result<(), PackError> {
        let members = self.members;
        let m = &members[i];
        let mut stat = m.stat;
        let (major, minor) = (libc::major(stat.rdev), libc::minor(stat.rdev));
        let mut link = Vec::new();
        let kind = match stat.file_type() {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFCHR => Kind::Char { major, minor },
            libc::S_IFBLK => Kind::Block { major, minor },
            _ if m.link_to.is_some() => Kind::Hardlink,
            _ => Kind::File,
        };
        match (&content, m.link_to) {
            (Content::Link(target), _) => link = target.clone(),
            (_, Some(first)) => link = members[first].path.clone(),
            (Content::Bytes(_, seen), _) => stat = *seen,
            _ => {}
        }
        let mut path = m.path.clone();
        match kind {
            Kind::Dir if path.is_empty() => path = b"./".to_vec(),
            Kind::Dir => path.push(b'/'),
            _ => {}
        }
        if kind == Kind::Dir {
            let dir = m.path.clone();
            self.current().dirs.insert(dir);
        }
        if let Content::Stream = content {
            return self.stream(i, &path);
        }
        let data: &[u8] = match &content {
            Content::Bytes(bytes, _) => bytes,
            _ => &[],
        };
        let size = if kind == Kind::File { data.len() as u64 } else { 0 };
        stat.size = size;
        let (header, attrs) = self.header(&path, kind, &stat, &link, None);
        let out = self.current();
        out.member_starts(header.len() as u64 + size + tar_writer::padding(size) as u64)?;
        out.write(&header)?;
        let offset = out.pos();
        out.write(data)?;
        out.pad(size)?;
        let rel = m.path.clone();
        self.current().index.add(&rel, kind, attrs, offset, &link).map_err(PackError::Index)?;
        self.count(kind, size);
        Ok(())
    }

    fn count(&mut self, kind: Kind, size: u64) {
        if kind == Kind::File {
            self.totals.files += 1;
            self.totals.bytes += size;
        }
    }

    /// The header blocks and index attributes of a member; `stored` is a sparse file's
    /// stored bytes (map and data runs).
    fn header(&mut self, path: &[u8], kind: Kind, stat: &Stat, link: &[u8], stored: Option<u64>) -> (Vec<u8>, Attrs) {
        let (mut mode, mut uid, mut gid) = (stat.mode & 0o7777, stat.uid, stat.gid);
        if self.opts.normalize {
            (uid, gid) = (0, 0);
            mode |= 0o444;
            if kind == Kind::Dir || mode & 0o111 != 0 {
                mode |= 0o111;
            }
        }
        let (uname, gname) = (self.name(false, uid), self.name(true, gid));
        let h = Header {
            path,
            kind,
            mode,
            uid: u64::from(uid),
            gid: u64::from(gid),
            uname: &uname,
            gname: &gname,
            mtime: stat.mtime,
            size: stored.unwrap_or(stat.size),
            link,
        };
        let header = match stored {
            Some(_) => tar_writer::encode_sparse(&h, stat.size),
            None => tar_writer::encode(&h),
        };
        let file_type = if kind == Kind::Hardlink { libc::S_IFREG } else { stat.file_type() };
        let attrs = Attrs { mode: file_type | mode, uid, gid, mtime: stat.mtime, mtime_nsec: 0, size: stat.size };
        (header, attrs)
    }

    /// Copies a large or sparse file in chunks (a sparse one without its holes), checked
    /// unchanged; if it changed, drops what was written of it and copies it once more.
    fn stream(&mut self, i: usize, tar_path: &[u8]) -> Result<(), PackError> {
        let members = self.members;
        let m = &members[i];
        let path = full_path(self.root, &m.path);
        let start = self.current().pos();
        let mut before = m.stat;
        let mut what = String::new();
        for attempt in 0..2 {
            let file = read::open(&path, &m.stat)?;
            let io = |source| PackError::Source { path: path.clone(), source };
            if attempt > 0 {
                before = Stat::of(&file.metadata().map_err(io)?);
            }
            let runs = match before.maybe_sparse() {
                true => sparse::data_runs(&file, before.size).map_err(io)?,
                false => None,
            };
            let stored = runs.as_deref().map(sparse::stored_len);
            let (header, attrs) = self.header(tar_path, Kind::File, &before, &[], stored);
            // A large member starts a compressed frame of its own: written again after
            // a change, it is cut back to that frame's start.
            self.current().member_starts(u64::MAX)?;
            self.current().write(&header)?;
            if let Some(runs) = &runs {
                self.current().write(&tar_writer::sparse_map(runs))?;
            }
            let offset = self.current().pos();
            let whole = [(0, before.size)];
            let mut complete = true;
            for &(at, len) in runs.as_deref().unwrap_or(&whole) {
                if !self.copy(&file, &path, at, len)? {
                    complete = false;
                    break;
                }
            }
            let after = file.metadata().map_err(io)?;
            let change = match complete {
                true => read::change(&before, &after, before.size),
                false => Some(format!("it shrank below the {} bytes it had", before.size)),
            };
            match change {
                None => {
                    self.current().pad(stored.unwrap_or(before.size))?;
                    let rel = m.path.clone();
                    let index = &mut self.current().index;
                    match &runs {
                        Some(runs) => index.add_sparse(&rel, attrs, offset, runs),
                        None => index.add(&rel, Kind::File, attrs, offset, &[]),
                    }
                    .map_err(PackError::Index)?;
                    self.count(Kind::File, before.size);
                    return Ok(());
                }
                Some(why) => what = why,
            }
            self.current().truncate(start)?;
        }
        Err(PackError::Changed { path, what })
    }

    /// Copies `len` bytes of `file` (at `path`) from `at` into the archive; false if the
    /// file ended first.
    fn copy(&mut self, file: &std::fs::File, path: &Path, at: u64, len: u64) -> Result<bool, PackError> {
        use std::os::unix::fs::FileExt;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(CHUNK, 0);
        let mut done = 0u64;
        let result = loop {
            if done == len {
                break Ok(true);
            }
            if let Err(e) = stagefs_open::cancel::check() {
                break Err(PackError::Interrupted(e));
            }
            let want = (len - done).min(CHUNK as u64) as usize;
            let n = match file.read_at(&mut buf[..want], at + done) {
                Ok(0) => break Ok(false),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => break Err(PackError::Source { path: path.to_owned(), source }),
            };
            if let Err(e) = self.current().write(&buf[..n]) {
                break Err(e);
            }
            done += n as u64;
            self.bar.inc(n as u64);
        };
        self.buf = buf;
        result
    }
}
