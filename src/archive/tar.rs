//! Tar reader: indexes GNU, oldgnu, pax, ustar and v7 archives straight from the map.
//!
//! Written by hand rather than on the `tar` crate because stagefs needs three things it
//! does not give: pax sparse maps (0.0, 0.1, 1.0), the byte offset of every fault for
//! error messages, and a zero-copy scan over millions of headers without a `Read` stream.
//! A regular member's content is the slice `map[data..data + size]`; sparse members
//! keep a map of extents in this reader and read holes as zeros.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::{Backing, Bytes, OpenError, ReadError};
use crate::escape::escape;
use crate::index::{Attrs, Data, Index, IndexBuilder, InodeId, XattrRun, MAX_LINK_TARGET, ROOT};

const BLOCK: usize = 512;
/// The largest file size Linux allows (`off_t` is signed): a sparse member may declare
/// no more.
const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most xattrs global pax headers may give every member: more than any real archive
/// sets, few enough that merging them into a member's own costs that member little.
const MAX_GLOBAL_XATTRS: usize = 256;

/// Serves member content; holds the sparse maps the index points into.
pub struct TarReader {
    backing: Backing,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
}

/// A sparse member's data runs: `extents[first..first + count]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseFile {
    pub first: u32,
    pub count: u32,
}

/// One run of real data in a sparse file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file as extracted.
    pub file_offset: u64,
    pub len: u64,
    /// Offset of these bytes in the archive.
    pub archive_offset: u64,
}

/// True if `head` starts with a plausible tar header (valid checksum, or the ustar magic),
/// or with an end-of-archive block (an empty tar).
pub fn looks_like_tar(head: &[u8]) -> bool {
    let Some(block) = head.get(..BLOCK) else { return false };
    block.get(257..262) == Some(b"ustar") || block.iter().all(|&b| b == 0) || checksum_ok(block).unwrap_or(false)
}

/// Indexes the whole archive.
pub fn open(path: &Path, backing: Backing) -> Result<(Index, TarReader), OpenError> {
    let mut scan = Scan::new(path, &backing);
    scan.run()?;
    tracing::debug!(pax_keywords = scan.pax_keywords, "scanned tar headers");
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing, sparse_files, extents }))
}

impl TarReader {
    /// A reader over tables saved earlier (see `index_cache`), checked against the archive.
    pub fn from_parts(backing: Backing, sparse_files: Vec<SparseFile>, extents: Vec<Extent>) -> Option<TarReader> {
        let in_bounds = sparse_files
            .iter()
            .all(|f| (f.first as usize).checked_add(f.count as usize).is_some_and(|end| end <= extents.len()))
            && extents
                .iter()
                .all(|e| e.archive_offset.checked_add(e.len).is_some_and(|end| end <= backing.len() as u64));
        // The read path relies on each file's extents being sorted and not overlapping,
        // as `sparse` builds them.
        let sorted = in_bounds
            && sparse_files.iter().all(|f| {
                let runs = &extents[f.first as usize..f.first as usize + f.count as usize];
                let ends_ok = runs.iter().all(|e| e.file_offset.checked_add(e.len).is_some());
                ends_ok && runs.windows(2).all(|w| w[0].file_offset + w[0].len <= w[1].file_offset)
            });
        sorted.then_some(TarReader { backing, sparse_files, extents })
    }

    /// The archive's bytes this reader serves from.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    pub fn sparse_files(&self) -> &[SparseFile] {
        &self.sparse_files
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    pub fn read(&self, data: Data, _size: u64, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match data {
            Data::Slice { offset: start } => Ok(self.backing.read_at(start + offset, len)?.into()),
            Data::Extern(handle) => self.read_sparse(handle, offset, len),
            other => Err(ReadError { offset: 0, what: format!("not a regular file ({other:?})") }),
        }
    }

    fn read_sparse(&self, handle: u32, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let bad = || ReadError { offset: 0, what: format!("sparse map {handle} missing") };
        let file = self.sparse_files.get(handle as usize).ok_or_else(bad)?;
        let extents = self.extents.get(file.first as usize..(file.first + file.count) as usize).ok_or_else(bad)?;
        let mut out = vec![0u8; len];
        let end = offset + len as u64;
        // Extents are sorted; start at the first one that ends after `offset`.
        let start = extents.partition_point(|e| e.file_offset + e.len <= offset);
        for e in extents[start..].iter().take_while(|e| e.file_offset < end) {
            let from = e.file_offset.max(offset);
            let to = (e.file_offset + e.len).min(end);
            let bytes = self.backing.read_at(e.archive_offset + (from - e.file_offset), (to - from) as usize)?;
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&bytes);
        }
        Ok(Bytes::Owned(out))
    }
}

/// The state of one pass over the headers.
struct Scan<'a> {
    path: &'a Path,
    map: &'a [u8],
    builder: IndexBuilder,
    globals: Globals,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
    /// pax keywords applied to members, global ones included (for the debug log, and
    /// the test that a member's cost does not grow with the global keywords declared).
    pax_keywords: u64,
}

/// The keywords of global pax headers ('g') that stagefs uses, parsed once when their
/// header is read. They apply to every later member until a later global header sets
/// them again (POSIX); folding the declared keywords into each member's own instead
/// cost every member all of them (8,000 keywords and members: 19 s). Keywords that
/// stagefs does not use (comment, atime, ...) are dropped here.
#[derive(Default)]
struct Globals {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, u32)>,
    /// Extended attributes of every member; a member's own win by name.
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `xattrs` as stored in the index, shared by the members with none of their own.
    xattrs_run: Option<XattrRun>,
}

/// Everything known about a member once its extension headers are folded in.
#[derive(Default)]
struct Member {
    header_offset: u64,
    typeflag: u8,
    path: Vec<u8>,
    link: Vec<u8>,
    attrs: Option<Attrs>,
    /// Bytes stored in the archive after the header.
    stored_size: u64,
    data_offset: u64,
    rdev: u32,
    /// Extended attributes from the member's own pax keywords, by name.
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Sparse layout: (file offset, length) of each data run, and the real size.
    sparse: Option<(Vec<(u64, u64)>, u64)>,
}

