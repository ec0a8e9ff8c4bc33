//! pax extended headers: records, times, xattrs (SCHILY and LIBARCHIVE forms), global keywords and how they apply to members.

use std::collections::{BTreeMap, HashMap};

use super::header::stores_data;
use super::member::{Member, Scan, MAX_GLOBAL_XATTRS};
use crate::error::OpenError;

impl Scan<'_> {
    /// A pax keyword's decimal value.
    pub(super) fn pax_number(&self, at: u64, key: &str, v: &[u8]) -> Result<u64, OpenError> {
        std::str::from_utf8(v).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
            self.corrupt(at, format!("pax keyword {key} is not a number: {:?}", String::from_utf8_lossy(v)))
        })
    }

    /// Parses a global header's records into [`Globals`]; an empty value unsets a
    /// keyword (POSIX), except for xattrs, whose values may be empty.
    pub(super) fn fold_globals(&mut self, data: &[u8], at: u64) -> Result<(), OpenError> {
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
    pub(super) fn apply_globals(&mut self, m: &mut Member) {
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
    pub(super) fn pax_xattr(&self, at: u64, key: &[u8], value: &[u8]) -> Result<Option<PaxXattr>, OpenError> {
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
    pub(super) fn apply_pax(&mut self, m: &mut Member, pax: &HashMap<Vec<u8>, Vec<u8>>) -> Result<(), OpenError> {
        if pax.is_empty() {
            return Ok(()); // Most members: nothing to apply (and no key to format).
        }
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
}

/// Parses a pax time `SECONDS[.FRACTION]`, possibly negative.
pub(super) fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
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
pub(super) struct PaxXattr {
    name: Vec<u8>,
    value: Vec<u8>,
    schily: bool,
}

/// Adds an xattr to a set. bsdtar writes each xattr twice, as `LIBARCHIVE.xattr` and
/// `SCHILY.xattr`: the SCHILY form (raw bytes) wins, whichever comes first.
pub(super) fn insert_xattr(set: &mut BTreeMap<Vec<u8>, Vec<u8>>, xattr: PaxXattr) {
    if xattr.schily {
        set.insert(xattr.name, xattr.value);
    } else {
        set.entry(xattr.name).or_insert(xattr.value);
    }
}

/// Parses pax records `"LEN KEY=VALUE\n"` into `out`; an empty value deletes the
/// keyword (POSIX), except for xattrs, whose values may be empty.
pub(super) fn parse_pax(data: &[u8], out: &mut HashMap<Vec<u8>, Vec<u8>>) -> Result<(), String> {
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
pub(super) type PaxRecord<'a> = (Vec<u8>, &'a [u8]);

/// Splits pax records `"LEN KEY=VALUE\n"` into (key, value), in order. Repeated pax 0.0
/// sparse keywords are numbered (see `sparse_key`) so their order survives in a map.
pub(super) fn pax_records(mut data: &[u8]) -> Result<Vec<PaxRecord<'_>>, String> {
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

/// `%XX` decoded (a `LIBARCHIVE.xattr.` name).
pub(super) fn percent_decode(s: &[u8]) -> Vec<u8> {
    percent_encoding::percent_decode(s).collect()
}

pub(super) fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
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

/// The key under which `parse_pax` keeps the n-th repeated pax 0.0 sparse keyword.
pub(super) fn sparse_key(what: &str, n: usize) -> Vec<u8> {
    format!("GNU.sparse.{what}#{n}").into_bytes()
}
