//! S3 against s3s-fs, which checks every SigV4 signature: staged and in-place mounts, credentials from the environment, a profile and instance metadata, every refusal with its exit code, shard sets from brace ranges and listings, and the saved index uploaded beside the object.

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;

use super::servers::{base_env, s3_env, stagefs_with, ACCESS_KEY, S3, SECRET_KEY};
use super::{contents, make_tree, mount_fails, mount_url};
use crate::kit::{pack_tar, require_root, TempDir};

/// A bucket `data` holding `train.tar` of a fresh tree; returns the tree.
fn bucket_with_tar(s3: &S3, tmp: &TempDir) -> std::path::PathBuf {
    let src = tmp.join("src");
    make_tree(&src);
    pack_tar(&src, &s3.bucket("data").join("train.tar"), &["."]);
    src
}

fn endpoint(s3: &S3) -> Vec<String> {
    vec!["--endpoint-url".into(), s3.endpoint()]
}

fn args<'a>(owned: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    owned.iter().map(String::as_str).chain(more.iter().copied()).collect()
}

#[test]
fn s3_objects_mount_staged_and_in_place_and_the_uploaded_index_is_used() {
    require_root();
    let s3 = S3::start("mount");
    let tmp = TempDir::new("remote-s3");
    let src = bucket_with_tar(&s3, &tmp);
    let env = s3_env(&tmp.join("cache"));
    let e = endpoint(&s3);
    for stage in ["ram", "none"] {
        let mnt =
            mount_url(&env, &args(&e, &["--stage", stage]), "s3://data/train.tar", &tmp.join(format!("mnt-{stage}")));
        assert_eq!(contents(&src), contents(mnt.path()), "--stage {stage}");
        let status = stagefs_with(&env, &["status"]);
        assert!(status.stdout.contains("s3://data/train.tar"), "{}", status.describe());
        mnt.unmount().assert_success();
    }
    // The index saved beside the object, then used by a mount with an empty cache.
    let out = stagefs_with(&env, &[&["index", "--upload", "s3://data/train.tar"][..], &args(&e, &[])].concat());
    assert!(out.success() && out.stdout.contains("s3://data/train.tar.stagefs-index"), "{}", out.describe());
    assert!(s3.root.join("data/train.tar.stagefs-index").is_file());
    let fresh = s3_env(&tmp.join("cache-empty"));
    let mp = tmp.join("mnt-indexed");
    let mount = ["mount", "-v", "--stage", "none", "s3://data/train.tar", mp.to_str().unwrap()];
    let out = stagefs_with(&fresh, &[&mount[..1], &args(&e, &mount[1..])].concat());
    assert!(out.success(), "{}", out.describe());
    let mnt = crate::kit::Mounted::adopt(Path::new("s3://data/train.tar"), &mp);
    assert!(out.stderr.contains("using the saved index s3://data/train.tar.stagefs-index"), "{}", out.describe());
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();
}

