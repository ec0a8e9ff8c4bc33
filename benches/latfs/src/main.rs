//! latfs: mounts a directory read-only and adds a fixed delay to every lookup, getattr,
//! open and readdir, as a parallel filesystem's metadata server round trip would.
//!
//! `latfs BACKING MOUNTPOINT [LATENCY_US [THREADS]]` serves until unmounted. Requests run
//! on THREADS fuser session threads (default 64), so requests made in parallel overlap
//! their delays, as they do on Lustre; a single-threaded client waits for each in turn.
//! The kernel may cache entries and attributes for a minute: mount afresh per run to
//! start cold. Reads are passed through without delay.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    Request, Session,
};

const TTL: Duration = Duration::from_secs(60);

/// A listed directory entry: inode, type, name.
type DirEntry = (u64, FileType, std::ffi::OsString);

struct LatFs {
    latency: Duration,
    root_ino: u64,
    /// Our inode number (the backing one; the root is 1) -> backing path.
    paths: RwLock<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_fh: AtomicU64,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind(ft: std::fs::FileType) -> FileType {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_char_device() {
        FileType::CharDevice
    } else if ft.is_block_device() {
        FileType::BlockDevice
    } else if ft.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

impl LatFs {
    fn wait(&self) {
        std::thread::sleep(self.latency);
    }

    fn ino(&self, backing: u64) -> u64 {
        if backing == self.root_ino {
            1
        } else {
            backing
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.read().unwrap().get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn attr(&self, meta: &std::fs::Metadata) -> FileAttr {
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        FileAttr {
            ino: INodeNo(self.ino(meta.ino())),
            size: meta.size(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: time(meta.ctime(), meta.ctime_nsec()),
            kind: kind(meta.file_type()),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
            flags: 0,
        }
    }
}

impl Filesystem for LatFs {
    /// Lets the kernel send lookups and readdirs of one directory in parallel (without
    /// FUSE_PARALLEL_DIROPS it serializes them per directory, which no kernel filesystem
    /// such as Lustre's client does), and more reads at once.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.wait();
        let path = match self.path(parent) {
            Ok(p) => p.join(name),
            Err(e) => return reply.error(e),
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                let attr = self.attr(&meta);
                self.paths.write().unwrap().insert(attr.ino.0, path);
                reply.entry(&TTL, &attr, Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.wait();
        match self.path(ino).map(|p| std::fs::symlink_metadata(p).map_err(|e| errno(&e))) {
            Ok(Ok(meta)) => reply.attr(&TTL, &self.attr(&meta)),
            Ok(Err(e)) | Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.path(ino).map(|p| std::fs::read_link(p).map_err(|e| errno(&e))) {
            Ok(Ok(target)) => reply.data(target.as_os_str().as_bytes()),
            Ok(Err(e)) | Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.wait();
        match self.path(ino).map(|p| std::fs::File::open(p).map_err(|e| errno(&e))) {
            Ok(Ok(file)) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.files.lock().unwrap().insert(fh, Arc::new(file));
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Ok(Err(e)) | Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.files.lock().unwrap().get(&fh.0).cloned() else { return reply.error(Errno::EBADF) };
        // One buffer per server thread: a read costs the copies, not an allocation.
        thread_local!(static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) });
        BUF.with_borrow_mut(|buf| {
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            let mut filled = 0;
            while filled < size as usize {
                match file.read_at(&mut buf[filled..size as usize], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) => return reply.error(errno(&e)),
                }
            }
            reply.data(&buf[..filled])
        })
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let mut entries = vec![(ino.0, FileType::Directory, ".".into()), (ino.0, FileType::Directory, "..".into())];
        match std::fs::read_dir(&path) {
            Ok(dir) => {
                for e in dir.flatten() {
                    let ft = e.file_type().map(kind).unwrap_or(FileType::RegularFile);
                    entries.push((self.ino(e.ino()), ft, e.file_name()));
                }
            }
            Err(e) => return reply.error(errno(&e)),
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().unwrap().insert(fh, entries);
        reply.opened(FileHandle(fh), FopenFlags::empty())
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.wait();
        let dirs = self.dirs.lock().unwrap();
        let Some(entries) = dirs.get(&fh.0) else { return reply.error(Errno::EBADF) };
        for (i, (ino, ft, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *ft, name) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().unwrap().remove(&fh.0);
        reply.ok()
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: latfs BACKING MOUNTPOINT [LATENCY_US (500)] [THREADS (64)]");
        std::process::exit(2);
    }
    let backing = std::fs::canonicalize(&args[1])?;
    let latency = Duration::from_micros(args.get(3).map_or(500, |s| s.parse().expect("LATENCY_US")));
    let threads = args.get(4).map_or(64, |s| s.parse().expect("THREADS"));
    let root_ino = std::fs::metadata(&backing)?.ino();
    let fs = LatFs {
        latency,
        root_ino,
        paths: RwLock::new(HashMap::from([(1, backing)])),
        files: Mutex::default(),
        dirs: Mutex::default(),
        next_fh: AtomicU64::new(1),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName("latfs".into())];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    Session::new(fs, &args[2], &config)?.run()
}
