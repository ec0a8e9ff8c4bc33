//! Error cases: each must be a prompt error naming the offending path, never a hang.

mod common;

use common::{is_root, sizes, Tree};
use stagefs_reader::{BackendChoice, Config, Error, FileList, Loader};
use std::path::Path;

fn cfg() -> Config {
    Config::default().backend(BackendChoice::Host).slot_bytes(8 << 10).depth(2).io_threads(2)
}

/// Runs the loader until its first error.
fn first_error(mut l: Loader) -> Error {
    loop {
        match l.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("loader finished without an error"),
            Err(e) => {
                assert!(matches!(l.next_batch(), Err(Error::Stopped)), "pipeline not stopped after {e}");
                return e;
            }
        }
    }
}

fn assert_names(err: &Error, path: &Path) {
    assert_eq!(err.path(), Some(path), "{err:?}");
    assert!(err.to_string().contains(&*path.to_string_lossy()), "message lacks path: {err}");
}

#[test]
fn missing_path_error_names_the_path() {
    let t = Tree::new(&sizes(3));
    let missing = t.dir.join("nope.bin");
    let err = FileList::from_paths([t.files[0].clone(), missing.clone()]).unwrap_err();
    assert!(matches!(err, Error::Io { op: "stat", .. }));
    assert_names(&err, &missing);
    let err = Loader::from_dir(&missing, cfg()).unwrap_err();
    assert_names(&err, &missing);
}

#[test]
fn file_larger_than_a_slot_is_rejected_naming_it() {
    let t = Tree::new(&[100, 9000, 100]);
    let err = Loader::from_dir(&t.dir, cfg()).unwrap_err();
    assert!(matches!(err, Error::FileTooLarge { len: 9000, slot_bytes: 8192, .. }));
    assert_names(&err, &t.files[1]);
}

#[test]
fn fixed_count_batch_larger_than_a_slot_names_its_first_file() {
    let t = Tree::new(&[3000, 3000, 3000, 3000]);
    let l = Loader::from_dir(&t.dir, cfg().batch_files(Some(3))).unwrap();
    let err = first_error(l);
    assert!(matches!(err, Error::BatchTooLarge { index: 0, files: 3, bytes: 9000, .. }), "{err}");
    assert_names(&err, &t.files[0]);
}

#[test]
fn unreadable_file_error_names_the_path() {
    let t = Tree::new(&sizes(20));
    let list = FileList::from_paths(&t.files).unwrap();
    let victim = &t.files[13];
    if is_root() {
        // Root ignores permission bits, so make it unreadable as a file
        // another way: replace it with a directory after listing.
        std::fs::remove_file(victim).unwrap();
        std::fs::create_dir(victim).unwrap();
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(victim, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let err = first_error(Loader::new(list, cfg()).unwrap());
    assert_names(&err, victim);
}

#[test]
fn file_removed_after_listing_surfaces_from_the_io_threads() {
    let t = Tree::new(&sizes(40));
    let list = FileList::from_paths(&t.files).unwrap();
    std::fs::remove_file(&t.files[29]).unwrap();
    let err = first_error(Loader::new(list, cfg()).unwrap());
    assert!(matches!(err, Error::Io { op: "open", .. }), "{err}");
    assert_names(&err, &t.files[29]);
}

#[test]
fn file_that_changed_size_is_reported() {
    let t = Tree::new(&sizes(10));
    let list = FileList::from_paths(&t.files).unwrap();
    std::fs::write(&t.files[4], b"short").unwrap();
    let err = first_error(Loader::new(list, cfg()).unwrap());
    assert!(matches!(err, Error::SizeChanged { actual: 5, .. }), "{err}");
    assert_names(&err, &t.files[4]);
}

#[test]
fn directory_given_as_a_file_is_rejected() {
    let t = Tree::new(&sizes(2));
    let err = FileList::from_paths([t.dir.clone()]).unwrap_err();
    assert!(matches!(err, Error::NotAFile { .. }));
    assert_names(&err, &t.dir);
}

#[test]
fn invalid_configs_are_rejected() {
    let t = Tree::new(&sizes(2));
    for c in [cfg().depth(1), cfg().io_threads(0), cfg().slot_bytes(0), cfg().shard(2, 2), cfg().batch_files(Some(0))] {
        assert!(matches!(Loader::from_dir(&t.dir, c), Err(Error::Config(_))));
    }
}

/// Links to directories that name the same ones by many paths (in each of 18 nested
/// directories `n`, a link `l -> n` beside it: 2^18 paths to one file, each path following
/// fewer links than the kernel's limit) end the walk with an error naming the directory,
/// after a bounded number of paths, instead of listing them all.
#[test]
fn a_walk_through_links_that_repeat_directories_is_bounded() {
    let t = Tree::new(&[]);
    let mut level = t.dir.join("root");
    std::fs::create_dir_all(&level).unwrap();
    for _ in 0..18 {
        std::fs::create_dir(level.join("n")).unwrap();
        std::os::unix::fs::symlink("n", level.join("l")).unwrap();
        level = level.join("n");
    }
    std::fs::write(level.join("x.bin"), b"x").unwrap();
    let root = t.dir.join("root");
    let err = FileList::from_dir(&root).unwrap_err();
    assert!(matches!(err, Error::TooManyPaths { budget: 65_536, .. }), "{err:?}");
    assert_names(&err, &root);
    assert!(err.to_string().contains("over and over"), "{err}");
    // A link that repeats a directory once is what ImageFolder follows.
    let small = Tree::new(&sizes(4));
    std::os::unix::fs::symlink(small.dir.join("d0"), small.dir.join("again")).unwrap();
    assert_eq!(FileList::from_dir(&small.dir).unwrap().len(), 8);
}
