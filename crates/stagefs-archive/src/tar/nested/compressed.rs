//! Compressed tars inside a tar (`--recursive`): each decoded from its byte range of the outer archive by the first pass and restart points of a compressed tar, sharing one restart-point budget.

use std::path::Path;

use super::reader::InnerTar;
use crate::caches::Caches;
use crate::codec::Compression;
use crate::index::Index;
use crate::seekable::{self, Points, Seekable};
use crate::source::{Backing, Source};
use crate::tar::reader::{Extent, SparseFile, TarReader};

/// The names a tar member has when it is a compressed tar, and the codec they announce
/// (the bytes decide the codec; the name only gives the directory's).
const SUFFIXES: [&[u8]; 10] =
    [b".tar.gz", b".tgz", b".tar.zst", b".tzst", b".tar.bz2", b".tbz2", b".tbz", b".tar.xz", b".txz", b".tar"];

/// The directory name of an inner archive named `name`, and whether it is compressed.
pub(super) fn stem(name: &[u8]) -> Option<(&[u8], bool)> {
    SUFFIXES.iter().find_map(|suffix| Some((name.strip_suffix(*suffix)?, *suffix != b".tar")))
}

/// The most decoded bytes between two restart points of a compressed inner tar: a read
/// decodes from the point before it, so a single zstd frame or xz block of 1 GiB would
/// cost 1 GiB of decoding per cold read. Such a tar stays a file.
pub(super) const MAX_GAP: u64 = 16 * seekable::SPAN;

/// Why a compressed inner tar was not opened.
pub(super) enum Refused {
    /// The work was stopped (a signal).
    Stopped,
    /// It stays a file, for this reason (said in one log line).
    Why(String),
}

/// The compressed inner tars opened so far, with the restart-point budget they share (their
/// decoded units share the process's one cache, as every compressed file's do).
pub(super) struct Opener {
    /// Restart points the inner tars may still take: together no more than one
    /// compressed file of the outer archive's size may have.
    points_left: usize,
    /// Range in the outer archive, and decoded bytes, of each: reader `k` is `opened[k - 1]`.
    opened: Vec<(u64, u64, Backing)>,
    /// Where their decoded units are kept: the open's.
    caches: Caches,
}

/// An inner tar's tree and sparse tables, and the reader number that serves it.
type Scanned = (Index, Vec<SparseFile>, Vec<Extent>, u32);

impl Opener {
    pub(super) fn new(outer_len: u64, caches: Caches) -> Opener {
        Opener { points_left: seekable::max_points(outer_len), opened: Vec::new(), caches }
    }

    pub(super) fn count(&self) -> usize {
        self.opened.len()
    }

    /// The decoded bytes of reader `reader` (`None` for the outer archive's).
    pub(super) fn decoded(&self, reader: u32) -> Option<&Backing> {
        self.opened.get((reader as usize).checked_sub(1)?).map(|(_, _, decoded)| decoded)
    }

    /// Scans the `codec` tar stored at `start..start + len` of `outer` (the archive at
    /// `path`) from its decoded stream, noting its restart points.
    pub(super) fn open(
        &mut self,
        path: &Path,
        outer: &Backing,
        (start, len): (u64, u64),
        codec: Compression,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scanned, Refused> {
        let input = Source::within(outer, start, len).ok_or(Refused::Why("it lies outside the archive".into()))?;
        let scanned = crate::tar::compressed::scan_compressed(path, &input, codec, Some(cancelled), &self.caches);
        let (index, sparse_files, extents, points) = scanned.map_err(|e| match cancelled() {
            true => Refused::Stopped,
            false => Refused::Why(format!("it does not decode as a {} tar ({e})", codec.name())),
        })?;
        let gap = largest_gap(&points);
        if gap > MAX_GAP {
            return Err(Refused::Why(format!(
                "its {} stream restarts only every {} MiB (a single zstd frame or xz block?), and each read would \
                 decode up to that much; recompress it with restart points (gzip, bzip2, pzstd, xz -T0) to open it",
                codec.name(),
                gap >> 20
            )));
        }
        let Some(left) = self.points_left.checked_sub(points.list.len()) else {
            return Err(Refused::Why(format!(
                "the compressed tars inside this archive have more restart points than one compressed file of its \
                 size may have ({}); mount the inner tar on its own",
                seekable::max_points(outer.len() as u64)
            )));
        };
        self.points_left = left;
        let reader = u32::try_from(self.opened.len() + 1).map_err(|_| Refused::Why("too many inner tars".into()))?;
        let decoded = Source::decoded(Seekable::new(input, points, &self.caches))
            .map_err(|e| Refused::Why(format!("cannot map: {e}")))?;
        self.opened.push((start, len, std::sync::Arc::new(decoded)));
        Ok((index, sparse_files, extents, reader))
    }

    /// Their readers, over the sparse tables the nested tree gave each (`tables[k - 1]`
    /// for reader `k`); `None` if a table does not fit its tar.
    pub(super) fn finish(self, tables: Vec<(Vec<SparseFile>, Vec<Extent>)>) -> Option<Vec<InnerTar>> {
        self.opened
            .into_iter()
            .zip(tables)
            .map(|((start, len, decoded), (sparse_files, extents))| {
                Some(InnerTar { start, len, reader: TarReader::from_parts(decoded, sparse_files, extents)? })
            })
            .collect()
    }
}

/// The most decoded bytes from one restart point to the next (or to the end).
pub(crate) fn largest_gap(points: &Points) -> u64 {
    let ends = points.list.iter().skip(1).map(|p| p.out).chain([points.total]);
    points.list.iter().zip(ends).map(|(p, end)| end.saturating_sub(p.out)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// The inner tars' restart points share one budget: once it is spent, the next inner
    /// tar stays a file (9 MiB tars of several points each, a budget one point short).
    /// Compressed at the default level: zlib-rs's fastest level wrote this text as one
    /// block, which has no restart point inside (gzip and pigz cut blocks of ~16-64 KiB).
    #[test]
    fn restart_points_of_all_inner_tars_share_one_budget() {
        let data = crate::test_rng::text_like(4, 9 << 20);
        let tar = crate::test_support::ustar(&[("big", &data)]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        let outer = Source::memory(&[gz.clone(), gz.clone()].concat());
        let mut opener = Opener::new(0, crate::caches::Caches::default());
        let budget = opener.points_left;
        let path = Path::new("t.tar");
        let first = opener.open(path, &outer, (0, gz.len() as u64), Compression::Gzip, &|| false);
        assert!(matches!(first, Ok((_, _, _, 1))), "the first fits");
        let used = budget - opener.points_left;
        assert!(used >= 2, "{used} restart points in 9 MiB");
        opener.points_left = used - 1;
        let second = opener.open(path, &outer, (gz.len() as u64, gz.len() as u64), Compression::Gzip, &|| false);
        assert!(matches!(second, Err(Refused::Why(why)) if why.contains("more restart points")));
        assert_eq!(opener.count(), 1);
    }
}
