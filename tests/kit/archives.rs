//! Archives for the tests: committed fixtures, tars/zips/SquashFS images built from members, extraction.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::run_tool;

/// The directory holding the committed fixture archives.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// A committed fixture archive; panics (with how to regenerate) if missing.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    assert!(p.is_file(), "fixture {} is missing; regenerate with: sudo tests/fixtures/make-fixtures.sh", p.display());
    p
}

/// `tar --format=gnu -C src -cf archive MEMBERS...` with GNU tar.
pub fn pack_tar(src: &Path, archive: &Path, members: &[&str]) {
    let mut args =
        vec![OsStr::new("--format=gnu"), OsStr::new("-C"), src.as_os_str(), OsStr::new("-cf"), archive.as_os_str()];
    args.extend(members.iter().map(OsStr::new));
    run_tool("tar", args);
}

/// 64-bit FNV-1a, for compact content fingerprints in messages.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Reads a whole file, panicking with the path on error.
pub fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Extracts a tar archive with GNU tar as root: owners (numeric), modes,
/// times, xattrs.
pub fn extract_tar(archive: &Path, dest: &Path) {
    fs::create_dir_all(dest).unwrap();
    run_tool(
        "tar",
        [
            OsStr::new("-x"),
            OsStr::new("--xattrs"),
            OsStr::new("--xattrs-include=*"),
            OsStr::new("--numeric-owner"),
            OsStr::new("--same-owner"),
            OsStr::new("--same-permissions"),
            OsStr::new("-f"),
            archive.as_os_str(),
            OsStr::new("-C"),
            dest.as_os_str(),
        ],
    );
}

/// Extracts a SquashFS image with unsquashfs (dest must not exist).
pub fn extract_squashfs(image: &Path, dest: &Path) {
    run_tool(
        "unsquashfs",
        [OsStr::new("-no-progress"), OsStr::new("-quiet"), OsStr::new("-d"), dest.as_os_str(), image.as_os_str()],
    );
}
