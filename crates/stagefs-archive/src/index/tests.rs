//! The tree's rules, on indexes built here: sorted children, links counted, later names winning, paths resolved as on the mount, and the saved form read back the same.

use super::*;

fn file(size: u64) -> Attrs {
    Attrs { mode: libc::S_IFREG | 0o644, uid: 1, gid: 2, mtime: 3, mtime_nsec: 0, size }
}

fn names(index: &Index, dir: InodeId) -> Vec<Vec<u8>> {
    let dir = index.inode(dir).unwrap();
    index.children(&dir).unwrap().iter().map(|d| index.name(&d).unwrap().to_vec()).collect()
}

#[test]
fn children_are_sorted_and_found() {
    let mut b = IndexBuilder::new();
    for name in ["zeta", "alpha", "mid"] {
        let id = b.add_inode(file(1), Data::Slice { offset: 0 }).unwrap();
        b.link(ROOT, name.as_bytes(), id).unwrap();
    }
    let index = b.finish().unwrap();
    assert_eq!(names(&index, ROOT), [b"alpha".to_vec(), b"mid".to_vec(), b"zeta".to_vec()]);
    let root = index.inode(ROOT).unwrap();
    assert_eq!(index.lookup(&root, b"mid").unwrap(), Some(3));
    assert_eq!(index.lookup(&root, b"nope").unwrap(), None);
    assert!(matches!(index.inode(4), Err(IndexError::NoInode(4))));
}

#[test]
fn hardlinks_share_an_inode_and_count_links() {
    let mut b = IndexBuilder::new();
    let dir = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
    b.link(ROOT, b"d", dir).unwrap();
    let f = b.add_inode(file(5), Data::Slice { offset: 512 }).unwrap();
    b.link(dir, b"a", f).unwrap();
    b.link(ROOT, b"b", f).unwrap();
    let index = b.finish().unwrap();
    assert_eq!(index.inode(f).unwrap().nlink, 2);
    assert_eq!(index.inode(ROOT).unwrap().nlink, 3);
    assert_eq!(index.inode(dir).unwrap().data, Data::Dir { first: 2, count: 1, parent: ROOT });
    assert_eq!(index.summary().files, 1, "a file with two names counts once");
    assert_eq!(index.path_of(f), "/b");
    assert_eq!(index.path_of(dir), "/d");
}

#[test]
fn a_later_entry_replaces_an_earlier_one() {
    let mut b = IndexBuilder::new();
    let first = b.add_inode(file(1), Data::Slice { offset: 0 }).unwrap();
    b.link(ROOT, b"x", first).unwrap();
    let second = b.add_inode(file(2), Data::Slice { offset: 1024 }).unwrap();
    b.link(ROOT, b"x", second).unwrap();
    assert_eq!(b.child(ROOT, b"x"), Some(second));
    let index = b.finish().unwrap();
    assert_eq!(names(&index, ROOT).len(), 1);
    assert_eq!(index.inode(second).unwrap().nlink, 1);
    assert_eq!(index.inode(first).unwrap().nlink, 0);
}

#[test]
fn xattrs_are_found_by_inode_and_the_last_set_wins() {
    let mut b = IndexBuilder::new();
    let f = b.add_inode(file(1), Data::None).unwrap();
    b.link(ROOT, b"f", f).unwrap();
    let g = b.add_inode(file(1), Data::None).unwrap();
    b.link(ROOT, b"g", g).unwrap();
    b.set_xattrs(f, &[(b"user.old", b"1")]).unwrap();
    b.set_xattrs(f, &[(b"user.a", b"x"), (b"user.b", b"")]).unwrap();
    let index = b.finish().unwrap();
    let got: Vec<_> = index
        .xattrs(f)
        .unwrap()
        .iter()
        .map(|x| {
            let (n, v) = index.xattr(&x).unwrap();
            (n.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(got, [(b"user.a".to_vec(), b"x".to_vec()), (b"user.b".to_vec(), vec![])]);
    assert!(index.xattrs(g).unwrap().is_empty());
    assert!(index.has_xattrs());
}

#[test]
fn paths_resolve_through_links_as_on_the_mount() {
    let mut b = IndexBuilder::new();
    let dir = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
    b.link(ROOT, b"d", dir).unwrap();
    let f = b.add_inode(file(5), Data::Slice { offset: 512 }).unwrap();
    b.link(dir, b"f", f).unwrap();
    let link = |b: &mut IndexBuilder, name: &[u8], target: &[u8]| {
        let span = b.intern(target).unwrap();
        let attrs = Attrs { mode: libc::S_IFLNK | 0o777, ..file(0) };
        let id = b.add_inode(attrs, Data::Symlink(span)).unwrap();
        b.link(ROOT, name, id).unwrap();
        id
    };
    let to_f = link(&mut b, b"to-f", b"d/../d/./f");
    link(&mut b, b"to-d", b"d");
    link(&mut b, b"loop", b"loop");
    link(&mut b, b"abs", b"/etc/passwd");
    let index = b.finish().unwrap();
    assert_eq!(index.resolve(b"", true), Ok(ROOT));
    assert_eq!(index.resolve(b"/d//f", true), Ok(f));
    assert_eq!(index.resolve(b"to-f", true), Ok(f));
    assert_eq!(index.resolve(b"to-f", false), Ok(to_f), "the last link stays unless followed");
    assert_eq!(index.resolve(b"to-d/f", false), Ok(f), "links on the way are followed");
    assert_eq!(index.resolve(b"d/../to-d/", false), Ok(dir), "a trailing slash follows the link");
    assert_eq!(index.resolve(b"d/missing", true), Err(PathError::NotFound));
    assert_eq!(index.resolve(b"d/f/x", true), Err(PathError::NotDir));
    assert_eq!(index.resolve(b"loop", true), Err(PathError::Loop));
    assert_eq!(index.resolve(b"abs", true), Err(PathError::Outside));
}

/// The summary counts each reachable inode once and keeps one example per owner and mode.
#[test]
fn the_summary_counts_what_a_walk_would() {
    let mut b = IndexBuilder::new();
    let d = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
    b.link(ROOT, b"d", d).unwrap();
    for (name, mode, size) in [("a", 0o644, 10), ("b", 0o600, 30), ("c", 0o644, 20)] {
        let id = b.add_inode(Attrs { mode: libc::S_IFREG | mode, ..file(size) }, Data::None).unwrap();
        b.link(d, name.as_bytes(), id).unwrap();
    }
    let index = b.finish().unwrap();
    let s = index.summary();
    assert_eq!((s.files, s.file_bytes, s.largest, s.dirs, s.symlinks), (3, 60, 30, 1, 0));
    assert!(s.modes_complete);
    let private = s.modes.iter().find(|m| m.perm == 0o600).unwrap();
    assert_eq!(private.count, 1);
    let dirent = index.children(&index.inode(d).unwrap()).unwrap().get(1).unwrap();
    assert_eq!(index.path_in(private.example.0, &dirent), "/d/b");
}
