//! Secrets never reach a log: mounts at `-vvv` (trace), with `RUST_LOG` asking for the HTTP and TLS crates' request dumps, over HTTPS with a URL's password and a bearer token file, and over S3 with a session token; the foreground stderr and the `--log-file` are searched for every piece of each secret.

use std::ffi::OsString;
use std::fs;
use std::process::Stdio;
use std::time::Duration;

use super::servers::{s3_env, Nginx, BASIC_PASSWORD, BASIC_USER, S3, SECRET_KEY};
use super::{command_with, hello_tar, mount_url, scene, stagefs_with};
use crate::kit::{chmod, is_mounted, wait_timeout, wait_until, KillOnDrop};

const TOKEN: &str = "tk9d1f2e7aQx4Lm8Wb";
const SESSION_TOKEN: &str = "ss4b8c6e0dZp7Rw2Kq";
const SIGNATURE: &str = "sg7e2c9f1bMv3Tn6Yh";
/// What a user's `RUST_LOG` may ask for: ignored for these crates whatever it says.
const RUST_LOG: &str = "trace,ureq=trace,ureq_proto::util=trace,ureq::unversioned=trace,rustls=trace";

/// Every 6-character piece of each secret: ureq's hex dumps split a header over lines of
/// 16 bytes, so a whole token would never be found there even when it leaked.
fn assert_no_secret(log: &str, secrets: &[&str], what: &str) {
    for secret in secrets {
        let chars: Vec<char> = secret.chars().collect();
        for piece in chars.windows(6).map(|w| w.iter().collect::<String>()) {
            assert!(!log.contains(&piece), "{what}: {piece:?} of a secret is in the log:\n{log}");
        }
    }
    for dump in ["ureq_proto", "rustls::", "Authorization:", "authorization:"] {
        assert!(!log.contains(dump), "{what}: {dump:?} in the log:\n{log}");
    }
}

#[test]
fn secrets_never_reach_the_logs_even_at_trace_level() {
    let (tmp, mut env) = scene("remote-secrets");
    let nginx = Nginx::start_tls("secrets");
    hello_tar(&nginx.root.join("a.tar"));
    fs::copy(nginx.root.join("a.tar"), nginx.root.join("private/a.tar")).unwrap();
    let token_file = tmp.join("token");
    fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    chmod(&token_file, 0o600);
    env.push(("SSL_CERT_FILE".into(), nginx.ca.clone().unwrap().into()));
    env.push(("RUST_LOG".into(), RUST_LOG.into()));
    let basic = format!("{BASIC_USER}:{BASIC_PASSWORD}");
    let with_password = |path: &str| nginx.url(path).replacen("https://", &format!("https://{basic}@"), 1);
    // The Basic header's value too (base64 of user:password).
    let basic_b64 = base64(basic.as_bytes());
    let secrets = [BASIC_PASSWORD, basic_b64.as_str(), TOKEN, SESSION_TOKEN];

    // In the foreground, the log is stderr: the URL's password is sent (Basic).
    let mp = tmp.join("mnt-fg");
    let stderr = tmp.join("foreground.log");
    let url = with_password("private/a.tar");
    let mut cmd = command_with(&env, &["-vvv", "mount", "-f", &url, mp.to_str().unwrap()]);
    let file = fs::File::create(&stderr).unwrap();
    let mut child =
        KillOnDrop(cmd.stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap());
    let read_log = || fs::read_to_string(&stderr).unwrap_or_default();
    // A hang guard: the mount takes well under a second.
    let up = wait_until(Duration::from_secs(30), || is_mounted(&mp) || !matches!(child.0.try_wait(), Ok(None)));
    assert!(up && is_mounted(&mp), "the foreground mount failed:\n{}", read_log());
    assert_eq!(fs::read(mp.join("a.txt")).unwrap(), b"hello\n");
    stagefs_with(&env, &["umount", mp.to_str().unwrap()]).assert_success();
    assert!(wait_timeout(&mut child.0, Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", read_log());
    let log = read_log();
    assert!(log.contains("DEBUG"), "-vvv logs every level:\n{log}");
    assert_no_secret(&log, &secrets, "foreground stderr");

    // Detached, with --log-file: the bearer token is sent (it wins over the URL's password).
    let log_file = tmp.join("daemon.log");
    let (log_text, mp) = (log_file.to_str().unwrap(), tmp.join("mnt-bg"));
    let token = token_file.to_str().unwrap();
    let opts = ["-vvv", "--log-file", log_text, "--bearer-token-file", token];
    // A presigned URL's signature in the query (nginx ignores it) besides the password.
    let mnt = mount_url(&env, &opts, &with_password(&format!("a.tar?X-Amz-Signature={SIGNATURE}")), &mp);
    assert_eq!(fs::read(mnt.path().join("a.txt")).unwrap(), b"hello\n");
    // What `ps` shows every user of the node, for the mount's whole life.
    assert_no_secret(&command_lines(), &[BASIC_PASSWORD, SIGNATURE], "a command line");
    mnt.unmount().assert_success();
    // The URL on standard input (`stagefs mount -`, as stagefs.mount() passes it).
    let mp = tmp.join("mnt-stdin");
    let mut cmd = command_with(&env, &["mount", "-", mp.to_str().unwrap()]);
    let mut child = KillOnDrop(cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    std::io::Write::write_all(child.0.stdin.as_mut().unwrap(), format!("{}\n", with_password("a.tar")).as_bytes())
        .unwrap();
    drop(child.0.stdin.take());
    let status = wait_timeout(&mut child.0, Duration::from_secs(60)).expect("mount - hung");
    assert!(status.success() && is_mounted(&mp), "stagefs mount - failed");
    assert_eq!(fs::read(mp.join("a.txt")).unwrap(), b"hello\n");
    assert_no_secret(&command_lines(), &[BASIC_PASSWORD], "a command line (stdin)");
    stagefs_with(&env, &["umount", mp.to_str().unwrap()]).assert_success();
    assert_no_secret(&fs::read_to_string(&log_file).unwrap(), &secrets, "--log-file (bearer)");

    // S3: signed requests (Authorization) with a session token, staged and in place.
    let s3 = S3::start("secrets");
    hello_tar(&s3.bucket("data").join("a.tar"));
    let mut env: Vec<(OsString, OsString)> = s3_env(&tmp.join("cache"));
    env.push(("AWS_SESSION_TOKEN".into(), SESSION_TOKEN.into()));
    env.push(("RUST_LOG".into(), RUST_LOG.into()));
    let s3_log = tmp.join("s3.log");
    let opts = s3.args(&["-vvv", "--log-file", s3_log.to_str().unwrap(), "--stage", "none"]);
    let mnt = mount_url(&env, &opts, "s3://data/a.tar", &tmp.join("mnt-s3"));
    assert_eq!(fs::read(mnt.path().join("a.txt")).unwrap(), b"hello\n");
    mnt.unmount().assert_success();
    let log = fs::read_to_string(&s3_log).unwrap();
    assert_no_secret(&log, &secrets, "--log-file (S3)");
    // The secret key is never sent (it signs); its name for the test begins like every path here.
    assert!(!log.contains(SECRET_KEY) && !log.contains("Signature="), "a key or signature in the log:\n{log}");
}

/// Every process's command line, as `ps` shows it to every user (arguments joined by spaces).
fn command_lines() -> String {
    let mut all = String::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = fs::read(entry.path().join("cmdline")) {
            all.push_str(&String::from_utf8_lossy(&cmdline).replace('\0', " "));
            all.push('\n');
        }
    }
    all
}

/// Standard base64 with padding (what a Basic header carries).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}
