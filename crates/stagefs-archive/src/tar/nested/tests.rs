//! The nesting walk on archives made by Python's `tarfile`, gzip, zstd and bzip2: what opens, what stays a file, how often each inner tar is scanned, and that every byte read through the composed reader is the inner member's.

use std::io::Write;

use super::*;
use crate::source::Source;
use crate::test_rng::text_like;
use crate::test_support::{python_tar, ustar as tar};

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Position of `path` in the expanded tree.
fn find(index: &Index, path: &str) -> InodeId {
    path.split('/').fold(ROOT, |dir, part| {
        index.lookup(&index.inode(dir).unwrap(), part.as_bytes()).unwrap().unwrap_or_else(|| panic!("no {path}"))
    })
}

/// The whole file at `path` of the expanded tree, read through its reader.
fn read(expanded: &Expanded, path: &str) -> Vec<u8> {
    let id = find(&expanded.index, path);
    let inode = expanded.index.inode(id).unwrap();
    crate::archive::read_file(&*expanded.reader, id, &inode, 0, inode.attrs.size as u32).unwrap().to_vec()
}

/// `bytes` (an outer tar) scanned and expanded `depth` levels deep.
fn expand_to(bytes: &[u8], depth: usize) -> Expanded {
    let mut scan = Scan::new(Path::new("t.tar"), bytes);
    scan.run().unwrap();
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().unwrap();
    let nesting = Nesting { depth, cancelled: &|| false, caches: &crate::Caches::default() };
    expand(Path::new("t.tar"), &Source::memory(bytes), &index, (&sparse_files, &extents), nesting).unwrap()
}

fn expand_all(bytes: &[u8]) -> Expanded {
    expand_to(bytes, DEFAULT_DEPTH)
}

fn names(index: &Index, dir: InodeId) -> Vec<String> {
    let dir = index.inode(dir).unwrap();
    index
        .children(&dir)
        .unwrap()
        .iter()
        .map(|d| String::from_utf8_lossy(index.name(&d).unwrap()).into_owned())
        .collect()
}

#[test]
fn a_damaged_inner_tar_stays_a_file_and_a_good_one_opens_in_place() {
    let inner = python_tar("", "add('a.txt', b'inside')");
    // A valid first header, then the member's data cut short: it does not scan.
    let damaged = python_tar("", "add('big.bin', b'x' * 5000)")[..1024].to_vec();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let script = format!(
        "add('good.tar', bytes.fromhex('{}'))\nadd('bad.tar', bytes.fromhex('{}'))",
        hex(&inner),
        hex(&damaged)
    );
    let outer = python_tar("", &script);
    let Expanded { index: nested, opened, .. } = expand_all(&outer);
    assert_eq!(opened, 1);
    let mut top = names(&nested, ROOT);
    top.sort();
    assert_eq!(top, ["bad.tar", "good"]);
    let good = nested.lookup(&nested.inode(ROOT).unwrap(), b"good").unwrap().unwrap();
    let a = nested.lookup(&nested.inode(good).unwrap(), b"a.txt").unwrap().unwrap();
    let Data::Slice { offset } = nested.inode(a).unwrap().data else { panic!("a slice of the outer archive") };
    assert_eq!(&outer[offset as usize..offset as usize + 6], b"inside", "served in place from the outer bytes");
}

#[test]
fn an_inner_tar_with_many_names_opens_once() {
    let inner = python_tar("", "add('a.txt', b'inside')");
    let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
    let script = format!(
        "add('good.tar', bytes.fromhex('{hex}'))\n\
         for i in range(3):\n    l = tarfile.TarInfo(f'link{{i}}.tar'); l.type = tarfile.LNKTYPE; l.linkname = 'good.tar'; t.addfile(l)"
    );
    let outer = python_tar("", &script);
    let Expanded { index: nested, opened, .. } = expand_all(&outer);
    assert_eq!(opened, 1, "scanned once, not once per name");
    let mut top = names(&nested, ROOT);
    top.sort();
    assert_eq!(top, ["good", "link0.tar", "link1.tar", "link2.tar"]);
}

