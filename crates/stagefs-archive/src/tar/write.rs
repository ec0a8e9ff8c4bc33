//! Writing tar: ustar headers, pax records where ustar cannot hold a field, padding; `stagefs pack` writes with it, and `stagefs demo` and tests craft archives with it.
//!
//! Written by hand (the project already parses these headers in `archive::tar`) so that
//! every byte is a function of the member alone: no time of packing, no host name, no
//! hash-ordered records. A member gets a pax extended header (`x`) only when ustar
//! cannot hold it: a name or link target too long for the name/prefix fields, a size of
//! 8 GiB or more, an owner id of 2^21 or more, a time before 1970 or after 2242. Names
//! that are not UTF-8 and too long for ustar go in a GNU long-name member instead (raw
//! bytes, read by GNU tar, bsdtar and tarfile; pax would need `hdrcharset`, which GNU tar
//! 1.34 warns about).

/// The tar block size.
pub const BLOCK: u64 = 512;

/// What a member is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (the link target is its target).
    Symlink,
    /// A hard link to an earlier member (the link target is its path).
    Hardlink,
    /// A FIFO.
    Fifo,
    /// A character device.
    Char {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
    /// A block device.
    Block {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
}

/// One member's header fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// The member path: relative, no leading `./`; directories end with `/`.
    pub path: &'a [u8],
    /// What it is.
    pub kind: Kind,
    /// Permission bits (07777).
    pub mode: u32,
    /// Owner user id.
    pub uid: u64,
    /// Owner group id.
    pub gid: u64,
    /// Owner user name (may be empty).
    pub uname: &'a [u8],
    /// Owner group name (may be empty).
    pub gname: &'a [u8],
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Content bytes that follow (files only).
    pub size: u64,
    /// Symlink target or hard link target path.
    pub link: &'a [u8],
}

const OCTAL_MAX_11: u64 = 0o77777777777;
const OCTAL_MAX_7: u64 = 0o7777777;

/// Encodes a member's header blocks: a pax extended header first when needed, then the
/// ustar header. The content (padded to a block with [`padding`]) follows.
pub fn encode(h: &Header) -> Vec<u8> {
    encode_with(h, Vec::new())
}

/// Encodes a sparse file as GNU tar's pax format 1.0 does: the header names
/// `DIR/GNUSparseFile.0/NAME` and stores [`sparse_map`] then the data runs (`h.size` bytes
/// in all); pax keywords give the real name and size. `h.path` is the real path.
pub fn encode_sparse(h: &Header, real_size: u64) -> Vec<u8> {
    let (dir, base) = match h.path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&h.path[..=i], &h.path[i + 1..]),
        None => (&[][..], h.path),
    };
    let stand_in = [dir, b"GNUSparseFile.0/", base].concat();
    let mut pax = record(b"GNU.sparse.major", b"1");
    pax.extend(record(b"GNU.sparse.minor", b"0"));
    pax.extend(record(b"GNU.sparse.name", h.path));
    pax.extend(record(b"GNU.sparse.realsize", real_size.to_string().as_bytes()));
    encode_with(&Header { path: &stand_in, ..h.clone() }, pax)
}

/// The sparse map that starts a pax 1.0 sparse member's data: the count, then each run's
/// offset and length, one decimal number per line, padded to a block.
pub fn sparse_map(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut text = format!("{}\n", runs.len());
    for (offset, len) in runs {
        text.push_str(&format!("{offset}\n{len}\n"));
    }
    let mut bytes = text.into_bytes();
    bytes.resize(bytes.len() + padding(bytes.len() as u64), 0);
    bytes
}

