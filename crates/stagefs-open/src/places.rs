//! Every place stagefs keeps on a node (runtime dir, locks, status records, default mountpoints, the index cache), created once and checked against other users.
//!
//! Login and compute nodes are shared, and `/tmp` and `/dev/shm` are world-writable: any
//! user can pre-create a path another user's stagefs will later use, or plant a symlink
//! there. So every directory stagefs makes or reuses goes through [`private_dir`]: after
//! creation (or when found) it must be a real directory, owned by this user, writable by
//! nobody else; if not, stagefs refuses (exit 4) and names the path and its owner. Inside
//! such a directory nobody else can create or rename anything, so the files in it are
//! ours; they are still opened with `O_NOFOLLOW`, and temp files with `O_EXCL` and an
//! unpredictable name, so a mistake elsewhere cannot turn into a write through a link.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

mod checked;
mod errors;
mod files;
mod outside;
mod private;
mod users;
pub use checked::CheckedDir;
pub use errors::PlaceError;
pub use files::random_suffix;
pub use files::{
    judged, open_private, read_all, read_checked, read_own, remove_file, remove_unless_locked, write_atomically,
    Distrust,
};
pub use outside::{open_append, open_outside, read_own_file, ArchiveSet, OutsideError, OutsideFile, Trust};
pub use private::{check_private, others_can_write};
pub use users::{my_uid, user_label, user_name};

/// Refuses `path` when a directory above it lets other users rename what it holds (see
/// [`others_can_write`]), as OpenSSH's StrictModes does: they could move the real path
/// away and build their own in its place. Checks the existing ancestors, root first.
pub fn check_ancestors(path: &Path) -> Result<(), PlaceError> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut dir = PathBuf::from("/");
    for component in absolute.components().skip(1) {
        let child = dir.join(component);
        let Ok(meta) = std::fs::metadata(&dir) else { break };
        if others_can_write(&meta) {
            return Err(PlaceError::Renamable { dir, child, mode: meta.mode() & 0o7777 });
        }
        dir = match std::fs::canonicalize(&child) {
            Ok(resolved) => resolved,
            Err(_) => break,
        };
    }
    Ok(())
}

/// Makes the directories of `path` below `base` that are missing (mode 0700) and checks
/// each with [`check_private`]; `check_existing` also checks the components that were
/// there already (for paths stagefs chose, like `/dev/shm/$USER/stagefs`). Returns the
/// directories it created, outermost first, so they can be removed again.
pub fn private_dir(base: &Path, path: &Path, check_existing: bool, advice: &str) -> Result<Vec<PathBuf>, PlaceError> {
    let relative = path.strip_prefix(base).unwrap_or(path);
    let mut current = if path.starts_with(base) { base.to_path_buf() } else { PathBuf::new() };
    let mut created = Vec::new();
    for component in relative.components() {
        current.push(component);
        if !matches!(component, Component::Normal(_)) {
            continue;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&current) {
            Ok(()) => {
                created.push(current.clone());
                check_private(&current, advice)?;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if check_existing {
                    check_private(&current, advice)?;
                }
            }
            Err(source) => {
                return Err(PlaceError::Io { path: current, what: "cannot create this directory", source });
            }
        }
    }
    Ok(created)
}

/// [`private_dir`] for a directory stagefs keeps to itself: the directory itself is
/// checked whether it was made now or found. Returns the directories created.
pub fn own_dir(path: &Path, advice: &str) -> Result<Vec<PathBuf>, PlaceError> {
    check_ancestors(path)?;
    let created = private_dir(Path::new("/"), path, false, advice)?;
    check_private(path, advice)?;
    Ok(created)
}

/// Removes the directories [`private_dir`] created, innermost first, as far as they are
/// empty: what stagefs made for a mount goes away with it.
pub fn remove_created(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        if std::fs::remove_dir(dir).is_err() {
            break;
        }
    }
    tidy_shm();
}

