//! Zip archives: the central directory is the index; member data is read only on request.
//!
//! Mounting reads the end record and the central directory, nothing else (symlink targets
//! aside, which are member data). No index is saved: the directory already is one.
//! Names, modes and times follow what Info-ZIP `unzip` extracts; see doc/design.md.

mod cp437;
mod cursors;
mod directory;
mod member;
mod stream;

use std::path::Path;

pub use directory::{find_end, TAIL_SEARCH};
pub use member::ZipReader;

use super::fault::Fault;
use super::{Backing, OpenError};
use crate::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, MAX_LINK_TARGET, ROOT};
use directory::{show, Entry};
use member::Member;

/// Upper byte of "version made by" for archives written on Unix: the external
/// attributes' upper 16 bits are then an `st_mode`.
const MADE_ON_UNIX: u16 = 3;
/// MS-DOS attribute bits in the external attributes' low byte.
const DOS_READONLY: u32 = 0x01;
const DOS_DIRECTORY: u32 = 0x10;

/// True if `bytes` look like a zip: a local header first, or an end record at the end
/// (an empty zip, or one behind a self-extracting stub).
pub fn looks_like_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") || find_end(bytes).is_some()
}

/// Indexes the zip in `backing` from its central directory.
pub fn open(path: &Path, backing: Backing) -> Result<(Index, ZipReader), OpenError> {
    open_with_cache(path, backing.clone(), cache_bytes_for(backing.len() as u64))
}

/// Decompressed-member cache size: four times the archive, between 64 MiB and 1 GiB,
/// as for SquashFS blocks (the cache only grows as members are read).
fn cache_bytes_for(archive_bytes: u64) -> u64 {
    archive_bytes.saturating_mul(4).clamp(64 << 20, 1 << 30)
}

/// Indexes the zip in `backing`; decompressed members are cached up to `cache_bytes`.
pub fn open_with_cache(path: &Path, backing: Backing, cache_bytes: u64) -> Result<(Index, ZipReader), OpenError> {
    let fail = |fault: Fault| fault.into_open_error(path);
    let mut dir = directory::read(&backing).map_err(fail)?;
    unwrap_stored_sizes(&backing, &mut dir.entries, dir.start);
    refuse_aliases(&dir.entries).map_err(fail)?;
    let mut builder = IndexBuilder::new();
    let mut members = Vec::new();
    for entry in &dir.entries {
        add(&backing, &mut builder, &mut members, entry, dir.start).map_err(fail)?;
    }
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    members.shrink_to_fit();
    Ok((index, ZipReader::new(backing, members, cache_bytes)))
}

/// Adds one central directory entry to the index.
fn add(
    backing: &Backing,
    builder: &mut IndexBuilder,
    members: &mut Vec<Member>,
    e: &Entry,
    cd_start: u64,
) -> Result<(), Fault> {
    if e.name.contains(&0) {
        // The kernel's names end at a NUL: listed cut short, such a member could never be opened.
        tracing::warn!(name = %show(&e.name), "skipping a member whose name holds a NUL byte: no file can have it");
        return Ok(());
    }
    let components = components(&e.name);
    let attrs = attrs_of(e);
    // The member's data must lie before the central directory; the local header is
    // checked on first read, so mounting touches no data.
    let data_end = e.local.checked_add(30 + u64::from(e.stored_name_len)).and_then(|h| h.checked_add(e.compressed));
    if !attrs.is_dir() && data_end.is_none_or(|end| end > cd_start) {
        return Err(Fault::corrupt(
            e.at,
            format!(
                "member {} at {} with {} compressed bytes: expected it to end before the central directory at {cd_start}",
                show(&e.name),
                e.local,
                e.compressed
            ),
        ));
    }
    let member = Member::from_entry(e);
    let data = match attrs.file_type() {
        libc::S_IFLNK if e.size > MAX_LINK_TARGET as u64 => {
            tracing::warn!(
                name = %show(&e.name),
                "skipping symlink member whose target is {} bytes, longer than Linux allows ({MAX_LINK_TARGET})",
                e.size
            );
            return Ok(());
        }
        libc::S_IFLNK => {
            let target = member.whole(backing).map_err(|err| Fault::corrupt(err.offset, err.what))?;
            Data::Symlink(builder.intern(&target)?)
        }
        libc::S_IFREG if attrs.size > 0 || e.compressed > 0 => {
            let handle = u32::try_from(members.len()).map_err(|_| BuildError::TooManyEntries)?;
            members.push(member);
            Data::Extern(handle)
        }
        _ => Data::None,
    };
    let mut attrs = attrs;
    if let Data::Symlink(span) = data {
        attrs.size = span.len.into();
    }
    let Some((name, dirs)) = components.split_last() else {
        if attrs.is_dir() {
            builder.set_inode(ROOT, attrs, Data::None);
        }
        return Ok(());
    };
    let parent = parents(builder, dirs)?;
    match builder.child(parent, name) {
        // A later directory entry updates the directory and keeps its children.
        Some(existing) if attrs.is_dir() && builder.attrs(existing).is_dir() => {
            builder.set_inode(existing, attrs, data)
        }
        _ => {
            let id = builder.add_inode(attrs, data)?;
            builder.link(parent, name, id)?;
        }
    }
    Ok(())
}

