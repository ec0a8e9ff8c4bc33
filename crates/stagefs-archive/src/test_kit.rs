//! The one test kit's base, shared by the unit tests (`crate::test_kit`) and the
//! integration tests (`tests/util.rs` includes this file): temporary directories that
//! unmount what a failed test left below them, the mount table, and tools that must be
//! installed (a missing one is a panic naming its Debian package: tests never skip).

// Each of the two test builds uses only part of the kit.
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Debian package providing a tool, for the panic message.
pub(crate) fn package_of(tool: &str) -> &'static str {
    match tool {
        "mksquashfs" | "unsquashfs" => "squashfs-tools",
        "gensquashfs" | "tar2sqfs" | "sqfs2tar" => "squashfs-tools-ng",
        "bsdtar" => "libarchive-tools",
        "setfattr" | "getfattr" => "attr",
        "fuser" => "psmisc",
        "fusermount3" => "fuse3",
        "python3" => "python3",
        "tar" => "tar",
        "umount" | "mount" => "mount",
        "sleep" | "truncate" => "coreutils",
        "useradd" => "passwd",
        "setpriv" => "util-linux",
        "openssl" => "openssl",
        "script" => "bsdutils",
        _ => "(unknown package)",
    }
}

/// Panics unless `tool` is an executable on PATH. Tests never skip silently.
pub fn require_tool(tool: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(tool);
        if let Ok(meta) = fs::metadata(&candidate) {
            if meta.is_file() && meta.mode() & 0o111 != 0 {
                return candidate;
            }
        }
    }
    panic!(
        "required tool `{tool}` is not installed (Debian package `{}`); install it, \
         e.g. by running .ci/run — these tests never skip",
        package_of(tool)
    );
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A unique directory under `std::env::temp_dir()`, removed on drop (after
/// lazily unmounting anything a failed test left mounted below it).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new empty directory whose name holds `label`.
    pub fn new(label: &str) -> TempDir {
        let base = std::env::temp_dir();
        let base = base.canonicalize().unwrap_or(base);
        let label: String =
            label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::SeqCst);
            let path = base.join(format!("stagefs-test-{label}-{}-{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create temp dir {}: {e}", path.display()),
            }
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `p` inside it.
    pub fn join<P: AsRef<Path>>(&self, p: P) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Never recurse into a live mount: unmount leftovers first.
        for m in mounts().iter().rev() {
            if m.mount_point.starts_with(&self.path) {
                eprintln!("TempDir cleanup: {} is still mounted; lazily unmounting it", m.mount_point.display());
                let _ = Command::new("umount").arg("-l").arg(&m.mount_point).status();
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.path) {
            eprintln!("TempDir cleanup: cannot remove {}: {e}", self.path.display());
        }
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountInfo {
    /// `MAJOR:MINOR` of the mounted device.
    pub major_minor: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The filesystem type.
    pub fs_type: String,
    /// The mount source.
    pub source: String,
    /// Per-superblock options.
    pub options: String,
}

/// Undoes the octal escapes (`\040` for a space) of /proc mount tables.
fn unescape_mount_field(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsStr::from_bytes(&out).to_os_string()
}

/// The current mount table of this process's mount namespace.
pub fn mounts() -> Vec<MountInfo> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let mut v = Vec::new();
    for line in text.lines() {
        // id parent major:minor root mount_point options [optional...] - type source super_options
        let (left, right) = match line.split_once(" - ") {
            Some(x) => x,
            None => continue,
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 2 {
            continue;
        }
        v.push(MountInfo {
            major_minor: l[2].to_string(),
            mount_point: PathBuf::from(unescape_mount_field(l[4])),
            fs_type: r[0].to_string(),
            source: unescape_mount_field(r[1]).to_string_lossy().into_owned(),
            options: l[5].to_string(),
        });
    }
    v
}
