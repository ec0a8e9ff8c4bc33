//! The only file that imports `fuser`: translates kernel requests to [`Fs`] calls and back.
//!
//! A number never changes its meaning while mounted, so every entry, attribute and
//! negative lookup is cached by the kernel "forever" and file pages stay cached across
//! opens; a growing set tells the kernel which names to forget when it changes
//! ([`kernel_cache`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyXattr, Request, Session,
};

use crate::fs::{Attr, Fs, FsError};

/// How long the kernel may trust what we tell it: the archive is immutable.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// Largest read the kernel sends us, and how far it reads ahead.
pub const MAX_READ: u32 = 1 << 20;
const BLKSIZE: u32 = 128 * 1024;

/// Mounts `fs` at `mountpoint` and starts serving on `threads` threads. Returns once the
/// kernel's INIT handshake is done; the mount then lives until it is unmounted.
/// A live mount served by background threads; `join` waits until it is unmounted.
pub type MountedSession = fuser::BackgroundSession;

pub fn mount(fs: Arc<Fs>, mountpoint: &Path, threads: usize) -> std::io::Result<MountedSession> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
        MountOption::FSName("stagefs".into()),
        MountOption::Subtype("stagefs".into()),
        MountOption::CUSTOM(format!("max_read={MAX_READ}")),
    ];
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    Session::new(FuseAdapter { fs, no_open: false, no_opendir: false }, mountpoint, &config)?.spawn()
}

/// Puts file bytes into the kernel's page cache for an inode it knows (FUSE_NOTIFY_STORE):
/// what the warm-up calls for each chunk, from any thread.
pub fn page_cache_store(session: &fuser::BackgroundSession) -> impl Fn(u64, u64, &[u8]) -> std::io::Result<()> + Sync {
    let notifier = session.notifier();
    move |ino, offset, data| notifier.store(INodeNo(ino), offset, data)
}

/// The kernel's caches of this mount, as a growing set tells them what changed: FUSE's
/// NOTIFY_INVAL_ENTRY, NOTIFY_DELETE and NOTIFY_INVAL_INODE. A name the kernel does not
/// hold answers ENOENT, which is no failure: nothing was cached to forget.
pub fn kernel_cache(session: &fuser::BackgroundSession) -> Arc<dyn crate::growing::KernelCache> {
    Arc::new(Notices(session.notifier()))
}

struct Notices(fuser::Notifier);

fn notice_failed(what: &str, result: std::io::Result<()>) {
    if let Err(e) = result {
        if e.raw_os_error() != Some(libc::ENOENT) {
            tracing::debug!("{what}: {e}");
        }
    }
}

impl crate::growing::KernelCache for Notices {
    fn forget_name(&self, parent: u64, name: &[u8]) {
        notice_failed("invalidating an entry", self.0.inval_entry(INodeNo(parent), OsStr::from_bytes(name)));
    }

    fn delete_name(&self, parent: u64, child: u64, name: &[u8]) {
        // A kernel without NOTIFY_DELETE (or a child it holds under another name) still
        // forgets the name.
        if self.0.delete(INodeNo(parent), INodeNo(child), OsStr::from_bytes(name)).is_err() {
            self.forget_name(parent, name);
        }
    }

    fn forget_dir(&self, dir: u64) {
        notice_failed("invalidating a directory", self.0.inval_inode(INodeNo(dir), 0, 0));
    }
}

struct FuseAdapter {
    fs: Arc<Fs>,
    /// The kernel supports zero-message open/opendir (set during INIT).
    no_open: bool,
    no_opendir: bool,
}

