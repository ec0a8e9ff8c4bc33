//! The pass over a tar's headers: each member's header and extension headers folded into one record, then added to the index.

use std::collections::BTreeMap;
use std::path::Path;

use super::header::{
    checksum_ok, normalise, parse_number, parse_signed, round_up, stores_data, trim_field, trim_nul, BLOCK,
};
use super::member::{Found, Globals, Member, Pending, Scan};
use super::pax::parse_pax;
use super::window::{Window, LOOKAHEAD};
use crate::error::OpenError;
use crate::index::{Attrs, Data, IndexBuilder, InodeId, MAX_LINK_TARGET, ROOT};
use stagefs_text::escape;

/// Members scanned before the builder is sized for the rest (see `Scan::reserve_for`).
const SAMPLE: u64 = 4096;

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
            last_parent: Default::default(),
            members: 0,
            progress: None,
            saw_globals: false,
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
        self.run_until(&mut 0, u64::MAX)?;
        self.check_stream_end()
    }

    /// Adds the members of the groups (a member and the extension headers before it) that
    /// start before `stop_at`, from `pos` on; leaves `pos` at the next group. `true` once
    /// the archive ended.
    pub(super) fn run_until(&mut self, pos: &mut usize, stop_at: u64) -> Result<bool, OpenError> {
        let mut pending = Pending::default();
        while (*pos as u64) < stop_at {
            match self.next_member(pos, &mut pending)? {
                Found::End => return Ok(true),
                Found::Member { member, end, .. } => self.apply(member, end)?,
            }
        }
        Ok(false)
    }

    /// Adds a member whose data ends at `end` (see [`Scan::next_member`]).
    pub(super) fn apply(&mut self, member: Member, end: u64) -> Result<(), OpenError> {
        self.last_data = (end, member.header_offset);
        self.add(member)?;
        self.members += 1;
        if self.members == SAMPLE {
            self.reserve_for(end);
        }
        if self.members == 1 {
            // Tests hold this point to signal a scan under way.
            crate::stop::phase("scanning headers");
        }
        Ok(())
    }

    /// A stream's length is known only at its end: the last member's data must fit it.
    pub(super) fn check_stream_end(&self) -> Result<(), OpenError> {
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

    /// Reads the headers from `pos` to the next member (extension headers folded into it)
    /// and leaves `pos` after its data; or finds the end of the archive.
    pub(super) fn next_member(&mut self, pos: &mut usize, pending: &mut Pending) -> Result<Found, OpenError> {
        loop {
            if crate::stop::check().is_err() {
                return Err(self.corrupt(*pos as u64, crate::stop::Stopped.to_string()));
            }
            let at = *pos as u64;
            if let Some(progress) = self.progress.filter(|_| self.window.limit() != u64::MAX) {
                progress.store(at, std::sync::atomic::Ordering::Relaxed);
            }
            self.window.prepare(at).map_err(|e| self.corrupt(at, format!("cannot decompress: {e}")))?;
            if at >= self.window.limit() {
                return Ok(Found::End); // Missing end-of-archive blocks: GNU tar accepts this too.
            }
            // Borrowed, not copied: the window moves only at `prepare`, above.
            let Some(header) = self.window.get(at, at + BLOCK as u64) else {
                return Err(self.truncated(at, "a partial header block (expected 512 bytes)"));
            };
            if header.iter().all(|&b| b == 0) {
                return Ok(Found::End); // End of archive (one or two zero blocks).
            }
            if checksum_ok(header) != Some(true) {
                return Err(self.corrupt(
                    at,
                    format!(
                        "bad tar header checksum (stored {:?}); the archive is damaged or not a tar file",
                        String::from_utf8_lossy(trim_field(&header[148..156]))
                    ),
                ));
            }
            let group = *pending.group.get_or_insert(at);
            let typeflag = header[156];
            let size = self.number(&header[124..136], at, "size")?;
            let data_start = *pos + BLOCK;
            let content_at = data_start as u64;
            match typeflag {
                b'L' => pending.long_name = Some(trim_nul(self.extension_content(at, content_at, size)?).to_vec()),
                b'K' => pending.long_link = Some(trim_nul(self.extension_content(at, content_at, size)?).to_vec()),
                b'x' | b'X' => parse_pax(self.extension_content(at, content_at, size)?, &mut pending.pax)
                    .map_err(|e| self.corrupt(at, e))?,
                b'g' => {
                    let globals = self.extension_content(at, content_at, size)?.to_vec();
                    self.saw_globals = true;
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
                    let mut member = self.member(header, at, typeflag, size, content_at)?;
                    if let Some(name) = pending.long_name.take() {
                        member.path = name;
                    }
                    if let Some(link) = pending.long_link.take() {
                        member.link = link;
                    }
                    if typeflag == b'S' {
                        let header: [u8; BLOCK] = header.try_into().expect("one block");
                        self.gnu_sparse(&header, &mut member)?;
                    }
                    self.apply_globals(&mut member);
                    self.apply_pax(&mut member, &pending.pax)?;
                    pending.pax.clear();
                    pending.group = None;
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
                    *pos = round_up(end);
                    return Ok(Found::Member { group, member, end });
                }
            }
            // Extension headers: the next header follows their padded content.
            *pos = data_start.saturating_add(round_up(size));
        }
    }

    /// Makes room for the members still to come, guessed from how many the first `SAMPLE`
    /// took (up to byte `done`): growing the builder's tables step by step moved each entry
    /// several times (a fifth of a scan of tiny members). A guess past what the archive
    /// can hold (a member per 512 bytes) is cut to that.
    fn reserve_for(&mut self, done: u64) {
        let limit = self.window.limit();
        if limit == u64::MAX || done == 0 {
            return;
        }
        let guess = (SAMPLE as u128 * u128::from(limit) / u128::from(done)).min(u128::from(limit / 512));
        self.builder.reserve(usize::try_from(guess).unwrap_or(0).saturating_sub(SAMPLE as usize));
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
        // A later directory entry updates the directory and keeps its children; any other
        // later member takes the name over (one lookup: the common case, a file).
        let existing = if attrs.is_dir() { self.builder.child(parent, name) } else { None };
        let id = match existing {
            Some(existing) if self.builder.attrs(existing).is_dir() => {
                self.builder.set_inode(existing, attrs, data);
                existing
            }
            _ => {
                let id = self.builder.add_inode(attrs, data).map_err(|e| self.index_err(e))?;
                self.link(parent, name, id)?;
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

    /// Names `id` as `name` in `parent`; a name taken over (perhaps a directory of the
    /// remembered chain) makes [`Scan::parents`] look the next chain up again.
    fn link(&mut self, parent: InodeId, name: &[u8], id: InodeId) -> Result<(), OpenError> {
        let replaced = self.builder.relink(parent, name, id).map_err(|e| self.index_err(e))?;
        if replaced.is_some() {
            self.last_parent = Default::default();
        }
        Ok(())
    }

    /// Resolves (creating implicit directories) the directory chain `dirs` under the root.
    /// The last chain resolved is remembered: members of one directory come together in
    /// most archives, and then cost no lookup at all (any name taken over forgets it).
    pub(super) fn parents(&mut self, dirs: &[&[u8]]) -> Result<InodeId, OpenError> {
        let (chain, id) = &self.last_parent;
        if chain.len() == dirs.len() && chain.iter().zip(dirs).all(|(a, b)| **a == **b) {
            return Ok(*id);
        }
        let dir = self.resolve_parents(dirs)?;
        self.last_parent = (dirs.iter().map(|d| Box::from(*d)).collect(), dir);
        Ok(dir)
    }

    fn resolve_parents(&mut self, dirs: &[&[u8]]) -> Result<InodeId, OpenError> {
        let mut dir = ROOT;
        for name in dirs {
            dir = match self.builder.child(dir, name) {
                Some(id) if self.builder.attrs(id).is_dir() => id,
                _ => {
                    let id =
                        self.builder.add_inode(Attrs::implicit_dir(), Data::None).map_err(|e| self.index_err(e))?;
                    self.link(dir, name, id)?;
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
            (Some(target), Some(name)) => self.link(parent, name, target),
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
