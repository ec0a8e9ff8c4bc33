//! `stagefs ls` and `stagefs index --print-stats`: an archive's tree without mounting it, from its saved index when there is one (instant), else a scan.

use std::path::Path;

use crate::error::{code, Failure};
use stagefs_archive::escape::{escape, Shown};
use stagefs_archive::index::{Data, Index, InodeId};
use stagefs_open::open::{Indexing, Opened};
use stagefs_open::places::{ArchiveSet, Trust};
use stagefs_open::report::human;
use stagefs_open::OpenOptions;

/// What `stagefs ls` prints.
#[derive(Debug, Clone, Copy, Default)]
pub struct Style {
    /// Mode, owner, size and time, as `tar -tvf`.
    pub long: bool,
    /// The whole subtree.
    pub recursive: bool,
    /// One JSON object per entry.
    pub json: bool,
}

/// `stagefs ls ARCHIVE [PATH]`: the entries of `path` inside `archive` (a directory's
/// children, or the one file it names), each under the name the archive gives it.
pub fn ls(archive: &Path, path: Option<&Path>, style: Style, indexing: Indexing) -> Result<(), Failure> {
    let one = ArchiveSet { label: archive.to_owned(), shards: vec![archive.to_owned()], trust: Trust::Named };
    let opened = stagefs_open::open(&one, OpenOptions::default().indexing(indexing))?;
    let index = &opened.archive.index;
    let wanted = path.unwrap_or(Path::new("/"));
    let prefix = normalised(wanted);
    let at = index
        .resolve(wanted.as_os_str().as_encoded_bytes(), false)
        .map_err(|_| Failure::new(code::USAGE, format!("{}: no {} in the archive", archive.shown(), wanted.shown())))?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let inode = index.inode(at)?;
    if !inode.attrs.is_dir() {
        return print_entry(&mut out, index, at, &prefix, style);
    }
    // Depth-first in name order, each directory before what it holds (as `find` lists),
    // the path carried down the walk.
    index.walk(at, &prefix, |entry| {
        print_entry(&mut out, index, entry.id, entry.path, style)?;
        let dir = index.inode(entry.id)?.attrs.is_dir();
        Ok::<_, Failure>((style.recursive && dir).then_some(entry.id))
    })
}

/// `path` as the archive names it: relative, `.` and empty components left out, `..`
/// taking the one before it away (what [`Index::resolve`] walks, links aside).
fn normalised(path: &Path) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::Normal(name) => parts.push(name.as_encoded_bytes()),
            std::path::Component::ParentDir => drop(parts.pop()),
            _ => {}
        }
    }
    parts.join(&b'/')
}

fn print_entry(
    out: &mut impl std::io::Write,
    index: &Index,
    id: InodeId,
    path: &[u8],
    style: Style,
) -> Result<(), Failure> {
    let failed = |e: std::io::Error| Failure::other(format!("cannot write the listing: {e}"));
    let inode = index.inode(id)?;
    let a = &inode.attrs;
    // As tar -t shows them: relative, directories ending in `/`.
    let path = escape(path);
    let shown = if a.is_dir() && !style.json { format!("{path}/") } else { path.clone() };
    let target = match inode.data {
        Data::Symlink(span) => Some(index.bytes(span)?.shown().to_string()),
        _ => None,
    };
    let kind = match a.mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFREG => "file",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFIFO => "fifo",
        _ => "other",
    };
    let line = if style.json {
        serde_json::json!({
            "path": path, "type": kind, "size": a.size, "mode": format!("{:04o}", a.mode & 0o7777),
            "uid": a.uid, "gid": a.gid, "mtime": a.mtime, "target": target, "links": inode.nlink,
        })
        .to_string()
    } else if style.long {
        let time = chrono_like(a.mtime);
        let link = target.map_or(String::new(), |t| format!(" -> {t}"));
        format!("{} {:>5}/{:<5} {:>12} {time} {shown}{link}", mode_string(a.mode), a.uid, a.gid, a.size)
    } else {
        shown
    };
    writeln!(out, "{line}").map_err(failed)
}

/// `drwxr-xr-x` from `st_mode`.
fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        _ => '-',
    };
    let bits = "rwxrwxrwx".chars().enumerate().map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' });
    std::iter::once(kind).chain(bits).collect()
}

/// `YYYY-MM-DD HH:MM` in UTC (days from the civil calendar, as `zip::dos_time` inverts).
fn chrono_like(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}", rem / 3600, rem / 60 % 60)
}

/// The lines `stagefs index --print-stats` adds: what the index holds (its summary, kept
/// when it was built: a saved index is not read through).
pub fn print_stats(opened: &Opened) {
    let index = &opened.archive.index;
    let s = index.summary();
    println!(
        "format: {:?}{}",
        opened.archive.format,
        opened.archive.compression().map_or(String::new(), |c| format!(", {c}"))
    );
    println!("files: {} ({}, the largest {})", s.files, human(s.file_bytes), human(s.largest));
    println!("directories: {}", s.dirs);
    println!("symbolic links: {}", s.symlinks);
    let memory = index.memory();
    let mapped = match index.source() {
        Some(file) => format!(", mapped from {} ({})", file.shown(), human(memory.mapped)),
        None => String::new(),
    };
    println!("entries: {} (index in memory: {}{mapped})", index.entry_count(), human(memory.heap));
    println!("archive: {}", human(opened.archive.size()));
    if let Some(path) = &opened.saved_index {
        let size = std::fs::symlink_metadata(path).map_or(0, |m| m.len());
        println!("saved index: {} ({})", path.shown(), human(size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_times_as_tar_shows_them() {
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFREG | 0o640), "-rw-r-----");
        assert_eq!(chrono_like(0), "1970-01-01 00:00");
        assert_eq!(chrono_like(1_728_053_248), "2024-10-04 14:47");
    }
}
