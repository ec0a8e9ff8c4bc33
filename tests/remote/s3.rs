//! S3 against s3s-fs, which checks every SigV4 signature: staged and in-place mounts, credentials from the environment, a profile and instance metadata, every refusal with its exit code, shard sets from brace ranges and listings, and the saved index uploaded beside the object.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::PathBuf;

use super::proxy::{read_head, Server};
use super::servers::{base_env, s3_env, stagefs_with, ACCESS_KEY, S3, SECRET_KEY};
use super::{contents, make_tree, mount, mount_fails, mount_url};
use crate::kit::{osargs, pack_tar, pseudo_random, require_root, stagefs, Mounted, Scene, TempDir};

/// As root: s3s-fs, a directory, [`s3_env`] and in bucket `data` `train.tar` of a fresh tree.
fn s3_scene(name: &str) -> (S3, TempDir, Vec<(OsString, OsString)>, PathBuf) {
    require_root();
    let (s3, tmp) = (S3::start(name), TempDir::new(&format!("remote-s3-{name}")));
    let src = tmp.join("src");
    make_tree(&src);
    pack_tar(&src, &s3.bucket("data").join("train.tar"), &["."]);
    let env = s3_env(&tmp.join("cache"));
    (s3, tmp, env, src)
}

#[test]
fn s3_objects_mount_staged_and_in_place_and_the_uploaded_index_is_used() {
    let (s3, tmp, env, src) = s3_scene("mount");
    let url = "s3://data/train.tar";
    for stage in ["ram", "none"] {
        let mnt = mount_url(&env, &s3.args(&["--stage", stage]), url, &tmp.join(format!("mnt-{stage}")));
        assert_eq!(contents(&src), contents(mnt.path()), "--stage {stage}");
        let status = stagefs_with(&env, &["status"]);
        assert!(status.stdout.contains(url), "{}", status.describe());
        mnt.unmount().assert_success();
    }
    // The index saved beside the object, then used by a mount with an empty cache.
    let out = stagefs_with(&env, &s3.args(&["index", "--upload", url]));
    assert!(out.success() && out.stdout.contains("s3://data/train.tar.stagefs-index"), "{}", out.describe());
    assert!(s3.root.join("data/train.tar.stagefs-index").is_file());
    let mp = tmp.join("mnt-indexed");
    let out = mount(&s3_env(&tmp.join("cache-empty")), &s3.args(&["-v", "--stage", "none"]), url, &mp);
    assert!(out.success(), "{}", out.describe());
    let mnt = Mounted::adopt(url.as_ref(), &mp);
    assert!(out.stderr.contains("using the saved index s3://data/train.tar.stagefs-index"), "{}", out.describe());
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();
}

