//! Errors that name their cause at once: a host that does not resolve, a certificate no trusted CA signed (and which CA setting won), a refused connection tried a few times only, 404, a wrong URL password told apart from none. nginx's access log counts the tries: a permanent refusal is asked once.

use std::fs;
use std::process::Command;

use super::servers::{free_port, Nginx, BASIC_PASSWORD, BASIC_USER};
use super::{hello_tar, mount_fails, mount_url, scene};
use crate::kit::{require_tool, run_cmd, stagefs_bin, CMD_TIMEOUT};

/// Requests nginx logged for `path` with `status`.
fn requests(nginx: &Nginx, path: &str, status: u16) -> usize {
    nginx.access_log().iter().filter(|l| l.starts_with(&format!("GET {path} {status} "))).count()
}

#[test]
fn a_name_that_does_not_resolve_fails_at_once_naming_the_host() {
    let (_tmp, env) = scene("remote-dns");
    // `.invalid` never resolves (RFC 2606).
    let err = mount_fails(&env, &[], "https://nosuch.invalid/a.tar", 1, &["could not resolve nosuch.invalid"]);
    assert!(!err.contains("gave up"), "no retry: {err}");
    let mut s3 = env.clone();
    s3.push(("AWS_ENDPOINT_URL".into(), "https://nosuch.invalid:9000".into()));
    let err = mount_fails(&s3, &[], "s3://bucket/a.tar", 1, &["could not resolve nosuch.invalid", "$AWS_ENDPOINT_URL"]);
    assert!(!err.contains("gave up"), "no retry: {err}");
}

#[test]
fn an_untrusted_certificate_fails_at_once_naming_the_ca_setting_that_won() {
    let (tmp, env) = scene("remote-tls");
    let nginx = Nginx::start_tls("untrusted");
    hello_tar(&nginx.root.join("a.tar"));
    let ca = nginx.ca.clone().unwrap();
    let url = nginx.url("a.tar");
    let system = "/etc/ssl/certs/ca-certificates.crt";
    let err = mount_fails(&env, &[], &url, 1, &["certificate not trusted (UnknownIssuer) for host 127.0.0.1", system]);
    assert!(!err.contains("gave up"), "no retry: {err}");
    // AWS_CA_BUNDLE wins over SSL_CERT_FILE, and the message says so.
    let mut both = env.clone();
    both.push(("SSL_CERT_FILE".into(), ca.clone().into()));
    both.push(("AWS_CA_BUNDLE".into(), system.into()));
    let precedence = format!("$AWS_CA_BUNDLE={system} (it takes precedence over $SSL_CERT_FILE={})", ca.display());
    mount_fails(&both, &[], &url, 1, &["UnknownIssuer", &precedence]);
    // A bundle that cannot be read is an error, not a silent fallback to other CAs.
    let mut missing = env.clone();
    missing.push(("AWS_CA_BUNDLE".into(), tmp.join("nonexistent.pem").into()));
    mount_fails(&missing, &[], &url, 2, &["$AWS_CA_BUNDLE=", "cannot read it", "unset AWS_CA_BUNDLE"]);
    // The CA named alone: trusted.
    let mut trusted = env.clone();
    trusted.push(("SSL_CERT_FILE".into(), ca.into()));
    let mnt = mount_url(&trusted, &[], &url, &tmp.join("mnt"));
    assert_eq!(fs::read(mnt.path().join("a.txt")).unwrap(), b"hello\n");
    mnt.unmount().assert_success();
}

/// Also: one line per retry on a terminal (a pty made by `script`), none on stderr where
/// there is no terminal (the log has them).
#[test]
fn a_refused_connection_is_tried_a_few_times_only_each_retry_shown_on_a_terminal() {
    let (tmp, env) = scene("remote-refused");
    // A port nothing listens on (bound a moment ago, then closed).
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/a.tar");
    let refused = format!("connection refused by 127.0.0.1:{port}: nothing listens there");
    let err = mount_fails(&env, &[], &url, 1, &[&refused, "gave up after 4 tries"]);
    assert!(!err.contains("(try "), "no retry lines without a terminal: {err}");
    // Fewer tries asked for: fewer given.
    mount_fails(&env, &["--remote-tries", "2"], &url, 1, &[&refused, "gave up after 2 tries"]);

    let line = format!("{} mount {url} {}", stagefs_bin().display(), tmp.join("mnt").display());
    let mut on_a_terminal = Command::new(require_tool("script"));
    on_a_terminal.args(["-qec", &line, "/dev/null"]).envs(env.iter().map(|(k, v)| (k, v)));
    // `script` passes the pty's output, stderr included, to its stdout.
    let out = run_cmd(&mut on_a_terminal, CMD_TIMEOUT);
    assert_eq!(out.code(), Some(1), "{}", out.describe());
    for n in 1..=3 {
        assert!(out.stdout.contains(&format!("(try {n} of 4; again in ")), "{}", out.describe());
    }
    assert!(!out.stdout.contains("(try 4 of"), "{}", out.describe());
}

