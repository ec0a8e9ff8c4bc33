//! Reads of a compressed file served by its restart points: each unit (a zstd frame, a bzip2 or xz block, a gzip span) decoded once into one cache that every reader shares, a larger unit by a decoder kept positioned, the next unit decoded ahead when reads go in file order.
//!
//! A unit of at most [`WHOLE_UNIT`] is decoded whole and cached as one entry: the files
//! inside one 8 MiB pzstd frame are all served from one decode, and readers who want
//! the same unit at once wait for that decode instead of repeating it. A larger unit (a
//! high level's 512 MiB frame) is cut into [`PIECE`]s, decoded by a decoder that is kept
//! where it stopped ([`CURSORS`] of them), so reading it front to back decodes it once
//! rather than once per piece from its start. The cache is the open's ([`Caches`], made
//! once from its RAM budget and passed in), weighed in bytes, so a set of 1,000
//! compressed shards takes no more than one.

use std::borrow::Cow;
use std::io::{Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::points::{Point, Points, SPAN};
use super::{bzip2, gzip, xz};
use crate::caches::{Caches, Unit, UnitCache};
use crate::codec::Compression;
use crate::error::ReadError;
use crate::source::{Backing, Derived, Source, SourceCache};

/// A unit decoding to at most this is decoded whole and cached as one entry.
pub(crate) const WHOLE_UNIT: u64 = 32 << 20;
/// A larger unit is decoded and cached in pieces of this much.
pub const PIECE: u64 = 4 << 20;
/// Decoders of large units kept where they stopped (each holds a zstd window or an xz
/// dictionary: up to 128 MiB for `zstd --long=27`, so few).
const CURSORS: usize = 4;

/// Bytes `pos..end` of a source read through [`crate::Source::read_at`] (so a file served
/// in place is checked to be unchanged), as a stream: the compressed file for the
/// decoders, or a decoded inner tar for the scan of a tar inside it. A read takes at most
/// [`SPAN`] (a scan's 16 MiB buffer is filled in pieces, not by one allocation).
pub(crate) struct Compressed {
    pub(crate) source: Backing,
    pub(crate) pos: u64,
    pub(crate) end: u64,
}

impl Compressed {
    /// `source` from byte `pos` to its end.
    pub(crate) fn to_end(source: Backing, pos: u64) -> Compressed {
        let end = source.len() as u64;
        Compressed { source, pos, end }
    }
}

impl Read for Compressed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.end.saturating_sub(self.pos)).min(SPAN) as usize;
        if n == 0 {
            return Ok(0);
        }
        let bytes = self.source.read_at(self.pos, n).map_err(|e| std::io::Error::other(e.to_string()))?;
        buf[..n].copy_from_slice(&bytes);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Compressed {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        match to {
            SeekFrom::Start(at) => self.pos = at,
            _ => return Err(std::io::Error::other("only absolute seeks")),
        }
        Ok(self.pos)
    }
}

/// A decoder of a large unit, kept where it stopped.
struct Cursor {
    point: usize,
    /// The next piece it decodes.
    piece: u64,
    decoder: Box<dyn Read + Send>,
}

struct Shared {
    /// Tells this file's entries from other files' in the open's cache.
    id: u64,
    cache: Arc<UnitCache>,
    input: Backing,
    points: Points,
    cursors: Mutex<Vec<Cursor>>,
    /// The (unit, piece) a reader read last, to see reads in file order.
    last_read: Mutex<Option<(usize, u64)>>,
    /// A unit is being decoded ahead.
    ahead: AtomicBool,
    /// Decoders started (whole units and cursors), for tests.
    started: AtomicU64,
}

/// A compressed file served by its restart points.
pub struct Seekable {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Seekable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let points = &self.shared.points;
        write!(f, "Seekable({:?}, {} points, {} bytes)", points.codec, points.list.len(), points.total)
    }
}

impl Seekable {
    /// The decoded bytes of `input` served from `points`, decoded units kept in the open's
    /// `caches`.
    pub fn new(input: Backing, points: Points, caches: &Caches) -> Seekable {
        Seekable::with_cache(input, points, caches.units())
    }