/// An inner tar that fails its scan late, with 100 names: scanned once, not 100 times.
#[test]
fn an_inner_tar_that_fails_late_is_scanned_once_whatever_its_links() {
    // Many good members, then a header whose checksum is wrong: the scan fails at the end.
    let mut inner = python_tar("", "for i in range(50): add(f'f{i}.txt', b'x' * 100)");
    inner.truncate(50 * 1024);
    inner.extend_from_slice(&[b'z'; 512]);
    inner.extend_from_slice(&[0u8; 1024]);
    let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
    let script = format!(
        "add('bad.tar', bytes.fromhex('{hex}'))\n\
         for i in range(100):\n    l = tarfile.TarInfo(f'link{{i}}.tar'); l.type = tarfile.LNKTYPE; l.linkname = 'bad.tar'; t.addfile(l)"
    );
    let outer = python_tar("", &script);
    let expanded = expand_all(&outer);
    assert_eq!((expanded.opened, expanded.scans), (0, 1), "one scan for 101 names of a tar that fails");
    assert_eq!(names(&expanded.index, ROOT).len(), 101, "all stay files");
}

/// `..tar` and `...tar` would be directories `.` and `..`: they stay files, listed once,
/// and the tree passes the saved index's own checks.
#[test]
fn inner_tars_named_dot_dot_tar_stay_files() {
    let inner = python_tar("", "add('a.txt', b'inside')");
    let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
    let script = format!("add('..tar', bytes.fromhex('{hex}'))\nadd('...tar', bytes.fromhex('{hex}'))\nadd('ok.tar', bytes.fromhex('{hex}'))");
    let outer = python_tar("", &script);
    let expanded = expand_all(&outer);
    let mut top = names(&expanded.index, ROOT);
    top.sort();
    assert_eq!(top, ["...tar", "..tar", "ok"]);
    assert_eq!(expanded.opened, 1);
}

/// Many inner tars in one directory: the sibling-name check is a set, built once (the
/// scan per inner tar was quadratic: 80,000 inner tars took 3 s).
#[test]
fn many_inner_tars_in_one_directory_open_each() {
    let inner = python_tar("", "add('a.txt', b'inside')");
    let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
    let script = format!("data = bytes.fromhex('{hex}')\nfor i in range(5000): add(f'c{{i}}.tar', data)");
    let outer = python_tar("", &script);
    let expanded = expand_all(&outer);
    assert_eq!((expanded.opened, expanded.scans), (5000, 5000));
    assert!(expanded.name_work <= 2 * 5000, "{} sibling names looked at for 5000", expanded.name_work);
    let top = names(&expanded.index, ROOT);
    assert_eq!(top.len(), 5000);
    assert!(top.iter().all(|n| !n.ends_with(".tar")));
}