/// Gives back the 4 GiB a writer without zip64 dropped from a stored member's sizes: a
/// stored member of 4 GiB or more whose headers carry its size modulo 2^32 (a known bug
/// of old writers). When the bytes between its data start and the next member (or the
/// central directory) are its declared size plus whole multiples of 4 GiB, that is its
/// size; the CRC-32 checked before its first byte goes out confirms it. Reads one local
/// header per such member, none for any other.
fn unwrap_stored_sizes(backing: &Backing, entries: &mut [Entry], cd_start: u64) {
    let mut starts: Vec<u64> = entries.iter().map(|e| e.local).collect();
    starts.sort_unstable();
    for e in entries.iter_mut().filter(|e| e.method == 0 && e.compressed == e.size && e.size <= u64::from(u32::MAX)) {
        let next = starts.get(starts.partition_point(|&s| s <= e.local)).copied().unwrap_or(cd_start).min(cd_start);
        let named_end = e.local + 30 + u64::from(e.stored_name_len);
        if next.saturating_sub(named_end) < e.size + (1 << 32) {
            continue;
        }
        let Ok(header) = backing.read_at(e.local, 30) else { continue };
        let extra = u64::from(u16::from_le_bytes([header[28], header[29]]));
        let room = next - named_end.saturating_add(extra).min(next);
        // A data descriptor (flag bit 3) may follow the data: 12 bytes, or 16 with its signature.
        let descriptors: &[u64] = if e.flags & 8 != 0 { &[16, 12] } else { &[0] };
        let real = descriptors
            .iter()
            .filter_map(|d| room.checked_sub(*d))
            .find(|real| *real > e.size && (real - e.size) % (1 << 32) == 0);
        if let Some(real) = real {
            tracing::warn!(
                name = %show(&e.name),
                declared = e.size,
                real,
                "stored member's declared size is {} GiB short (a writer without zip64 dropped it); \
                 serving its {real} bytes, which its CRC-32 must confirm",
                (real - e.size) >> 30
            );
            (e.size, e.compressed) = (real, real);
        }
    }
}

/// Refuses two entries whose local headers coincide or whose data overlap: every
/// member's bytes are its own, so one name never serves another's bytes (and an
/// overlapping "bomb" cannot multiply its data).
fn refuse_aliases(entries: &[Entry]) -> Result<(), Fault> {
    let mut spans: Vec<(u64, u64, &Entry)> = entries
        .iter()
        .map(|e| (e.local, e.local.saturating_add(30 + u64::from(e.stored_name_len)).saturating_add(e.compressed), e))
        .collect();
    spans.sort_unstable_by_key(|&(local, _, _)| local);
    for pair in spans.windows(2) {
        let ((_, end, a), (local, _, b)) = (pair[0], pair[1]);
        if local < end {
            return Err(Fault::corrupt(
                b.at,
                format!(
                    "members {} and {} share archive bytes (local headers at {} and {}): refused, so that no \
                     name serves another member's bytes",
                    show(&a.name),
                    show(&b.name),
                    a.local,
                    b.local
                ),
            ));
        }
    }
    Ok(())
}

/// Resolves (creating implicit directories) the directory chain `dirs` under the root.
fn parents(builder: &mut IndexBuilder, dirs: &[&[u8]]) -> Result<InodeId, BuildError> {
    let mut dir = ROOT;
    for name in dirs {
        dir = match builder.child(dir, name) {
            Some(id) if builder.attrs(id).is_dir() => id,
            _ => {
                let id = builder.add_inode(Attrs::implicit_dir(), Data::None)?;
                builder.link(dir, name, id)?;
                id
            }
        };
    }
    Ok(dir)
}