    /// A file with a cache of its own of `bytes` (tests: other tests' reads do not evict).
    #[cfg(test)]
    pub(super) fn with_own_cache(input: Backing, points: Points, bytes: u64) -> Seekable {
        Seekable::with_cache(input, points, Arc::new(crate::caches::unit_cache(bytes)))
    }

    fn with_cache(input: Backing, points: Points, cache: Arc<UnitCache>) -> Seekable {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let shared = Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cache,
            input,
            points,
            cursors: Mutex::new(Vec::new()),
            last_read: Mutex::new(None),
            ahead: AtomicBool::new(false),
            started: AtomicU64::new(0),
        };
        Seekable { shared: Arc::new(shared) }
    }

    /// The restart points served from.
    pub fn points(&self) -> &Points {
        &self.shared.points
    }

    /// The compressed bytes.
    pub fn input(&self) -> &Backing {
        &self.shared.input
    }

    pub(crate) fn decoded_len(&self) -> u64 {
        self.shared.points.total
    }

    /// Decoders started so far by reads (one per unit decoded whole, one per kept
    /// decoder of a large unit): how tests see that nothing is decoded twice.
    #[cfg(test)]
    pub(crate) fn decoders_started(&self) -> u64 {
        self.shared.started.load(Ordering::Relaxed)
    }

    /// Whether the unit (or piece) holding decoded byte `offset` is in the cache.
    #[cfg(test)]
    pub(super) fn is_cached(&self, offset: u64) -> bool {
        let shared = &self.shared;
        let (point, piece) = shared.locate(offset);
        shared.cache.contains_key(&(shared.id, point, piece))
    }

    /// `len` decoded bytes at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let shared = &self.shared;
        let total = shared.points.total;
        let end = offset.checked_add(len as u64).filter(|&e| e <= total).ok_or_else(|| ReadError {
            offset,
            what: format!("{len} bytes run past the end of the decompressed archive ({total} bytes)"),
        })?;
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        while at < end {
            let list = &shared.points.list;
            let (point, piece) = shared.locate(at);
            let chunk = shared.chunk(point, piece)?;
            let from = (at - list[point].out - piece * PIECE) as usize;
            let to = chunk.len().min(from + (end - at) as usize);
            if to <= from {
                return Err(ReadError {
                    offset: list[point].input,
                    what: "the restart points do not cover this byte".into(),
                });
            }
            out.extend_from_slice(&chunk[from..to]);
            at += (to - from) as u64;
        }
        Ok(out)
    }
}

impl Shared {
    /// The unit (its restart point) and the piece of it (0 for a unit decoded whole) that
    /// hold decoded byte `offset`.
    fn locate(&self, offset: u64) -> (usize, u64) {
        let list = &self.points.list;
        let point = list.partition_point(|p| p.out <= offset).saturating_sub(1);
        let piece = if self.unit_len(point) <= WHOLE_UNIT { 0 } else { (offset - list[point].out) / PIECE };
        (point, piece)
    }

    /// Decoded bytes from restart point `point` to the next.
    fn unit_len(&self, point: usize) -> u64 {
        let list = &self.points.list;
        list.get(point + 1).map_or(self.points.total, |p| p.out).saturating_sub(list[point].out)
    }

    fn fail(&self, point: usize, what: impl std::fmt::Display) -> ReadError {
        ReadError {
            offset: self.points.list[point].input,
            what: format!("{} stream: {what}", self.points.codec.name()),
        }
    }

    /// Piece `piece` of the unit at `point` (the whole unit if it is small), from the
    /// cache or decoded; one being decoded for another reader is waited for.
    fn chunk(self: &Arc<Self>, point: usize, piece: u64) -> Result<Unit, ReadError> {
        let key = (self.id, point, piece);
        let chunk = match self.cache.get(&key) {
            Some(chunk) => chunk,
            None => self.cache.get_or_insert_with(&key, || self.decode(point, piece))?,
        };
        self.note_read(point, piece);
        Ok(chunk)
    }

