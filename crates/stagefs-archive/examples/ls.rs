//! Lists any archive the crate reads (tar, zip, SquashFS, a compressed tar it can restart in: gzip, bzip2, zstd of several frames, xz of several blocks), or writes one member to stdout: the crate without FUSE, as squashfuse's `ls.c` shows its library.
//!
//!     cargo run -p stagefs-archive --example ls -- ARCHIVE            # every path, sizes
//!     cargo run -p stagefs-archive --example ls -- ARCHIVE MEMBER     # the member's bytes

use std::error::Error;
use std::io::Write;
use std::path::Path;

use stagefs_archive::escape::Shown;
use stagefs_archive::index::{Data, ROOT};
use stagefs_archive::seekable;
use stagefs_archive::{map_file, Archive, Caches};

/// Bytes asked of the archive per read (as a FUSE read would).
const CHUNK: u32 = 1 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("ls: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, member) = match args.as_slice() {
        [path] => (Path::new(path), None),
        [path, member] => (Path::new(path), Some(member.as_bytes())),
        _ => return Err("usage: ls ARCHIVE [MEMBER]".into()),
    };
    // The caller opens the file (and decides whom to trust); the crate maps and indexes it:
    // a compressed tar from restart points, anything else by its format.
    let backing = map_file(&std::fs::File::open(path)?)?;
    // One memory budget for what is decoded (restart points' units, zip members, blocks).
    let codec = seekable::restartable(&backing);
    let archive = Archive::from_staged(path, backing, codec, &Caches::default())?;
    let index = &archive.index;
    let mut out = std::io::stdout().lock();
    match member {
        None => index.walk(ROOT, b"", |entry| -> Result<_, Box<dyn Error>> {
            let inode = index.inode(entry.id)?;
            let dir = inode.attrs.is_dir();
            let slash = if dir { "/" } else { "" };
            writeln!(out, "{:>12} {}{slash}", inode.attrs.size, entry.path.shown())?;
            // Walk into directories, never through links.
            Ok(dir.then_some(entry.id))
        })?,
        Some(name) => {
            let id = index.resolve(name, true)?;
            let inode = index.inode(id)?;
            if matches!(inode.data, Data::Dir { .. }) {
                return Err(format!("{} is a directory", name.shown()).into());
            }
            let mut offset = 0;
            while offset < inode.attrs.size {
                let bytes = archive.read(id, &inode, offset, CHUNK)?;
                if bytes.is_empty() {
                    return Err(format!("{} ended early at {offset}", name.shown()).into());
                }
                out.write_all(&bytes)?;
                offset += bytes.len() as u64;
            }
        }
    }
    Ok(())
}
