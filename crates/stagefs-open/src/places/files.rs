//! The files stagefs keeps in its checked directories: opened without following links, written atomically, read only when trusted, and removed here alone.

use stagefs_archive::escape::Shown;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::users::{my_uid, user_label};

/// Opens (creating with mode 0600 if missing) a file in a checked directory for reading and
/// writing, never through a symlink, and refuses anything but a regular file of ours.
pub fn open_private(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.uid() != my_uid() {
        return Err(std::io::Error::other(format!("{} is not a regular file of yours", path.shown())));
    }
    Ok(file)
}

/// Eight bytes from the kernel's random pool, as hex: temp names nobody can predict.
pub fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    let got = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if got.is_err() {
        // No /dev/urandom (a bare container): O_EXCL still refuses any planted name.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (stagefs_archive::hash::hash(&nanos.to_le_bytes()) ^ u64::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` atomically: see [`write_atomically_at`], in `path`'s directory.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = File::options().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(dir)?;
    write_atomically_at(dir.as_fd(), path.file_name().unwrap_or_default(), bytes, mode)
}

/// Writes `bytes` to the file `name` of the directory `dir` atomically: a temp file beside
/// it, created with `O_EXCL` and `O_NOFOLLOW` under an unpredictable name with exactly
/// `mode`, then renamed over `name` (rename replaces a planted symlink itself, never what
/// it points to; in a sticky directory it fails on another user's entry).
pub fn write_atomically_at(dir: BorrowedFd<'_>, name: &OsStr, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_parts_atomically_at(dir, name, &[bytes], mode)
}

/// [`write_atomically_at`] of a file written in `parts`, one after the other (a saved
/// index of gigabytes is written from where its parts lie, never copied into one buffer).
pub fn write_parts_atomically_at(dir: BorrowedFd<'_>, name: &OsStr, parts: &[&[u8]], mode: u32) -> std::io::Result<()> {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", random_suffix()));
    let c =
        |n: &OsStr| CString::new(n.as_bytes()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e));
    let (c_tmp, c_name) = (c(&tmp)?, c(name)?);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name relative to a descriptor we hold; the result is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c_tmp.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let result = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| parts.iter().try_for_each(|part| file.write_all(part)))
        .and_then(|()| {
            // SAFETY: NUL-terminated names relative to the same descriptor.
            let rc = unsafe { libc::renameat(dir.as_raw_fd(), c_tmp.as_ptr(), dir.as_raw_fd(), c_name.as_ptr()) };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    if result.is_err() {
        // SAFETY: as above.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c_tmp.as_ptr(), 0) };
    }
    result
}

/// All of an open file, refused past `cap` bytes (an error of kind `FileTooLarge`).
pub fn read_all(file: &File, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("it is larger than {cap} bytes")));
    }
    Ok(bytes)
}

/// A file stagefs wrote in one of its checked directories (a record, a status), read back
/// without following a link: `None` unless it is a regular file of this user's, writable
/// by nobody else, of at most `cap` bytes.
pub fn read_own(path: &Path, cap: u64) -> Option<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    read_checked(file, &[my_uid()], cap).ok()
}

/// Why a file was not trusted, for the log line.
#[derive(Debug, thiserror::Error)]
pub enum Distrust {
    #[error("it is a symbolic link")]
    Link,
    #[error("cannot open it: {0}")]
    Open(std::io::Error),
    #[error("cannot inspect it: {0}")]
    Inspect(std::io::Error),
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it belongs to {owner}, not to {owners}")]
    Owner { owner: String, owners: String },
    #[error("other users may write it (mode {mode:04o})")]
    Writable { mode: u32 },
    #[error("it is larger ({len} bytes) than such a file can be ({cap})")]
    TooLarge { len: u64, cap: u64 },
    #[error("it grew while being read")]
    Grew,
}

/// Reads an open file only if it deserves trust: a regular file (opened without following
/// a symlink and without blocking on a FIFO, by [`super::OutsideFile::read_beside`] or
/// [`super::CheckedDir::open_file`]), owned by one of `owners`, writable by nobody else,
/// and at most `cap` bytes.
pub fn read_checked(file: File, owners: &[u32], cap: u64) -> Result<Vec<u8>, Distrust> {
    let file = judged(file, owners, cap)?;
    let mut bytes = Vec::with_capacity(file.metadata().map_or(0, |m| m.len()) as usize);
    file.take(cap + 1).read_to_end(&mut bytes).map_err(Distrust::Read)?;
    if bytes.len() as u64 > cap {
        return Err(Distrust::Grew);
    }
    Ok(bytes)
}

