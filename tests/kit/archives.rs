//! Archives for the tests: committed fixtures, tars/zips/SquashFS images built from members, extraction.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use super::{require_tool, run_cmd, run_tool, Mounted, TempDir};

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

/// A private copy of the fixture `name` as `dir/as_name` (a daemon is then told apart from
/// those of other tests by its archive's path).
pub fn fixture_copy(name: &str, dir: &Path, as_name: &str) -> PathBuf {
    let copy = dir.join(as_name);
    fs::copy(fixture(name), &copy).unwrap_or_else(|e| panic!("copy {name} to {}: {e}", copy.display()));
    copy
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

/// The common scene of a test: members written under `src` of a temporary directory, packed
/// by the real tools into an archive, mounted, checked. Directories of a member's path are
/// made as needed; [`Scene::tar`] packs the top-level names in the order they were added.
pub struct Scene {
    pub tmp: TempDir,
    src: PathBuf,
    top: Vec<String>,
    added: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
}

impl Scene {
    /// An empty scene in a fresh temporary directory named after `name`.
    pub fn new(name: &str) -> Scene {
        let tmp = TempDir::new(name);
        let src = tmp.join("src");
        fs::create_dir_all(&src).unwrap();
        Scene { tmp, src, top: Vec::new(), added: Vec::new(), files: Vec::new() }
    }

    fn add(&mut self, path: &str) -> PathBuf {
        let top = path.split('/').next().unwrap().to_string();
        if !self.top.contains(&top) {
            self.top.push(top);
        }
        self.added.push(path.to_string());
        let p = self.src.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        p
    }

    /// The member `path` holding `bytes`.
    pub fn file(mut self, path: &str, bytes: impl AsRef<[u8]>) -> Scene {
        fs::write(self.add(path), bytes.as_ref()).unwrap();
        self.files.push((path.to_string(), bytes.as_ref().to_vec()));
        self
    }

    /// Each of `files` (path, bytes) as [`Scene::file`].
    pub fn files<P: AsRef<str>, B: AsRef<[u8]>>(self, files: impl IntoIterator<Item = (P, B)>) -> Scene {
        files.into_iter().fold(self, |s, (p, b)| s.file(p.as_ref(), b))
    }

    /// The directory member `path` (also when it holds nothing).
    pub fn dir(mut self, path: &str) -> Scene {
        fs::create_dir_all(self.add(path)).unwrap();
        self
    }

    /// The symbolic link `path` to `target`.
    pub fn symlink(mut self, path: &str, target: &str) -> Scene {
        std::os::unix::fs::symlink(target, self.add(path)).unwrap();
        self
    }

    /// The directory the members are written to.
    pub fn src(&self) -> &Path {
        &self.src
    }

    /// `name` in the scene's temporary directory.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.tmp.join(name)
    }

    /// The files added with [`Scene::file`]: (path, bytes).
    pub fn members(&self) -> &[(String, Vec<u8>)] {
        &self.files
    }

    /// The members packed by GNU tar (`--format=gnu`) into `archive`.
    pub fn tar_at(&self, archive: &Path) -> PathBuf {
        let top: Vec<&str> = self.top.iter().map(String::as_str).collect();
        pack_tar(&self.src, archive, &top);
        archive.to_path_buf()
    }

    /// Each path added packed by GNU tar into `archive` as named (no entries for the
    /// directories of a file added by its path).
    pub fn tar_listed_at(&self, archive: &Path) -> PathBuf {
        let added: Vec<&str> = self.added.iter().map(String::as_str).collect();
        pack_tar(&self.src, archive, &added);
        archive.to_path_buf()
    }

    /// The members packed by GNU tar into `a.tar` of the scene's directory.
    pub fn tar(&self) -> PathBuf {
        self.tar_at(&self.join("a.tar"))
    }

    /// The source directory packed as `.` (its members named `./PATH`, the root included).
    pub fn tar_dot_at(&self, archive: &Path) -> PathBuf {
        pack_tar(&self.src, archive, &["."]);
        archive.to_path_buf()
    }

    /// The members packed by Info-ZIP `zip -r -y` into `a.zip` of the scene's directory.
    pub fn zip(&self) -> PathBuf {
        let archive = self.join("a.zip");
        let mut cmd = std::process::Command::new(require_tool("zip"));
        cmd.current_dir(&self.src).args(["-q", "-r", "-y"]).arg(&archive).args(&self.top);
        run_cmd(&mut cmd, std::time::Duration::from_secs(300)).assert_success();
        archive
    }

    /// The source directory as a SquashFS image `a.sqfs` of the scene's directory.
    pub fn squashfs(&self) -> PathBuf {
        self.squashfs_at(&self.join("a.sqfs"))
    }

    /// The source directory as the SquashFS image `image`, by `mksquashfs -noappend`.
    pub fn squashfs_at(&self, image: &Path) -> PathBuf {
        let quiet = ["-noappend", "-quiet", "-no-progress"].map(OsStr::new);
        run_tool("mksquashfs", [self.src.as_os_str(), image.as_os_str()].into_iter().chain(quiet));
        image.to_path_buf()
    }

    /// `stagefs mount ARGS ARCHIVE` at `mnt` of the scene's directory.
    pub fn mount(&self, archive: &Path, args: &[&str]) -> Mounted {
        Mounted::with_args(args, archive, &self.join("mnt"))
    }
}

/// Panics unless every file member of `scene` reads back from `root` byte for byte.
pub fn assert_tree_matches(root: &Path, scene: &Scene) {
    for (path, bytes) in scene.members() {
        let got = read(&root.join(path));
        assert!(&got == bytes, "{path} under {}: {} bytes, expected {}", root.display(), got.len(), bytes.len());
    }
}

/// The names of the entries of `dir`, sorted; none if it does not exist.
pub fn file_names(dir: &Path) -> Vec<String> {
    let entries = fs::read_dir(dir).into_iter().flatten().flatten();
    let mut names: Vec<String> = entries.map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// `lsetxattr(path, name, value)`: sets an extended attribute of `path` (not of a link's target).
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let c = |s: &OsStr| std::ffi::CString::new(s.as_encoded_bytes()).unwrap();
    let (p, n) = (c(path.as_os_str()), c(OsStr::new(name)));
    // SAFETY: NUL-terminated strings and a buffer of `value.len()` bytes.
    let rc = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    nix::errno::Errno::result(rc).map(drop).map_err(Into::into)
}

/// A fresh `TempDir` named `name` and `mnt` in it, a test's usual mount point.
pub fn tmp_mnt(name: &str) -> (TempDir, PathBuf) {
    let tmp = TempDir::new(name);
    let mnt = tmp.join("mnt");
    (tmp, mnt)
}

/// [`tmp_mnt`] with a private copy `a.tar` of the fixture gnu.tar in it (whose daemon is told
/// apart from those of other tests by its path): the directory, the copy, the mount point.
pub fn gnu_copy(name: &str) -> (TempDir, PathBuf, PathBuf) {
    let (tmp, mnt) = tmp_mnt(name);
    let archive = fixture_copy("gnu.tar", tmp.path(), "a.tar");
    (tmp, archive, mnt)
}

/// `bytes` written as `name` in `tmp`: its path.
pub fn put(tmp: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = tmp.join(name);
    fs::write(&path, bytes).map(|()| path).unwrap()
}

/// The number right after `prefix` in `text`, at the first `prefix` a number follows; None if none does.
pub fn number_after(text: &str, prefix: &str) -> Option<u64> {
    text.split(prefix)
        .skip(1)
        .find_map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok())
}
