//! The index at scale (issue 41): `stagefs ls` names every entry as the archive does, in one walk.

use std::ffi::OsStr;
use std::fs;

use crate::util::*;

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `text`'s lines, sorted.
fn sorted(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

/// `stagefs ls -R` of a GNU tar of 100,000 members lists exactly the names `tar -tf`
/// lists (once the path of every entry was searched for: 11.5 s at this size).
#[test]
fn ls_recursive_lists_what_tar_lists_for_100k_members() {
    let tmp = TempDir::new("index-ls-100k");
    let src = tmp.join("src");
    for d in 0..100 {
        let dir = src.join(format!("data/d{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..1000 {
            fs::write(dir.join(format!("f{f:04}.txt")), b"x").unwrap();
        }
    }
    let archive = tmp.join("big.tar");
    pack_tar(&src, &archive, &["data"]);
    let tar_list = run_tool("tar", [os("-tf"), archive.as_os_str()]).stdout;
    let listed = stagefs([os("ls"), os("-R"), archive.as_os_str()]);
    listed.assert_success();
    assert_eq!(listed.stdout.lines().count(), 100_101, "every member once");
    assert_eq!(sorted(&listed.stdout), sorted(&tar_list), "as tar -tf lists it");
}

/// Each name of a hard-linked file shows as itself, in every form of `stagefs ls` (before,
/// both showed the first name the index held for the inode).
#[test]
fn ls_shows_each_hard_link_under_its_own_name() {
    let tmp = TempDir::new("index-ls-hardlink");
    let src = tmp.join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("z")).unwrap();
    fs::write(src.join("a/first"), b"shared bytes").unwrap();
    fs::hard_link(src.join("a/first"), src.join("z/second")).unwrap();
    let archive = tmp.join("links.tar");
    pack_tar(&src, &archive, &["a", "z"]);
    let ls = |args: &[&OsStr]| {
        let mut all = vec![os("ls")];
        all.extend_from_slice(args);
        let out = stagefs(&all);
        out.assert_success();
        out.stdout
    };
    let a = archive.as_os_str();
    assert_eq!(sorted(&ls(&[os("-R"), a])), ["a/", "a/first", "z/", "z/second"]);
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
