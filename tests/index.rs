//! The index at scale (issue 41): `stagefs ls` names every entry in one walk; the saved index mapped, checked block by block, and trusted only from its owner.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::kit::*;
use stagefs_archive::index::{tamper, SectionId};

/// `stagefs ls -R` of a GNU tar of 100,000 members lists exactly the names `tar -tf`
/// lists (once the path of every entry was searched for: 11.5 s at this size).
#[test]
fn ls_recursive_lists_what_tar_lists_for_100k_members() {
    let files = (0..100_000).map(|i| (format!("data/d{:03}/f{:04}.txt", i / 1000, i % 1000), b"x"));
    let scene = Scene::new("index-ls-100k").files(files);
    let archive = scene.tar();
    let tar_list = run_tool("tar", osargs!["-tf", archive]).stdout;
    let listed = stagefs(osargs!["ls", "-R", archive]).assert_success().stdout.clone();
    assert_eq!(listed.lines().count(), 100_101, "every member once");
    assert_eq!(sorted_lines(&listed), sorted_lines(&tar_list), "as tar -tf lists it");
}

/// Each hard link's name shows as itself in every form of `stagefs ls` (before, all showed the first name indexed).
#[test]
fn ls_shows_each_hard_link_under_its_own_name() {
    let scene = Scene::new("index-ls-hardlink").file("a/first", b"shared bytes").dir("z");
    fs::hard_link(scene.src().join("a/first"), scene.src().join("z/second")).unwrap();
    let archive = scene.tar();
    let ls = |args: &[&OsStr]| StagefsCmd::new(["ls"]).args(args).run().assert_success().stdout.clone();
    let a = archive.as_os_str();
    assert_eq!(sorted_lines(&ls(&[os("-R"), a])), ["a/", "a/first", "z/", "z/second"]);
    assert_eq!(ls(&[a, os("z")]).trim(), "z/second");
    assert_eq!(ls(&[a, os("z/second")]).trim(), "z/second");
    assert_eq!(ls(&[a, os("./a/../z//second")]).trim(), "z/second");
    let long = ls(&[os("-l"), a, os("z")]);
    assert!(long.trim().ends_with(" z/second") && long.starts_with("-rw"), "{long}");
    let json = ls(&[os("--json"), a, os("z/second")]);
    assert!(json.contains("\"path\":\"z/second\"") && json.contains("\"links\":2"), "{json}");
    let json = ls(&[os("--json"), os("-R"), a]);
    assert!(json.contains("\"path\":\"a/first\"") && json.contains("\"path\":\"z/second\""), "{json}");
}

/// What each file of a test tree holds: its content and its `user.k` xattr.
type Expected = BTreeMap<PathBuf, (Vec<u8>, Vec<u8>)>;

/// A tree of `dirs` × `per_dir` small files with a `user.k` xattr each, a symlink and a sparse
/// file, as a pax tar: every section of a saved index holds something. And what each file holds.
fn rich_tar(tmp: &TempDir, dirs: usize, per_dir: usize) -> (PathBuf, Expected) {
    let src = tmp.join("src");
    let mut expected = BTreeMap::new();
    for d in 0..dirs {
        fs::create_dir_all(src.join(format!("d{d:03}"))).unwrap();
        for f in 0..per_dir {
            let rel = PathBuf::from(format!("d{d:03}/f{f:04}.txt"));
            let (content, value) =
                (format!("content of {d}/{f}\n").into_bytes(), format!("value {d}/{f}").into_bytes());
            fs::write(src.join(&rel), &content).unwrap();
            set_xattr(&src.join(&rel), "user.k", &value).unwrap_or_else(|e| panic!("setxattr {}: {e}", rel.display()));
            expected.insert(rel, (content, value));
        }
    }
    std::os::unix::fs::symlink("d000/f0000.txt", src.join("link")).unwrap();
    std::os::unix::fs::FileExt::write_at(&fs::File::create(src.join("sparse.bin")).unwrap(), b"end", 10 << 20).unwrap();
    let archive = tmp.join("rich.tar");
    run_tool(
        "tar",
        osargs!["--format=posix", "--sparse", "--xattrs", "--xattrs-include=user.*", "-C", src, "-cf", archive, "."],
    );
    (archive, expected)
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let c = |s: &OsStr| std::ffi::CString::new(s.as_encoded_bytes()).unwrap();
    let (p, n) = (c(path.as_os_str()), c(OsStr::new(name)));
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of `buf.len()` bytes.
    let n = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(nix::errno::Errno::result(n)? as usize);
    Ok(buf)
}