/// Wrong secret, no credentials, unsigned requests, a missing key and a missing bucket:
/// each a clear message and exit 3 (unreadable archive); secrets never printed.
#[test]
fn s3_refusals_say_why_with_exit_3_and_never_show_secrets() {
    require_root();
    let s3 = S3::start("errors");
    let tmp = TempDir::new("remote-s3-errors");
    bucket_with_tar(&s3, &tmp);
    let e = endpoint(&s3);
    let good = s3_env(&tmp.join("cache"));
    let mut wrong = base_env(&tmp.join("cache"));
    wrong.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()));
    wrong.push(("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into()));
    let said = ["access denied", "SignatureDoesNotMatch", "keys from AWS_ACCESS_KEY_ID", "endpoint http://127.0.0.1"];
    let err = mount_fails(&wrong, &args(&e, &[]), "s3://data/train.tar", 3, &said);
    assert!(!err.contains("not-the-secret") && !err.contains(SECRET_KEY));
    let unsigned = ["access denied", "no credentials found", "the requests were unsigned"];
    mount_fails(&base_env(&tmp.join("cache")), &args(&e, &[]), "s3://data/train.tar", 3, &unsigned);
    mount_fails(
        &good,
        &args(&e, &["--no-sign-request"]),
        "s3://data/train.tar",
        3,
        &["access denied", "--no-sign-request"],
    );
    mount_fails(&good, &args(&e, &[]), "s3://data/missing.tar", 3, &["s3://data/missing.tar", "no such"]);
    mount_fails(&good, &args(&e, &[]), "s3://no-such-bucket/train.tar", 3, &["no such"]);
    mount_fails(&good, &args(&e, &[]), "s3://data/nothing-*.tar", 3, &["no object matches"]);
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
    let all = tmp.join("all");
    for i in 0..3 {
        let src = tmp.join(format!("src{i}"));
        fs::create_dir_all(src.join(format!("part{i}"))).unwrap();
        for j in 0..5 {
            let bytes = crate::kit::pseudo_random(i * 10 + j, 10_000 + j as usize);
            fs::write(src.join(format!("part{i}/{j}.bin")), &bytes).unwrap();
            fs::create_dir_all(all.join(format!("part{i}"))).unwrap();
            fs::write(all.join(format!("part{i}/{j}.bin")), &bytes).unwrap();
        }
        pack_tar(&src, &bucket.join(format!("shards/train-{i:06}.tar")), &[&format!("part{i}")]);
    }
    let env = s3_env(&tmp.join("cache"));
    let e = endpoint(&s3);
    let out =
        stagefs_with(&env, &[&["index", "--upload", "s3://data/shards/train-000000.tar"][..], &args(&e, &[])].concat());
    assert!(out.success(), "{}", out.describe());
    for spec in ["s3://data/shards/train-{000000..000002}.tar", "s3://data/shards/*.tar*"] {
        let mnt = mount_url(&env, &args(&e, &[]), spec, &tmp.join("mnt"));
        assert_eq!(contents(&all), contents(mnt.path()), "{spec}");
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
    require_root();
    let s3 = S3::start("chain");
    let tmp = TempDir::new("remote-s3-chain");
    let src = bucket_with_tar(&s3, &tmp);
    let e = endpoint(&s3);
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
    mount_fails(&env, &args(&e, &[]), "s3://data/train.tar", 3, &["access denied", &format!("keys from {file}")]);
    let mut mistyped = env.clone();
    mistyped.push(("AWS_PROFILE".into(), "nosuch".into()));
    let missing = [
        "profile nosuch (from AWS_PROFILE) not found in $AWS_CONFIG_FILE=/nonexistent or $AWS_SHARED_CREDENTIALS_FILE=",
        "the profiles there: default, lab",
    ];
    mount_fails(&mistyped, &args(&e, &[]), "s3://data/train.tar", 2, &missing);
    let missing = ["profile nosuch (from --profile) not found"];
    mount_fails(&env, &args(&e, &["--profile", "nosuch"]), "s3://data/train.tar", 2, &missing);
    env.push(("AWS_PROFILE".into(), "lab".into()));
    let mnt = mount_url(&env, &args(&e, &[]), "s3://data/train.tar", &tmp.join("mnt-profile"));
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();

    let imds = fake_instance_metadata();
    let mut env: Vec<(OsString, OsString)> = base_env(&tmp.join("cache"));
    env.retain(|(k, _)| k != "AWS_EC2_METADATA_DISABLED");
    env.push(("AWS_EC2_METADATA_SERVICE_ENDPOINT".into(), format!("http://127.0.0.1:{imds}").into()));
    let mnt = mount_url(&env, &args(&e, &["--stage", "none"]), "s3://data/train.tar", &tmp.join("mnt-imds"));
    assert_eq!(contents(&src), contents(mnt.path()));
    mnt.unmount().assert_success();
}

/// Answers IMDSv2 as EC2 does: PUT /latest/api/token, then the role's name and its
/// credentials (JSON) to requests that carry the token. Serves until the test ends.
fn fake_instance_metadata() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(200) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            let mut token_ok = false;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                token_ok |= line.to_ascii_lowercase().starts_with("x-aws-ec2-metadata-token: test-token");
            }
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let body = match (request.starts_with("PUT"), path, token_ok) {
                (true, "/latest/api/token", _) => "test-token".to_string(),
                (false, "/latest/meta-data/iam/security-credentials/", true) => "test-role".to_string(),
                (false, "/latest/meta-data/iam/security-credentials/test-role", true) => format!(
                    r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"{ACCESS_KEY}","SecretAccessKey":"{SECRET_KEY}","Expiration":"2999-01-01T00:00:00Z"}}"#
                ),
                _ => {
                    let _ = stream
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    continue;
                }
            };
            let _ =
                write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    port
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
    let pack = crate::kit::stagefs([
        "pack".as_ref(),
        "--compress".as_ref(),
        "zstd".as_ref(),
        src.as_os_str(),
        packed.as_os_str(),
    ]);
    pack.assert_success();
    for local in fs::read_dir(s3.root.join("data")).unwrap().flatten() {
        if local.file_name().to_string_lossy().contains(".stagefs-index") {
            fs::remove_file(local.path()).unwrap(); // pack's own index is keyed to the local file
        }
    }
    let env = s3_env(&tmp.join("cache"));
    let e = endpoint(&s3);
    let url = "s3://data/train.tar.zst";
    mount_fails(&env, &args(&e, &["--stage", "none"]), url, 3, &["stagefs index --upload s3://data/train.tar.zst"]);
    let out = stagefs_with(&env, &[&["index", "--upload", url][..], &args(&e, &[])].concat());
    assert!(out.success(), "{}", out.describe());
    let fresh = s3_env(&tmp.join("cache-empty"));
    let mnt = mount_url(&fresh, &args(&e, &["--stage", "none"]), url, &tmp.join("mnt"));
    assert_eq!(contents(&src), contents(mnt.path()));
    let status = stagefs_with(&fresh, &["status", "--json"]);
    assert!(status.stdout.contains("\"staged_bytes\":0"), "read in place, nothing staged: {}", status.describe());
    mnt.unmount().assert_success();
}
