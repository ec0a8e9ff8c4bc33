//! The pass over a tar's headers: each member's header and extension headers folded into one record, then added to the index.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::header::{
    checksum_ok, normalise, parse_number, parse_signed, round_up, stores_data, trim_field, trim_nul, BLOCK,
};
use super::member::{Globals, Member, Scan};
use super::pax::parse_pax;
use super::window::{Window, LOOKAHEAD};
use crate::escape::escape;
use crate::index::{Attrs, Data, IndexBuilder, InodeId, MAX_LINK_TARGET, ROOT};
use crate::OpenError;

impl<'a> Scan<'a> {
    pub(super) fn new(path: &'a Path, map: &'a [u8]) -> Scan<'a> {
        Scan::over(path, Window::whole(map))
    }

    /// A scan of a decoded stream (see [`Window::stream`]).
    pub(super) fn streaming(path: &'a Path, decoded: &'a mut dyn std::io::Read) -> Scan<'a> {
        Scan::over(path, Window::stream(decoded))
    }

    fn over(path: &'a Path, window: Window<'a>) -> Scan<'a> {
        Scan {
            path,
            window,
            last_data: (0, 0),
            builder: IndexBuilder::new(),
            globals: Globals::default(),
            sparse_files: Vec::new(),
            extents: Vec::new(),
            pax_keywords: 0,
        }
    }
}

impl Scan<'_> {
    pub(super) fn corrupt(&self, offset: u64, what: impl Into<String>) -> OpenError {
        OpenError::Corrupt { path: self.path.to_owned(), offset, what: what.into() }
    }

    pub(super) fn truncated(&self, offset: u64, what: impl Into<String>) -> OpenError {
        OpenError::Truncated { path: self.path.to_owned(), offset, what: what.into() }
    }

    pub(super) fn index_err(&self, source: crate::index::BuildError) -> OpenError {
        OpenError::Index { path: self.path.to_owned(), source }
    }

    /// Walks every header until the end-of-archive marker or the end of the file.
    pub(super) fn run(&mut self) -> Result<(), OpenError> {
        let mut pos = 0usize;
        // Extension headers (GNU L/K, pax x) apply to the next real member.
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut marked = false;
        loop {
            if crate::stop::check().is_err() {
                return Err(self.corrupt(pos as u64, crate::stop::Stopped.to_string()));
            }
            if self.window.limit() != u64::MAX {
                crate::SCAN_PROGRESS.store(pos as u64, std::sync::atomic::Ordering::Relaxed);
            }
            self.window.prepare(pos as u64).map_err(|e| self.corrupt(pos as u64, format!("cannot decompress: {e}")))?;
            if pos as u64 >= self.window.limit() {
                break; // Missing end-of-archive blocks: GNU tar accepts this too.
            }
            // A copy: the window moves under a stream scan.
            let Some(header) = self.window.get(pos as u64, (pos + BLOCK) as u64) else {
                return Err(self.truncated(pos as u64, "a partial header block (expected 512 bytes)"));
            };
            let header: [u8; BLOCK] = header.try_into().expect("one block");
            let header = &header;
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
            let content_at = data_start as u64;
            match typeflag {
                b'L' => long_name = Some(trim_nul(self.extension_content(at, content_at, size)?).to_vec()),
                b'K' => long_link = Some(trim_nul(self.extension_content(at, content_at, size)?).to_vec()),
                b'x' | b'X' => parse_pax(self.extension_content(at, content_at, size)?, &mut pax)
                    .map_err(|e| self.corrupt(at, e))?,
                b'g' => {
                    let globals = self.extension_content(at, content_at, size)?.to_vec();
                    self.fold_globals(&globals, at)?
                }
                b'V' => {
                    // Volume label: not a file, but its size must fit.
                    self.extension_content(at, content_at, size)?;
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
                    let end = member.data_offset.checked_add(member.stored_size).filter(|&e| e <= self.window.limit());
                    let Some(end) = end else {
                        return Err(self.truncated(
                            at,
                            format!(
                                "member '{}' needs {} bytes of data from byte {} but the archive ends at byte {}",
                                escape(&member.path),
                                member.stored_size,
                                member.data_offset,
                                self.window.limit()
                            ),
                        ));
                    };
                    self.last_data = (end, at);
                    self.add(member)?;
                    if !std::mem::replace(&mut marked, true) {
                        // Tests hold this point to signal a scan under way.
                        crate::stop::phase("scanning headers");
                    }
                    pos = round_up(end);
                    continue;
                }
            }
            // Extension headers: the next header follows their padded content.
            pos = data_start.saturating_add(round_up(size));
        }
        // A stream's length is known only now.
        let (data_end, at) = self.last_data;
        if data_end > self.window.limit() {
            return Err(self.truncated(
                at,
                format!(
                    "the member at byte {at} needs data up to byte {data_end} but the archive ends at byte {}",
                    self.window.limit()
                ),
            ));
        }
        Ok(())
    }

    /// The content of the extension header at `at` (`size` bytes from `data_start`).
    fn extension_content(&self, at: u64, data_start: u64, size: u64) -> Result<&[u8], OpenError> {
        let end = data_start.saturating_add(size);
        if end > self.window.limit() {
            return Err(self.truncated(
                at,
                format!("extension header claims {size} bytes but the archive ends at byte {}", self.window.limit()),
            ));
        }
        self.window.get(data_start, end).ok_or_else(|| {
            self.corrupt(
                at,
                format!(
                    "an extension header of {size} bytes: a compressed tar indexed as a stream may have them up \
                     to {} MiB; mount it with --stage copy to decompress it whole",
                    LOOKAHEAD >> 20
                ),
            )
        })
    }

    /// Parses a numeric header field: octal text, or GNU base-256 when the high bit is set.
    pub(super) fn number(&self, field: &[u8], at: u64, name: &str) -> Result<u64, OpenError> {
        parse_number(field).ok_or_else(|| {
            self.corrupt(at, format!("header field {name} is not a number: {:?}", String::from_utf8_lossy(field)))
        })
    }

    /// Reads the fixed header fields of a member.
    pub(super) fn member(
        &self,
        h: &[u8],
        at: u64,
        typeflag: u8,
        size: u64,
        data_offset: u64,
    ) -> Result<Member, OpenError> {
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

    /// Adds a member to the index under its normalised path.
    pub(super) fn add(&mut self, mut m: Member) -> Result<(), OpenError> {
        let Some(components) = normalise(&m.path) else {
            tracing::warn!(
                path = %escape(&m.path),
                "skipping member whose name contains '..' (as GNU tar does) or a NUL byte (no file can have it)"
            );
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
    pub(super) fn member_xattrs(&mut self, id: InodeId, own: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), OpenError> {
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
    pub(super) fn parents(&mut self, dirs: &[&[u8]]) -> Result<InodeId, OpenError> {
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
    pub(super) fn hardlink(&mut self, parent: InodeId, name: Option<&[u8]>, m: &Member) -> Result<(), OpenError> {
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
}