fn encode_with(h: &Header, mut pax: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 * BLOCK as usize);
    let (name, prefix) = match split_ustar_name(h.path) {
        Some(parts) => parts,
        None if std::str::from_utf8(h.path).is_err() => {
            gnu_long(&mut out, b'L', h.path);
            (truncated_name(h.path), &[][..])
        }
        None => {
            pax.extend(record(b"path", h.path));
            (truncated_name(h.path), &[][..])
        }
    };
    if h.link.len() > 100 {
        if std::str::from_utf8(h.link).is_err() {
            gnu_long(&mut out, b'K', h.link);
        } else {
            pax.extend(record(b"linkpath", h.link));
        }
    }
    if h.size > OCTAL_MAX_11 {
        pax.extend(record(b"size", h.size.to_string().as_bytes()));
    }
    if h.uid > OCTAL_MAX_7 {
        pax.extend(record(b"uid", h.uid.to_string().as_bytes()));
    }
    if h.gid > OCTAL_MAX_7 {
        pax.extend(record(b"gid", h.gid.to_string().as_bytes()));
    }
    if h.mtime < 0 || h.mtime as u64 > OCTAL_MAX_11 {
        pax.extend(record(b"mtime", h.mtime.to_string().as_bytes()));
    }
    for (key, value) in [(&b"uname"[..], h.uname), (b"gname", h.gname)] {
        if value.len() > 31 && std::str::from_utf8(value).is_ok() {
            pax.extend(record(key, value));
        }
    }
    if !pax.is_empty() {
        let mut pax_name = b"PaxHeaders/".to_vec();
        let base = h.path.split(|&b| b == b'/').rfind(|c| !c.is_empty()).unwrap_or(b"root");
        let base = String::from_utf8_lossy(&base[..base.len().min(80)]).into_owned();
        pax_name.extend_from_slice(base.as_bytes());
        let (name, prefix) = split_ustar_name(&pax_name).unwrap_or((truncated_name(&pax_name), &[]));
        out.extend_from_slice(&ustar(&extension_header(&pax_name, h.mtime, pax.len() as u64), name, prefix, b'x'));
        out.extend_from_slice(&pax);
        out.resize(out.len() + padding(pax.len() as u64), 0);
    }
    let typeflag = match h.kind {
        Kind::File => b'0',
        Kind::Hardlink => b'1',
        Kind::Symlink => b'2',
        Kind::Char { .. } => b'3',
        Kind::Block { .. } => b'4',
        Kind::Dir => b'5',
        Kind::Fifo => b'6',
    };
    out.extend_from_slice(&ustar(h, name, prefix, typeflag));
    out
}

/// The header of an extension member (pax `x`, GNU `L`/`K`) of `size` bytes.
fn extension_header(name: &[u8], mtime: i64, size: u64) -> Header<'_> {
    Header {
        path: name,
        kind: Kind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        uname: b"",
        gname: b"",
        mtime: mtime.clamp(0, OCTAL_MAX_11 as i64),
        size,
        link: b"",
    }
}

/// A GNU long name (`L`) or long link (`K`) member: for names that are not UTF-8, which
/// pax may only carry with `hdrcharset=BINARY`, a keyword GNU tar 1.34 warns about.
fn gnu_long(out: &mut Vec<u8>, typeflag: u8, value: &[u8]) {
    let name = b"././@LongLink";
    let size = value.len() as u64 + 1;
    out.extend_from_slice(&ustar(&extension_header(name, 0, size), name, &[], typeflag));
    out.extend_from_slice(value);
    out.push(0);
    out.resize(out.len() + padding(size), 0);
}

/// Zero bytes that pad `len` content bytes to a whole block.
pub fn padding(len: u64) -> usize {
    ((BLOCK - len % BLOCK) % BLOCK) as usize
}

/// The end-of-archive marker: two zero blocks.
pub fn end() -> [u8; 2 * BLOCK as usize] {
    [0; 2 * BLOCK as usize]
}

/// Bytes a member takes in the archive (headers, content, padding), for shard planning:
/// exact for members without a pax header, a close upper bound otherwise.
pub fn member_len(path_len: usize, link_len: usize, size: u64) -> u64 {
    let pax = if path_len > 100 || link_len > 100 || size > OCTAL_MAX_11 {
        BLOCK + (path_len + link_len + 100).div_ceil(BLOCK as usize) as u64 * BLOCK
    } else {
        0
    };
    pax + BLOCK + size + padding(size) as u64
}

/// Splits a path into the ustar name (≤ 100 bytes) and prefix (≤ 155 bytes) at a `/`.
fn split_ustar_name(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= 100 {
        return Some((path, &[]));
    }
    // The last `/` that leaves a name of at most 100 bytes and a prefix of at most 155.
    // A trailing `/` (directories) stays with the name.
    let search = &path[..path.len() - 1];
    let cut = search.iter().enumerate().rev().filter(|&(_, &b)| b == b'/').map(|(i, _)| i).find(|&i| {
        let name_len = path.len() - i - 1;
        name_len <= 100 && name_len > 0 && i <= 155 && i > 0
    })?;
    Some((&path[cut + 1..], &path[..cut]))
}

/// What ustar's name field holds when pax carries the real path: the path's end, which
/// is what tools that ignore pax would show.
fn truncated_name(path: &[u8]) -> &[u8] {
    &path[path.len().saturating_sub(100)..]
}

fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

