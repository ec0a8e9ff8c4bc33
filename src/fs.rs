//! Filesystem core: lookup, getattr, read, readdir, xattrs over an [`Archive`](stagefs_archive::Archive), in plain Rust types.
//!
//! This is the whole behaviour of the mount; `fuse.rs` only translates it to `fuser`
//! replies, so every rule here is tested without FUSE in the loop. FUSE inode numbers
//! are index positions plus one (see `index.rs`), or for a growing set, numbers that keep
//! their meaning as the set changes (see `growing/tree.rs`). A request is answered from one
//! [`View`]: one state of the tree.

mod errors;
mod replies;
mod served;
mod view;

pub use errors::{FsError, Result};
pub use replies::{Attr, DirEntry, FsStats};
pub use served::{Content, Fs};
pub use view::{ino_of, View};

/// The views of the filesystem that requests are answered from.
impl Fs {
    /// The state to answer a read of file bytes from: as [`Fs::view`], without holding up
    /// a change (see [`GrowingSet::answering`](crate::growing::GrowingSet::answering)).
    pub fn data_view(&self) -> View<'_> {
        let tree = self.growing().map(|set| set.current());
        View { fs: self, tree, retired: std::sync::OnceLock::new(), _answering: None, intact: Default::default() }
    }

    /// The state to answer one request from.
    pub fn view(&self) -> View<'_> {
        let answering = self.growing().map(|set| set.answering());
        let tree = self.growing().map(|set| set.current());
        View { fs: self, tree, retired: std::sync::OnceLock::new(), _answering: answering, intact: Default::default() }
    }

    /// The state to list the directory opened as `handle` from.
    pub fn dir_view(&self, handle: u64) -> View<'_> {
        let mut view = self.view();
        if let Some(tree) = self.open_dirs.lock().ok().and_then(|dirs| dirs.get(&handle).cloned()) {
            view.tree = Some(tree);
        }
        view
    }

    /// Non-empty regular files, each inode once: (ino, size).
    pub fn files(&self) -> Vec<(u64, u64)> {
        let view = self.view();
        // An inode in a damaged block is left cold: reading it fails as any read would.
        let inodes = view.index().inodes().filter_map(|item| item.ok());
        inodes
            // nlink 0: replaced by a later member or shard of the same name, unreachable.
            .filter(|(_, n)| n.attrs.file_type() == libc::S_IFREG && n.attrs.size > 0 && n.nlink > 0)
            .map(|(id, n)| (view.ino_at(id), n.attrs.size))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{run_tool, TempDir};
    use stagefs_archive::{Archive, ReadError};
    use std::ffi::OsStr;

    /// A small GNU tar (a directory, a file, a symlink and a hard link) opened through the
    /// real reader.
    fn sample_fs() -> Fs {
        let tmp = TempDir::new("fs");
        let src = tmp.join("src");
        std::fs::create_dir_all(src.join("dir")).unwrap();
        std::fs::write(src.join("dir/hello.txt"), b"hello world").unwrap();
        std::os::unix::fs::symlink("hello.txt", src.join("dir/link")).unwrap();
        std::fs::hard_link(src.join("dir/hello.txt"), src.join("hard")).unwrap();
        let path = tmp.join("t.tar");
        let args =
            ["--format=gnu", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@1728053248", "-C"];
        let mut args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        args.extend([src.as_os_str(), OsStr::new("-cf"), path.as_os_str(), OsStr::new("dir"), OsStr::new("hard")]);
        run_tool("tar", &args, None);
        let archive =
            Archive::open(&std::fs::File::open(&path).unwrap(), &path, &stagefs_archive::Caches::default()).unwrap();
        Fs::new(archive)
    }

    #[test]
    fn lookup_getattr_read() {
        let fs = sample_fs();
        let dir = fs.view().lookup(1, b"dir").unwrap();
        assert_eq!(dir.mode & libc::S_IFMT, libc::S_IFDIR);
        let file = fs.view().lookup(dir.ino, b"hello.txt").unwrap();
        assert_eq!((file.size, file.uid, file.mtime, file.nlink), (11, 0, 0o14700000000, 2));
        assert_eq!(&*fs.view().read(file.ino, 6, 100).unwrap(), b"world");
        assert_eq!(&*fs.view().read(file.ino, 11, 100).unwrap(), b"");
        assert_eq!(fs.view().lookup(1, b"hard").unwrap().ino, file.ino);
        assert_eq!(fs.view().readlink(fs.view().lookup(dir.ino, b"link").unwrap().ino).unwrap(), b"hello.txt");
        assert_eq!(fs.reads_served(), 2);
    }

    #[test]
    fn errors_map_to_errno() {
        let fs = sample_fs();
        let file = fs.view().lookup(2, b"hello.txt").unwrap();
        assert_eq!(fs.view().lookup(1, b"missing").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.view().lookup(file.ino, b"x").unwrap_err().errno(), libc::ENOTDIR);
        assert_eq!(fs.view().readlink(file.ino).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(fs.view().read(1, 0, 10).unwrap_err().errno(), libc::EISDIR);
        // An archive without any xattrs says so once for all (ENOSYS: the kernel stops asking).
        assert_eq!(fs.view().getxattr(file.ino, b"user.x").unwrap_err().errno(), libc::ENOSYS);
        assert_eq!(fs.view().listxattr(file.ino).unwrap_err().errno(), libc::ENOSYS);
        assert_eq!(fs.view().getattr(0).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.view().getattr(u64::MAX).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(FsError::Range.errno(), libc::ERANGE);
        // Mistakes of the caller are not failures of the mount.
        assert_eq!(fs.reply_errno(&fs.view().lookup(1, b"missing").unwrap_err()), libc::ENOENT);
        assert_eq!(fs.errors_served(), (0, None));
        let damage = FsError::Corrupt {
            path: "/dir/hello.txt".into(),
            source: ReadError { offset: 512, what: "the archive file changed since it was mounted".into() },
        };
        assert_eq!(fs.reply_errno(&damage), libc::EIO);
        assert_eq!(fs.reply_errno(&damage), libc::EIO);
        let (count, last) = fs.errors_served();
        assert_eq!(count, 2);
        assert!(last.is_some_and(|l| l.starts_with("/dir/hello.txt: ") && l.contains("changed")));
    }

    #[test]
    fn readdir_resumes_at_offset() {
        let fs = sample_fs();
        let names: Vec<_> =
            fs.view().readdir(1, 0).unwrap().map(|e| e.unwrap()).map(|e| (e.name.to_vec(), e.next)).collect();
        assert_eq!(names, [(b".".to_vec(), 1), (b"..".to_vec(), 2), (b"dir".to_vec(), 3), (b"hard".to_vec(), 4)]);
        let rest: Vec<_> = fs.view().readdir(1, 3).unwrap().map(|e| e.unwrap().name.to_vec()).collect();
        assert_eq!(rest, [b"hard".to_vec()]);
        assert!(fs.view().readdir(1, 99).unwrap().next().is_none());
        assert_eq!(fs.view().index().path_of(3), "/dir/link");
    }
}