    /// Records a read of `piece` of the unit at `point`; when it follows the read before
    /// in file order, the next piece is decoded ahead. A piece found in the cache (the
    /// last read-ahead finished first) counts too: else a reader slower than the decoder
    /// would get read-ahead only every other piece.
    fn note_read(self: &Arc<Self>, point: usize, piece: u64) {
        let last = self.last_read.lock().unwrap_or_else(|e| e.into_inner()).replace((point, piece));
        if last.and_then(|(u, p)| self.next_after(u, p)) == Some((point, piece)) {
            if let Some((next, next_piece)) = self.next_after(point, piece) {
                self.read_ahead(next, next_piece);
            }
        }
    }

    fn decode(&self, point: usize, piece: u64) -> Result<Unit, ReadError> {
        tracing::debug!(point, piece, "decoding a compressed unit");
        if self.unit_len(point) <= WHOLE_UNIT {
            self.decode_whole(point).map(Arc::new)
        } else {
            self.decode_piece(point, piece).map(Arc::new)
        }
    }

    /// The (unit, piece) after `piece` of the unit at `point`, in file order.
    fn next_after(&self, point: usize, piece: u64) -> Option<(usize, u64)> {
        let unit = self.unit_len(point);
        if unit > WHOLE_UNIT && (piece + 1) * PIECE < unit {
            Some((point, piece + 1))
        } else {
            (point + 1 < self.points.list.len()).then_some((point + 1, 0))
        }
    }

    /// Decodes piece `piece` of the unit at `point` into the cache in the background,
    /// when reads go in file order (the read before was of the piece before): one at a
    /// time; the reader who wants it meanwhile waits for that decode.
    fn read_ahead(self: &Arc<Self>, point: usize, piece: u64) {
        let key = (self.id, point, piece);
        if self.cache.contains_key(&key) || self.ahead.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.clone();
        let spawned = std::thread::Builder::new().name("stagefs-ahead".into()).spawn(move || {
            let mut decoded_here = false;
            let _ = shared.cache.get_or_insert_with(&key, || {
                let decoded = shared.decode(point, piece);
                // Free before the piece is in the cache: the reader who finds it there
                // may start the next read-ahead at once.
                decoded_here = true;
                shared.ahead.store(false, Ordering::Release);
                decoded
            });
            if !decoded_here {
                shared.ahead.store(false, Ordering::Release);
            }
        });
        if spawned.is_err() {
            self.ahead.store(false, Ordering::Release);
        }
    }

    /// A decoder of the stream from restart point `point` on.
    fn decoder(&self, point: usize) -> Result<Box<dyn Read + Send>, ReadError> {
        self.started.fetch_add(1, Ordering::Relaxed);
        let list = &self.points.list;
        let at = &list[point];
        let input = Compressed::to_end(self.input.clone(), at.input);
        Ok(match self.points.codec {
            Compression::Zstd => {
                let input = std::io::BufReader::new(input);
                Box::new(crate::codec::zstd_decoder(input).map_err(|e| self.fail(point, e))?.single_frame())
            }
            Compression::Bzip2 => {
                Box::new(std::io::Cursor::new(self.bzip2_block(at).map_err(|e| self.fail(point, e))?))
            }
            Compression::Xz => {
                let stream = xz::block_stream(at, self.unit_len(point), input);
                Box::new(crate::codec::xz_streams(stream).map_err(|e| self.fail(point, e))?)
            }
            // gzip's decoder is no `Send` (zlib's state): see `decode_gzip`.
            other => return Err(self.fail(point, format!("no {} decoder starts at a restart point", other.name()))),
        })
    }

    /// The bzip2 block starting at `point`, decoded whole (a block is at most ~46 MB).
    fn bzip2_block(&self, point: &Point) -> Result<Vec<u8>, String> {
        let start = point.input * 8 + u64::from(point.bits);
        let end = point.end.max(start);
        if end - start > bzip2::MAX_BLOCK_BITS {
            return Err(format!("a block of {} bits, longer than any", end - start));
        }
        let len = usize::try_from(end.div_ceil(8) - point.input).map_err(|e| e.to_string())?;
        let bytes = self.input.read_at(point.input, len).map_err(|e| e.to_string())?;
        let stream = bzip2::block_stream(&bytes, start - point.input * 8, end - point.input * 8)
            .ok_or("the block runs past the end of the file")?;
        bzip2::decode_block(&stream, bzip2::MAX_BLOCK_OUTPUT)
    }