/// How many reads (content, xattr) of the expected files gave EIO; panics on other errors or bytes not the archive's.
fn read_back(mnt: &Path, expected: &Expected) -> usize {
    let mut eio = 0;
    let mut seen = |result: std::io::Result<Vec<u8>>, want: &[u8], what: &Path| match result {
        Ok(got) => assert!(got == want, "{}: other bytes served", what.display()),
        Err(e) if e.raw_os_error() == Some(libc::EIO) => eio += 1,
        Err(e) => panic!("{}: {e} (only EIO may come of a damaged index)", what.display()),
    };
    for (rel, (content, value)) in expected {
        let path = mnt.join(rel);
        seen(fs::read(&path), content, &path);
        seen(get_xattr(&path, "user.k"), value, &path);
    }
    let mut sparse = vec![0u8; (10 << 20) + 3];
    sparse[10 << 20..].copy_from_slice(b"end");
    seen(fs::read(mnt.join("sparse.bin")), &sparse, &mnt.join("sparse.bin"));
    seen(fs::read(mnt.join("link")), &expected[Path::new("d000/f0000.txt")].0, &mnt.join("link"));
    eio
}

/// A byte flipped in each section of a saved index. The tree's sections, read in place and checked block by block,
/// fail only the damaged block's requests (EIO, logged naming the file and what the block holds); the mount stays up.
/// Those read whole at open (the summary, the tar's tables) make the mount ignore the file and scan the archive.
#[test]
fn damage_in_each_section_fails_what_it_holds() {
    let (tmp, mnt) = tmp_mnt("index-damage");
    let (archive, expected) = rich_tar(&tmp, 40, 100);
    stagefs(osargs!["index", archive]).assert_success();
    let index = archive.with_file_name("rich.tar.stagefs-index");
    let pristine = fs::read(&index).unwrap();
    let tree = [
        (SectionId::Inodes, "inodes"),
        (SectionId::Dirents, "directory entries"),
        (SectionId::Names, "names"),
        (SectionId::Xattrs, "extended attributes"),
        (SectionId::XattrOwners, "which inodes have extended attributes"),
    ];
    // A byte flipped in the middle of section `id`, and a mount of the archive beside it.
    let damaged_mount = |id: SectionId| {
        let range = tamper::section(&pristine, id);
        let mut damaged = pristine.clone();
        damaged[range.start + range.len() / 2] ^= 0x20;
        fs::write(&index, &damaged).unwrap();
        (range, Foreground::start(&archive, &mnt, &tmp.join(format!("{id:?}.log")), &[]))
    };
    for (id, what) in tree {
        let (range, fg) = damaged_mount(id);
        assert!(range.len() > 8, "{what}: an empty section in the test's index");
        assert!(read_back(&mnt, &expected) > 0, "{what}: the damaged block was never read");
        assert!(is_mounted(&mnt) && !stagefs_pids(&mnt).is_empty(), "{what}: the mount and its daemon stay up");
        let log = fg.finish();
        assert!(log.contains("using saved index"), "{what}: {log}");
        let named = format!("{}: block", index.display());
        assert!(log.contains(&named) && log.contains(&format!("holding {what}")), "{what}: {log}");
    }
    for id in [SectionId::Summary, SectionId::SparseFiles, SectionId::Extents, SectionId::Points, SectionId::Nested] {
        let (_, fg) = damaged_mount(id);
        assert_eq!(read_back(&mnt, &expected), 0, "{id:?}: served whole from a scan");
        let log = fg.finish();
        assert!(log.contains("ignoring saved index") && log.contains("damaged"), "{id:?}: {log}");
    }
}

/// Another user's index beside the victim's archive, even a sound one, is never mapped (by
/// `/proc/PID/maps`): neither as it lies, nor renamed over the victim's own.
#[test]
fn another_users_index_is_never_mapped() {
    let victim = User::get("sfs-mapvictim");
    let mallory = User::get("sfs-mallory");
    let project = TempDir::new("index-two-users");
    chmod(project.path(), 0o1777);
    let (archive, expected) = rich_tar(&project, 4, 50);
    victim.chown(&archive);
    chmod(&archive, 0o644);
    let index = archive.with_file_name("rich.tar.stagefs-index");
    // Mallory's copy of a sound index (made by the victim, then taken over).
    victim.stagefs(osargs!["index", archive]).assert_success();
    let sound = fs::read(&index).unwrap();
    let mnt = victim.fresh_mountpoint("mnt-index");
    let mounted_maps = |user: &User| {
        let stderr = user.stagefs(osargs!["mount", archive, mnt]).assert_success().stderr.clone();
        let pids = stagefs_pids(&mnt);
        let maps: String = pids.iter().map(|p| fs::read_to_string(format!("/proc/{p}/maps")).unwrap()).collect();
        let read = user.sh(&format!("cat {}/d000/f0000.txt", mnt.display()));
        assert_eq!(read.stdout.as_bytes(), expected[Path::new("d000/f0000.txt")].0.as_slice());
        user.stagefs(osargs!["umount", mnt]).assert_success();
        (stderr, maps)
    };
    let (_, maps) = mounted_maps(&victim);
    assert!(maps.contains(&index.display().to_string()), "the victim's own index is mapped:\n{maps}");
    plant(&index, &sound, &mallory, 0o644);
    let (log, maps) = mounted_maps(&victim);
    assert!(log.contains("ignoring saved index") && log.contains("sfs-mallory"), "{log}");
    assert!(!maps.contains("stagefs-index"), "another user's index was mapped:\n{maps}");
    // Swapped in by rename where the directory lets her (not sticky).
    chmod(project.path(), 0o777);
    fs::remove_file(&index).unwrap();
    victim.stagefs(osargs!["index", archive]).assert_success();
    let hers = project.join("hers.index");
    plant(&hers, &sound, &mallory, 0o644);
    mallory.sh(&format!("mv -f {} {}", hers.display(), index.display()));
    let (log, maps) = mounted_maps(&victim);
    assert!(log.contains("ignoring saved index") && log.contains("sfs-mallory"), "{log}");
    assert!(!maps.contains("stagefs-index"), "a swapped index was mapped:\n{maps}");
}