impl<'a> Scan<'a> {
    fn new(path: &'a Path, map: &'a [u8]) -> Scan<'a> {
        Scan {
            path,
            map,
            builder: IndexBuilder::new(),
            globals: Globals::default(),
            sparse_files: Vec::new(),
            extents: Vec::new(),
            pax_keywords: 0,
        }
    }

    fn corrupt(&self, offset: u64, what: impl Into<String>) -> OpenError {
        OpenError::Corrupt { path: self.path.to_owned(), offset, what: what.into() }
    }

    fn truncated(&self, offset: u64, what: impl Into<String>) -> OpenError {
        OpenError::Truncated { path: self.path.to_owned(), offset, what: what.into() }
    }

    fn index_err(&self, source: crate::index::BuildError) -> OpenError {
        OpenError::Index { path: self.path.to_owned(), source }
    }

    /// Walks every header until the end-of-archive marker or the end of the file.
    fn run(&mut self) -> Result<(), OpenError> {
        let mut pos = 0usize;
        // Extension headers (GNU L/K, pax x) apply to the next real member.
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        loop {
            super::SCAN_PROGRESS.store(pos as u64, std::sync::atomic::Ordering::Relaxed);
            if pos >= self.map.len() {
                break; // Missing end-of-archive blocks: GNU tar accepts this too.
            }
            let Some(header) = self.map.get(pos..pos + BLOCK) else {
                return Err(self.truncated(pos as u64, "a partial header block (expected 512 bytes)"));
            };
            if header.iter().all(|&b| b == 0) {
                break; // End of archive (one or two zero blocks).
            }
            match checksum_ok(header) {
                Some(true) => {}
                _ => {
                    return Err(self.corrupt(
                        pos as u64,
                        format!(
                            "bad tar header checksum (stored {:?}); the archive is damaged or not a tar file",
                            String::from_utf8_lossy(trim_field(&header[148..156]))
                        ),
                    ))
                }
            }
            let at = pos as u64;
            let typeflag = header[156];
            let size = self.number(&header[124..136], at, "size")?;
            let data_start = pos + BLOCK;
            let content = |s: &Self| -> Result<&[u8], OpenError> {
                let end = (data_start as u64).saturating_add(size);
                if end > s.map.len() as u64 {
                    return Err(s.truncated(
                        at,
                        format!("extension header claims {size} bytes but the archive ends at byte {}", s.map.len()),
                    ));
                }
                Ok(&s.map[data_start..end as usize])
            };
            match typeflag {
                b'L' => long_name = Some(trim_nul(content(self)?).to_vec()),
                b'K' => long_link = Some(trim_nul(content(self)?).to_vec()),
                b'x' | b'X' => parse_pax(content(self)?, &mut pax).map_err(|e| self.corrupt(at, e))?,
                b'g' => self.fold_globals(content(self)?, at)?,
                b'V' => {
                    content(self)?; // Volume label: not a file, but its size must fit.
                }
                b'M' => {
                    return Err(OpenError::Unsupported {
                        path: self.path.to_owned(),
                        what: format!("multi-volume continuation member at byte {at}; join the volumes first"),
                    })
                }
                _ => {
                    let mut member = self.member(header, at, typeflag, size, data_start as u64)?;
                    if let Some(name) = long_name.take() {
                        member.path = name;
                    }
                    if let Some(link) = long_link.take() {
                        member.link = link;
                    }
                    if typeflag == b'S' {
                        self.gnu_sparse(header, &mut member)?;
                    }
                    self.apply_globals(&mut member);
                    self.apply_pax(&mut member, &pax)?;
                    pax.clear();
                    let end =
                        member.data_offset.checked_add(member.stored_size).filter(|&e| e <= self.map.len() as u64);
                    let Some(end) = end else {
                        return Err(self.truncated(
                            at,
                            format!(
                                "member '{}' needs {} bytes of data from byte {} but the archive ends at byte {}",
                                escape(&member.path),
                                member.stored_size,
                                member.data_offset,
                                self.map.len()
                            ),
                        ));
                    };
                    self.add(member)?;
                    pos = round_up(end);
                    continue;
                }
            }
            // Extension headers: the next header follows their padded content.
            pos = data_start.saturating_add(round_up(size));
        }
        Ok(())
    }

    /// Parses a numeric header field: octal text, or GNU base-256 when the high bit is set.
    fn number(&self, field: &[u8], at: u64, name: &str) -> Result<u64, OpenError> {
        parse_number(field).ok_or_else(|| {
            self.corrupt(at, format!("header field {name} is not a number: {:?}", String::from_utf8_lossy(field)))
        })
    }

    /// Reads the fixed header fields of a member.
    fn member(&self, h: &[u8], at: u64, typeflag: u8, size: u64, data_offset: u64) -> Result<Member, OpenError> {
        let ustar = &h[257..263] == b"ustar\0";
        let name = trim_nul(&h[0..100]);
        let path = if ustar && h[345] != 0 {
            let mut p = trim_nul(&h[345..500]).to_vec();
            p.push(b'/');
            p.extend_from_slice(name);
            p
        } else {
            name.to_vec()
        };
        let mode = self.number(&h[100..108], at, "mode")? as u32 & 0o7777;
        let uid = self.number(&h[108..116], at, "uid")? as u32;
        let gid = self.number(&h[116..124], at, "gid")? as u32;
        let mtime = parse_signed(&h[136..148]).ok_or_else(|| self.corrupt(at, "header field mtime is not a number"))?;
        let dev = |field: &[u8]| parse_number(field).unwrap_or(0) as u32;
        let rdev = if matches!(typeflag, b'3' | b'4') {
            libc::makedev(dev(&h[329..337]), dev(&h[337..345])) as u32
        } else {
            0
        };
        let kind = match typeflag {
            b'0' | b'\0' | b'7' | b'S' if path.ends_with(b"/") => libc::S_IFDIR, // v7 directories
            b'0' | b'\0' | b'7' | b'S' | b'1' => libc::S_IFREG,
            b'2' => libc::S_IFLNK,
            b'3' => libc::S_IFCHR,
            b'4' => libc::S_IFBLK,
            b'5' | b'D' => libc::S_IFDIR,
            b'6' => libc::S_IFIFO,
            _ => libc::S_IFREG, // Unknown types extract as regular files (POSIX).
        };
        Ok(Member {
            header_offset: at,
            typeflag,
            path,
            link: trim_nul(&h[157..257]).to_vec(),
            attrs: Some(Attrs { mode: kind | mode, uid, gid, mtime, mtime_nsec: 0, size }),
            stored_size: if stores_data(typeflag) { size } else { 0 },
            data_offset,
            rdev,
            ..Member::default()
        })
    }

    /// A pax keyword's decimal value.
    fn pax_number(&self, at: u64, key: &str, v: &[u8]) -> Result<u64, OpenError> {
        std::str::from_utf8(v).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
            self.corrupt(at, format!("pax keyword {key} is not a number: {:?}", String::from_utf8_lossy(v)))
        })
    }

    /// Parses a global header's records into [`Globals`]; an empty value unsets a
    /// keyword (POSIX), except for xattrs, whose values may be empty.
    fn fold_globals(&mut self, data: &[u8], at: u64) -> Result<(), OpenError> {
        let records = pax_records(data).map_err(|e| self.corrupt(at, e))?;
        let mut g = std::mem::take(&mut self.globals);
        let mut sparse_keys = 0;
        for (key, value) in records {
            let text = (!value.is_empty()).then_some(value);
            let number = |key: &str| text.map(|v| self.pax_number(at, key, v)).transpose();
            match key.as_slice() {
                b"path" => g.path = text.map(<[u8]>::to_vec),
                b"linkpath" => g.linkpath = text.map(<[u8]>::to_vec),
                b"size" => g.size = number("size")?,
                b"uid" => g.uid = number("uid")?,
                b"gid" => g.gid = number("gid")?,
                b"mtime" => {
                    let time =
                        text.map(|v| parse_pax_time(v).ok_or_else(|| self.corrupt(at, "pax mtime is not a time")));
                    g.mtime = time.transpose()?;
                }
                // A sparse map describes one member's data, never all of them.
                k if k.starts_with(b"GNU.sparse.") => sparse_keys += 1,
                _ => {
                    if let Some(xattr) = self.pax_xattr(at, &key, value)? {
                        insert_xattr(&mut g.xattrs, xattr);
                        g.xattrs_run = None;
                    }
                }
            }
        }
        if sparse_keys > 0 {
            tracing::warn!(offset = at, "ignoring {sparse_keys} GNU.sparse keywords in a global pax header");
        }
        if g.xattrs.len() > MAX_GLOBAL_XATTRS {
            return Err(self.corrupt(
                at,
                format!(
                    "global pax headers give every member {} xattrs; stagefs accepts at most {MAX_GLOBAL_XATTRS}",
                    g.xattrs.len()
                ),
            ));
        }
        self.globals = g;
        Ok(())
    }

    /// Gives a member the global keywords; its own, applied next, win.
    fn apply_globals(&mut self, m: &mut Member) {
        let g = &self.globals;
        let attrs = m.attrs.as_mut().expect("member() always sets attrs");
        let mut applied = 0;
        if let Some(path) = &g.path {
            m.path = path.clone();
            applied += 1;
        }
        if let Some(link) = &g.linkpath {
            m.link = link.clone();
            applied += 1;
        }
        if let Some(size) = g.size {
            attrs.size = size;
            if stores_data(m.typeflag) {
                m.stored_size = size;
            }
            applied += 1;
        }
        if let Some(uid) = g.uid {
            attrs.uid = uid as u32;
            applied += 1;
        }
        if let Some(gid) = g.gid {
            attrs.gid = gid as u32;
            applied += 1;
        }
        if let Some((s, ns)) = g.mtime {
            (attrs.mtime, attrs.mtime_nsec) = (s, ns);
            applied += 1;
        }
        // Global xattrs are given when the member is indexed (`member_xattrs`): one
        // stored copy serves every member without xattrs of its own.
        self.pax_keywords += applied + u64::from(!g.xattrs.is_empty());
    }

    /// The (name, value) of an xattr keyword, `SCHILY.xattr.NAME` (raw) or
    /// `LIBARCHIVE.xattr.NAME` (percent-encoded name, base64 value), and whether it is
    /// the SCHILY form; `None` for other keywords, and for names that listxattr could
    /// not list (empty, or holding a NUL byte: it separates names), which are skipped.
    fn pax_xattr(&self, at: u64, key: &[u8], value: &[u8]) -> Result<Option<PaxXattr>, OpenError> {
        let (name, value, schily) = if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
            (name.to_vec(), value.to_vec(), true)
        } else if let Some(name) = key.strip_prefix(b"LIBARCHIVE.xattr.") {
            let value = base64_decode(value).ok_or_else(|| self.corrupt(at, "LIBARCHIVE.xattr value is not base64"))?;
            (percent_decode(name), value, false)
        } else {
            return Ok(None);
        };
        if name.is_empty() || name.contains(&0) {
            tracing::warn!(offset = at, "skipping an xattr whose name is empty or contains a NUL byte");
            return Ok(None);
        }
        Ok(Some(PaxXattr { name, value, schily }))
    }

    /// Folds a member's own pax keywords into it (after the global ones).
    fn apply_pax(&mut self, m: &mut Member, pax: &HashMap<Vec<u8>, Vec<u8>>) -> Result<(), OpenError> {
        self.pax_keywords += pax.len() as u64;
        let at = m.header_offset;
        let attrs = m.attrs.as_mut().expect("member() always sets attrs");
        let num = |key: &str, v: &[u8]| self.pax_number(at, key, v);
        let mut sparse_map: Vec<(u64, u64)> = Vec::new();
        let mut sparse_offsets: Vec<u64> = Vec::new();
        let (mut sparse_size, mut sparse_major) = (None, None);
        let mut sparse_name = None;
        // Keys are visited in sorted order so results do not depend on hash order.
        let mut keys: Vec<_> = pax.keys().collect();
        keys.sort();
        for key in keys {
            let value = &pax[key];
            match key.as_slice() {
                b"path" => m.path = value.clone(),
                b"linkpath" => m.link = value.clone(),
                b"size" => {
                    attrs.size = num("size", value)?;
                    if stores_data(m.typeflag) {
                        m.stored_size = attrs.size;
                    }
                }
                b"uid" => attrs.uid = num("uid", value)? as u32,
                b"gid" => attrs.gid = num("gid", value)? as u32,
                b"mtime" => {
                    let (s, ns) = parse_pax_time(value).ok_or_else(|| self.corrupt(at, "pax mtime is not a time"))?;
                    attrs.mtime = s;
                    attrs.mtime_nsec = ns;
                }
                b"GNU.sparse.size" | b"GNU.sparse.realsize" => sparse_size = Some(num("GNU.sparse.size", value)?),
                b"GNU.sparse.major" => sparse_major = Some(num("GNU.sparse.major", value)?),
                b"GNU.sparse.name" => sparse_name = Some(value.clone()),
                b"GNU.sparse.map" => {
                    let numbers =
                        value.split(|&b| b == b',').map(|n| num("GNU.sparse.map", n)).collect::<Result<Vec<_>, _>>()?;
                    if numbers.len() % 2 != 0 {
                        return Err(self.corrupt(at, "GNU.sparse.map has an odd count of numbers"));
                    }
                    sparse_map = numbers.chunks(2).map(|c| (c[0], c[1])).collect();
                }
                _ => {
                    if let Some(xattr) = self.pax_xattr(at, key, value)? {
                        insert_xattr(&mut m.xattrs, xattr);
                    }
                }
            }
        }
        // pax 0.0 repeats GNU.sparse.offset/numbytes, which a map cannot hold: they are
        // kept in order by parse_pax under numbered keys.
        let mut i = 0;
        while let (Some(o), Some(n)) = (pax.get(&sparse_key("offset", i)), pax.get(&sparse_key("numbytes", i))) {
            sparse_offsets.push(num("GNU.sparse.offset", o)?);
            sparse_map.push((*sparse_offsets.last().unwrap_or(&0), num("GNU.sparse.numbytes", n)?));
            i += 1;
        }
        if let Some(name) = sparse_name {
            m.path = name;
        }
        if let Some(real_size) = sparse_size {
            if sparse_major == Some(1) {
                // pax 1.0: the map is stored in front of the data, as decimal lines.
                let (map, skip) = self.sparse_map_v1(m.data_offset, m.stored_size)?;
                sparse_map = map;
                m.data_offset = m.data_offset.saturating_add(skip);
                m.stored_size = m.stored_size.saturating_sub(skip);
            }
            attrs.size = real_size;
            m.sparse = Some((sparse_map, real_size));
        }
        Ok(())
    }

    /// Reads the pax 1.0 sparse map at the start of a member's data; returns it and the
    /// bytes it occupies (rounded to a block).
    fn sparse_map_v1(&self, at: u64, stored_size: u64) -> Result<(Vec<(u64, u64)>, u64), OpenError> {
        let data = self.map.get(at as usize..).unwrap_or(&[]);
        let data = &data[..data.len().min(stored_size as usize)];
        let mut lines = data.split(|&b| b == b'\n');
        let mut used = 0u64;
        let mut next = |what: &str| -> Result<u64, OpenError> {
            let line = lines.next().ok_or_else(|| self.truncated(at, format!("sparse map ends before its {what}")))?;
            used += line.len() as u64 + 1;
            std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.corrupt(at, format!("sparse map {what} is not a number")))
        };
        let count = next("count")?;
        // Each entry takes at least 4 bytes of text, which bounds the count by the data
        // actually present (the size field may claim more than the archive holds).
        if count > data.len() as u64 / 4 {
            return Err(self.corrupt(at, format!("sparse map claims {count} extents in {} bytes", data.len())));
        }
        let mut map = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let offset = next("offset")?;
            let len = next("length")?;
            map.push((offset, len));
        }
        Ok((map, round_up(used) as u64))
    }

    /// Decodes an old GNU sparse member ('S'): up to 4 extents in the header, more in
    /// extension blocks, after which its data starts.
    fn gnu_sparse(&mut self, header: &[u8], m: &mut Member) -> Result<(), OpenError> {
        let at = m.header_offset;
        let mut map = Vec::new();
        let mut push = |s: &Self, entry: &[u8]| -> Result<(), OpenError> {
            if entry.iter().all(|&b| b == 0) {
                return Ok(());
            }
            let off = s.number(&entry[0..12], at, "sparse offset")?;
            let len = s.number(&entry[12..24], at, "sparse length")?;
            map.push((off, len));
            Ok(())
        };
        for i in 0..4 {
            push(self, &header[386 + i * 24..386 + (i + 1) * 24])?;
        }
        let real_size = self.number(&header[483..495], at, "sparse real size")?;
        let mut extended = header[482] != 0;
        let mut pos = at as usize + BLOCK;
        while extended {
            let block =
                self.map.get(pos..pos + BLOCK).ok_or_else(|| self.truncated(pos as u64, "sparse extension header"))?;
            for i in 0..21 {
                push(self, &block[i * 24..(i + 1) * 24])?;
            }
            extended = block[504] != 0;
            pos += BLOCK;
        }
        m.data_offset = pos as u64;
        if let Some(attrs) = m.attrs.as_mut() {
            attrs.size = real_size;
        }
        m.sparse = Some((map, real_size));
        Ok(())
    }

    /// Adds a member to the index under its normalised path.
    fn add(&mut self, mut m: Member) -> Result<(), OpenError> {
        let Some(components) = normalise(&m.path) else {
            tracing::warn!(path = %escape(&m.path), "skipping member whose name contains '..' (as GNU tar does)");
            return Ok(());
        };
        let mut attrs = m.attrs.take().expect("member() always sets attrs");
        let (parent, name) = match components.split_last() {
            Some((name, dirs)) => (self.parents(dirs)?, Some(*name)),
            None => (ROOT, None),
        };
        if m.typeflag == b'1' {
            return self.hardlink(parent, name, &m);
        }
        if attrs.file_type() == libc::S_IFLNK && m.link.len() > MAX_LINK_TARGET {
            tracing::warn!(
                path = %escape(&m.path),
                "skipping symlink whose target is {} bytes, longer than Linux allows ({MAX_LINK_TARGET})",
                m.link.len()
            );
            return Ok(());
        }
        let data = match attrs.file_type() {
            libc::S_IFREG => match m.sparse.take() {
                Some((map, real_size)) => self.sparse(&m, map, real_size)?,
                None if attrs.size == 0 => Data::None,
                None => Data::Slice { offset: m.data_offset },
            },
            libc::S_IFLNK => Data::Symlink(self.builder.intern(&m.link).map_err(|e| self.index_err(e))?),
            libc::S_IFCHR | libc::S_IFBLK => Data::Device(m.rdev),
            _ => Data::None,
        };
        if !attrs.is_dir() && attrs.file_type() != libc::S_IFREG {
            attrs.size = if let Data::Symlink(span) = data { span.len as u64 } else { 0 };
        }
        if attrs.is_dir() {
            attrs.size = 0;
        }
        let Some(name) = name else {
            // The archive's "./" entry: the root's own attributes.
            if attrs.is_dir() {
                self.builder.set_inode(ROOT, attrs, Data::None);
            }
            return Ok(());
        };
        let id = match self.builder.child(parent, name) {
            // A later directory entry updates the directory and keeps its children.
            Some(existing) if attrs.is_dir() && self.builder.attrs(existing).is_dir() => {
                self.builder.set_inode(existing, attrs, data);
                existing
            }
            _ => {
                let id = self.builder.add_inode(attrs, data).map_err(|e| self.index_err(e))?;
                self.builder.link(parent, name, id).map_err(|e| self.index_err(e))?;
                id
            }
        };
        self.member_xattrs(id, &m.xattrs)
    }

    /// Gives an indexed member its own xattrs and the global ones it does not override.
    /// Members with none of their own share one stored copy of the global set.
    fn member_xattrs(&mut self, id: InodeId, own: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), OpenError> {
        let path = self.path;
        let index_err = |source| OpenError::Index { path: path.to_owned(), source };
        let globals = &self.globals.xattrs;
        if own.is_empty() {
            if globals.is_empty() {
                return Ok(());
            }
            let run = match self.globals.xattrs_run {
                Some(run) => run,
                None => {
                    let pairs: Vec<(&[u8], &[u8])> =
                        globals.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
                    self.builder.add_xattrs(&pairs).map_err(index_err)?
                }
            };
            self.globals.xattrs_run = Some(run);
            self.builder.set_xattr_run(id, run);
            return Ok(());
        }
        let inherited = globals.iter().filter(|(name, _)| !own.contains_key(*name));
        let pairs: Vec<(&[u8], &[u8])> =
            own.iter().chain(inherited).map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
        self.builder.set_xattrs(id, &pairs).map_err(index_err)
    }

    /// Resolves (creating implicit directories) the directory chain `dirs` under the root.
    fn parents(&mut self, dirs: &[&[u8]]) -> Result<InodeId, OpenError> {
        let mut dir = ROOT;
        for name in dirs {
            dir = match self.builder.child(dir, name) {
                Some(id) if self.builder.attrs(id).is_dir() => id,
                _ => {
                    let id =
                        self.builder.add_inode(Attrs::implicit_dir(), Data::None).map_err(|e| self.index_err(e))?;
                    self.builder.link(dir, name, id).map_err(|e| self.index_err(e))?;
                    id
                }
            };
        }
        Ok(dir)
    }

    /// A hardlink names the inode its target has at this point of the archive.
    fn hardlink(&mut self, parent: InodeId, name: Option<&[u8]>, m: &Member) -> Result<(), OpenError> {
        let target = normalise(&m.link).and_then(|parts| {
            let (last, dirs) = parts.split_last()?;
            let mut dir = ROOT;
            for d in dirs {
                dir = self.builder.child(dir, d)?;
            }
            self.builder.child(dir, last)
        });
        match (target, name) {
            // A directory with two names would sit inside itself (`d/loop` -> `d`): the
            // kernel finds a loop (ELOOP, and a warning in its log). GNU tar refuses to
            // extract such links; they are skipped the same way.
            (Some(target), Some(_)) if self.builder.attrs(target).is_dir() => {
                tracing::warn!(
                    offset = m.header_offset,
                    "hardlink '{}' -> '{}': the target is a directory, which cannot have hardlinks; skipped",
                    escape(&m.path),
                    escape(&m.link)
                );
                Ok(())
            }
            (Some(target), Some(name)) => self.builder.link(parent, name, target).map_err(|e| self.index_err(e)),
            _ => {
                tracing::warn!(
                    offset = m.header_offset,
                    "hardlink '{}' -> '{}': target not found earlier in the archive; skipped",
                    escape(&m.path),
                    escape(&m.link)
                );
                Ok(())
            }
        }
    }

    /// Validates a sparse map against the stored data and records it. The declared real
    /// size may not exceed the largest file Linux allows, and the extents must lie inside
    /// it, in order, without overlapping, and within the data stored: a map that breaks
    /// any of these is damage (or a crafted archive), reported with the member's name.
    fn sparse(&mut self, m: &Member, map: Vec<(u64, u64)>, real_size: u64) -> Result<Data, OpenError> {
        let at = m.header_offset;
        let name = escape(&m.path);
        let bad = |what: String| self.corrupt(at, format!("sparse member '{name}': {what}"));
        if real_size > MAX_FILE_SIZE {
            return Err(bad(format!("declares {real_size} bytes, more than the largest file ({MAX_FILE_SIZE})")));
        }
        let mut stored = 0u64;
        let mut last_end = 0u64;
        let mut extents = Vec::new();
        for (file_offset, len) in map.into_iter().filter(|&(_, len)| len > 0) {
            let Some(end) = file_offset.checked_add(len) else {
                return Err(bad(format!("sparse extent {file_offset}+{len} wraps past 2^64")));
            };
            if file_offset < last_end {
                return Err(bad(format!(
                    "sparse extent {file_offset}+{len} overlaps the one before (ending at {last_end})"
                )));
            }
            if end > real_size {
                return Err(bad(format!("sparse extent {file_offset}+{len} exceeds the file size {real_size}")));
            }
            // Inside the member's data, which lies inside the archive: cannot overflow.
            let archive_offset = m.data_offset + stored;
            stored = stored
                .checked_add(len)
                .filter(|&s| s <= m.stored_size)
                .ok_or_else(|| bad(format!("sparse map needs more data than the {} bytes stored", m.stored_size)))?;
            extents.push(Extent { file_offset, len, archive_offset });
            last_end = end;
        }
        let too_many = || self.index_err(crate::index::BuildError::TooManyEntries);
        let (first, count) = (u32::try_from(self.extents.len()).ok(), u32::try_from(extents.len()).ok());
        let (first, count) = first.zip(count).filter(|(f, c)| f.checked_add(*c).is_some()).ok_or_else(too_many)?;
        let handle = u32::try_from(self.sparse_files.len()).map_err(|_| too_many())?;
        self.extents.extend(extents);
        self.sparse_files.push(SparseFile { first, count });
        Ok(Data::Extern(handle))
    }
}