fn ustar(h: &Header, name: &[u8], prefix: &[u8], typeflag: u8) -> [u8; BLOCK as usize] {
    let mut b = [0u8; BLOCK as usize];
    b[..name.len()].copy_from_slice(name);
    octal(&mut b[100..108], u64::from(h.mode & 0o7777));
    octal(&mut b[108..116], h.uid.min(OCTAL_MAX_7));
    octal(&mut b[116..124], h.gid.min(OCTAL_MAX_7));
    let size = if matches!(h.kind, Kind::File) { h.size } else { 0 };
    octal(&mut b[124..136], size.min(OCTAL_MAX_11));
    octal(&mut b[136..148], h.mtime.clamp(0, OCTAL_MAX_11 as i64) as u64);
    b[156] = typeflag;
    let link = &h.link[..h.link.len().min(100)];
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    let uname = &h.uname[..h.uname.len().min(31)];
    b[265..265 + uname.len()].copy_from_slice(uname);
    let gname = &h.gname[..h.gname.len().min(31)];
    b[297..297 + gname.len()].copy_from_slice(gname);
    if let Kind::Char { major, minor } | Kind::Block { major, minor } = h.kind {
        octal(&mut b[329..337], u64::from(major).min(OCTAL_MAX_7));
        octal(&mut b[337..345], u64::from(minor).min(OCTAL_MAX_7));
    } else {
        octal(&mut b[329..337], 0);
        octal(&mut b[337..345], 0);
    }
    b[345..345 + prefix.len()].copy_from_slice(prefix);
    b[148..156].fill(b' ');
    let sum: u64 = b.iter().map(|&x| u64::from(x)).sum();
    octal(&mut b[148..155], sum);
    b[155] = b' ';
    b
}

/// One pax record, `"LEN KEY=VALUE\n"`, LEN counting the whole record.
fn record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len.to_string().len() + body != len {
        len += 1;
    }
    let mut out = len.to_string().into_bytes();
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// Encodes one ustar header (names and link targets up to 100 bytes, owner 0:0, a fixed
/// mtime): `stagefs demo` writes its archive with it, and tests craft archives with it.
pub fn ustar_header(name: &str, typeflag: u8, mode: u32, size: u64, link: &str) -> [u8; BLOCK as usize] {
    let mut h = [0u8; BLOCK as usize];
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
    record(key.as_bytes(), value.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file<'a>(path: &'a [u8], size: u64) -> Header<'a> {
        Header {
            path,
            kind: Kind::File,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            uname: b"u",
            gname: b"g",
            mtime: 1_700_000_000,
            size,
            link: b"",
        }
    }

    /// Round trip through the project's own tar reader: header, then content.
    fn scan(blocks: &[u8], size: u64) -> crate::index::Index {
        let mut bytes = blocks.to_vec();
        bytes.resize(bytes.len() + size as usize + padding(size), 0);
        bytes.extend_from_slice(&end());
        let map = memmap2::MmapMut::map_anon(bytes.len()).unwrap();
        let mut map = map;
        map.copy_from_slice(&bytes);
        let backing = std::sync::Arc::new(crate::source::Source::private(map.make_read_only().unwrap()));
        super::super::open(std::path::Path::new("t.tar"), backing, &Default::default()).unwrap().0
    }

    #[test]
    fn pax_records_count_their_own_length() {
        assert_eq!(record(b"path", b"abc"), b"12 path=abc\n");
        let r = record(b"path", &[b'x'; 90]);
        assert_eq!(format!("{} ", r.len()).as_bytes(), &r[..3]);
    }

    #[test]
    fn short_names_need_no_pax() {
        let h = encode(&file(b"a/b.jpg", 5));
        assert_eq!(h.len(), 512);
        assert_eq!(&h[..7], b"a/b.jpg");
    }

    #[test]
    fn long_names_split_into_prefix_or_go_to_pax() {
        let mid = [b"d".repeat(120), b"/f.txt".to_vec()].concat();
        let h = encode(&file(&mid, 0));
        assert_eq!(h.len(), 512, "fits prefix + name");
        let index = scan(&h, 0);
        assert_eq!(index.inode_count(), 3);
        let long = [b"d".repeat(300), b"/".to_vec(), b"e".repeat(150)].concat();
        let h = encode(&file(&long, 3));
        assert!(h.len() > 512);
        let index = scan(&h, 3);
        let d = index.lookup(&index.inode(0).unwrap(), &b"d".repeat(300)).unwrap().unwrap();
        assert!(index.lookup(&index.inode(d).unwrap(), &b"e".repeat(150)).unwrap().is_some());
    }

    /// Sizes of 8 GiB and more do not fit ustar's 11 octal digits: pax `size` carries them.
    #[test]
    fn huge_sizes_go_to_pax() {
        let size = 9u64 << 30;
        let h = encode(&file(b"big", size));
        let text = String::from_utf8_lossy(&h);
        assert!(text.contains(&format!("size={size}\n")), "{text}");
        assert_eq!(member_len(3, 0, size) % 512, 0);
        assert!(member_len(3, 0, size) >= h.len() as u64 + size);
    }

    #[test]
    fn non_utf8_long_names_go_to_gnu_long_names() {
        let mut name = vec![0xff; 150];
        name.extend_from_slice(b"x");
        let h = encode(&file(&name, 0));
        assert_eq!(h[156], b'L', "a GNU long name");
        let index = scan(&h, 0);
        assert!(index.lookup(&index.inode(0).unwrap(), &name).unwrap().is_some());
    }
}