/// A set of plain tars opens from its own saved index: no shard's index is read (they are
/// deleted) and nothing merged; a shard changed since (its ctime) makes it merge and save anew.
#[test]
fn a_saved_set_opens_without_its_shards_indexes() {
    let (tmp, mnt) = tmp_mnt("index-set");
    let dir = tmp.join("shards");
    fs::create_dir_all(&dir).unwrap();
    for k in 0..12 {
        let files = (0..1000).map(|f| (format!("s{k:02}/f{f:04}"), format!("shard {k} file {f}\n")));
        let scene = Scene::new("index-set-src").files(files).file("shared.txt", format!("from shard {k}\n"));
        scene.tar_at(&dir.join(format!("train-{k:02}.tar")));
    }
    let indexes = tmp.join("indexes");
    let glob = dir.join("train-*.tar");
    // A mount of the set, checked; its log.
    let mount = |name: &str| {
        let log = tmp.join(format!("{name}.log"));
        let fg = Foreground::start_with(&["--index-dir", indexes.to_str().unwrap()], &glob, &mnt, &log, &[]);
        assert_eq!(fs::read(mnt.join("shared.txt")).unwrap(), b"from shard 11\n", "the later shard wins");
        assert_eq!(fs::read(mnt.join("s03/f0999")).unwrap(), b"shard 3 file 999\n");
        assert_eq!(fs::read_dir(mnt.join("s07")).unwrap().count(), 1000);
        fg.finish()
    };
    let log = mount("first");
    assert!(log.contains("saved the set's index"), "{log}");
    for name in file_names(&indexes).iter().filter(|name| !name.contains("-set-")) {
        fs::remove_file(indexes.join(name)).unwrap(); // the shards' own indexes
    }
    let log = mount("second");
    assert!(log.contains("using the set's saved index") && !log.contains("merged"), "{log}");
    std::process::Command::new("touch").arg(dir.join("train-05.tar")).status().unwrap();
    let log = mount("third");
    assert!(log.contains("ignoring the set's saved index") && log.contains("saved the set's index"), "{log}");
}

/// The saved index of a mount, truncated or rewritten underneath: requests fail with EIO (the
/// file named), never SIGBUS or other bytes; a remount serves everything again.
#[test]
fn an_index_truncated_or_rewritten_while_mapped_gives_errors() {
    let (tmp, mnt) = tmp_mnt("index-torn");
    let (archive, expected) = rich_tar(&tmp, 20, 100);
    stagefs(osargs!["index", archive]).assert_success();
    let index = archive.with_file_name("rich.tar.stagefs-index");
    let pristine = fs::read(&index).unwrap();
    for (case, change) in [("truncated", 0usize), ("rewritten", 1)] {
        fs::write(&index, &pristine).unwrap();
        let fg = Foreground::start(&archive, &mnt, &tmp.join(format!("{case}.log")), &[]);
        assert_eq!(fs::read(mnt.join("d000/f0000.txt")).unwrap(), expected[Path::new("d000/f0000.txt")].0);
        let file = fs::OpenOptions::new().write(true).open(&index).unwrap();
        match change {
            0 => file.set_len(4096).unwrap(),
            _ => std::os::unix::fs::FileExt::write_all_at(&file, b"rewritten", pristine.len() as u64 / 2).unwrap(),
        }
        drop(file);
        assert!(read_back(&mnt, &expected) > 0, "{case}: every request was served from an index changed underneath");
        assert!(is_mounted(&mnt) && !stagefs_pids(&mnt).is_empty(), "{case}: the daemon lives on");
        let log = fg.finish();
        let named = index.display().to_string();
        assert!(log.contains("truncated or rewritten while in use") && log.contains(&named), "{case}: {log}");
    }
    // The damaged file is no index any more (cut short), or another version of one
    // (rewritten): a remount ignores or uses it soundly, and serves every byte.
    fs::write(&index, &pristine[..4096]).unwrap();
    let fg = Foreground::start(&archive, &mnt, &tmp.join("after.log"), &[]);
    assert_eq!(read_back(&mnt, &expected), 0);
    fg.finish();
}