/// Wrong secret, no credentials, unsigned requests, a missing key and a missing bucket:
/// each a clear message and exit 3 (unreadable archive); secrets never printed.
#[test]
fn s3_refusals_say_why_with_exit_3_and_never_show_secrets() {
    let (s3, tmp, good, _) = s3_scene("errors");
    let mut wrong = base_env(&tmp.join("cache"));
    wrong.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()));
    wrong.push(("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into()));
    let said = ["access denied", "SignatureDoesNotMatch", "keys from AWS_ACCESS_KEY_ID", "endpoint http://127.0.0.1"];
    let err = mount_fails(&wrong, &s3.args(&[]), "s3://data/train.tar", 3, &said);
    assert!(!err.contains("not-the-secret") && !err.contains(SECRET_KEY));
    let unsigned = ["access denied", "no credentials found", "the requests were unsigned"];
    let (no_keys, none, no_sign) = (base_env(&tmp.join("cache")), s3.args(&[]), s3.args(&["--no-sign-request"]));
    for (env, extra, url, needles) in [
        (&no_keys, &none, "s3://data/train.tar", &unsigned[..]),
        (&good, &no_sign, "s3://data/train.tar", &["access denied", "--no-sign-request"]),
        (&good, &none, "s3://data/missing.tar", &["s3://data/missing.tar", "no such"]),
        (&good, &none, "s3://no-such-bucket/train.tar", &["no such"]),
        (&good, &none, "s3://data/nothing-*.tar", &["no object matches"]),
    ] {
        mount_fails(env, extra, url, 3, needles);
    }
    mount_fails(&good, &[], "http://example.org/x.tar", 2, &["--allow-http"]);
}

/// A brace range and a glob over the listing name the same three shards (the uploaded
/// index of one of them is no shard); the merged tree holds all their files.
#[test]
fn s3_shard_sets_from_brace_ranges_and_listings() {
    require_root();
    let s3 = S3::start("shards");
    let tmp = TempDir::new("remote-s3-shards");
    let bucket = s3.bucket("data");
    fs::create_dir_all(bucket.join("shards")).unwrap();
    let mut all = Vec::new();
    for i in 0..3 {
        let files = (0..5).map(|j| (format!("part{i}/{j}.bin"), pseudo_random(i * 10 + j, 10_000 + j as usize)));
        let shard = Scene::new("remote-s3-shard").files(files);
        shard.tar_at(&bucket.join(format!("shards/train-{i:06}.tar")));
        all.extend(contents(shard.src()));
    }
    all.sort();
    let env = s3_env(&tmp.join("cache"));
    let out = stagefs_with(&env, &s3.args(&["index", "--upload", "s3://data/shards/train-000000.tar"]));
    assert!(out.success(), "{}", out.describe());
    for spec in ["s3://data/shards/train-{000000..000002}.tar", "s3://data/shards/*.tar*"] {
        let mnt = mount_url(&env, &s3.args(&[]), spec, &tmp.join("mnt"));
        assert_eq!(all, contents(mnt.path()), "{spec}");
        let status = stagefs_with(&env, &["status"]);
        assert!(status.stdout.contains("(3 shards"), "{}", status.describe());
        mnt.unmount().assert_success();
    }
}

/// Credentials as users have them: a profile of the shared credentials file picked by
/// AWS_PROFILE, and an EC2 instance role from instance metadata (IMDSv2: a session token
/// first), served here by a small metadata server on 127.0.0.1. A profile named but not
/// there fails (never unsigned requests); a refusal names the file the keys came from.
#[test]
fn s3_credentials_from_a_profile_and_from_instance_metadata() {
    let (s3, tmp, _, src) = s3_scene("chain");
    let credentials = tmp.join("credentials");
    fs::write(
        &credentials,
        format!("[default]\naws_access_key_id = WRONG\naws_secret_access_key = wrong\n\n[lab]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"),
    )
    .unwrap();
    let mut env = base_env(&tmp.join("cache"));
    env.retain(|(k, _)| k != "AWS_SHARED_CREDENTIALS_FILE");
    env.push(("AWS_SHARED_CREDENTIALS_FILE".into(), credentials.clone().into()));
    let file = format!("profile default in $AWS_SHARED_CREDENTIALS_FILE={}", credentials.display());
    mount_fails(&env, &s3.args(&[]), "s3://data/train.tar", 3, &["access denied", &format!("keys from {file}")]);
    let mut mistyped = env.clone();
    mistyped.push(("AWS_PROFILE".into(), "nosuch".into()));
    let missing = [
        "profile nosuch (from AWS_PROFILE) not found in $AWS_CONFIG_FILE=/nonexistent or $AWS_SHARED_CREDENTIALS_FILE=",
        "the profiles there: default, lab",
    ];
    mount_fails(&mistyped, &s3.args(&[]), "s3://data/train.tar", 2, &missing);
    let missing = ["profile nosuch (from --profile) not found"];
    mount_fails(&env, &s3.args(&["--profile", "nosuch"]), "s3://data/train.tar", 2, &missing);
    env.push(("AWS_PROFILE".into(), "lab".into()));
    let mnt = mount_url(&env, &s3.args(&[]), "s3://data/train.tar", &tmp.join("mnt-profile"));
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();

    let imds = fake_instance_metadata();
    let mut env: Vec<(OsString, OsString)> = base_env(&tmp.join("cache"));
    env.retain(|(k, _)| k != "AWS_EC2_METADATA_DISABLED");
    env.push(("AWS_EC2_METADATA_SERVICE_ENDPOINT".into(), format!("http://127.0.0.1:{}", imds.port).into()));
    let mnt = mount_url(&env, &s3.args(&["--stage", "none"]), "s3://data/train.tar", &tmp.join("mnt-imds"));
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();
}

/// Answers IMDSv2 as EC2 does: PUT /latest/api/token, then the role's name and its
/// credentials (JSON) to requests that carry the token. Serves until the test ends.
fn fake_instance_metadata() -> Server {
    Server::start(|mut stream, _, _| {
        let Ok(Some(head)) = read_head(&mut stream) else { return };
        let head = String::from_utf8_lossy(&head);
        let request = head.lines().next().unwrap_or("");
        let token_ok = head.lines().any(|l| l.to_ascii_lowercase().starts_with("x-aws-ec2-metadata-token: test-token"));
        let path = request.split_whitespace().nth(1).unwrap_or("");
        let body = match (request.starts_with("PUT"), path, token_ok) {
            (true, "/latest/api/token", _) => "test-token".to_string(),
            (false, "/latest/meta-data/iam/security-credentials/", true) => "test-role".to_string(),
            (false, "/latest/meta-data/iam/security-credentials/test-role", true) => format!(
                r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"{ACCESS_KEY}","SecretAccessKey":"{SECRET_KEY}","Expiration":"2999-01-01T00:00:00Z"}}"#
            ),
            _ => {
                let _ =
                    stream.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return;
            }
        };
        let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    })
}

/// A `stagefs pack --compress zstd` archive in a store is read in place frame by frame
/// (`--stage none`) once its saved index is beside it (`stagefs index --upload`); without
/// one the refusal says how to make it, not that restart points need a whole decode.
#[test]
fn a_packed_zstd_object_is_read_in_place_from_its_saved_index() {
    require_root();
    let s3 = S3::start("packed-zstd");
    let tmp = TempDir::new("remote-packed-zstd");
    let src = tmp.join("src");
    make_tree(&src);
    let packed = s3.bucket("data").join("train.tar.zst");
    stagefs(osargs!["pack", "--compress", "zstd", src, packed]).assert_success();
    for local in fs::read_dir(s3.root.join("data")).unwrap().flatten() {
        if local.file_name().to_string_lossy().contains(".stagefs-index") {
            fs::remove_file(local.path()).unwrap(); // pack's own index is keyed to the local file
        }
    }
    let env = s3_env(&tmp.join("cache"));
    let url = "s3://data/train.tar.zst";
    mount_fails(&env, &s3.args(&["--stage", "none"]), url, 3, &["stagefs index --upload s3://data/train.tar.zst"]);
    let out = stagefs_with(&env, &s3.args(&["index", "--upload", url]));
    assert!(out.success(), "{}", out.describe());
    let fresh = s3_env(&tmp.join("cache-empty"));
    let mnt = mount_url(&fresh, &s3.args(&["--stage", "none"]), url, &tmp.join("mnt"));
    assert_eq!(contents(&src), contents(mnt.path()));
    let status = stagefs_with(&fresh, &["status", "--json"]);
    assert!(status.stdout.contains("\"staged_bytes\":0"), "read in place, nothing staged: {}", status.describe());
    mnt.unmount().assert_success();
}