/// The one rule for what stagefs leaves in `/dev/shm`: `/dev/shm/$USER/stagefs` and
/// `/dev/shm/$USER` go as soon as they are empty, whichever mount or broadcast made them,
/// at the end of every mount and broadcast (a mount racing in makes them again). `rmdir`
/// removes nothing that holds anything, and in sticky `/dev/shm` nothing of another user's.
/// The runtime directory stays: it coordinates the mounts that start at the same time.
pub fn tidy_shm() {
    let root = default_mount_root();
    let _ = std::fs::remove_dir(&root);
    if let Some(user_dir) = root.parent() {
        let _ = std::fs::remove_dir(user_dir);
    }
}

const RUNTIME_ADVICE: &str =
    "remove it if you can (or ask the admins), or set STAGEFS_RUNTIME_DIR to a private directory";

/// The node-local, per-user directory for locks and status records, created and checked
/// once per process: `$STAGEFS_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/stagefs` (when that is
/// this user's own), else `/tmp/stagefs-<uid>`.
pub fn runtime_dir() -> Result<&'static Path, PlaceError> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir);
    }
    let dir = choose_runtime_dir();
    // Its parents are the system's (`/tmp`) or the user's choice; the directory itself,
    // new or found, must be ours alone.
    own_dir(&dir, RUNTIME_ADVICE)?;
    Ok(DIR.get_or_init(|| dir))
}

/// Every runtime directory a shell of this user on this node may have used, this
/// process's first ([`runtime_dir`], which is `$STAGEFS_RUNTIME_DIR` when set), then
/// `$XDG_RUNTIME_DIR/stagefs`, `/run/user/<uid>/stagefs` and `/tmp/stagefs-<uid>`: those
/// that exist and are private.
/// A batch step or an ssh session often lacks the `XDG_RUNTIME_DIR` of the shell that
/// mounted: what is mounted must not depend on an environment variable.
pub fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = runtime_dir().map(|d| vec![d.to_owned()]).unwrap_or_default();
    let uid = my_uid();
    let candidates = [
        std::env::var_os("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("stagefs")),
        Some(PathBuf::from(format!("/run/user/{uid}/stagefs"))),
        Some(PathBuf::from(format!("/tmp/stagefs-{uid}"))),
    ];
    for dir in candidates.into_iter().flatten().filter(|d| d.is_absolute()) {
        if !dirs.contains(&dir) && check_private(&dir, "").is_ok() {
            dirs.push(dir);
        }
    }
    dirs
}

fn choose_runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STAGEFS_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return std::path::absolute(PathBuf::from(&dir)).unwrap_or_else(|_| PathBuf::from(dir));
    }
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|d| d.is_absolute());
    match xdg {
        Some(xdg) if check_private(&xdg, "").is_ok() => xdg.join("stagefs"),
        _ => PathBuf::from(format!("/tmp/stagefs-{}", my_uid())),
    }
}

/// The runtime file `<hash of the mountpoint path>.<extension>`: every per-mountpoint
/// file (record, lock, users, log) is named this way.
pub fn mountpoint_file(mountpoint: &Path, extension: &str) -> Result<PathBuf, PlaceError> {
    let hash = stagefs_archive::hash::hash(mountpoint.as_os_str().as_encoded_bytes());
    Ok(runtime_dir()?.join(format!("{hash:016x}.{extension}")))
}

/// `/dev/shm/$USER/stagefs/<archive stem>`: node-local, private, gone at reboot.
pub fn default_mountpoint(archive: &Path) -> PathBuf {
    default_mount_root().join(archive_stem(archive))
}

/// `/dev/shm/$USER/stagefs`, the parent of every default mountpoint.
pub fn default_mount_root() -> PathBuf {
    PathBuf::from("/dev/shm").join(user_name()).join("stagefs")
}

const MOUNT_ADVICE: &str =
    "remove it if you can (or ask the admins), or give stagefs another mountpoint (stagefs mount ARCHIVE DIR)";

