//! The one way stagefs opens a file it did not make — an archive, a shard, a list of shards, a saved index beside an archive, a log it appends to — with every entry on the way judged by who could have put it there.
//!
//! Other users of a shared directory can plant entries in it: a file, or a symbolic link
//! to a file of theirs elsewhere, or (where they may rename entries) a whole directory of
//! their own in place of the user's. Checking the canonical path judges a link by its
//! target (eve's file in eve's own directory looks like "the dataset owner's"), and
//! checking a path then opening it again lets the entry be swapped in between. So the path
//! is walked here one component at a time, through directory descriptors opened with
//! `O_NOFOLLOW`; a link is read and followed by this code, after noting who made it, and
//! the file is opened `O_NOFOLLOW | O_NONBLOCK` relative to the descriptor of the
//! directory that holds it. Its [`FileId`] comes from the descriptor that was opened, and
//! everything after (format check, index key, staging, reading) uses that descriptor,
//! never the path again.
//!
//! Who could have put an entry where the walk found it: the owner of its directory (and
//! root), plus, in a sticky directory others may write (`/tmp`), the entry's own owner; a
//! link's and the file's owner made them. A directory others may write without the sticky
//! bit lets anyone replace what it holds. As OpenSSH's StrictModes does, every directory
//! from `/` down to the file is judged this way, not only the file's own: a group
//! directory (2770) holding the user's dataset directory lets any member of the group
//! rename that directory away and put their own in its place.
//!
//! The rules ([`Rule`]): a member of a shard set ([`Trust::Member`]) may be put in place
//! only by the user, root or the dataset's owner (the owner of the directory holding the
//! file); a file stagefs writes (a `--log-file`) only by the user or root. An archive the
//! user names alone ([`Trust::Named`]) is theirs to judge: it is opened the same way,
//! unchecked.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use stagefs_archive::escape::Shown;
use stagefs_archive::FileId;

use super::files::Distrust;
use super::private::others_can_write;
use super::users::{my_uid, user_label};

/// The archives a mount serves, in the order they win.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSet {
    /// The resolved path of a single archive (or an object's URL); for a set, the spec and a digest of the list.
    pub label: std::path::PathBuf,
    /// Resolved paths (every link followed), each once.
    pub shards: Vec<std::path::PathBuf>,
    /// The checks each shard passes when it is opened to serve.
    pub trust: Trust,
}

/// How far to trust what a path leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// An archive the user named alone: whoever made it, it is what they asked for.
    Named,
    /// A member of a set that other users must not join (a pattern's match, a listed,
    /// added or watched shard, a list of shards): see the module's doc.
    Member,
}

/// Whom a walk lets have put the entries on its way (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Nobody is judged.
    Anyone,
    /// The user, root and the owner of the file's directory.
    Dataset,
    /// The user and root: a file stagefs writes.
    Own,
}

/// Why a file from outside was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OutsideError {
    #[error("cannot open {}: {source}", path.shown())]
    Io { path: PathBuf, source: std::io::Error },
    /// Another user could have made what the path leads to.
    #[error("{}: {why}; refusing it. Pass --trust-shards to use such shards on purpose", path.shown())]
    Untrusted { path: PathBuf, why: String },
    /// Another user could have made (or could replace) a file stagefs would write.
    #[error("{}: {why}; refusing it: use a file in a directory of your own", path.shown())]
    Unsafe { path: PathBuf, why: String },
    /// The file lies on the very mount that would serve it.
    #[error("{}: lies on this stagefs mount itself; a shard must come from outside the mount it is added to", path.shown())]
    OnOwnMount { path: PathBuf },
}

/// A file from outside, opened once and checked; used only through its descriptor.
#[derive(Debug)]
pub struct OutsideFile {
    /// Shared with the sources that serve it in place (one descriptor per file).
    file: Arc<File>,
    id: FileId,
    /// The directory that holds it, as it was walked (for files beside it); shared by the
    /// files of a set found in the same directory ([`OutsideFile::share_dir`]).
    dir: Arc<OwnedFd>,
    /// The directory's device and inode.
    dir_id: (u64, u64),
    dir_uid: u32,
    /// The path as named (absolute), for messages.
    named: PathBuf,
    /// The path with every link followed: the file's name in sets and saved indexes.
    resolved: PathBuf,
}