/// Encodes one ustar header (names and link targets up to 100 bytes, owner 0:0, a fixed
/// mtime): `stagefs demo` writes its archive with it, and tests craft archives with it.
pub fn ustar_header(name: &str, typeflag: u8, mode: u32, size: u64, link: &str) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let (name, link) = (name.as_bytes(), link.as_bytes());
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[100..107].copy_from_slice(format!("{:07o}", mode & 0o7777).as_bytes());
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    if size < 1 << 33 {
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    } else {
        h[124] = 0x80; // GNU base-256 for sizes octal cannot hold.
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    h[136..147].copy_from_slice(b"14700000000");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// Encodes one pax record, `"LEN KEY=VALUE\n"` (LEN counts the whole record, itself
/// included): tests craft pax headers with it.
pub fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

/// The key under which `parse_pax` keeps the n-th repeated pax 0.0 sparse keyword.
fn sparse_key(what: &str, n: usize) -> Vec<u8> {
    format!("GNU.sparse.{what}#{n}").into_bytes()
}

/// Whether a member of this type is followed by `size` bytes of content.
fn stores_data(typeflag: u8) -> bool {
    !matches!(typeflag, b'1' | b'2' | b'3' | b'4' | b'5' | b'6')
}

fn round_up(n: u64) -> usize {
    (n.div_ceil(BLOCK as u64) as usize).saturating_mul(BLOCK)
}

/// Splits a member name into components the way GNU tar extracts it: leading `/` and
/// `./` removed, `.` components dropped. `None` if a component is `..`.
pub(crate) fn normalise(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts)
}

