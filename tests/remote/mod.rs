//! Archives in object storage: `stagefs mount` of `http://` (nginx) and `s3://` (s3s-fs) URLs for every format, staged and in place, compared with what GNU tar, unzip and unsquashfs extract; faults from a misbehaving proxy; errors that name their cause at once; S3 credentials, errors, listings and saved indexes beside the object; secrets kept out of logs.

mod cluster;
mod errors;
mod faults;
mod formats;
mod proxy;
mod s3;
mod secrets;
mod servers;
mod status;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::kit::{is_mounted, pseudo_random, require_root, CmdOutput, Mounted, Scene, TempDir};
use servers::base_env;
pub use servers::{command_with, stagefs_with, Env};

/// A tree with directories, files of several sizes (some compressible), a symlink and an
/// executable, all with the same mtime (zip keeps no sub-second times).
pub fn make_tree(src: &Path) {
    fs::create_dir_all(src.join("train/cats")).unwrap();
    fs::create_dir_all(src.join("train/dogs")).unwrap();
    fs::create_dir_all(src.join("empty")).unwrap();
    for i in 0..40u64 {
        let class = if i % 2 == 0 { "cats" } else { "dogs" };
        let size = (i as usize * 7919) % 150_000 + 1;
        fs::write(src.join(format!("train/{class}/{i:03}.jpg")), pseudo_random(i, size)).unwrap();
    }
    let text: Vec<u8> = (0..300_000u32).flat_map(|i| format!("token {i}\n").into_bytes()).collect();
    fs::write(src.join("train/labels.txt"), text).unwrap();
    fs::write(src.join("big.bin"), pseudo_random(99, 3 << 20)).unwrap();
    fs::write(src.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    symlink("train/labels.txt", src.join("labels")).unwrap();
    Command::new("find").arg(src).args(["-exec", "touch", "-h", "-d", "@1700000000", "{}", "+"]).status().unwrap();
}

/// A test's directory (as root) and [`base_env`] with the index cache in it.
pub fn scene(name: &str) -> (TempDir, Vec<(OsString, OsString)>) {
    require_root();
    let tmp = TempDir::new(name);
    let env = base_env(&tmp.join("cache"));
    (tmp, env)
}

/// `stagefs mount EXTRA URL MP` with `env`.
pub fn mount(env: &Env, extra: &[&str], url: &str, mp: &Path) -> CmdOutput {
    stagefs_with(env, &[&["mount"], extra, &[url, mp.to_str().unwrap()]].concat())
}

/// Mounts `url` with `env` and `extra` options at `mp`; panics with stagefs's output if
/// it fails. The guard unmounts on drop.
pub fn mount_url(env: &Env, extra: &[&str], url: &str, mp: &Path) -> Mounted {
    let out = mount(env, extra, url, mp);
    assert!(out.success(), "stagefs mount {url} failed:\n{}", out.describe());
    assert!(is_mounted(mp), "exit 0 but nothing mounted at {}", mp.display());
    Mounted::adopt(Path::new(url), mp)
}

/// A mount that must fail with `code`, its stderr containing each of `needles`; never
/// leaves a mount behind. Returns stderr.
pub fn mount_fails(env: &Env, extra: &[&str], url: &str, code: i32, needles: &[&str]) -> String {
    let tmp = TempDir::new("remote-fails");
    let mp = tmp.join("mnt");
    mount(env, extra, url, &mp).assert_mount_failed(&mp, code, needles).stderr.clone()
}

/// A tar at `archive` of one file, `a.txt` holding "hello\n".
pub fn hello_tar(archive: &Path) {
    Scene::new("hello-tar").file("a.txt", "hello\n").tar_dot_at(archive);
}

/// The files of a tree, relative path and bytes (or link target), sorted: a comparison
/// that needs no owner or mode rules (the format tests use `compare` for those).
pub fn contents(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if meta.is_dir() {
                stack.push(path);
                out.push((rel, b"<dir>".to_vec()));
            } else if meta.file_type().is_symlink() {
                out.push((rel, fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()));
            } else {
                out.push((rel, fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))));
            }
        }
    }
    out.sort();
    out
}