/// At most this many links are followed (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Opens `path` for reading the way the module's doc describes. `not_on`: a device the
/// file must not lie on (a mount's own, for shards added to it); checked on every
/// directory walked, before anything below it is opened.
pub fn open_outside(path: &Path, trust: Trust, not_on: Option<u64>) -> Result<OutsideFile, OutsideError> {
    let rule = match trust {
        Trust::Named => Rule::Anyone,
        Trust::Member => Rule::Dataset,
    };
    let Walked { dir, name, file, meta, named } = walk(path, rule, not_on, |dir, name| dir.open_file(name))?;
    let resolved = dir.path.join(&name);
    Ok(OutsideFile {
        file: Arc::new(file),
        id: FileId::of(&meta),
        dir_id: (dir.meta.dev(), dir.meta.ino()),
        dir_uid: dir.meta.uid(),
        dir: Arc::new(dir.fd),
        named,
        resolved,
    })
}

/// Opens `path` to append to it (a `--log-file`), creating it (mode 0600) if it is
/// missing: only where nobody but the user (or root) could have put anything on the way,
/// never through a link someone else made, and only a regular file of the user's own,
/// with no other name (a hard link to the user's `~/.bashrc` planted by someone else).
pub fn open_append(path: &Path) -> Result<File, OutsideError> {
    let walked = walk(path, Rule::Own, None, |dir, name| dir.open_append(name))?;
    let unsafe_ = |why: String| OutsideError::Unsafe { path: walked.named.clone(), why };
    let meta = &walked.meta;
    if !meta.file_type().is_file() {
        return Err(unsafe_("it is not a regular file".into()));
    }
    if meta.nlink() > 1 {
        return Err(unsafe_(format!(
            "it has {} names (hard links): another one may be a file you did not mean",
            meta.nlink()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_(format!("other users may write it (mode {:04o})", meta.mode() & 0o7777)));
    }
    Ok(walked.file)
}

/// Reads a file of the user's own that stagefs trusts with secrets or trust (AWS config and
/// credentials, a CA bundle, a token, `~/.netrc`): walked as a log is (nothing on the way
/// that another user could have put there), a regular file owned by the user or root that
/// nobody else may write, at most `cap` bytes. `Ok(None)` when there is none; its text and
/// permission bits otherwise.
pub fn read_own_file(path: &Path, cap: u64) -> Result<Option<(Vec<u8>, u32)>, OutsideError> {
    let walked = match walk(path, Rule::Own, None, |dir, name| dir.open_file(name)) {
        Err(OutsideError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        walked => walked?,
    };
    let unsafe_ = |why: String| OutsideError::Unsafe { path: walked.named.clone(), why };
    let mode = walked.meta.mode();
    let bytes = super::files::read_checked(walked.file, &[my_uid(), 0], cap).map_err(|e| unsafe_(e.to_string()))?;
    Ok(Some((bytes, mode & 0o7777)))
}

/// What a walk ends with: the file, opened, and the directory holding it.
struct Walked {
    dir: Dir,
    name: OsString,
    file: File,
    meta: std::fs::Metadata,
    named: PathBuf,
}

/// Walks `path` from `/`, opening the last component with `open_last` and judging every
/// entry on the way by `rule`.
fn walk(
    path: &Path,
    rule: Rule,
    not_on: Option<u64>,
    open_last: impl Fn(&Dir, &OsStr) -> Result<Opened, Step>,
) -> Result<Walked, OutsideError> {
    let named = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let io = |source| OutsideError::Io { path: named.clone(), source };
    // Components still to walk, front first; links push their targets' in front.
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, &named);
    let mut dirs = vec![Dir::root().map_err(io)?];
    let mut makers = Makers::default();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let dir = dirs.last().expect("the root stays");
        if not_on.is_some_and(|dev| dir.meta.dev() == dev) {
            return Err(OutsideError::OnOwnMount { path: named.clone() });
        }
        let last = todo.is_empty();
        let opened = if last { open_last(dir, &name) } else { dir.open_dir(&name) };
        match opened {
            Ok(Opened::Dir(next)) => {
                makers.note(dir, &name, next.meta.uid(), None);
                dirs.push(next);
            }
            Ok(Opened::File(file, meta)) => {
                let dir = dirs.pop().expect("the file's directory");
                if not_on.is_some_and(|dev| meta.dev() == dev) {
                    return Err(OutsideError::OnOwnMount { path: named.clone() });
                }
                makers.note(&dir, &name, meta.uid(), Some("owns the file"));
                let trusted = match rule {
                    Rule::Anyone => Ok(()),
                    Rule::Dataset => makers.judge(&[my_uid(), 0, dir.meta.uid()], Some(dir.meta.uid())),
                    Rule::Own => makers.judge(&[my_uid(), 0], None),
                };
                if let Err(why) = trusted {
                    return Err(match rule {
                        Rule::Own => OutsideError::Unsafe { path: named, why },
                        _ => OutsideError::Untrusted { path: named, why },
                    });
                }
                return Ok(Walked { dir, name, file, meta, named });
            }
            Err(Step::Link(owner, target)) => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io(std::io::Error::from_raw_os_error(libc::ELOOP)));
                }
                makers.note(dir, &name, owner, Some("made the symbolic link"));
                if Path::new(&target).is_absolute() {
                    dirs.truncate(1);
                }
                push_components(&mut todo, Path::new(&target));
            }
            Err(Step::Failed(e)) => return Err(io(e)),
        }
    }
    // The path named `/`.
    Err(io(std::io::Error::from_raw_os_error(libc::EISDIR)))
}