    /// The unit at `point`, decoded whole, by a decoder reading the compressed bytes
    /// 128 KiB at a time (one buffer of the unit's size is all it allocates: a copy of
    /// the compressed unit as well cost as much in page faults as the decoding itself).
    fn decode_whole(&self, point: usize) -> Result<Vec<u8>, ReadError> {
        let len = self.unit_len(point) as usize;
        if self.points.codec == Compression::Gzip {
            return self.decode_gzip(point, 0, len);
        }
        let mut out = vec![0u8; len];
        self.decoder(point)?.read_exact(&mut out).map_err(|e| self.fail(point, e))?;
        Ok(out)
    }

    /// gzip's `len` bytes from `skip` bytes after `point`, decoded from the point (gzip
    /// points are at most a few MiB apart: nothing to keep a decoder for).
    fn decode_gzip(&self, point: usize, skip: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let at = &self.points.list[point];
        let window = match &at.window {
            Some(packed) => Some(
                crate::codec::zstd_frame(packed, gzip::WINDOW)
                    .map_err(|e| self.fail(point, format!("bad saved window: {e}")))?,
            ),
            None => None,
        };
        self.started.fetch_add(1, Ordering::Relaxed);
        let input = Compressed::to_end(self.input.clone(), at.input);
        let mut decoder = gzip::Resume::new(input, at, window.as_deref()).map_err(|e| self.fail(point, e))?;
        std::io::copy(&mut (&mut decoder).take(skip), &mut std::io::sink()).map_err(|e| self.fail(point, e))?;
        let mut out = vec![0u8; len];
        decoder.read_exact(&mut out).map_err(|e| self.fail(point, e))?;
        Ok(out)
    }

    /// Piece `piece` of the large unit at `point`, by the kept decoder furthest along
    /// before it (or a new one); the pieces it passes are cached on the way.
    fn decode_piece(&self, point: usize, piece: u64) -> Result<Vec<u8>, ReadError> {
        let unit = self.unit_len(point);
        let piece_len = |p: u64| (unit - p * PIECE).min(PIECE) as usize;
        if self.points.codec == Compression::Gzip {
            return self.decode_gzip(point, piece * PIECE, piece_len(piece));
        }
        let kept = {
            let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            let best = (0..cursors.len())
                .filter(|&i| cursors[i].point == point && cursors[i].piece <= piece)
                .max_by_key(|&i| cursors[i].piece);
            best.map(|i| cursors.remove(i))
        };
        let mut cursor = match kept {
            Some(cursor) => cursor,
            None => Cursor { point, piece: 0, decoder: self.decoder(point)? },
        };
        let io = |e: std::io::Error| self.fail(point, e);
        while cursor.piece < piece {
            let mut passed = vec![0u8; piece_len(cursor.piece)];
            cursor.decoder.read_exact(&mut passed).map_err(io)?;
            let key = (self.id, point, cursor.piece);
            if !self.cache.contains_key(&key) {
                self.cache.insert(key, Arc::new(passed));
            }
            cursor.piece += 1;
        }
        let mut out = vec![0u8; piece_len(piece)];
        cursor.decoder.read_exact(&mut out).map_err(io)?;
        cursor.piece += 1;
        if cursor.piece * PIECE < unit {
            let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            if cursors.len() >= CURSORS {
                cursors.remove(0);
            }
            cursors.push(cursor);
        }
        Ok(out)
    }
}

impl Derived for Seekable {
    fn len(&self) -> u64 {
        self.decoded_len()
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Cow<'_, [u8]>, ReadError> {
        Seekable::read_at(self, offset, len).map(Cow::Owned)
    }

    /// The compressed bytes.
    fn origin(&self) -> &Backing {
        self.input()
    }

    fn source_cache(&self, what: SourceCache<'_>) {
        self.input().source_cache(what);
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Source {
    /// The decoded bytes of a compressed file, served by its restart points.
    pub fn decoded(seekable: Seekable) -> std::io::Result<Source> {
        let mut source = Source::empty()?;
        source.derived = Some(Box::new(seekable));
        Ok(source)
    }

    /// The restart points and compressed bytes, when this is a compressed file's decoding.
    pub fn seekable(&self) -> Option<&Seekable> {
        self.derived.as_ref()?.as_any().downcast_ref()
    }
}