/// Creates the missing directories above `mountpoint` (0700, checked); under
/// `/dev/shm/$USER` the existing ones are checked too, because stagefs chose that path.
/// The mountpoint itself is left to the caller: a live or stale mount may sit on it.
/// Returns the directories created, outermost first.
pub fn mountpoint_parents(mountpoint: &Path) -> Result<Vec<PathBuf>, PlaceError> {
    let Some(parent) = mountpoint.parent() else { return check_ancestors(mountpoint).map(|()| Vec::new()) };
    let shm_user = PathBuf::from("/dev/shm").join(user_name());
    if mountpoint.starts_with(&shm_user) {
        // Every existing directory below /dev/shm is checked as our own first, so a
        // squatted `/dev/shm/$USER` is named with its owner; the ancestor rule then holds.
        let created = private_dir(Path::new("/dev/shm"), parent, true, MOUNT_ADVICE)?;
        if let Err(e) = check_ancestors(mountpoint) {
            remove_created(&created);
            return Err(e);
        }
        return Ok(created);
    }
    check_ancestors(mountpoint)?;
    private_dir(Path::new("/"), parent, false, MOUNT_ADVICE)
}

/// Creates the missing directories above `out` (an archive `stagefs pack` writes), as a
/// mountpoint's are: none below a directory others could rename entries in, each made
/// without following a link and checked to be this user's after creation; but with the
/// user's usual mode (`mode`, umask applied), since what goes in them is to be shared.
/// Returns the directories created, outermost first.
pub fn output_parents(out: &Path, mode: u32) -> Result<Vec<PathBuf>, PlaceError> {
    let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(Vec::new()) };
    check_ancestors(out)?;
    let absolute = std::path::absolute(parent).unwrap_or_else(|_| parent.to_owned());
    let mut created = Vec::new();
    let mut current = PathBuf::new();
    for component in absolute.components() {
        current.push(component);
        if !matches!(component, Component::Normal(_)) {
            continue;
        }
        match std::fs::DirBuilder::new().mode(mode).create(&current) {
            Ok(()) => {
                let meta = std::fs::symlink_metadata(&current).map_err(|source| PlaceError::Io {
                    path: current.clone(),
                    what: "cannot inspect the directory just made",
                    source,
                })?;
                if !meta.is_dir() || meta.uid() != my_uid() {
                    return Err(PlaceError::NotOwned {
                        path: current,
                        owner: user_label(meta.uid()),
                        advice: "it was replaced as it was made; pack again".into(),
                    });
                }
                created.push(current.clone());
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists && current.is_dir() => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                return Err(PlaceError::NotADirectory {
                    path: current,
                    advice: "name a directory (or a path where one can be made) for the archive".into(),
                })
            }
            Err(source) => return Err(PlaceError::Io { path: current, what: "cannot create this directory", source }),
        }
    }
    Ok(created)
}

/// Creates `mountpoint` itself (0700) and checks it, when it is missing.
pub fn create_mountpoint(mountpoint: &Path) -> Result<(), PlaceError> {
    std::fs::DirBuilder::new().mode(0o700).create(mountpoint).map_err(|source| PlaceError::Io {
        path: mountpoint.to_owned(),
        what: "cannot create the mountpoint",
        source,
    })?;
    check_private(mountpoint, MOUNT_ADVICE)
}

/// `imagenet.tar.zst` → `imagenet`: the file name without its archive extensions.
pub fn archive_stem(archive: &Path) -> String {
    const EXTENSIONS: &[&str] = &[
        "tar", "zip", "gz", "tgz", "zst", "tzst", "xz", "txz", "bz2", "tbz2", "lz4", "sqsh", "sqfs", "squashfs", "sfs",
        "img",
    ];
    let mut name = archive.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    while let Some((stem, ext)) = name.rsplit_once('.') {
        if stem.is_empty() || !EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()) {
            break;
        }
        name = stem.to_string();
    }
    if name.is_empty() {
        "archive".into()
    } else {
        name
    }
}

