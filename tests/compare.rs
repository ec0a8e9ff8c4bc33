//! Entry-by-entry comparison of two directory trees: a reference (an archive
//! extracted by the real tool) and a stagefs mount of the same archive.
//!
//! Every difference is collected, and one panic lists them all with their
//! paths. The tests at the bottom prove the comparison can fail for each
//! property it checks.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsString};
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What to compare beyond the always-checked properties (set of paths, file
/// type, permission bits, size, mtime seconds, owner, content, link target,
/// hardlink identity).
#[derive(Debug, Clone)]
pub struct Options {
    /// Compare mtime nanoseconds too (formats storing sub-second times:
    /// pax; for the others both sides must show 0).
    pub nanos: bool,
    /// Compare the attributes of the root directory itself (only meaningful
    /// when the archive has an entry for it: "./" in tar, always in SquashFS).
    pub root: bool,
    /// Compare extended attributes.
    pub xattrs: bool,
    /// Compare st_nlink of directories (2 + number of subdirectories on
    /// Linux file systems; SquashFS stores the same).
    pub dir_nlink: bool,
    /// Directories (relative paths, "" for the root) whose mode, owner and
    /// mtime are not compared: implicit directories of an archive that has no
    /// member for them, which the extracting tool creates with its own
    /// defaults.
    pub skip_dir_attrs: BTreeSet<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { nanos: true, root: true, xattrs: true, dir_nlink: true, skip_dir_attrs: BTreeSet::new() }
    }
}

impl Options {
    pub fn nanos(mut self, on: bool) -> Self {
        self.nanos = on;
        self
    }
    pub fn root(mut self, on: bool) -> Self {
        self.root = on;
        self
    }
    pub fn xattrs(mut self, on: bool) -> Self {
        self.xattrs = on;
        self
    }
    pub fn dir_nlink(mut self, on: bool) -> Self {
        self.dir_nlink = on;
        self
    }
    pub fn skip_dir_attrs<I: IntoIterator<Item = &'static str>>(mut self, dirs: I) -> Self {
        self.skip_dir_attrs.extend(dirs.into_iter().map(PathBuf::from));
        self
    }
}

/// One node found by the walk.
struct Node {
    meta: Metadata,
}

/// Walks `root` without following symlinks; keys are paths relative to
/// `root` ("" is the root itself). Errors are recorded as differences.
fn walk(root: &Path, errors: &mut Vec<String>, side: &str) -> BTreeMap<PathBuf, Node> {
    let mut map = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(&rel) };
        let meta = match fs::symlink_metadata(&abs) {
            Ok(m) => m,
            Err(e) => {
                errors.push(format!("{}: {side}: lstat failed: {e}", show(&rel)));
                continue;
            }
        };
        if meta.file_type().is_dir() {
            match fs::read_dir(&abs) {
                Ok(rd) => {
                    let mut seen = BTreeSet::new();
                    for entry in rd {
                        match entry {
                            Ok(e) => {
                                let name = e.file_name();
                                if !seen.insert(name.clone()) {
                                    errors.push(format!(
                                        "{}: {side}: readdir lists the name {:?} twice",
                                        show(&rel),
                                        name
                                    ));
                                    continue;
                                }
                                stack.push(rel.join(name));
                            }
                            Err(e) => errors.push(format!("{}: {side}: readdir failed: {e}", show(&rel))),
                        }
                    }
                }
                Err(e) => errors.push(format!("{}: {side}: opendir failed: {e}", show(&rel))),
            }
        }
        map.insert(rel, Node { meta });
    }
    map
}

/// A relative path for messages.
fn show(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "<root>".to_string()
    } else {
        format!("{:?}", rel)
    }
}

fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "char device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "unknown"
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// Extended attributes of `p` (not following symlinks), name → value.
/// "Not supported" counts as none.
pub fn xattrs(p: &Path) -> io::Result<BTreeMap<OsString, Vec<u8>>> {
    let c = cstr(p);
    let mut out = BTreeMap::new();
    let names = loop {
        // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
        let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOTSUP) {
                return Ok(out);
            }
            return Err(e);
        }
        let mut buf = vec![0u8; n as usize];
        if n == 0 {
            break buf;
        }
        // SAFETY: NUL-terminated names; the buffer is as long as the length passed.
        let m = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
        if m < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue; // grew in between
            }
            return Err(e);
        }
        buf.truncate(m as usize);
        break buf;
    };
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        let value = loop {
            // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
            let n = unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), std::ptr::null_mut(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut buf = vec![0u8; n as usize];
            if n == 0 {
                break buf;
            }
            // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
            let m = unsafe {
                libc::lgetxattr(c.as_ptr(), cname.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len())
            };
            if m < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ERANGE) {
                    continue;
                }
                return Err(e);
            }
            buf.truncate(m as usize);
            break buf;
        };
        out.insert(OsString::from_vec(name.to_vec()), value);
    }
    Ok(out)
}

fn show_bytes(v: &[u8]) -> String {
    match std::str::from_utf8(v) {
        Ok(s) if !s.contains('\0') => format!("{s:?}"),
        _ => format!("0x{}", v.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

/// Where two byte strings first differ, for messages.
fn content_diff(a: &[u8], b: &[u8]) -> Option<String> {
    if a == b {
        return None;
    }
    let first = a.iter().zip(b.iter()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let end_a = (first + 16).min(a.len());
    let end_b = (first + 16).min(b.len());
    Some(format!(
        "content differs: lengths {} vs {}, first difference at byte {} (expected {} / actual {}; fnv {:016x} vs {:016x})",
        a.len(),
        b.len(),
        first,
        show_bytes(&a[first.min(a.len())..end_a]),
        show_bytes(&b[first.min(b.len())..end_b]),
        crate::kit::fnv1a(a),
        crate::kit::fnv1a(b)
    ))
}

/// Every difference between `expected` and `actual`, one line each.
pub fn diff_trees(expected: &Path, actual: &Path, opts: &Options) -> Vec<String> {
    let mut diffs = Vec::new();
    let left = walk(expected, &mut diffs, "expected");
    let right = walk(actual, &mut diffs, "actual");

    for rel in left.keys() {
        if !right.contains_key(rel) {
            diffs.push(format!("{}: missing (expected a {})", show(rel), kind(&left[rel].meta)));
        }
    }
    for rel in right.keys() {
        if !left.contains_key(rel) {
            diffs.push(format!("{}: unexpected {} (not in the reference tree)", show(rel), kind(&right[rel].meta)));
        }
    }

    // Hardlink groups: path -> every path (in the same tree) sharing its inode.
    let peers = |tree: &BTreeMap<PathBuf, Node>| -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        let mut by_ino: BTreeMap<(u64, u64), BTreeSet<PathBuf>> = BTreeMap::new();
        for (rel, n) in tree {
            if !n.meta.is_dir() {
                by_ino.entry((n.meta.dev(), n.meta.ino())).or_default().insert(rel.clone());
            }
        }
        let mut out = BTreeMap::new();
        for group in by_ino.values() {
            for p in group {
                out.insert(p.clone(), group.clone());
            }
        }
        out
    };
    let left_peers = peers(&left);
    let right_peers = peers(&right);

    for (rel, l) in &left {
        let r = match right.get(rel) {
            Some(r) => r,
            None => continue,
        };
        let (lm, rm) = (&l.meta, &r.meta);
        let here = show(rel);
        let is_root = rel.as_os_str().is_empty();
        if kind(lm) != kind(rm) {
            diffs.push(format!("{here}: type: expected {}, actual {}", kind(lm), kind(rm)));
            continue;
        }
        let is_dir = lm.is_dir();
        let skipped_root = is_root && !opts.root;
        let skipped_dir = is_dir && opts.skip_dir_attrs.contains(rel);
        let attrs = !skipped_root && !skipped_dir;

        if attrs {
            if lm.mode() & 0o7777 != rm.mode() & 0o7777 {
                diffs.push(format!(
                    "{here}: mode: expected {:04o}, actual {:04o}",
                    lm.mode() & 0o7777,
                    rm.mode() & 0o7777
                ));
            }
            if lm.uid() != rm.uid() || lm.gid() != rm.gid() {
                diffs.push(format!(
                    "{here}: owner: expected {}:{}, actual {}:{}",
                    lm.uid(),
                    lm.gid(),
                    rm.uid(),
                    rm.gid()
                ));
            }
            if lm.mtime() != rm.mtime() {
                diffs.push(format!("{here}: mtime: expected {}, actual {}", lm.mtime(), rm.mtime()));
            } else if opts.nanos && lm.mtime_nsec() != rm.mtime_nsec() {
                diffs.push(format!(
                    "{here}: mtime nanoseconds: expected {}.{:09}, actual {}.{:09}",
                    lm.mtime(),
                    lm.mtime_nsec(),
                    rm.mtime(),
                    rm.mtime_nsec()
                ));
            }
        }
        if !is_dir && lm.size() != rm.size() {
            diffs.push(format!("{here}: size: expected {}, actual {}", lm.size(), rm.size()));
        }
        if (!is_dir || opts.dir_nlink) && lm.nlink() != rm.nlink() {
            diffs.push(format!("{here}: st_nlink: expected {}, actual {}", lm.nlink(), rm.nlink()));
        }
        if !is_dir {
            let (lp, rp) = (&left_peers[rel], &right_peers[rel]);
            if lp != rp {
                diffs.push(format!(
                    "{here}: hardlink identity: in the reference it shares its inode with {:?}, in the mount with {:?}",
                    lp, rp
                ));
            }
        }
        if lm.file_type().is_file() {
            match (fs::read(expected.join(rel)), fs::read(actual.join(rel))) {
                (Ok(a), Ok(b)) => {
                    if let Some(d) = content_diff(&a, &b) {
                        diffs.push(format!("{here}: {d}"));
                    }
                    if b.len() as u64 != rm.size() {
                        diffs.push(format!("{here}: read {} bytes but st_size is {}", b.len(), rm.size()));
                    }
                }
                (Err(e), _) => diffs.push(format!("{here}: expected: read failed: {e}")),
                (_, Err(e)) => diffs.push(format!("{here}: actual: read failed: {e}")),
            }
        }
        if lm.file_type().is_symlink() {
            match (fs::read_link(expected.join(rel)), fs::read_link(actual.join(rel))) {
                (Ok(a), Ok(b)) => {
                    if a != b {
                        diffs.push(format!("{here}: link target: expected {:?}, actual {:?}", a, b));
                    }
                }
                (Err(e), _) => diffs.push(format!("{here}: expected: readlink failed: {e}")),
                (_, Err(e)) => diffs.push(format!("{here}: actual: readlink failed: {e}")),
            }
        }
        if opts.xattrs && attrs {
            let la = xattrs(&if is_root { expected.to_path_buf() } else { expected.join(rel) });
            let ra = xattrs(&if is_root { actual.to_path_buf() } else { actual.join(rel) });
            match (la, ra) {
                (Ok(a), Ok(b)) => {
                    if a != b {
                        let fmt = |m: &BTreeMap<OsString, Vec<u8>>| {
                            m.iter()
                                .map(|(k, v)| format!("{}={}", k.to_string_lossy(), show_bytes(v)))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        diffs.push(format!("{here}: xattrs: expected {{{}}}, actual {{{}}}", fmt(&a), fmt(&b)));
                    }
                }
                (Err(e), _) => diffs.push(format!("{here}: expected: listxattr/getxattr failed: {e}")),
                (_, Err(e)) => diffs.push(format!("{here}: actual: listxattr/getxattr failed: {e}")),
            }
        }
    }
    diffs
}

/// Panics, listing every difference, unless the trees match.
pub fn assert_trees_equal(expected: &Path, actual: &Path, opts: &Options) {
    let diffs = diff_trees(expected, actual, opts);
    if !diffs.is_empty() {
        panic!(
            "{} difference(s) between the reference tree {} and {}:\n  {}",
            diffs.len(),
            expected.display(),
            actual.display(),
            diffs.join("\n  ")
        );
    }
}

/// Number of entries below `root` (not counting it), to guard against
/// vacuous comparisons of two empty trees.
pub fn count_entries(root: &Path) -> usize {
    let mut errors = Vec::new();
    let n = walk(root, &mut errors, "tree").len();
    assert!(errors.is_empty(), "walking {}: {errors:?}", root.display());
    n - 1
}

// ---------------------------------------------------------------------------
// The comparison itself must be able to fail.

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn set_mtime(p: &Path, sec: i64, nsec: i64) {
        let c = cstr(p);
        let ts = [libc::timespec { tv_sec: sec, tv_nsec: nsec }, libc::timespec { tv_sec: sec, tv_nsec: nsec }];
        // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
        assert_eq!(r, 0, "utimensat {}: {}", p.display(), io::Error::last_os_error());
    }

    fn set_xattr(p: &Path, name: &str, value: &[u8]) {
        let c = cstr(p);
        let n = CString::new(name).unwrap();
        let r =
            // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
            unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr() as *const libc::c_void, value.len(), 0) };
        assert_eq!(r, 0, "lsetxattr {}: {}", p.display(), io::Error::last_os_error());
    }

    /// A small tree with one of everything the comparison looks at.
    fn make(root: &Path) {
        fs::create_dir_all(root.join("d/e")).unwrap();
        fs::write(root.join("d/file"), b"hello world").unwrap();
        fs::write(root.join("d/other"), b"other").unwrap();
        fs::hard_link(root.join("d/file"), root.join("d/link")).unwrap();
        symlink("file", root.join("d/sym")).unwrap();
        set_xattr(&root.join("d/file"), "user.k", b"v");
        for p in ["d/file", "d/other", "d/sym", "d/e", "d", ""] {
            set_mtime(&root.join(p), 1_600_000_000, 5);
        }
    }

    fn pair() -> (TempDir, PathBuf, PathBuf) {
        let t = TempDir::new("compare-selftest");
        let (a, b) = (t.join("a"), t.join("b"));
        make(&a);
        make(&b);
        (t, a, b)
    }

    /// Applies `change` to the second tree and returns the differences.
    fn diffs_after(opts: &Options, change: impl FnOnce(&Path)) -> Vec<String> {
        let (_t, a, b) = pair();
        assert!(diff_trees(&a, &b, opts).is_empty(), "identical trees must compare equal");
        change(&b);
        diff_trees(&a, &b, opts)
    }

    fn expect(what: &str, opts: &Options, needle: &str, change: impl FnOnce(&Path)) {
        let d = diffs_after(opts, change);
        assert!(
            d.iter().any(|l| l.contains(needle)),
            "{what}: expected a difference mentioning {needle:?}, got {d:#?}"
        );
    }

    #[test]
    fn compare_detects_each_kind_of_difference() {
        let o = Options::default();
        expect("missing file", &o, "missing", |b| fs::remove_file(b.join("d/other")).unwrap());
        expect("extra file", &o, "unexpected", |b| fs::write(b.join("d/new"), b"x").unwrap());
        expect("content", &o, "content differs", |b| {
            fs::write(b.join("d/other"), b"OTHER").unwrap();
            set_mtime(&b.join("d/other"), 1_600_000_000, 5);
            set_mtime(&b.join("d"), 1_600_000_000, 5);
        });
        expect("size", &o, "size", |b| {
            fs::write(b.join("d/other"), b"other!").unwrap();
        });
        expect("mode", &o, "mode", |b| {
            fs::set_permissions(b.join("d/other"), fs::Permissions::from_mode(0o4755)).unwrap()
        });
        expect("owner", &o, "owner", |b| std::os::unix::fs::lchown(b.join("d/other"), Some(1234), Some(5678)).unwrap());
        expect("mtime", &o, "mtime", |b| set_mtime(&b.join("d/other"), 1_600_000_001, 5));
        expect("mtime ns", &o, "nanoseconds", |b| set_mtime(&b.join("d/other"), 1_600_000_000, 6));
        assert!(
            diffs_after(&o.clone().nanos(false), |b| set_mtime(&b.join("d/other"), 1_600_000_000, 6)).is_empty(),
            "nanos(false) must ignore nanoseconds"
        );
        expect("root mtime", &o, "<root>", |b| set_mtime(b, 1_600_000_001, 5));
        assert!(diffs_after(&o.clone().root(false), |b| set_mtime(b, 1_600_000_001, 5)).is_empty());
        expect("symlink target", &o, "link target", |b| {
            fs::remove_file(b.join("d/sym")).unwrap();
            symlink("fil_", b.join("d/sym")).unwrap();
            set_mtime(&b.join("d/sym"), 1_600_000_000, 5);
            set_mtime(&b.join("d"), 1_600_000_000, 5);
        });
        expect("type", &o, "type", |b| {
            fs::remove_file(b.join("d/sym")).unwrap();
            fs::write(b.join("d/sym"), b"file").unwrap();
        });
        expect("xattr value", &o, "xattrs", |b| set_xattr(&b.join("d/file"), "user.k", b"w"));
        expect("xattr extra", &o, "xattrs", |b| set_xattr(&b.join("d/other"), "user.new", b""));
        assert!(diffs_after(&o.clone().xattrs(false), |b| set_xattr(&b.join("d/other"), "user.new", b"")).is_empty());
        expect("hardlink broken", &o, "hardlink identity", |b| {
            fs::remove_file(b.join("d/link")).unwrap();
            fs::copy(b.join("d/file"), b.join("d/link")).unwrap();
            set_xattr(&b.join("d/link"), "user.k", b"v");
            set_mtime(&b.join("d/link"), 1_600_000_000, 5);
            set_mtime(&b.join("d"), 1_600_000_000, 5);
        });
        expect("nlink", &o, "st_nlink", |b| fs::hard_link(b.join("d/other"), b.join("d/e/other2")).unwrap());
        expect("dir nlink", &o, "st_nlink", |b| {
            fs::create_dir(b.join("d/e/sub")).unwrap();
        });
        assert!(
            !diffs_after(&o.clone().dir_nlink(false), |b| fs::create_dir(b.join("d/e/sub")).unwrap())
                .iter()
                .any(|l| l.contains("st_nlink")),
            "dir_nlink(false) must ignore directory link counts"
        );
        expect("dir mode", &o, "mode", |b| {
            fs::set_permissions(b.join("d/e"), fs::Permissions::from_mode(0o700)).unwrap()
        });
        assert!(diffs_after(&o.clone().skip_dir_attrs(["d/e"]), |b| {
            fs::set_permissions(b.join("d/e"), fs::Permissions::from_mode(0o700)).unwrap()
        })
        .is_empty());
    }

    #[test]
    fn compare_reports_all_differences_at_once() {
        let d = diffs_after(&Options::default(), |b| {
            fs::remove_file(b.join("d/other")).unwrap();
            fs::set_permissions(b.join("d/file"), fs::Permissions::from_mode(0o600)).unwrap();
            set_mtime(&b.join("d/e"), 1, 0);
        });
        assert!(d.len() >= 3, "expected at least 3 differences, got {d:#?}");
        let r = std::panic::catch_unwind(|| {
            let (_t, a, b) = pair();
            fs::remove_file(b.join("d/other")).unwrap();
            assert_trees_equal(&a, &b, &Options::default());
        });
        assert!(r.is_err(), "assert_trees_equal must panic on a difference");
    }
}