/// Compressed inner tars (gzip, single-frame zstd, bzip2) open as directories served by
/// readers of their own beside the outer archive's, an uncompressed tar inside one opens
/// too, and every byte read is the member's.
#[test]
fn compressed_inner_tars_open_and_read_through_their_own_readers() {
    let big = text_like(3, 9 << 20);
    let deep = tar(&[("deep.txt", b"inside the inner-inner tar")]);
    let class = tar(&[("a.JPEG", b"first image"), ("big.bin", &big), ("deep.tar", &deep)]);
    let zst = zstd::bulk::compress(&tar(&[("z.JPEG", b"zstd image")]), 3).unwrap();
    let mut bz = ::bzip2::write::BzEncoder::new(Vec::new(), ::bzip2::Compression::fast());
    bz.write_all(&tar(&[("b.JPEG", b"bzip2 image")])).unwrap();
    let bz = bz.finish().unwrap();
    let outer = tar(&[
        ("n1.tar.gz", &gzip(&class)),
        ("n2.tar.zst", &zst),
        ("n3.tbz2", &bz),
        ("plain.tar", &tar(&[("p.txt", b"plain")])),
        ("README", b"outer file"),
    ]);
    let expanded = expand_all(&outer);
    assert_eq!((expanded.opened, expanded.compressed), (5, 3), "n1, n1/deep, n2, n3, plain; 3 compressed");
    assert_eq!(read(&expanded, "n1/a.JPEG"), b"first image");
    assert!(read(&expanded, "n1/big.bin") == big, "9 MiB across restart points");
    assert_eq!(read(&expanded, "n1/deep/deep.txt"), b"inside the inner-inner tar");
    assert_eq!(read(&expanded, "n2/z.JPEG"), b"zstd image");
    assert_eq!(read(&expanded, "n3/b.JPEG"), b"bzip2 image");
    assert_eq!(read(&expanded, "plain/p.txt"), b"plain");
    assert_eq!(read(&expanded, "README"), b"outer file");
    let tables = super::TarTables::of(expanded.reader.saved().expect("a tar's tables"));
    assert_eq!(tables.inner.len(), 3);
    assert!(tables.runs.len() >= 3, "runs of positions per reader: {:?}", tables.runs);
    // One level only: the tar inside n1 stays a file.
    let shallow = expand_to(&outer, 1);
    assert_eq!((shallow.opened, shallow.compressed), (4, 3));
    assert_eq!(read(&shallow, "n1/deep.tar"), deep);
    let flat = expand_to(&outer, 0);
    assert_eq!(flat.opened, 0);
    assert_eq!(read(&flat, "n1.tar.gz"), gzip(&class));
}

/// What stays a file: a member claiming gzip but damaged, a gzip of something that is no
/// tar, a compressed tar inside a compressed tar, and a single zstd frame too large to
/// restart in. The rest of the archive opens.
#[test]
fn damaged_and_unservable_compressed_inner_tars_stay_files() {
    let inner = tar(&[("a.txt", &text_like(1, 300 << 10))]);
    let mut damaged = gzip(&inner);
    let middle = damaged.len() / 2;
    damaged[middle..middle + 64].fill(0x55);
    let nested = tar(&[("in.tar.gz", &gzip(&inner))]);
    let huge = zstd::bulk::compress(&tar(&[("zeros", &vec![0u8; 70 << 20])]), 1).unwrap();
    let outer = tar(&[
        ("bad.tar.gz", &damaged),
        ("notatar.tar.gz", &gzip(b"just text, not a tar")),
        ("outer.tar.gz", &gzip(&nested)),
        ("huge.tar.zst", &huge),
        ("good.tar.gz", &gzip(&inner)),
    ]);
    let expanded = expand_all(&outer);
    assert_eq!((expanded.opened, expanded.compressed), (2, 2), "outer and good");
    assert_eq!(read(&expanded, "bad.tar.gz"), damaged, "served as the file it is");
    assert_eq!(read(&expanded, "notatar.tar.gz"), gzip(b"just text, not a tar"));
    assert_eq!(read(&expanded, "outer/in.tar.gz"), gzip(&inner), "compressed inside compressed");
    assert_eq!(read(&expanded, "huge.tar.zst"), huge);
    assert_eq!(read(&expanded, "good/a.txt"), text_like(1, 300 << 10));
}

/// Work stops when asked, between inner tars and inside one's decoding.
#[test]
fn expanding_stops_when_cancelled() {
    let outer = tar(&[("a.tar.gz", &gzip(&tar(&[("x", b"x")])))]);
    let mut scan = Scan::new(Path::new("t.tar"), &outer);
    scan.run().unwrap();
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().unwrap();
    let nesting = Nesting { depth: DEFAULT_DEPTH, cancelled: &|| true, caches: &crate::Caches::default() };
    let stopped = expand(Path::new("t.tar"), &Source::memory(&outer), &index, (&sparse_files, &extents), nesting);
    assert!(matches!(stopped, Err(OpenError::Stopped { .. })));
}
