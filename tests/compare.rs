//! Entry-by-entry comparison of a reference tree (the archive extracted by the real tool) with a stagefs mount of it:
//! one panic lists every difference; the tests at the bottom prove it can fail for each property it checks.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What to compare beyond the always-checked properties (set of paths, file type, permission bits, size,
/// mtime seconds, owner, content, link target, hardlink identity).
#[derive(Debug, Clone)]
pub struct Options {
    /// mtime nanoseconds too (pax stores them; for other formats both sides must show 0).
    pub nanos: bool,
    /// The root directory's attributes (only when the archive has an entry for it: "./" in tar, always in SquashFS).
    pub root: bool,
    /// Extended attributes.
    pub xattrs: bool,
    /// st_nlink of directories (2 + subdirectories on Linux; SquashFS stores the same).
    pub dir_nlink: bool,
    /// Directories (relative paths, "" for the root) whose mode, owner and mtime are not compared: implicit
    /// directories of an archive without a member for them, which the extracting tool creates with its own defaults.
    pub skip_dir_attrs: BTreeSet<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options { nanos: true, root: true, xattrs: true, dir_nlink: true, skip_dir_attrs: BTreeSet::new() }
    }
}

/// A builder setter for each `bool` field: `Options::default().root(false)`.
macro_rules! setters {
    ($($field:ident),*) => {$(
        pub fn $field(mut self, on: bool) -> Self {
            self.$field = on;
            self
        }
    )*};
}

impl Options {
    setters!(nanos, root, xattrs, dir_nlink);

    pub fn skip_dir_attrs(mut self, dirs: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.skip_dir_attrs.extend(dirs.into_iter().map(Into::into));
        self
    }
}

/// Walks `root` without following symlinks, by path relative to it ("" the root); errors become differences.
fn walk(root: &Path, errors: &mut Vec<String>, side: &str) -> BTreeMap<PathBuf, Metadata> {
    let (mut map, mut stack) = (BTreeMap::new(), vec![PathBuf::new()]);
    while let Some(rel) = stack.pop() {
        let here = show(&rel);
        let abs = if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(&rel) };
        let Ok(meta) =
            fs::symlink_metadata(&abs).map_err(|e| errors.push(format!("{here}: {side}: lstat failed: {e}")))
        else {
            continue;
        };
        if meta.is_dir() {
            let entries = fs::read_dir(&abs).map_err(|e| errors.push(format!("{here}: {side}: opendir failed: {e}")));
            let mut seen = BTreeSet::new();
            for entry in entries.into_iter().flatten() {
                match entry.map(|e| e.file_name()) {
                    Ok(name) if !seen.insert(name.clone()) => {
                        errors.push(format!("{here}: {side}: readdir lists the name {name:?} twice"))
                    }
                    Ok(name) => stack.push(rel.join(name)),
                    Err(e) => errors.push(format!("{here}: {side}: readdir failed: {e}")),
                }
            }
        }
        map.insert(rel, meta);
    }
    map
}

/// A relative path for messages.
fn show(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "<root>".to_string()
    } else {
        format!("{rel:?}")
    }
}

fn kind(meta: &Metadata) -> &'static str {
    match meta.mode() & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char device",
        libc::S_IFBLK => "block device",
        _ => "unknown",
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// A value the kernel copies out (`llistxattr`, `lgetxattr`): `call(buffer, length)` asked
/// for the size with no buffer, then for the value, again if it grew in between (ERANGE).
fn sized(mut call: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let n = usize::try_from(call(std::ptr::null_mut(), 0)).map_err(|_| io::Error::last_os_error())?;
        let mut buf = vec![0u8; n];
        if n == 0 {
            return Ok(buf);
        }
        if let Ok(m) = usize::try_from(call(buf.as_mut_ptr(), buf.len())) {
            buf.truncate(m);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

/// Extended attributes of `p` (not following symlinks), name → value. "Not supported" counts as none.
pub fn xattrs(p: &Path) -> io::Result<BTreeMap<OsString, Vec<u8>>> {
    let c = cstr(p);
    // SAFETY: a NUL-terminated path, and a buffer (or null) of the length passed.
    let names = match sized(|buf, len| unsafe { libc::llistxattr(c.as_ptr(), buf.cast(), len) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(BTreeMap::new()),
        names => names?,
    };
    let names = names.split(|b| *b == 0).filter(|n| !n.is_empty()).map(OsStr::from_bytes);
    names.map(|name| Ok((name.to_os_string(), xattr(p, name)?))).collect()
}

/// The extended attribute `name` of `p` (not following symlinks).
pub fn xattr(p: &Path, name: impl AsRef<OsStr>) -> io::Result<Vec<u8>> {
    let (c, name) = (cstr(p), CString::new(name.as_ref().as_bytes()).unwrap());
    // SAFETY: a NUL-terminated path and name, and a buffer (or null) of the length passed.
    sized(|buf, len| unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), buf.cast(), len) })
}

