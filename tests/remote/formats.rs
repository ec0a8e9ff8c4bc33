//! Every format stagefs mounts, served by nginx over http:// and mounted from its URL (staged in RAM, on the local disk, and in place by ranges), compared entry by entry with what GNU tar, unzip and unsquashfs extract.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::servers::{base_env, Nginx};
use super::{make_tree, mount_url};
use crate::compare::{assert_trees_equal, Options};
use crate::kit::{extract_squashfs, extract_tar, require_root, require_tool, run_cmd, run_tool, TempDir};

/// The archives of one tree, each with how to extract it for reference.
struct Made {
    name: &'static str,
    reference: &'static str,
}

/// Makes `dir/src` and every archive of it in `www`.
fn make_archives(dir: &Path, www: &Path) -> Vec<Made> {
    let src = dir.join("src");
    make_tree(&src);
    let tar = www.join("data.tar");
    run_tool(
        "tar",
        [
            OsStr::new("--format=gnu"),
            OsStr::new("-C"),
            src.as_os_str(),
            OsStr::new("-cf"),
            tar.as_os_str(),
            OsStr::new("."),
        ],
    );
    let compress = |tool: &str, args: &[&str], out: &str| {
        let file = fs::File::create(www.join(out)).unwrap();
        let mut cmd = Command::new(require_tool(tool));
        cmd.args(args).arg(&tar);
        let done = crate::kit::run_cmd_into(&mut cmd, Duration::from_secs(120), Some(file));
        assert!(done.success(), "{tool} failed:\n{}", done.describe());
    };
    compress("gzip", &["-c"], "data.tar.gz");
    compress("bzip2", &["-c"], "data.tar.bz2");
    compress("xz", &["-c"], "data.tar.xz");
    compress("zstd", &["-q", "-c"], "data.tar.zst");
    compress("lz4", &["-q", "-c"], "data.tar.lz4");
    let zip = www.join("data.zip");
    let mut cmd = Command::new(require_tool("zip"));
    cmd.current_dir(&src).args(["-q", "-r", "-y", "-X"]).arg(&zip).arg(".");
    let out = run_cmd(&mut cmd, Duration::from_secs(120));
    assert!(out.success(), "zip failed:\n{}", out.describe());
    let sqfs = www.join("data.sqsh");
    run_tool(
        "mksquashfs",
        [
            src.as_os_str(),
            sqfs.as_os_str(),
            OsStr::new("-no-progress"),
            OsStr::new("-quiet"),
            OsStr::new("-no-xattrs"),
            OsStr::new("-comp"),
            OsStr::new("zstd"),
        ],
    );
    let tars = ["data.tar", "data.tar.gz", "data.tar.bz2", "data.tar.xz", "data.tar.zst", "data.tar.lz4"];
    let mut made: Vec<Made> = tars.iter().map(|name| Made { name, reference: "tar" }).collect();
    made.push(Made { name: "data.zip", reference: "unzip" });
    made.push(Made { name: "data.sqsh", reference: "unsquashfs" });
    made
}

/// What the extracting tool makes of `archive` (compressed tars: of the plain tar).
fn reference(dir: &Path, www: &Path, made: &Made) -> std::path::PathBuf {
    let expected = dir.join(format!("expected-{}", made.reference));
    if expected.exists() {
        return expected;
    }
    match made.reference {
        "tar" => extract_tar(&www.join("data.tar"), &expected),
        "unzip" => {
            fs::create_dir_all(&expected).unwrap();
            let mut cmd = Command::new(require_tool("unzip"));
            cmd.current_dir(&expected).env("TZ", "UTC").arg("-q").arg(www.join("data.zip"));
            let out = run_cmd(&mut cmd, Duration::from_secs(120));
            assert!(out.success(), "unzip failed:\n{}", out.describe());
            // unzip gives symlinks the time of extraction; the archive has the source's.
            Command::new("touch").args(["-h", "-d", "@1700000000"]).arg(expected.join("labels")).status().unwrap();
        }
        _ => extract_squashfs(&www.join("data.sqsh"), &expected),
    }
    expected
}

fn options(made: &Made) -> Options {
    let opts = Options::default().root(false).xattrs(false);
    match made.reference {
        "unzip" => opts.nanos(false),
        _ => opts,
    }
}

/// Staged (the default: fetched into RAM), every format matches its extraction, and the
/// object's bytes crossed the network once (the access log's byte count: the object,
/// plus the one byte of the first request that pins its version).
#[test]
fn every_format_over_http_staged_matches_the_extracting_tools_fetched_once() {
    require_root();
    let nginx = Nginx::start("formats");
    let tmp = TempDir::new("remote-formats");
    let made = make_archives(tmp.path(), &nginx.root);
    let env = base_env(&tmp.join("cache"));
    for m in &made {
        let expected = reference(tmp.path(), &nginx.root, m);
        let mp = tmp.join(format!("mnt-{}", m.name));
        let mnt = mount_url(&env, &["--stage", "auto"], &nginx.url(m.name), &mp);
        assert_trees_equal(&expected, mnt.path(), &options(m));
        mnt.unmount().assert_success();
        let size = fs::metadata(nginx.root.join(m.name)).unwrap().len();
        assert_eq!(nginx.bytes_sent(&format!("/{}", m.name)), size + 1, "{}: fetched once", m.name);
    }
}

/// In place (`--stage none`): a tar (indexed from a stream of the object), a zip (its
/// directory fetched) and a SquashFS image (its tables fetched) read by ranges; and a
/// compressed tar staged to the local disk, served compressed from there.
#[test]
fn tar_zip_squashfs_in_place_and_a_compressed_tar_on_disk_match() {
    require_root();
    let nginx = Nginx::start("in-place");
    let tmp = TempDir::new("remote-in-place");
    let made = make_archives(tmp.path(), &nginx.root);
    let env = base_env(&tmp.join("cache"));
    for m in made.iter().filter(|m| ["data.tar", "data.zip", "data.sqsh"].contains(&m.name)) {
        let expected = reference(tmp.path(), &nginx.root, m);
        let mp = tmp.join(format!("mnt-{}", m.name));
        let mnt = mount_url(&env, &["--stage", "none"], &nginx.url(m.name), &mp);
        assert_trees_equal(&expected, mnt.path(), &options(m));
        mnt.unmount().assert_success();
    }
    let gz = made.iter().find(|m| m.name == "data.tar.gz").unwrap();
    let expected = reference(tmp.path(), &nginx.root, gz);
    let stage_dir = tmp.join("local-disk");
    fs::create_dir_all(&stage_dir).unwrap();
    let mnt = mount_url(
        &env,
        &["--stage", "disk", "--stage-dir", stage_dir.to_str().unwrap()],
        &nginx.url(gz.name),
        &tmp.join("mnt-disk"),
    );
    assert_trees_equal(&expected, mnt.path(), &options(gz));
    let status = super::stagefs_with(&env, &["status"]);
    assert!(status.stdout.contains("staged to the local disk"), "{}", status.describe());
    mnt.unmount().assert_success();
    let compressed_in_place =
        super::mount_fails(&env, &["--stage", "none"], &nginx.url("data.tar.xz"), 3, &["compressed"]);
    assert!(compressed_in_place.contains("--stage ram or disk"), "{compressed_in_place}");
}