/// Checks the header checksum, accepting both the unsigned and the historic signed sum.
fn checksum_ok(header: &[u8]) -> Option<bool> {
    let stored = parse_number(&header[148..156])?;
    let mut unsigned = 0u64;
    let mut signed = 0i64;
    for (i, &b) in header.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += b as u64;
        signed += b as i8 as i64;
    }
    Some(stored == unsigned || stored as i64 == signed)
}

fn trim_nul(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

fn trim_field(field: &[u8]) -> &[u8] {
    let s = trim_nul(field);
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    let end = s.iter().rposition(|&b| b != b' ').map_or(start, |e| e + 1);
    &s[start..end]
}

/// Octal text (space or NUL padded), or base-256 (GNU) when the high bit is set.
fn parse_number(field: &[u8]) -> Option<u64> {
    match field.first() {
        Some(0x80) => field[1..].iter().try_fold(0u64, |n, &b| n.checked_mul(256).map(|n| n | b as u64)),
        Some(0xff) => None, // Negative: not valid for sizes and ids.
        _ => {
            let text = trim_field(field);
            if text.is_empty() {
                return Some(0);
            }
            text.iter().try_fold(0u64, |n, &b| match b {
                b'0'..=b'7' => n.checked_mul(8).map(|n| n + (b - b'0') as u64),
                _ => None,
            })
        }
    }
}

/// Like `parse_number`, but allows negative base-256 values (mtimes before 1970).
fn parse_signed(field: &[u8]) -> Option<i64> {
    if field.first() == Some(&0xff) {
        // Two's complement over the field: fits i64 when all but the last 8 bytes are 0xff.
        let (high, low) = field.split_at(field.len().saturating_sub(8));
        if !high.iter().all(|&b| b == 0xff) {
            return None;
        }
        let mut bytes = [0xff; 8];
        bytes[8 - low.len()..].copy_from_slice(low);
        return Some(i64::from_be_bytes(bytes));
    }
    parse_number(field).and_then(|n| i64::try_from(n).ok())
}

/// Parses a pax time `SECONDS[.FRACTION]`, possibly negative.
fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = int.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nsec = if digits.is_empty() { 0 } else { format!("{digits:0<9}").parse::<u32>().ok()? };
    if int.starts_with('-') && nsec > 0 {
        Some((secs - 1, 1_000_000_000 - nsec))
    } else {
        Some((secs, nsec))
    }
}