/// Pushes `path`'s components onto `todo` so that the first is popped first.
fn push_components(todo: &mut Vec<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    todo.extend(parts.into_iter().rev());
}

/// Who could have put each entry of a walk where it was found (see the module's doc).
#[derive(Default)]
struct Makers {
    /// (uid, the entry, how, the owner of its directory): who made each link on the way
    /// and the file (its bytes). Each must be the user, root or the owner of the directory
    /// it stands in: a link another user planted in the user's sticky directory is
    /// refused, whatever (and whoever's) it leads to.
    made: Vec<(u32, PathBuf, &'static str, u32)>,
    /// (uid, the entry, how they could): everyone who could have put an entry where it
    /// stands (the owners of the directories on the way, and in shared sticky ones the
    /// entries' owners).
    could: Vec<(u32, PathBuf, &'static str)>,
    /// A directory that lets anyone replace what it holds, with the entry it held.
    open_to_all: Option<(PathBuf, PathBuf, u32)>,
}

impl Makers {
    /// The entry `name` of `dir`, owned by `owner`; `made`: how its owner made what it is
    /// (a link, a file's bytes), not only where it stands.
    fn note(&mut self, dir: &Dir, name: &OsStr, owner: u32, made: Option<&'static str>) {
        let entry = dir.path.join(name);
        if let Some(how) = made {
            self.made.push((owner, entry.clone(), how, dir.meta.uid()));
        }
        if others_can_write(&dir.meta) {
            if self.open_to_all.is_none() {
                self.open_to_all = Some((dir.path.clone(), entry.clone(), dir.meta.mode() & 0o7777));
            }
        } else {
            self.could.push((dir.meta.uid(), entry.clone(), "owns the directory holding"));
            // Sticky and writable by others: each entry's owner may still rename it.
            if dir.meta.mode() & 0o022 != 0 {
                self.could.push((owner, entry, "owns, in a shared sticky directory,"));
            }
        }
    }

    /// Whether only `allowed` users could have put the entries in place; `dataset`: the
    /// dataset's owner (who may also have made what stands in a directory of theirs),
    /// named in the message.
    fn judge(&self, allowed: &[u32], dataset: Option<u32>) -> Result<(), String> {
        let made_by_stranger = self.made.iter().find(|(uid, .., dir_owner)| {
            let own = [my_uid(), 0];
            !(own.contains(uid) || (dataset.is_some() && uid == dir_owner))
        });
        if let Some((uid, entry, how, dir_owner)) = made_by_stranger {
            let whom = match dataset {
                Some(_) => {
                    format!("neither you nor the owner of the directory it stands in ({})", user_label(*dir_owner))
                }
                None => "not you".to_string(),
            };
            return Err(format!(
                "{} {how} {}, {whom}: another user may have put it there",
                user_label(*uid),
                entry.shown()
            ));
        }
        if let Some((dir, entry, mode)) = &self.open_to_all {
            return Err(format!(
                "{} is writable by other users (mode {mode:04o}) without the sticky bit, so they could replace {} \
                 with their own",
                dir.shown(),
                entry.shown()
            ));
        }
        let Some((uid, entry, how)) = self.could.iter().find(|(uid, ..)| !allowed.contains(uid)) else { return Ok(()) };
        let whom = match dataset {
            Some(owner) => format!("neither you nor the dataset's owner ({})", user_label(owner)),
            None => "not you".to_string(),
        };
        Err(format!("{} {how} {}, {whom}: another user may have put it there", user_label(*uid), entry.shown()))
    }
}

/// A directory on the way, held open.
struct Dir {
    fd: OwnedFd,
    meta: std::fs::Metadata,
    path: PathBuf,
}

enum Opened {
    Dir(Dir),
    File(File, std::fs::Metadata),
}

enum Step {
    /// A symbolic link: its owner and target.
    Link(u32, OsString),
    Failed(std::io::Error),
}

impl Dir {
    fn root() -> std::io::Result<Dir> {
        let fd = open_at(libc::AT_FDCWD, OsStr::new("/"), libc::O_PATH | libc::O_DIRECTORY)?;
        Dir::from_fd(fd, PathBuf::from("/"))
    }

    fn from_fd(fd: OwnedFd, path: PathBuf) -> std::io::Result<Dir> {
        let meta = File::from(fd.try_clone()?).metadata()?;
        Ok(Dir { fd, meta, path })
    }

    fn open_dir(&self, name: &OsStr) -> Result<Opened, Step> {
        match open_at(self.fd.as_raw_fd(), name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW) {
            Ok(fd) => Dir::from_fd(fd, self.path.join(name)).map(Opened::Dir).map_err(Step::Failed),
            // A link, or not a directory: which one, the entry says.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => Err(self.link_or(name, e)),
            Err(e) => Err(Step::Failed(e)),
        }
    }

    fn open_file(&self, name: &OsStr) -> Result<Opened, Step> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        match open_at(self.fd.as_raw_fd(), name, flags) {
            Ok(fd) => {
                let file = File::from(fd);
                let meta = file.metadata().map_err(Step::Failed)?;
                Ok(Opened::File(file, meta))
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(self.link_or(name, e)),
            Err(e) => Err(Step::Failed(e)),
        }
    }

    fn open_append(&self, name: &OsStr) -> Result<Opened, Step> {
        let flags =
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        match open_at_mode(self.fd.as_raw_fd(), name, flags, 0o600) {
            Ok(fd) => {
                let file = File::from(fd);
                let meta = file.metadata().map_err(Step::Failed)?;
                Ok(Opened::File(file, meta))
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(self.link_or(name, e)),
            Err(e) => Err(Step::Failed(e)),
        }
    }

    /// The link `name` is (its owner and target), or `error` when it is no link.
    fn link_or(&self, name: &OsStr, error: std::io::Error) -> Step {
        let Ok(c) = CString::new(name.as_bytes()) else { return Step::Failed(error) };
        // SAFETY: all-zero bytes are a valid `stat` (plain integers).
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated name relative to our descriptor; `stat` is written by the call.
        if unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return Step::Failed(std::io::Error::last_os_error());
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFLNK {
            return Step::Failed(error);
        }
        let mut target = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: the buffer is as long as the length passed.
        let n = unsafe { libc::readlinkat(self.fd.as_raw_fd(), c.as_ptr(), target.as_mut_ptr().cast(), target.len()) };
        if n < 0 {
            return Step::Failed(std::io::Error::last_os_error());
        }
        target.truncate(n as usize);
        Step::Link(stat.st_uid, OsString::from(std::ffi::OsStr::from_bytes(&target)))
    }
}

fn open_at(dir: libc::c_int, name: &OsStr, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    open_at_mode(dir, name, flags, 0)
}

fn open_at_mode(dir: libc::c_int, name: &OsStr, flags: libc::c_int, mode: libc::c_uint) -> std::io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated name; the descriptor returned is owned below.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl OutsideFile {
    /// The open file: read it only through this.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The open file, for a reader that keeps it (no descriptor of its own).
    pub fn shared_file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Holds the directory `other` holds instead of a descriptor of its own, when both are
    /// the same directory (the same device and inode): a set of 10,000 shards in one
    /// directory holds one descriptor of it, not 10,000.
    pub fn share_dir(&mut self, other: &OutsideFile) {
        if self.dir_id == other.dir_id {
            self.dir = other.dir.clone();
        }
    }

    /// Its identity when opened.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// The path as the caller named it, for messages.
    pub fn named(&self) -> &Path {
        &self.named
    }

    /// The path with every link followed.
    pub fn resolved(&self) -> &Path {
        &self.resolved
    }

    /// The uid owning the file.
    pub fn owner(&self) -> u32 {
        self.file.metadata().map_or(my_uid(), |m| m.uid())
    }

    /// Opens the file `name` beside this one (a saved index, to map) if it deserves trust:
    /// a regular file there (no link, no FIFO), owned by the user or by this file's owner,
    /// writable by nobody else, at most `cap` bytes. `Ok(None)` when there is none.
    pub fn open_beside(&self, name: &str, cap: u64) -> Result<Option<File>, Distrust> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let file = match open_at(self.dir.as_raw_fd(), OsStr::new(name), flags) {
            Ok(fd) => File::from(fd),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Distrust::Link),
            Err(e) => return Err(Distrust::Open(e)),
        };
        super::files::judged(file, &[my_uid(), self.owner()], cap).map(Some)
    }

    /// Writes the file `name` beside this one atomically, through the directory's
    /// descriptor (see [`super::files::write_atomically_at`]).
    pub fn write_beside(&self, name: &str, parts: &[&[u8]], mode: u32) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        super::files::write_parts_atomically_at(self.dir.as_fd(), OsStr::new(name), parts, mode)
    }

