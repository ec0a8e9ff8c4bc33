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
use crate::caches::Caches;
use crate::error::OpenError;
use crate::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, MAX_LINK_TARGET, ROOT};
use crate::source::Backing;
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
#[cfg(test)]
pub(crate) fn looks_like_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") || find_end(bytes).is_some()
}

/// Indexes the zip in `backing` from its central directory; decompressed members are
/// cached in the open's `caches`.
pub fn open(path: &Path, backing: Backing, caches: &Caches) -> Result<(Index, ZipReader), OpenError> {
    let fail = |fault: Fault| fault.into_open_error(path);
    let mut dir = directory::read(&backing).map_err(fail)?;
    let starts = Starts::of(&dir.entries, dir.start);
    unwrap_stored_sizes(&backing, &mut dir.entries, &starts);
    refuse_aliases(&dir.entries).map_err(fail)?;
    let mut builder = IndexBuilder::new();
    let mut members = Vec::new();
    for entry in &dir.entries {
        add(&backing, &mut builder, &mut members, entry, &starts).map_err(fail)?;
    }
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    members.shrink_to_fit();
    Ok((index, ZipReader::new(backing, members, caches)))
}

/// Adds one central directory entry to the index.
fn add(
    backing: &Backing,
    builder: &mut IndexBuilder,
    members: &mut Vec<Member>,
    e: &Entry,
    starts: &Starts,
) -> Result<(), Fault> {
    let cd_start = starts.cd_start;
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
    let member = Member::from_entry(e, starts.after(e.local));
    let data = match attrs.file_type() {
        libc::S_IFLNK if e.size > MAX_LINK_TARGET as u64 => {
            tracing::warn!(
                name = %show(&e.name),
                "skipping symlink member whose target is {} bytes, longer than Linux allows ({MAX_LINK_TARGET})",
                e.size
            );
            return Ok(());
        }
        libc::S_IFLNK => match member.whole(backing) {
            Ok(target) => Data::Symlink(builder.intern(&target)?),
            // A link has no bytes to fail a read with: one bad member must not take the
            // mount down, so it is left out, as bsdtar leaves it unextracted.
            Err(err) => {
                tracing::warn!(name = %show(&e.name), "skipping symlink member whose target cannot be read: {err}");
                return Ok(());
            }
        },
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

/// Where each member's bytes must end: at the next local header, or the central directory.
struct Starts {
    sorted: Vec<u64>,
    cd_start: u64,
}

impl Starts {
    fn of(entries: &[Entry], cd_start: u64) -> Starts {
        let mut sorted: Vec<u64> = entries.iter().map(|e| e.local).collect();
        sorted.sort_unstable();
        Starts { sorted, cd_start }
    }

    /// The first local header after `local`, or the central directory, whichever is first.
    fn after(&self, local: u64) -> u64 {
        let next = self.sorted.get(self.sorted.partition_point(|&s| s <= local)).copied();
        next.unwrap_or(self.cd_start).min(self.cd_start)
    }
}

/// Stored members whose two sizes a writer got wrong by whole multiples of 4 GiB (a known
/// bug of writers without zip64, which keep sizes modulo 2^32):
/// - both sizes 4 GiB short of a member of 4 GiB or more: when the bytes between its data
///   start and the next member (or the central directory) are its declared size plus
///   whole multiples of 4 GiB, that is its size;
/// - an uncompressed size whole multiples of 4 GiB above the compressed one: the stored
///   bytes are the member (as unzip "continues with the compressed size value", and
///   Python and bsdtar 3.6 extract them).
///
/// Either way the CRC-32 checked before its first byte goes out confirms it. Reads one
/// local header per such member, none for any other.
fn unwrap_stored_sizes(backing: &Backing, entries: &mut [Entry], starts: &Starts) {
    const FOUR_GIB: u64 = 1 << 32;
    let off_by_4_gib = |e: &Entry| e.compressed != e.size && e.compressed.abs_diff(e.size) % FOUR_GIB == 0;
    for e in entries.iter_mut().filter(|e| e.method == 0) {
        let next = starts.after(e.local);
        let named_end = e.local + 30 + u64::from(e.stored_name_len);
        let declared = e.size.min(e.compressed);
        let maybe_short = e.compressed == e.size && e.size <= u64::from(u32::MAX);
        let may_be_longer = maybe_short && next.saturating_sub(named_end) >= e.size + FOUR_GIB;
        if !off_by_4_gib(e) && !may_be_longer {
            continue;
        }
        let Ok(header) = backing.read_at(e.local, 30) else { continue };
        let extra = u64::from(u16::from_le_bytes([header[28], header[29]]));
        let room = next - named_end.saturating_add(extra).min(next);
        // A data descriptor (flag bit 3) may follow the data: 12 bytes, or 16 with its signature.
        let descriptors: &[u64] = if e.flags & 8 != 0 { &[16, 12] } else { &[0] };
        let fits = descriptors
            .iter()
            .filter_map(|d| room.checked_sub(*d))
            .find(|real| *real >= declared && (real - declared) % FOUR_GIB == 0);
        let real = match fits {
            Some(real) => real,
            None if e.compressed < e.size => e.compressed,
            None => continue,
        };
        if (real, real) == (e.size, e.compressed) {
            continue;
        }
        tracing::warn!(
            name = %show(&e.name),
            declared = e.size,
            compressed = e.compressed,
            real,
            "stored member's sizes are off by whole multiples of 4 GiB (a writer kept them modulo 2^32); \
             serving its {real} stored bytes, which its CRC-32 must confirm"
        );
        (e.size, e.compressed) = (real, real);
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

    /// Many zips opened with one `Caches` (a shard set's) hold no more decoded members
    /// together than its one bound, each serving its own bytes.
    #[test]
    fn zips_of_one_open_share_one_bound() {
        let zip = directory::tests::python_zip(
            "import random\nr = random.Random(5)\n\
             z.writestr('m', bytes(r.getrandbits(4) for _ in range(512 << 10)), compress_type=zipfile.ZIP_DEFLATED)",
        );
        let caches = crate::Caches::of_bytes(8 << 20);
        let zips: Vec<_> =
            (0..40).map(|_| open(Path::new("t.zip"), crate::source::Source::memory(&zip), &caches).unwrap()).collect();
        let mut first = None;
        for (index, reader) in &zips {
            let id = index.lookup(&index.inode(ROOT).unwrap(), b"m").unwrap().unwrap();
            let inode = index.inode(id).unwrap();
            // Half of it: a member read to its end leaves the cache at once.
            let half = crate::read_file(reader, id, &inode, 0, (inode.attrs.size / 2) as u32).unwrap().to_vec();
            assert_eq!(&half, first.get_or_insert_with(|| half.clone()), "every zip serves the same bytes");
            assert!(caches.held_bytes() <= 8 << 20, "{} bytes held past the one 8 MiB bound", caches.held_bytes());
        }
        assert!(caches.held_bytes() > 0, "members are cached at all");
    }

    /// Reads all of the regular file at `path` of a zip opened from `bytes`.
    fn read_member(bytes: &[u8], path: &str) -> Result<Vec<u8>, crate::error::ReadError> {
        let (index, reader) =
            open(Path::new("t.zip"), crate::source::Source::memory(bytes), &crate::Caches::default()).unwrap();
        let id = index.lookup(&index.inode(ROOT).unwrap(), path.as_bytes()).unwrap().unwrap();
        let inode = index.inode(id).unwrap();
        crate::archive::read_file(&reader, id, &inode, 0, inode.attrs.size as u32).map(|b| b.to_vec())
    }

    /// A local header whose name differs from the central one serves the data after its own
    /// name and extra field; one whose lengths would move the data into the next member's
    /// bytes is refused, whatever its CRC says: no name serves another member's bytes.
    #[test]
    fn a_local_header_cannot_move_a_member_into_its_neighbour() {
        let zip = directory::tests::python_zip("z.writestr('a', b'first')\nz.writestr('b', b'second')");
        // Same length, other name in the local header: served under the central name.
        let mut renamed = zip.clone();
        renamed[30] = b'x';
        assert_eq!(read_member(&renamed, "a").unwrap(), b"first");
        // A local extra field of 6 bytes: the data would be "second"'s header bytes.
        let mut moved = zip.clone();
        moved[28] = 6;
        let err = read_member(&moved, "a").unwrap_err();
        assert!(err.what.contains("run into the next member"), "{err}");
        assert_eq!(read_member(&moved, "b").unwrap(), b"second", "the neighbour is served");
    }

    /// A stored member whose uncompressed size is 4 GiB more than its compressed one (the
    /// zip64 field of libarchive's `uncompressed_size_off_by_4gib`) serves its stored bytes.
    #[test]
    fn a_stored_size_off_by_4_gib_serves_the_stored_bytes() {
        let script = "i = zipfile.ZipInfo('hello.txt')\nz.writestr(i, b'hello')";
        let zip = directory::tests::python_zip(script);
        let dir = directory::read(&zip).unwrap();
        let mut entries = dir.entries;
        entries[0].size += 1 << 32;
        let backing = crate::source::Source::memory(&zip);
        let starts = Starts::of(&entries, dir.start);
        unwrap_stored_sizes(&backing, &mut entries, &starts);
        assert_eq!((entries[0].size, entries[0].compressed), (5, 5));
        // Off by anything else: left as declared (reads then fail with EIO).
        entries[0].size = 7;
        unwrap_stored_sizes(&backing, &mut entries, &starts);
        assert_eq!((entries[0].size, entries[0].compressed), (7, 5));
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