impl FuseAdapter {
    /// Every error reply goes through [`Fs::reply_errno`], which counts the failures.
    fn errno(&self, err: &FsError) -> Errno {
        Errno::from_i32(self.fs.reply_errno(err))
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The archive's time as the kernel wants it. Never panics: a time that `SystemTime` cannot
/// hold (a hostile base-256 mtime, nanoseconds past a second) shows as the epoch.
fn to_system_time(secs: i64, nsec: u32) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    let time = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    time.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

fn file_attr(a: &Attr) -> FileAttr {
    let mtime = to_system_time(a.mtime, a.mtime_nsec);
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: file_type(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each setting is best effort: an older kernel caps or refuses it, which only
        // costs speed, never correctness.
        let _ = config.set_max_readahead(MAX_READ);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        self.no_open = config.add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT).is_ok();
        // A growing set lists each open directory from one state of its tree: it needs opendir.
        self.no_opendir =
            self.fs.growing().is_none() && config.add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT).is_ok();
        // Always READDIRPLUS, not the adaptive READDIRPLUS_AUTO: listing a directory then
        // gives the kernel every entry's inode, so the opens that follow (ImageFolder
        // lists, then the loader opens) need no LOOKUP, and the warm-up can store into
        // every file. AUTO falls back to plain READDIR after the first buffer (~1,000
        // entries), which left the first epoch of a 100k-file tree at a third of tmpfs.
        for flag in [InitFlags::FUSE_DO_READDIRPLUS, InitFlags::FUSE_CACHE_SYMLINKS, InitFlags::FUSE_PARALLEL_DIROPS] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let view = self.fs.view();
        match view.lookup(parent.0, name.as_bytes()) {
            Ok(attr) => {
                view.looked_up(attr.ino);
                reply.entry(&TTL, &file_attr(&attr), Generation(0))
            }
            // A negative entry (inode 0) makes the kernel cache "not found" too.
            Err(FsError::NotFound) => {
                let mut none = file_attr(&Attr {
                    ino: 0,
                    mode: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    mtime: 0,
                    mtime_nsec: 0,
                    rdev: 0,
                });
                none.ino = INodeNo(0);
                reply.entry(&TTL, &none, Generation(0))
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.view().getattr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.view().readlink(ino.0) {
            Ok(target) => reply.data(target),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// Zero-message open: ENOSYS tells the kernel (which advertised FUSE_NO_OPEN_SUPPORT)
    /// to stop sending open and release at all; it then keeps page cache across opens,
    /// as FOPEN_KEEP_CACHE would. Older kernels get a normal open with KEEP_CACHE.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
        }
    }

    /// Nothing to flush in a read-only filesystem; ENOSYS stops the kernel sending flush on close.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: fuser::LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.data_view().read(ino.0, offset, size) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// No ioctls: ENOTTY is what `isatty` and friends expect (and it keeps fuser quiet).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            reply.error(Errno::ENOSYS);
        } else if self.fs.growing().is_some() {
            // No FOPEN_CACHE_DIR: every listing comes from the handle's own state.
            reply.opened(FileHandle(self.fs.open_dir()), FopenFlags::empty());
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR);
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: fuser::ReplyEmpty) {
        self.fs.close_dir(fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.fs.dir_view(fh.0).readdir(ino.0, offset) {
            Ok(entries) => {
                for e in entries {
                    let e = match e {
                        Ok(e) => e,
                        // Nothing of a listing that met damage goes out.
                        Err(err) => return reply.error(self.errno(&err)),
                    };
                    if reply.add(INodeNo(e.ino), e.next, file_type(e.mode), OsStr::from_bytes(e.name)) {
                        break; // Reply buffer full: the kernel asks again from `next`.
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let view = self.fs.dir_view(fh.0);
        // A directory opened before a growing set changed lists the old tree: the kernel
        // may show those entries but must look each up again before it uses one.
        let ttl = if view.is_current() { TTL } else { Duration::ZERO };
        match view.readdir(ino.0, offset) {
            Ok(entries) => {
                for e in entries {
                    let e = match e {
                        Ok(e) => e,
                        Err(err) => return reply.error(self.errno(&err)),
                    };
                    let Ok(attr) = view.getattr(e.ino) else { continue };
                    if reply.add(
                        INodeNo(e.ino),
                        e.next,
                        OsStr::from_bytes(e.name),
                        &ttl,
                        &file_attr(&attr),
                        Generation(0),
                    ) {
                        break;
                    }
                    // The kernel counts a lookup for every entry but "." and "..".
                    if e.next > 2 {
                        view.looked_up(e.ino);
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(self.errno(&e)),
        };
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stats = self.fs.view().statfs();
        let blocks = stats.bytes.div_ceil(BLKSIZE as u64);
        reply.statfs(blocks, 0, 0, stats.files, 0, BLKSIZE, 255, BLKSIZE);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.view().getxattr(ino.0, name.as_bytes()) {
            Ok(value) => xattr_reply(value, size, reply),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.view().listxattr(ino.0) {
            Ok(names) => xattr_reply(&names, size, reply),
            Err(e) => reply.error(self.errno(&e)),
        }
    }
}

/// xattr calls first ask for the size (size 0), then for the bytes.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::from_i32(FsError::Range.errno()));
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_times_never_panic() {
        assert_eq!(to_system_time(1, 5), UNIX_EPOCH + Duration::new(1, 5));
        assert_eq!(to_system_time(-1, 0), UNIX_EPOCH - Duration::from_secs(1));
        for (secs, nsec) in [(i64::MAX, u32::MAX), (i64::MIN, u32::MAX), (0, 2_000_000_000)] {
            let _ = to_system_time(secs, nsec);
        }
    }
}