/// An xattr from a pax keyword (see `Scan::pax_xattr`).
struct PaxXattr {
    name: Vec<u8>,
    value: Vec<u8>,
    schily: bool,
}

/// Adds an xattr to a set. bsdtar writes each xattr twice, as `LIBARCHIVE.xattr` and
/// `SCHILY.xattr`: the SCHILY form (raw bytes) wins, whichever comes first.
fn insert_xattr(set: &mut BTreeMap<Vec<u8>, Vec<u8>>, xattr: PaxXattr) {
    if xattr.schily {
        set.insert(xattr.name, xattr.value);
    } else {
        set.entry(xattr.name).or_insert(xattr.value);
    }
}

/// Parses pax records `"LEN KEY=VALUE\n"` into `out`; an empty value deletes the
/// keyword (POSIX), except for xattrs, whose values may be empty.
fn parse_pax(data: &[u8], out: &mut HashMap<Vec<u8>, Vec<u8>>) -> Result<(), String> {
    for (key, value) in pax_records(data)? {
        let is_xattr = key.starts_with(b"SCHILY.xattr.") || key.starts_with(b"LIBARCHIVE.xattr.");
        if value.is_empty() && !is_xattr {
            out.remove(&key);
        } else {
            out.insert(key, value.to_vec());
        }
    }
    Ok(())
}