/// Type, permissions, size and mtime as `unzip` extracts them.
fn attrs_of(e: &Entry) -> Attrs {
    let named_dir = e.name.ends_with(b"/");
    let unix = (e.made_by >> 8 == MADE_ON_UNIX).then_some(e.external >> 16).filter(|&m| m != 0);
    let mode = match unix {
        Some(mode) if mode & libc::S_IFMT != 0 => mode & (libc::S_IFMT | 0o7777),
        Some(perm) if named_dir => libc::S_IFDIR | (perm & 0o7777),
        Some(perm) => libc::S_IFREG | (perm & 0o7777),
        None if named_dir || e.external & DOS_DIRECTORY != 0 => libc::S_IFDIR | 0o755,
        None if e.external & DOS_READONLY != 0 => libc::S_IFREG | 0o444,
        None => libc::S_IFREG | 0o644,
    };
    // Only files, directories and symlinks are extracted by unzip; other types are files.
    let mode = match mode & libc::S_IFMT {
        libc::S_IFREG | libc::S_IFDIR | libc::S_IFLNK => mode,
        _ => libc::S_IFREG | (mode & 0o7777),
    };
    let size = if mode & libc::S_IFMT == libc::S_IFREG { e.size } else { 0 };
    let mtime = e.unix_mtime.unwrap_or_else(|| dos_time(e.dos_date, e.dos_time));
    // A zip records no owner: its members are the mounting user's, as unzip makes them.
    Attrs { mode, uid: my_uid(), gid: my_gid(), mtime, mtime_nsec: 0, size }
}

fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn my_gid() -> u32 {
    // SAFETY: getegid has no preconditions.
    unsafe { libc::getegid() }
}

/// A member name's components as `unzip` extracts it: leading `/`, empty and `.`
/// components dropped, and `..` components dropped too (`folder/../ufo` -> `folder/ufo`),
/// with one warning, so nothing lands outside the mount.
fn components(name: &[u8]) -> Vec<&[u8]> {
    let all: Vec<&[u8]> = name.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
    if all.contains(&&b".."[..]) {
        tracing::warn!(name = %show(name), "dropping the '..' components of a member name (as unzip does)");
    }
    all.into_iter().filter(|c| *c != b"..").collect()
}

/// An MS-DOS date and time, read as UTC: the format has no zone, `unzip` reads it in
/// the local zone, and a daemon serving a cluster job has no better one to pick.
pub fn dos_time(date: u16, time: u16) -> i64 {
    let year = 1980 + i64::from(date >> 9);
    let month = i64::from((date >> 5) & 0xf).clamp(1, 12);
    let day = i64::from(date & 0x1f).max(1);
    let (h, m, s) = (i64::from(time >> 11), i64::from((time >> 5) & 0x3f), i64::from(time & 0x1f) * 2);
    days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_dot_components_are_dropped_as_unzip_drops_them() {
        let parts =
            |name: &[u8]| components(name).iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>();
        assert_eq!(parts(b"folder/../ufo"), ["folder", "ufo"]);
        assert_eq!(parts(b"/../../etc/passwd"), ["etc", "passwd"]);
        assert_eq!(parts(b"./a//b/."), ["a", "b"]);
    }

    #[test]
    fn members_belong_to_the_mounting_user() {
        let zip = directory::tests::python_zip("z.writestr('f', b'x')");
        let dir = directory::read(&zip).unwrap();
        let attrs = attrs_of(&dir.entries[0]);
        // SAFETY: geteuid/getegid have no preconditions.
        assert_eq!((attrs.uid, attrs.gid), unsafe { (libc::geteuid(), libc::getegid()) });
    }

    #[test]
    fn dos_times_read_as_utc() {
        // 2024-10-04 14:47:28, as Info-ZIP writes it.
        let date = ((2024 - 1980) << 9) | (10 << 5) | 4;
        let time = (14 << 11) | (47 << 5) | (28 / 2);
        assert_eq!(dos_time(date, time), 1_728_053_248);
        assert_eq!(dos_time(0, 0), 315_532_800);
    }

    #[test]
    fn end_record_is_found_behind_a_comment_and_not_in_garbage() {
        let mut zip = b"stub".to_vec();
        zip.extend_from_slice(b"PK\x05\x06");
        zip.extend_from_slice(&[0; 16]);
        zip.extend_from_slice(&3u16.to_le_bytes());
        zip.extend_from_slice(b"abc");
        assert_eq!(find_end(&zip), Some(4));
        assert!(looks_like_zip(&zip));
        assert_eq!(find_end(b"PK\x05\x06 too short"), None);
        assert!(!looks_like_zip(&[0u8; 100]));
    }
}