    /// The owner of the directory holding the file.
    pub fn dir_owner(&self) -> u32 {
        self.dir_uid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn links_are_followed_by_the_walk_and_dot_dot_pops() {
        let tmp = TempDir::new("outside-walk");
        std::fs::create_dir_all(tmp.join("a/b")).unwrap();
        std::fs::write(tmp.join("a/b/f.tar"), b"x").unwrap();
        std::os::unix::fs::symlink("a/b", tmp.join("lb")).unwrap();
        std::os::unix::fs::symlink("../b/f.tar", tmp.join("a/b/rel")).unwrap();
        std::os::unix::fs::symlink(tmp.join("a/b/f.tar"), tmp.join("abs")).unwrap();
        let real = tmp.join("a/b/f.tar").canonicalize().unwrap();
        for named in [tmp.join("lb/f.tar"), tmp.join("lb/rel"), tmp.join("abs"), tmp.join("a/../a/b/./f.tar")] {
            let opened = open_outside(&named, Trust::Member, None).unwrap();
            assert_eq!(opened.resolved(), real, "{}", named.display());
            assert_eq!(opened.named(), named);
        }
        std::os::unix::fs::symlink("loop", tmp.join("loop")).unwrap();
        assert!(matches!(open_outside(&tmp.join("loop"), Trust::Named, None), Err(OutsideError::Io { .. })));
        let dir = open_outside(&tmp.join("a"), Trust::Named, None).unwrap();
        assert!(dir.file().metadata().unwrap().is_dir(), "a directory opens: its caller says what to do with it");
        let dev = std::fs::metadata(tmp.path()).unwrap().dev();
        assert!(matches!(open_outside(&real, Trust::Named, Some(dev)), Err(OutsideError::OnOwnMount { .. })));
    }
}
