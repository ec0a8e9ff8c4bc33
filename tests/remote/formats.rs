//! Every format stagefs mounts, served by nginx over http:// and mounted from its URL (staged in RAM, on the local disk, and in place by ranges), compared entry by entry with what GNU tar, unzip and unsquashfs extract.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::servers::Nginx;
use super::{make_tree, mount_fails, mount_url, scene, stagefs_with, Env};
use crate::compare::{assert_trees_equal, Options};
use crate::kit::Mounted;
use crate::kit::{extract_squashfs, extract_tar, osargs, pack_tar, require_tool, run_cmd, run_cmd_into, run_tool};

/// The archives of one tree in nginx's root, each with the tool that extracts it for reference.
const ARCHIVES: [(&str, &str); 8] = [
    ("data.tar", "tar"),
    ("data.tar.gz", "tar"),
    ("data.tar.bz2", "tar"),
    ("data.tar.xz", "tar"),
    ("data.tar.zst", "tar"),
    ("data.tar.lz4", "tar"),
    ("data.zip", "unzip"),
    ("data.sqsh", "unsquashfs"),
];

/// Makes `dir/src` and every archive of [`ARCHIVES`] of it in `www`.
fn make_archives(dir: &Path, www: &Path) {
    let src = dir.join("src");
    make_tree(&src);
    let tar = www.join("data.tar");
    pack_tar(&src, &tar, &["."]);
    let compress = |tool: &str, args: &[&str], out: &str| {
        let file = fs::File::create(www.join(out)).unwrap();
        let mut cmd = Command::new(require_tool(tool));
        cmd.args(args).arg(&tar);
        run_cmd_into(&mut cmd, Duration::from_secs(120), Some(file)).assert_success();
    };
    compress("gzip", &["-c"], "data.tar.gz");
    compress("bzip2", &["-c"], "data.tar.bz2");
    compress("xz", &["-c"], "data.tar.xz");
    compress("zstd", &["-q", "-c"], "data.tar.zst");
    compress("lz4", &["-q", "-c"], "data.tar.lz4");
    let mut cmd = Command::new(require_tool("zip"));
    cmd.current_dir(&src).args(["-q", "-r", "-y", "-X"]).arg(www.join("data.zip")).arg(".");
    run_cmd(&mut cmd, Duration::from_secs(120)).assert_success();
    let sqfs = www.join("data.sqsh");
    run_tool("mksquashfs", osargs![src, sqfs, "-no-progress", "-quiet", "-no-xattrs", "-comp", "zstd"]);
}

/// What the extracting `tool` makes of the archives (compressed tars: of the plain tar).
fn reference(dir: &Path, www: &Path, tool: &str) -> PathBuf {
    let expected = dir.join(format!("expected-{tool}"));
    if expected.exists() {
        return expected;
    }
    match tool {
        "tar" => extract_tar(&www.join("data.tar"), &expected),
        "unzip" => {
            fs::create_dir_all(&expected).unwrap();
            let mut cmd = Command::new(require_tool("unzip"));
            cmd.current_dir(&expected).env("TZ", "UTC").arg("-q").arg(www.join("data.zip"));
            run_cmd(&mut cmd, Duration::from_secs(120)).assert_success();
            // unzip gives symlinks the time of extraction; the archive has the source's.
            Command::new("touch").args(["-h", "-d", "@1700000000"]).arg(expected.join("labels")).status().unwrap();
        }
        _ => extract_squashfs(&www.join("data.sqsh"), &expected),
    }
    expected
}

/// `name` from nginx mounted with `opts` at `dir/mnt-NAME`, which must match what `tool`
/// extracts (to the second for unzip, which keeps no sub-second times).
fn mount_matching(env: &Env, nginx: &Nginx, dir: &Path, (name, tool): (&str, &str), opts: &[&str]) -> Mounted {
    let expected = reference(dir, &nginx.root, tool);
    let mnt = mount_url(env, opts, &nginx.url(name), &dir.join(format!("mnt-{name}")));
    assert_trees_equal(&expected, mnt.path(), &Options::default().root(false).xattrs(false).nanos(tool != "unzip"));
    mnt
}

/// Staged (the default: fetched into RAM), every format matches its extraction, and the
/// object's bytes crossed the network once (the access log's byte count: the object,
/// plus the one byte of the first request that pins its version).
#[test]
fn every_format_over_http_staged_matches_the_extracting_tools_fetched_once() {
    let (tmp, env) = scene("remote-formats");
    let nginx = Nginx::start("formats");
    make_archives(tmp.path(), &nginx.root);
    for (name, tool) in ARCHIVES {
        mount_matching(&env, &nginx, tmp.path(), (name, tool), &["--stage", "auto"]).unmount().assert_success();
        let size = fs::metadata(nginx.root.join(name)).unwrap().len();
        assert_eq!(nginx.bytes_sent(&format!("/{name}")), size + 1, "{name}: fetched once");
    }
}

/// In place (`--stage none`): a tar (indexed from a stream of the object), a zip (its
/// directory fetched) and a SquashFS image (its tables fetched) read by ranges; and a
/// compressed tar staged to the local disk, served compressed from there.
#[test]
fn tar_zip_squashfs_in_place_and_a_compressed_tar_on_disk_match() {
    let (tmp, env) = scene("remote-in-place");
    let nginx = Nginx::start("in-place");
    make_archives(tmp.path(), &nginx.root);
    for archive in ARCHIVES.into_iter().filter(|(name, _)| ["data.tar", "data.zip", "data.sqsh"].contains(name)) {
        mount_matching(&env, &nginx, tmp.path(), archive, &["--stage", "none"]).unmount().assert_success();
    }
    let stage_dir = tmp.join("local-disk");
    fs::create_dir_all(&stage_dir).unwrap();
    let on_disk = ["--stage", "disk", "--stage-dir", stage_dir.to_str().unwrap()];
    let mnt = mount_matching(&env, &nginx, tmp.path(), ("data.tar.gz", "tar"), &on_disk);
    let status = stagefs_with(&env, &["status"]);
    assert!(status.stdout.contains("staged to the local disk"), "{}", status.describe());
    mnt.unmount().assert_success();
    let compressed_in_place = mount_fails(&env, &["--stage", "none"], &nginx.url("data.tar.xz"), 3, &["compressed"]);
    assert!(compressed_in_place.contains("--stage ram or disk"), "{compressed_in_place}");
}
