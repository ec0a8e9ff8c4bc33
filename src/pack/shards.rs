//! Splitting a pack into shards of about `--shard-size` bytes, keeping WebDataset samples whole, and naming them.
//!
//! A sample is every file of one directory sharing a stem (the name up to its first dot,
//! a leading dot aside): `a/123.jpg` and `a/123.cls`. In path order a sample's files are
//! adjacent, so a shard boundary is placed only between two members of different samples;
//! a sample larger than the limit makes a shard of its own, larger than the limit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::member::Member;
use stagefs_archive::tar::write::member_len;

/// The sample a member belongs to: (directory, stem); `None` for directories, which
/// never hold a shard boundary back.
fn sample_of(m: &Member) -> Option<(&[u8], &[u8])> {
    if m.stat.file_type() == libc::S_IFDIR {
        return None;
    }
    let (dir, name) = match m.path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&m.path[..i], &m.path[i + 1..]),
        None => (&[][..], &m.path[..]),
    };
    let stem_end = name.iter().skip(1).position(|&b| b == b'.').map_or(name.len(), |i| i + 1);
    Some((dir, &name[..stem_end]))
}

/// Sets every member's shard: members in order fill a shard until the next sample would
/// take it past `limit` (`None`: one archive).
pub fn plan(members: &mut [Member], limit: Option<u64>) {
    let Some(limit) = limit else { return };
    let mut shard = 0u32;
    let mut filled = 0u64;
    let mut start = 0;
    while start < members.len() {
        let key = sample_of(&members[start]);
        let end = match key {
            None => start + 1,
            Some(_) => start + members[start..].iter().take_while(|m| sample_of(m) == key).count(),
        };
        let bytes: u64 = members[start..end].iter().map(|m| member_len(m.path.len() + 1, 0, m.stat.size)).sum();
        if filled > 0 && filled + bytes > limit {
            shard += 1;
            filled = 0;
        }
        filled += bytes;
        for m in &mut members[start..end] {
            m.shard = shard;
        }
        start = end;
    }
}

/// Marks the second and later paths of a regular file (same device and inode) within one shard
/// as hard links to the first; across shards a file is stored again, so that every
/// shard stands alone.
pub fn link_hardlinks(members: &mut [Member]) {
    let mut first: HashMap<(u64, u64), (u32, usize)> = HashMap::new();
    for (i, m) in members.iter_mut().enumerate() {
        // Regular files only: a hard-linked symlink or FIFO is stored again (GNU tar links
        // them too, but a tar hard link carries no symlink target of its own).
        if m.stat.nlink < 2 || m.stat.file_type() != libc::S_IFREG {
            continue;
        }
        let key = (m.stat.dev, m.stat.ino);
        match first.get(&key) {
            Some(&(shard, at)) if shard == m.shard => m.link_to = Some(at),
            _ => {
                first.insert(key, (m.shard, i));
            }
        }
    }
}

/// The file shard `n` goes to: `OUT-000000.tar` for `OUT.tar` (or `OUT`).
pub fn shard_path(out: &Path, n: u32) -> PathBuf {
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A compressed archive's shards keep its extension.
    let suffix = [".tar.zst", ".tar.gz", ".tar"].into_iter().find(|s| name.ends_with(s)).unwrap_or(".tar");
    let stem = name.strip_suffix(suffix).unwrap_or(&name);
    out.with_file_name(format!("{stem}-{n:06}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::walk::Stat;

    fn member(path: &str, size: u64, dir: bool) -> Member {
        let mode = if dir { libc::S_IFDIR | 0o755 } else { libc::S_IFREG | 0o644 };
        let stat = Stat {
            mode,
            uid: 0,
            gid: 0,
            size,
            mtime: 0,
            mtime_nsec: 0,
            ctime: 0,
            ctime_nsec: 0,
            dev: 1,
            ino: 1,
            nlink: 1,
            rdev: 0,
            blocks: 0,
        };
        Member { path: path.as_bytes().to_vec(), stat, shard: 0, link_to: None }
    }

    #[test]
    fn samples_stay_together() {
        let mut ms = vec![
            member("", 0, true),
            member("a", 0, true),
            member("a/1.cls", 10, false),
            member("a/1.jpg", 3000, false),
            member("a/2.cls", 10, false),
            member("a/2.jpg", 3000, false),
            member("a/3.cls", 10, false),
            member("a/3.jpg", 3000, false),
        ];
        plan(&mut ms, Some(6000));
        let shards: Vec<u32> = ms.iter().map(|m| m.shard).collect();
        assert_eq!(shards, [0, 0, 0, 0, 1, 1, 2, 2]);
    }

    /// A file's second path is a hard link within its shard, stored again in another.
    #[test]
    fn hard_links_stay_inside_a_shard() {
        let mut ms = vec![member("a", 5, false), member("b", 5, false), member("c", 5, false)];
        for m in &mut ms {
            m.stat.nlink = 3;
        }
        ms[2].shard = 1;
        link_hardlinks(&mut ms);
        let links: Vec<Option<usize>> = ms.iter().map(|m| m.link_to).collect();
        assert_eq!(links, [None, Some(0), None]);
    }

    #[test]
    fn names() {
        assert_eq!(shard_path(Path::new("/d/train.tar"), 3), Path::new("/d/train-000003.tar"));
        assert_eq!(shard_path(Path::new("x"), 0), Path::new("x-000000.tar"));
        assert_eq!(sample_of(&member("d/.hidden.x", 1, false)), Some((&b"d"[..], &b".hidden"[..])));
    }
}
