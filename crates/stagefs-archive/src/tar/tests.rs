//! Unit tests of the tar reader: header fields, pax records, scans of crafted archives.

use std::collections::HashMap;

use super::header::*;
use super::member::MAX_GLOBAL_XATTRS;
use super::pax::*;
use super::write::{pax_record, ustar_header};
use super::*;
use crate::index::Data;
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
    open_noting(bytes, &Default::default())
}

fn open_noting(bytes: &[u8], caches: &crate::Caches) -> Result<(Index, TarReader), OpenError> {
    let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).unwrap();
    map[..bytes.len()].copy_from_slice(bytes);
    open(Path::new("t.tar"), std::sync::Arc::new(crate::source::Source::private(map.make_read_only().unwrap())), caches)
}

/// A scan notes how far it got in its own open's caches, not in a process global: another
/// open's caches stay at 0.
#[test]
fn a_scan_notes_its_progress_in_its_open_caches() {
    let members: Vec<(String, Vec<u8>)> = (0..50).map(|i| (format!("f{i}"), vec![b'x'; 100])).collect();
    let members: Vec<(&str, &[u8])> = members.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
    let bytes = archive(&members);
    let (scanned, other) = (crate::Caches::of_bytes(1 << 20), crate::Caches::of_bytes(1 << 20));
    let (index, _) = open_noting(&bytes, &scanned).unwrap();
    assert_eq!(index.inode_count(), 51, "50 members and the root");
    let last_header = 49 * (512 + 512);
    assert!(scanned.scan_progress() >= last_header, "progress {} of {}", scanned.scan_progress(), bytes.len());
    assert!(scanned.scan_progress() <= bytes.len() as u64);
    assert_eq!(other.scan_progress(), 0, "another open's progress");
}

#[test]
fn indexes_members_and_implicit_dirs() {
    let bytes = archive(&[("a/b/file.txt", b"hello"), ("a/b/file.txt", b"second")]);
    let (index, reader) = open_bytes(&bytes).unwrap();
    let root = index.inode(0).unwrap();
    let a = index.lookup(&root, b"a").unwrap().unwrap();
    let b = index.lookup(&index.inode(a).unwrap(), b"b").unwrap().unwrap();
    let f = index.lookup(&index.inode(b).unwrap(), b"file.txt").unwrap().unwrap();
    let inode = index.inode(f).unwrap();
    assert_eq!(inode.attrs.size, 6);
    assert_eq!(&*reader.read_data(inode.data, 0, 6).unwrap(), b"second");
    assert_eq!(&*reader.read_data(inode.data, 2, 3).unwrap(), b"con");
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
    assert_eq!(index.children(&index.inode(0).unwrap()).unwrap().len(), n);
    assert!(index.inodes().skip(1).all(|n| n.unwrap().1.attrs.uid == 4242), "the global uid applies to all");
}

/// A pax extended header ('x') holding `records`.
fn pax_header(records: &[u8]) -> Vec<u8> {
    let mut out = ustar_header("PaxHeaders/m", b'x', 0o644, records.len() as u64, "").to_vec();
    out.extend_from_slice(records);
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    out
}

fn xattrs_of(index: &Index, name: &str) -> Vec<(String, String)> {
    let id = index.lookup(&index.inode(0).unwrap(), name.as_bytes()).unwrap().unwrap();
    let text = |bytes| String::from_utf8_lossy(bytes).into_owned();
    let xattrs = index.xattrs(id).unwrap();
    xattrs.iter().map(|x| index.xattr(&x).unwrap()).map(|(n, v)| (text(n), text(v))).collect()
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
    let uid = |name: &str| {
        index.inode(index.lookup(&index.inode(0).unwrap(), name.as_bytes()).unwrap().unwrap()).unwrap().attrs.uid
    };
    assert_eq!([uid("a"), uid("b"), uid("c"), uid("d"), uid("e")], [7, 8, 7, 7, 0]);
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    assert_eq!(xattrs_of(&index, "a"), [pair("user.g", "global")]);
    assert_eq!(xattrs_of(&index, "b"), [pair("user.own", "1"), pair("user.g", "global")]);
    assert_eq!(xattrs_of(&index, "c"), [pair("user.g", "mine")], "the member's own value wins");
    assert_eq!(xattrs_of(&index, "e"), [pair("user.g", "global")], "a global sparse size is ignored");
    let id = |name: &str| index.lookup(&index.inode(0).unwrap(), name.as_bytes()).unwrap().unwrap();
    assert_eq!(index.inode(id("e")).unwrap().attrs.size, 0);
    let first = |name: &str| index.xattrs(id(name)).unwrap().iter().next();
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
        std::sync::Arc::new(crate::source::Source::private(m.make_read_only().unwrap()))
    };
    let reader = TarReader {
        backing,
        sparse_files: vec![SparseFile { first: 0, count: 2 }],
        extents: vec![
            Extent { file_offset: 2, len: 4, archive_offset: 0 },
            Extent { file_offset: 10, len: 4, archive_offset: 4 },
        ],
    };
    let got = reader.read_data(Data::Extern(0), 0, 16).unwrap();
    assert_eq!(&*got, b"\0\0AAAA\0\0\0\0BBBB\0\0");
    assert_eq!(&*reader.read_data(Data::Extern(0), 4, 8).unwrap(), b"AA\0\0\0\0BB");
}