#[test]
fn missing_objects_and_refused_passwords_are_asked_once_with_advice_for_each() {
    let (tmp, env) = scene("remote-refusals");
    let nginx = Nginx::start("refusals");
    hello_tar(&nginx.root.join("private/a.tar"));
    mount_fails(&env, &[], &nginx.url("missing.tar"), 3, &["no such object (HTTP 404)"]);
    assert_eq!(requests(&nginx, "/missing.tar", 404), 1, "{:?}", nginx.access_log());

    let private = nginx.url("private/a.tar");
    let with = |userinfo: &str| private.replacen("http://", &format!("http://{userinfo}@"), 1);
    mount_fails(&env, &[], &private, 3, &["access denied (HTTP 401)", "no credentials were sent"]);
    let wrong = format!("the password in the URL for user {BASIC_USER} was refused");
    let err = mount_fails(&env, &[], &with(&format!("{BASIC_USER}:not-it")), 3, &[&wrong]);
    assert!(!err.contains("not-it"), "{err}");
    mount_fails(&env, &[], &with(BASIC_USER), 3, &["names user alice but no password"]);
    assert_eq!(requests(&nginx, "/private/a.tar", 401), 3, "one request each: {:?}", nginx.access_log());
    let mnt = mount_url(&env, &[], &with(&format!("{BASIC_USER}:{BASIC_PASSWORD}")), &tmp.join("mnt"));
    assert_eq!(fs::read(mnt.path().join("a.txt")).unwrap(), b"hello\n");
    mnt.unmount().assert_success();
}

/// The files the client trusts with secrets and trust are the user's own, judged as a log
/// is: a CA bundle named by `SSL_CERT_FILE` that another user (eve) put in a shared sticky
/// directory, as a file or a link, is refused (exit 2, naming it and eve); alice's own copy
/// of the same CA is trusted.
#[test]
fn a_ca_bundle_another_user_put_in_place_is_not_trusted() {
    let s = crate::kit::two_users("remote-ca-users");
    let nginx = Nginx::start_tls("ca-users");
    hello_tar(&nginx.root.join("a.tar"));
    let ca = nginx.ca.clone().unwrap();
    let url = nginx.url("a.tar");
    let shared = s.dir("shared", 0o1777, &s.alice);
    let mnt = s.mountpoint("mnt-ca-users");
    let mount = |bundle: &std::path::Path| {
        s.alice
            .stagefs_cmd(&[("SSL_CERT_FILE", bundle.to_str().unwrap())], ["mount", &url, mnt.to_str().unwrap()])
            .run()
    };
    let planted = shared.join("ca.pem");
    fs::copy(&ca, &planted).unwrap();
    s.eve.chown(&planted);
    mount(&planted).assert_code(2).assert_stderr_has(&["ca.pem", "sfs-eve", "refusing it"]);
    fs::remove_file(&planted).unwrap();
    let eves = s.tmp.join("eve-ca.pem");
    fs::copy(&ca, &eves).unwrap();
    s.eve.chown(&eves);
    s.eve.sh(&format!("ln -s {} {}", eves.display(), planted.display()));
    mount(&planted).assert_code(2).assert_stderr_has(&["ca.pem", "symbolic link", "sfs-eve"]);
    let own = s.alice.home.join("remote-ca-users.pem");
    fs::copy(&ca, &own).unwrap();
    s.alice.chown(&own);
    mount(&own).assert_success();
    assert_eq!(s.cat(&mnt.join("a.txt")).stdout, "hello\n");
    s.umount(&mnt);
    fs::remove_file(&own).unwrap();
}
