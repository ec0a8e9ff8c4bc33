//! The files stagefs keeps in its checked directories: opened without following links, written atomically, read only when trusted, and removed here alone.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::{my_uid, user_label};

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
        return Err(std::io::Error::other(format!("{} is not a regular file of yours", path.display())));
    }
    Ok(file)
}

/// Eight bytes from the kernel's random pool, as hex: temp names nobody can predict.
pub(crate) fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    let got = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if got.is_err() {
        // No /dev/urandom (a bare container): O_EXCL still refuses any planted name.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (stagefs_archive::hash::hash(&nanos.to_le_bytes()) ^ u64::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` atomically: a temp file beside it, created with `O_EXCL` and
/// `O_NOFOLLOW` under an unpredictable name with exactly `mode`, then renamed over `path`
/// (rename replaces a planted symlink itself, never what it points to).
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".{}.tmp", random_suffix()));
    let tmp = path.with_file_name(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let result = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        remove_file(&tmp);
    }
    result
}

/// Why a file was not trusted, for the log line.
pub type Distrust = String;

/// Reads a file only if it deserves trust: a regular file (opened without following a
/// symlink and without blocking on a FIFO), owned by one of `owners`, writable by nobody
/// else, and at most `cap` bytes.
pub fn read_trusted(path: &Path, owners: &[u32], cap: u64) -> Result<Vec<u8>, Distrust> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open it: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot inspect it: {e}"))?;
    if !meta.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    if !owners.contains(&meta.uid()) {
        return Err(format!("it belongs to {}, neither you nor the archive's owner", user_label(meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("other users may write it (mode {:04o})", meta.mode() & 0o7777));
    }
    if meta.len() > cap {
        return Err(format!("it is larger ({} bytes) than an index of this archive can be ({cap})", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > cap {
        return Err("it grew while being read".into());
    }
    Ok(bytes)
}

/// Removes a file stagefs kept on the node (a lock, log, record or status in the runtime
/// directory, a saved index in the cache): the one place that deletes them, so that a
/// check (the test below) can see nothing else does. `unlink` never follows a link, and
/// the directories are checked private ones. A file already gone is no error.
pub fn remove_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!("cannot remove {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    /// Files that create or delete on a node by themselves, and why each may.
    const MAY_WRITE: &[(&str, &str)] = &[
        ("places.rs", "makes the checked directories"),
        ("places/checked.rs", "works under a checked directory's descriptor"),
        ("places/files.rs", "this file"),
        ("open.rs", "opens the archive read-only, non-blocking"),
        ("daemon/start.rs", "opens /dev/fuse and /dev/null"),
        ("daemon/log.rs", "appends to the user's own --log-file"),
        ("saved_index.rs", "renews a cached index's mtime (O_NOFOLLOW)"),
        ("pack/output.rs", "writes the user's OUT through an O_EXCL temp name"),
        ("pack/read.rs", "reads the dataset read-only (O_NOFOLLOW)"),
        ("demo.rs", "writes in its own work directory, made by places::own_dir"),
    ];
    const WRITES: &[&str] =
        &["remove_file(", "create_dir", "File::create", "File::options", "OpenOptions", "fs::write("];

    /// Everything stagefs keeps on a node goes through `places`: no other product code
    /// creates, opens for writing or deletes a path by itself (test modules excepted).
    #[test]
    fn only_places_writes_and_deletes_on_the_node() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
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
                if MAY_WRITE.iter().any(|(file, _)| *file == rel) {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                // Test modules sit at the end of each file.
                let product = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                for (n, line) in product.lines().enumerate() {
                    let code = line.trim_start();
                    if !code.starts_with("//") && WRITES.iter().any(|w| code.contains(w)) && !code.contains("places::")
                    {
                        found.push(format!("src/{rel}:{}: {}", n + 1, code));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "write or delete through places (or list the file with a reason):\n{}",
            found.join("\n")
        );
    }
}