/// `$XDG_CACHE_HOME/stagefs` (default `~/.cache/stagefs`), created and checked, for saved
/// indexes that cannot go next to their archive.
pub fn cache_dir() -> Result<PathBuf, PlaceError> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| PlaceError::Io {
            path: PathBuf::from("$HOME"),
            what: "no cache directory",
            source: std::io::Error::other("neither XDG_CACHE_HOME nor HOME is set"),
        })?;
    let dir = base.join("stagefs");
    own_dir(&dir, "remove it, or set XDG_CACHE_HOME to a private directory")?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn stems_drop_archive_extensions_only() {
        assert_eq!(archive_stem(Path::new("/d/imagenet.sqsh")), "imagenet");
        assert_eq!(archive_stem(Path::new("data.tar.zst")), "data");
        assert_eq!(archive_stem(Path::new("v1.2.tar")), "v1.2");
        assert_eq!(archive_stem(Path::new(".tar")), ".tar");
        assert!(default_mountpoint(Path::new("x.tar")).starts_with("/dev/shm"));
        assert!(default_mountpoint(Path::new("x.tar")).ends_with("stagefs/x"));
    }

    #[test]
    fn private_dirs_are_made_0700_and_checked() {
        let tmp = TempDir::new("places");
        let base = tmp.join("base");
        let created = private_dir(Path::new("/"), &base.join("a/b"), false, "x").unwrap();
        assert_eq!(created, [base.clone(), base.join("a"), base.join("a/b")]);
        for dir in &created {
            assert_eq!(std::fs::metadata(dir).unwrap().mode() & 0o777, 0o700);
        }
        // Reused and writable by others: refused when stagefs chose the path.
        std::fs::set_permissions(base.join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&base, &base.join("a/b"), true, "do this").unwrap_err();
        assert!(matches!(err, PlaceError::Writable { mode: 0o777, .. }), "{err}");
        assert!(err.to_string().contains("do this"));
        // A symlink where a directory should be is refused, not followed.
        std::os::unix::fs::symlink("/tmp", base.join("link")).unwrap();
        assert!(matches!(check_private(&base.join("link"), ""), Err(PlaceError::NotADirectory { .. })));
        std::fs::set_permissions(base.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
        remove_created(&created);
        assert!(base.exists(), "the symlink keeps the outermost directory");
    }

    #[test]
    fn atomic_writes_replace_a_planted_symlink_not_its_target() {
        let tmp = TempDir::new("places");
        let dir = tmp.path();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("record")).unwrap();
        write_atomically(&dir.join("record"), b"new", 0o640).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(dir.join("record")).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o640);
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 2, "no temp file left");
        // open_private refuses the symlink instead of following it.
        std::os::unix::fs::symlink(&victim, dir.join("lock")).unwrap();
        assert!(open_private(&dir.join("lock")).is_err());
    }

    #[test]
    fn untrusted_files_are_not_read() {
        let tmp = TempDir::new("places");
        let dir = tmp.path();
        let me = my_uid();
        let file = dir.join("index");
        std::fs::write(&file, b"0123456789").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let checked = |path: &Path, owners: &[u32], cap: u64| {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::File::options()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .map_err(|e| Distrust::Open(e).to_string())?;
            read_checked(file, owners, cap).map_err(|e| e.to_string())
        };
        assert_eq!(checked(&file, &[me], 100).unwrap(), b"0123456789");
        assert!(checked(&file, &[me], 5).unwrap_err().contains("larger"));
        assert!(checked(&file, &[me + 1], 100).unwrap_err().contains("belongs to"));
        assert_eq!(read_own(&file, 100).as_deref(), Some(&b"0123456789"[..]));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(checked(&file, &[me], 100).unwrap_err().contains("may write"));
        assert_eq!(read_own(&file, 100), None);
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::from(0o600), 0)
            .unwrap();
        assert!(checked(&dir.join("fifo"), &[me], 100).unwrap_err().contains("not a regular file"));
        std::os::unix::fs::symlink(&file, dir.join("link")).unwrap();
        assert!(checked(&dir.join("link"), &[me], 100).unwrap_err().contains("cannot open"));
        assert_eq!(read_own(&dir.join("link"), 100), None);
    }
}