fn show_bytes(v: &[u8]) -> String {
    match std::str::from_utf8(v) {
        Ok(s) if !s.contains('\0') => format!("{s:?}"),
        _ => format!("0x{}", v.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

fn show_xattrs(m: &BTreeMap<OsString, Vec<u8>>) -> String {
    m.iter().map(|(k, v)| format!("{}={}", k.to_string_lossy(), show_bytes(v))).collect::<Vec<_>>().join(", ")
}

/// Where two byte strings first differ, for messages.
fn content_diff(a: &[u8], b: &[u8]) -> Option<String> {
    if a == b {
        return None;
    }
    let first = a.iter().zip(b.iter()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let at = |v: &[u8]| show_bytes(&v[first.min(v.len())..(first + 16).min(v.len())]);
    let (la, lb, xa, xb, fa, fb) = (a.len(), b.len(), at(a), at(b), crate::kit::fnv1a(a), crate::kit::fnv1a(b));
    Some(format!(
        "content differs: lengths {la} vs {lb}, first difference at byte {first} (expected {xa} / actual {xb}; fnv {fa:016x} vs {fb:016x})"
    ))
}

/// Both sides' results of `op`, or None after a difference naming the side it failed on.
fn both<T>(diff: &mut impl FnMut(String), op: &str, a: io::Result<T>, b: io::Result<T>) -> Option<(T, T)> {
    match (a, b) {
        (Ok(a), Ok(b)) => return Some((a, b)),
        (Err(e), _) => diff(format!("expected: {op} failed: {e}")),
        (_, Err(e)) => diff(format!("actual: {op} failed: {e}")),
    }
    None
}

/// Hardlink groups: path -> every path (in the same tree) sharing its inode.
fn peers(tree: &BTreeMap<PathBuf, Metadata>) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut by_ino: BTreeMap<(u64, u64), BTreeSet<PathBuf>> = BTreeMap::new();
    for (rel, m) in tree.iter().filter(|(_, m)| !m.is_dir()) {
        by_ino.entry((m.dev(), m.ino())).or_default().insert(rel.clone());
    }
    by_ino.values().flat_map(|group| group.iter().map(|p| (p.clone(), group.clone()))).collect()
}

/// Every difference between `expected` and `actual`, one line each.
pub fn diff_trees(expected: &Path, actual: &Path, opts: &Options) -> Vec<String> {
    let mut diffs = Vec::new();
    let left = walk(expected, &mut diffs, "expected");
    let right = walk(actual, &mut diffs, "actual");
    for (rel, m) in left.iter().filter(|(rel, _)| !right.contains_key(*rel)) {
        diffs.push(format!("{}: missing (expected a {})", show(rel), kind(m)));
    }
    for (rel, m) in right.iter().filter(|(rel, _)| !left.contains_key(*rel)) {
        diffs.push(format!("{}: unexpected {} (not in the reference tree)", show(rel), kind(m)));
    }
    let (left_peers, right_peers) = (peers(&left), peers(&right));

    for (rel, lm) in &left {
        let Some(rm) = right.get(rel) else { continue };
        let here = show(rel);
        let mut diff = |what: String| diffs.push(format!("{here}: {what}"));
        if kind(lm) != kind(rm) {
            diff(format!("type: expected {}, actual {}", kind(lm), kind(rm)));
            continue;
        }
        let (is_root, is_dir) = (rel.as_os_str().is_empty(), lm.is_dir());
        let attrs = (opts.root || !is_root) && !(is_dir && opts.skip_dir_attrs.contains(rel));
        if attrs {
            let (lmode, rmode) = (lm.mode() & 0o7777, rm.mode() & 0o7777);
            if lmode != rmode {
                diff(format!("mode: expected {lmode:04o}, actual {rmode:04o}"));
            }
            if (lm.uid(), lm.gid()) != (rm.uid(), rm.gid()) {
                diff(format!("owner: expected {}:{}, actual {}:{}", lm.uid(), lm.gid(), rm.uid(), rm.gid()));
            }
            let (lt, rt) = ((lm.mtime(), lm.mtime_nsec()), (rm.mtime(), rm.mtime_nsec()));
            if lt.0 != rt.0 {
                diff(format!("mtime: expected {}, actual {}", lt.0, rt.0));
            } else if opts.nanos && lt.1 != rt.1 {
                diff(format!("mtime nanoseconds: expected {}.{:09}, actual {}.{:09}", lt.0, lt.1, rt.0, rt.1));
            }
        }
        if !is_dir && lm.size() != rm.size() {
            diff(format!("size: expected {}, actual {}", lm.size(), rm.size()));
        }
        if (!is_dir || opts.dir_nlink) && lm.nlink() != rm.nlink() {
            diff(format!("st_nlink: expected {}, actual {}", lm.nlink(), rm.nlink()));
        }
        if !is_dir && left_peers[rel] != right_peers[rel] {
            let (lp, rp) = (&left_peers[rel], &right_peers[rel]);
            diff(format!("hardlink identity: shares its inode with {lp:?} in the reference, {rp:?} in the mount"));
        }
        // The root's own path, not join("") (which adds a slash).
        let at = |tree: &Path| if is_root { tree.to_path_buf() } else { tree.join(rel) };
        let (l, r) = (at(expected), at(actual));
        let contents = lm.is_file().then(|| both(&mut diff, "read", fs::read(&l), fs::read(&r)));
        if let Some((a, b)) = contents.flatten() {
            content_diff(&a, &b).into_iter().for_each(&mut diff);
            if b.len() as u64 != rm.size() {
                diff(format!("read {} bytes but st_size is {}", b.len(), rm.size()));
            }
        }
        let links = lm.is_symlink().then(|| both(&mut diff, "readlink", fs::read_link(&l), fs::read_link(&r)));
        if let Some((a, b)) = links.flatten().filter(|(a, b)| a != b) {
            diff(format!("link target: expected {a:?}, actual {b:?}"));
        }
        let xa = (opts.xattrs && attrs).then(|| both(&mut diff, "listxattr/getxattr", xattrs(&l), xattrs(&r)));
        if let Some((a, b)) = xa.flatten().filter(|(a, b)| a != b) {
            diff(format!("xattrs: expected {{{}}}, actual {{{}}}", show_xattrs(&a), show_xattrs(&b)));
        }
    }
    diffs
}

/// Panics, listing every difference, unless the trees match.
pub fn assert_trees_equal(expected: &Path, actual: &Path, opts: &Options) {
    let diffs = diff_trees(expected, actual, opts);
    let (n, e, a) = (diffs.len(), expected.display(), actual.display());
    assert!(diffs.is_empty(), "{n} difference(s) between the reference tree {e} and {a}:\n  {}", diffs.join("\n  "));
}

/// Number of entries below `root` (not counting it), to guard against vacuous comparisons of two empty trees.
pub fn count_entries(root: &Path) -> usize {
    let mut errors = Vec::new();
    let n = walk(root, &mut errors, "tree").len();
    assert!(errors.is_empty(), "walking {}: {errors:?}", root.display());
    n - 1
}

// The comparison itself must be able to fail.

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::*;
    use std::os::unix::fs::symlink;

    /// The mtime (and atime) of `p`, not of a link's target.
    fn set_mtime(p: &Path, sec: i64, nsec: i64) {
        run_tool("touch", osargs!["-h", "-d", format!("@{sec}.{nsec:09}"), p]);
    }

    /// A small tree with one of everything the comparison looks at.
    fn make(root: PathBuf) -> PathBuf {
        fs::create_dir_all(root.join("d/e")).unwrap();
        fs::write(root.join("d/file"), b"hello world").unwrap();
        fs::write(root.join("d/other"), b"other").unwrap();
        fs::hard_link(root.join("d/file"), root.join("d/link")).unwrap();
        symlink("file", root.join("d/sym")).unwrap();
        set_xattr(&root.join("d/file"), "user.k", b"v").unwrap();
        for p in ["d/file", "d/other", "d/sym", "d/e", "d", ""] {
            set_mtime(&root.join(p), 1_600_000_000, 5);
        }
        root
    }

    fn pair() -> (TempDir, PathBuf, PathBuf) {
        let t = TempDir::new("compare-selftest");
        let (a, b) = (make(t.join("a")), make(t.join("b")));
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
        assert!(d.iter().any(|l| l.contains(needle)), "{what}: no difference mentions {needle:?}: {d:#?}");
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
        expect("size", &o, "size", |b| fs::write(b.join("d/other"), b"other!").unwrap());
        expect("mode", &o, "mode", |b| chmod(&b.join("d/other"), 0o4755));
        expect("owner", &o, "owner", |b| std::os::unix::fs::lchown(b.join("d/other"), Some(1234), Some(5678)).unwrap());
        expect("mtime", &o, "mtime", |b| set_mtime(&b.join("d/other"), 1_600_000_001, 5));
        expect("mtime ns", &o, "nanoseconds", |b| set_mtime(&b.join("d/other"), 1_600_000_000, 6));
        let d = diffs_after(&o.clone().nanos(false), |b| set_mtime(&b.join("d/other"), 1_600_000_000, 6));
        assert!(d.is_empty(), "nanos(false) must ignore nanoseconds: {d:#?}");
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
        expect("xattr value", &o, "xattrs", |b| set_xattr(&b.join("d/file"), "user.k", b"w").unwrap());
        expect("xattr extra", &o, "xattrs", |b| set_xattr(&b.join("d/other"), "user.new", b"").unwrap());
        assert!(diffs_after(&o.clone().xattrs(false), |b| set_xattr(&b.join("d/other"), "user.new", b"").unwrap())
            .is_empty());
        expect("hardlink broken", &o, "hardlink identity", |b| {
            fs::remove_file(b.join("d/link")).unwrap();
            fs::copy(b.join("d/file"), b.join("d/link")).unwrap();
            set_xattr(&b.join("d/link"), "user.k", b"v").unwrap();
            set_mtime(&b.join("d/link"), 1_600_000_000, 5);
            set_mtime(&b.join("d"), 1_600_000_000, 5);
        });
        expect("nlink", &o, "st_nlink", |b| fs::hard_link(b.join("d/other"), b.join("d/e/other2")).unwrap());
        expect("dir nlink", &o, "st_nlink", |b| fs::create_dir(b.join("d/e/sub")).unwrap());
        let d = diffs_after(&o.clone().dir_nlink(false), |b| fs::create_dir(b.join("d/e/sub")).unwrap());
        assert!(!d.iter().any(|l| l.contains("st_nlink")), "dir_nlink(false) must ignore directory link counts");
        expect("dir mode", &o, "mode", |b| chmod(&b.join("d/e"), 0o700));
        assert!(diffs_after(&o.clone().skip_dir_attrs(["d/e"]), |b| chmod(&b.join("d/e"), 0o700)).is_empty());
    }

    #[test]
    fn compare_reports_all_differences_at_once() {
        let d = diffs_after(&Options::default(), |b| {
            fs::remove_file(b.join("d/other")).unwrap();
            chmod(&b.join("d/file"), 0o600);
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