/// The open file if it deserves trust (as [`read_checked`] judges it, on the descriptor:
/// what is then mapped or read is what was judged).
pub fn judged(file: File, owners: &[u32], cap: u64) -> Result<File, Distrust> {
    let meta = file.metadata().map_err(Distrust::Inspect)?;
    if !meta.file_type().is_file() {
        return Err(Distrust::NotAFile);
    }
    if !owners.contains(&meta.uid()) {
        let whom: Vec<String> = owners.iter().map(|&uid| user_label(uid)).collect();
        return Err(Distrust::Owner { owner: user_label(meta.uid()), owners: whom.join(" or ") });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Distrust::Writable { mode: meta.mode() & 0o7777 });
    }
    if meta.len() > cap {
        return Err(Distrust::TooLarge { len: meta.len(), cap });
    }
    Ok(file)
}

/// Removes a file stagefs kept on the node (a lock, log, record or status in the runtime
/// directory, a saved index in the cache): the one place that deletes them, so that a
/// check (the test below) can see nothing else does. `unlink` never follows a link, and
/// the directories are checked private ones. A file already gone is no error.
pub fn remove_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!("cannot remove {}: {e}", path.shown());
        }
    }
}

/// Removes a coordination file of ours (a users tally, a lock) unless a process holds an
/// `flock` on it: locked exclusively without waiting, checked to be the file the path
/// still names, then removed. A file already gone is no error.
pub fn remove_unless_locked(path: &Path) {
    if std::fs::symlink_metadata(path).is_err() {
        return;
    }
    let Ok(file) = open_private(path) else { return };
    // SAFETY: flock on a descriptor we own; LOCK_NB never waits.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return;
    }
    let same = match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    };
    if same {
        remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    /// Files that create or delete on a node by themselves, and why each may.
    const MAY_WRITE: &[(&str, &str)] = &[
        ("crates/stagefs-open/src/places.rs", "makes the checked directories"),
        ("crates/stagefs-open/src/places/checked.rs", "works under a checked directory's descriptor"),
        ("crates/stagefs-open/src/places/files.rs", "this file"),
        (
            "crates/stagefs-open/src/places/outside.rs",
            "writes a saved index beside its archive, through the directory's descriptor",
        ),
        ("daemon/start.rs", "opens /dev/fuse and /dev/null"),
        ("pack/output.rs", "writes the user's OUT through an O_EXCL temp name"),
        ("pack/read.rs", "reads the dataset read-only (O_NOFOLLOW)"),
        ("demo.rs", "writes in its own work directory, made by places::own_dir"),
        ("crates/stagefs-reader/src/bin/stagefs-reader/gen.rs", "the reader's benchmark tool writes its own test tree"),
        ("crates/stagefs-reader/src/source.rs", "File::options, read-only (see MAY_OPEN)"),
    ];
    const WRITES: &[&str] = &[
        "remove_file(",
        "create_dir",
        "File::create",
        "File::options",
        "fs::OpenOptions",
        "OpenOptions::new(",
        "fs::write(",
    ];

    /// Files that open a file by its path by themselves, and why each may: every archive,
    /// shard, list, saved index or record is opened through `places` (`open_outside`,
    /// `read_own`, a `CheckedDir`), which judges who made it and uses only what it opened.
    const MAY_OPEN: &[(&str, &str)] = &[
        ("crates/stagefs-open/src/places.rs", "the mechanism"),
        ("crates/stagefs-open/src/places/checked.rs", "the mechanism"),
        ("crates/stagefs-open/src/places/files.rs", "the mechanism"),
        ("crates/stagefs-open/src/places/outside.rs", "the mechanism"),
        ("daemon/start.rs", "/dev/fuse and /dev/null"),
        ("crates/stagefs-open/src/stage/budget.rs", "/proc/meminfo and the cgroup's limits"),
        ("node/slurm.rs", "/proc/PID/stat and cmdline"),
        ("crates/stagefs-open/src/registry.rs", "/proc/PID/stat"),
        ("daemon/memory.rs", "/proc/self/status"),
        ("mountpoint.rs", "/proc/self/mountinfo"),
        ("pack/read.rs", "the dataset being packed, read-only, O_NOFOLLOW"),
        ("pack/output.rs", "OUT's O_EXCL temp file"),
        ("demo.rs", "the files of its own mount"),
        ("growing.rs", "resolves the directory of a shard to remove, to match it: opens nothing"),
        (
            "crates/stagefs-reader/src/source.rs",
            "reads the files the user lists, as `cat` would (their trust is the user's, as a named archive's): \
             O_NONBLOCK, regular files of the listed size only",
        ),
        ("crates/stagefs-reader/src/bin/stagefs-reader/bench.rs", "the reader's benchmark tool reads its test tree"),
    ];
    const OPENS: &[&str] = &[
        "File::open(",
        "fs::read(",
        "fs::read_to_string(",
        "File::options(",
        "OpenOptions::new(",
        "libc::open(",
        "libc::openat(",
        "canonicalize(",
    ];

    /// The product code of every crate of the workspace and the Python binding: (the name
    /// the lists above use, whether a list may allow it, text before its test module).
    fn product_files() -> Vec<(String, bool, String)> {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let mut found = Vec::new();
        // The archive crate opens and writes nothing by itself: it is handed open files.
        let crates = [
            ("src", "", true),
            ("crates/stagefs-open/src", "crates/stagefs-open/src/", true),
            ("crates/stagefs-archive/src", "crates/stagefs-archive/src/", false),
            ("crates/stagefs-reader/src", "crates/stagefs-reader/src/", true),
            // The object-store client opens nothing by itself: its files come through the
            // door the stagefs crate hands it (`stagefs_remote::Files`).
            ("crates/stagefs-remote/src", "crates/stagefs-remote/src/", false),
            ("crates/stagefs-text/src", "crates/stagefs-text/src/", false),
            ("python/native/src", "python/native/src/", true),
        ];
        let members = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        for dir in members.split('"').filter(|m| m.starts_with("crates/") || m.starts_with("python/")) {
            let scanned = crates.iter().any(|(src, ..)| src.strip_suffix("/src") == Some(dir));
            assert!(scanned, "the workspace member {dir} is not scanned: add it to the list above");
        }
        for (dir, prefix, daemon) in crates {
            let src = root.join(dir);
            let mut stack = vec![src.clone()];
            while let Some(dir) = stack.pop() {
                for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        stack.push(path);
                        continue;
                    }
                    let rel = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
                    if !rel.ends_with(".rs") || rel.ends_with("tests.rs") || rel.starts_with("test_") {
                        continue;
                    }
                    let rel = format!("{prefix}{rel}");
                    let text = std::fs::read_to_string(&path).unwrap();
                    // Test modules sit at the end of each file.
                    let product = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("").to_string();
                    found.push((rel, daemon, product));
                }
            }
        }
        found
    }

    fn offending(allowed: &[(&str, &str)], calls: &[&str]) -> Vec<String> {
        let mut found = Vec::new();
        for (rel, daemon, product) in product_files() {
            if daemon && allowed.iter().any(|(file, _)| *file == rel) {
                continue;
            }
            for (n, line) in product.lines().enumerate() {
                let code = line.trim_start();
                // A call, not the tail of a longer name (`LockFile::open(` is no `File::open(`).
                let calls_one = calls.iter().any(|w| {
                    code.match_indices(w).any(|(i, _)| {
                        !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') || w.starts_with('.')
                    })
                });
                if !code.starts_with("//") && calls_one && !code.contains("places::") {
                    let shown = if rel.contains("/src/") { rel.clone() } else { format!("src/{rel}") };
                    found.push(format!("{shown}:{}: {}", n + 1, code));
                }
            }
        }
        found
    }

    /// Everything stagefs keeps on a node goes through `places`: no other product code
    /// creates, opens for writing or deletes a path by itself (test modules excepted).
    #[test]
    fn only_places_writes_and_deletes_on_the_node() {
        let found = offending(MAY_WRITE, WRITES);
        assert!(
            found.is_empty(),
            "write or delete through places (or list the file with a reason):\n{}",
            found.join("\n")
        );
    }

    /// Every file from outside is opened the one way (`places::open_outside`, or `read_own`
    /// for what stagefs wrote itself): no other product code opens a path by itself, nor
    /// resolves one with `canonicalize` to check it and open it again.
    #[test]
    fn only_places_opens_files_from_outside() {
        let found = offending(MAY_OPEN, OPENS);
        assert!(
            found.is_empty(),
            "open files from outside through places::open_outside (or list the file with a reason):\n{}",
            found.join("\n")
        );
    }

    /// Text from outside reaches terminals, logs and records escaped: paths are shown with
    /// `Shown::shown`, never `display()`.
    #[test]
    fn paths_are_shown_escaped() {
        let found = offending(&[], &[".display()"]);
        assert!(found.is_empty(), "show paths with .shown() (stagefs_archive::escape::Shown):\n{}", found.join("\n"));
    }
}