/// A pax record's key (see `pax_records`) and value.
type PaxRecord<'a> = (Vec<u8>, &'a [u8]);

/// Splits pax records `"LEN KEY=VALUE\n"` into (key, value), in order. Repeated pax 0.0
/// sparse keywords are numbered (see `sparse_key`) so their order survives in a map.
fn pax_records(mut data: &[u8]) -> Result<Vec<PaxRecord<'_>>, String> {
    let mut records = Vec::new();
    let (mut offsets, mut lengths) = (0, 0);
    while !data.is_empty() && data[0] != 0 {
        let space = data.iter().position(|&b| b == b' ').ok_or("pax record without a length")?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("pax record length is not a number")?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(format!("pax record length {len} does not fit the {} bytes left", data.len()));
        }
        let record = &data[space + 1..len - 1];
        let eq = record.iter().position(|&b| b == b'=').ok_or("pax record without '='")?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        let key = match key {
            b"GNU.sparse.offset" => {
                offsets += 1;
                sparse_key("offset", offsets - 1)
            }
            b"GNU.sparse.numbytes" => {
                lengths += 1;
                sparse_key("numbytes", lengths - 1)
            }
            k => k.to_vec(),
        };
        records.push((key, value));
        data = &data[len..];
    }
    Ok(records)
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (s[i], s.get(i + 1).and_then(|&b| hex(b)), s.get(i + 2).and_then(|&b| hex(b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s: Vec<u8> = s.iter().copied().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::python_tar;

    #[test]
    fn numbers_octal_and_base256() {
        assert_eq!(parse_number(b"0000644\0"), Some(0o644));
        assert_eq!(parse_number(b"  17 \0"), Some(0o17));
        assert_eq!(parse_number(b"\0\0\0\0"), Some(0));
        assert_eq!(parse_number(&[0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]), Some(1 << 32));
        assert_eq!(parse_number(b"0000x44\0"), None);
        assert_eq!(parse_signed(&[0xff; 12]), Some(-1));
    }

    #[test]
    fn names_normalise_like_gnu_tar() {
        assert_eq!(normalise(b"./a//b/./c/"), Some(vec![&b"a"[..], b"b", b"c"]));
        assert_eq!(normalise(b"/abs/x"), Some(vec![&b"abs"[..], b"x"]));
        assert_eq!(normalise(b"./"), Some(vec![]));
        assert_eq!(normalise(b"a/../b"), None);
    }

    #[test]
    fn pax_records_and_times() {
        let mut out = HashMap::new();
        parse_pax(b"18 path=some/name\n10 uid=77\n", &mut out).unwrap();
        assert_eq!(out[&b"path"[..].to_vec()], b"some/name");
        assert_eq!(out[&b"uid"[..].to_vec()], b"77");
        assert!(parse_pax(b"99 path=x\n", &mut HashMap::new()).is_err());
        assert!(parse_pax(b"garbage", &mut HashMap::new()).is_err());
        assert_eq!(parse_pax_time(b"1700000000.5"), Some((1700000000, 500_000_000)));
        assert_eq!(parse_pax_time(b"-1.25"), Some((-2, 750_000_000)));
        assert_eq!(parse_pax_time(b"12x"), None);
    }

    #[test]
    fn base64_and_percent() {
        assert_eq!(base64_decode(b"Ymx1ZQ==").unwrap(), b"blue");
        assert_eq!(base64_decode(b"aGk=").unwrap(), b"hi");
        assert_eq!(percent_decode(b"user.a%3Db"), b"user.a=b");
        assert!(base64_decode(b"!!!!").is_none());
    }

    /// A ustar archive of regular members written by Python's `tarfile`.
    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let script: String = members.iter().map(|(name, data)| format!("add({name:?}, bytes({data:?}))\n")).collect();
        python_tar(", format=tarfile.USTAR_FORMAT", &script)
    }

    fn open_bytes(bytes: &[u8]) -> Result<(Index, TarReader), OpenError> {
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).unwrap();
        map[..bytes.len()].copy_from_slice(bytes);
        open(Path::new("t.tar"), std::sync::Arc::new(crate::archive::Source::private(map.make_read_only().unwrap())))
    }

    #[test]
    fn indexes_members_and_implicit_dirs() {
        let bytes = archive(&[("a/b/file.txt", b"hello"), ("a/b/file.txt", b"second")]);
        let (index, reader) = open_bytes(&bytes).unwrap();
        let root = &index.inodes[0];
        let a = index.lookup(root, b"a").unwrap();
        let b = index.lookup(&index.inodes[a as usize], b"b").unwrap();
        let f = index.lookup(&index.inodes[b as usize], b"file.txt").unwrap();
        let inode = index.inodes[f as usize];
        assert_eq!(inode.attrs.size, 6);
        assert_eq!(&*reader.read(inode.data, 6, 0, 6).unwrap(), b"second");
        assert_eq!(&*reader.read(inode.data, 6, 2, 3).unwrap(), b"con");
    }

    #[test]
    fn bad_checksum_names_the_offset() {
        let mut bytes = archive(&[("ok", b"x"), ("bad", b"y")]);
        bytes[1024 + 10] ^= 0xff; // Damage the second header (at byte 1024).
        match open_bytes(&bytes) {
            Err(OpenError::Corrupt { offset, what, .. }) => {
                assert_eq!(offset, 1024);
                assert!(what.contains("checksum"), "{what}");
            }
            other => panic!("expected a checksum error, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn truncated_member_is_reported() {
        let bytes = archive(&[("big", &[7u8; 4000])]);
        match open_bytes(&bytes[..2048]) {
            Err(OpenError::Truncated { offset, .. }) => assert_eq!(offset, 0),
            other => panic!("expected truncation, got {:?}", other.map(|_| ())),
        }
    }

    /// A global pax header ('g') holding `records`.
    fn global_header(records: &[u8]) -> Vec<u8> {
        let mut out = ustar_header("pax_global_header", b'g', 0o644, records.len() as u64, "").to_vec();
        out.extend_from_slice(records);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        out
    }

    #[test]
    fn global_keywords_cost_each_member_the_same_however_many() {
        // One global header of 2000 keywords (a 4.3 MB archive of 8000 took 19 s: every
        // member re-applied every global keyword), then 2000 members.
        let n = 2000;
        let tar = python_tar(
            &format!(", format=tarfile.PAX_FORMAT, pax_headers={{**{{f'comment.{{i}}': 'x' for i in range({n})}}, 'uid': '4242'}}"),
            &format!("for i in range({n}): add(f'f{{i:05}}')"),
        );
        let mut scan = Scan::new(Path::new("t.tar"), &tar);
        scan.run().unwrap();
        let applied = scan.pax_keywords;
        assert!(applied <= 4 * n as u64, "{applied} pax keywords applied to {n} members");
        let index = scan.builder.finish().unwrap();
        assert_eq!(index.children(&index.inodes[0]).len(), n);
        assert!(index.inodes[1..].iter().all(|inode| inode.attrs.uid == 4242), "the global uid applies to all");
    }

    /// A pax extended header ('x') holding `records`.
    fn pax_header(records: &[u8]) -> Vec<u8> {
        let mut out = ustar_header("PaxHeaders/m", b'x', 0o644, records.len() as u64, "").to_vec();
        out.extend_from_slice(records);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        out
    }

    fn xattrs_of(index: &Index, name: &str) -> Vec<(String, String)> {
        let id = index.lookup(&index.inodes[0], name.as_bytes()).unwrap();
        let inode = &index.inodes[id as usize];
        let text = |span| String::from_utf8_lossy(index.bytes(span)).into_owned();
        index.xattrs_of(inode).iter().map(|x| (text(x.name), text(x.value))).collect()
    }

    /// Built header by header: Python's tarfile and GNU tar write one global header, at
    /// the start; this needs a second one further on that unsets a keyword.
    #[test]
    fn global_keywords_apply_until_unset_and_members_override_them() {
        let mut tar = global_header(&[pax_record("uid", "7"), pax_record("SCHILY.xattr.user.g", "global")].concat());
        tar.extend(ustar_header("a", b'0', 0o644, 0, ""));
        tar.extend(pax_header(&[pax_record("SCHILY.xattr.user.own", "1"), pax_record("uid", "8")].concat()));
        tar.extend(ustar_header("b", b'0', 0o644, 0, ""));
        tar.extend(pax_header(&pax_record("LIBARCHIVE.xattr.user.g", "bWluZQ==")));
        tar.extend(ustar_header("c", b'0', 0o644, 0, ""));
        tar.extend(ustar_header("d", b'0', 0o644, 0, ""));
        tar.extend(global_header(&[pax_record("uid", ""), pax_record("GNU.sparse.size", "99")].concat()));
        tar.extend(ustar_header("e", b'0', 0o644, 0, ""));
        tar.resize(tar.len() + 2 * BLOCK, 0);
        let (index, _) = open_bytes(&tar).unwrap();
        let uid =
            |name: &str| index.inodes[index.lookup(&index.inodes[0], name.as_bytes()).unwrap() as usize].attrs.uid;
        assert_eq!([uid("a"), uid("b"), uid("c"), uid("d"), uid("e")], [7, 8, 7, 7, 0]);
        let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
        assert_eq!(xattrs_of(&index, "a"), [pair("user.g", "global")]);
        assert_eq!(xattrs_of(&index, "b"), [pair("user.own", "1"), pair("user.g", "global")]);
        assert_eq!(xattrs_of(&index, "c"), [pair("user.g", "mine")], "the member's own value wins");
        assert_eq!(xattrs_of(&index, "e"), [pair("user.g", "global")], "a global sparse size is ignored");
        let id = |name: &str| index.lookup(&index.inodes[0], name.as_bytes()).unwrap() as usize;
        assert_eq!(index.inodes[id("e")].attrs.size, 0);
        let first = |name: &str| index.inodes[id(name)].xattr_first;
        assert_eq!(first("a"), first("d"), "members without xattrs of their own share the global set");
        assert_eq!(first("a"), first("e"));
    }

    #[test]
    fn an_xattr_in_both_pax_forms_is_listed_once() {
        // bsdtar writes every xattr as LIBARCHIVE.xattr (base64) and SCHILY.xattr (raw).
        let tar = python_tar(
            ", format=tarfile.PAX_FORMAT",
            "add('f', pax_headers={'LIBARCHIVE.xattr.user.color': 'Ymx1ZQ==', 'SCHILY.xattr.user.color': 'blue'})",
        );
        let (index, _) = open_bytes(&tar).unwrap();
        assert_eq!(xattrs_of(&index, "f"), [("user.color".to_string(), "blue".to_string())]);
    }

    #[test]
    fn too_many_global_xattrs_are_refused() {
        let tar = python_tar(
            &format!(
                ", format=tarfile.PAX_FORMAT, pax_headers={{f'SCHILY.xattr.user.x{{i}}': 'v' for i in range({})}}",
                MAX_GLOBAL_XATTRS + 1
            ),
            "add('f')",
        );
        match open_bytes(&tar) {
            Err(OpenError::Corrupt { offset: 0, what, .. }) => assert!(what.contains("257 xattrs"), "{what}"),
            other => panic!("expected a Corrupt error, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn sparse_reads_fill_holes_with_zeros() {
        let backing = {
            let mut m = memmap2::MmapMut::map_anon(16).unwrap();
            m[..8].copy_from_slice(b"AAAABBBB");
            std::sync::Arc::new(crate::archive::Source::private(m.make_read_only().unwrap()))
        };
        let reader = TarReader {
            backing,
            sparse_files: vec![SparseFile { first: 0, count: 2 }],
            extents: vec![
                Extent { file_offset: 2, len: 4, archive_offset: 0 },
                Extent { file_offset: 10, len: 4, archive_offset: 4 },
            ],
        };
        let got = reader.read(Data::Extern(0), 16, 0, 16).unwrap();
        assert_eq!(&*got, b"\0\0AAAA\0\0\0\0BBBB\0\0");
        assert_eq!(&*reader.read(Data::Extern(0), 16, 4, 8).unwrap(), b"AA\0\0\0\0BB");
    }
}
