//! Real servers on 127.0.0.1 for the remote tests: Debian's nginx (ranges, ETags, If-Match; HTTPS with a certificate of a CA made for the test, Basic authentication under /private/) and s3s-fs (an S3 server that checks SigV4 signatures), each on a free port with its own files, stopped on drop; and `stagefs` run against them.

use std::ffi::OsString;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::kit::{
    osargs, require_tool, run_cmd, run_tool, stagefs_bin, wait_until, CmdOutput, KillOnDrop, TempDir, CMD_TIMEOUT,
};

/// A port free a moment ago (the server binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts the server `what` with `cmd`, its stdout to `stdout`, and waits for it to listen
/// on `host:port` (else panics with its `log`); killed on drop.
fn serve(what: &str, cmd: &mut Command, stdout: Stdio, (host, port): (&str, u16), log: &Path) -> KillOnDrop {
    let child = cmd.stdin(Stdio::null()).stdout(stdout).stderr(Stdio::null()).spawn();
    let child = KillOnDrop(child.unwrap_or_else(|e| panic!("start {what}: {e}")));
    let up = wait_until(Duration::from_secs(20), || TcpStream::connect((host, port)).is_ok());
    assert!(up, "{what} did not listen on {host}:{port}:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    child
}

/// The user and password nginx asks for under `/private/` (HTTP Basic authentication).
pub const BASIC_USER: &str = "alice";
pub const BASIC_PASSWORD: &str = "pwc0ffee9Yh3Nv5Tj";

/// nginx serving `root` on 127.0.0.1 with a temporary configuration; its access log
/// (method, path, status, bytes sent, Range header) counts what was fetched. Files under
/// `root/private/` need [`BASIC_USER`] and [`BASIC_PASSWORD`].
pub struct Nginx {
    pub port: u16,
    pub root: PathBuf,
    /// The address it listens on: 127.0.0.1, or the test cluster's bridge.
    pub host: String,
    /// For HTTPS: the certificate of the CA that signed the server's (for `SSL_CERT_FILE`).
    pub ca: Option<PathBuf>,
    dir: TempDir,
    child: Option<KillOnDrop>,
}

impl Nginx {
    pub fn start(name: &str) -> Nginx {
        Nginx::start_on(name, "127.0.0.1", false)
    }

    /// HTTPS on 127.0.0.1, with a certificate for `127.0.0.1` and `localhost` signed by a CA
    /// made for this server (`ca`): no system bundle trusts it.
    pub fn start_tls(name: &str) -> Nginx {
        Nginx::start_on(name, "127.0.0.1", true)
    }

    /// On `host`, an address of this machine (the cluster's nodes reach its bridge's).
    pub fn start_on(name: &str, host: &str, tls: bool) -> Nginx {
        let dir = TempDir::new(&format!("nginx-{name}"));
        let root = dir.join("www");
        std::fs::create_dir_all(root.join("private")).unwrap();
        std::fs::write(dir.join("htpasswd"), format!("{BASIC_USER}:{{PLAIN}}{BASIC_PASSWORD}\n")).unwrap();
        let ca = tls.then(|| make_certificates(dir.path()));
        let port = free_port();
        let mut nginx = Nginx { port, root, host: host.to_string(), ca, dir, child: None };
        nginx.launch();
        nginx
    }

    fn launch(&mut self) {
        let d = self.dir.path().display();
        let tls = match self.ca {
            Some(_) => format!("ssl; ssl_certificate {d}/server.pem; ssl_certificate_key {d}/server.key"),
            None => String::new(),
        };
        let conf = format!(
            "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 512; }}
http {{
  log_format counted '$request_method $uri $status $body_bytes_sent \"$http_range\"';
  access_log {d}/access.log counted;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{
    listen {}:{} {tls}; root {};
    location /private/ {{ auth_basic \"stagefs tests\"; auth_basic_user_file {d}/htpasswd; }}
  }}
}}
",
            self.host,
            self.port,
            self.root.display()
        );
        std::fs::create_dir_all(self.dir.join("tmp")).unwrap();
        std::fs::write(self.dir.join("nginx.conf"), conf).unwrap();
        let (mut cmd, log) = (Command::new(require_tool("nginx")), self.dir.join("error.log"));
        cmd.args(osargs!["-c", self.dir.join("nginx.conf"), "-e", log]);
        self.child = Some(serve("nginx", &mut cmd, Stdio::null(), (&self.host, self.port), &log));
    }

    /// Stops it: connections are refused from now on.
    pub fn stop(&mut self) {
        self.child = None;
        assert!(wait_until(Duration::from_secs(10), || TcpStream::connect((self.host.as_str(), self.port)).is_err()));
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.launch();
    }

    pub fn url(&self, name: &str) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}/{name}", self.host, self.port)
    }

    /// Lines of the access log: `METHOD PATH STATUS BYTES "RANGE"`.
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default().lines().map(str::to_string).collect()
    }

    /// Body bytes sent for `path` (`/a.tar`) by GET requests.
    pub fn bytes_sent(&self, path: &str) -> u64 {
        self.access_log()
            .iter()
            .filter(|l| l.starts_with(&format!("GET {path} ")))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
            .sum()
    }
}

/// A CA and a server certificate it signed (for `127.0.0.1` and `localhost`: a self-signed
/// server certificate is a CA used as an end entity, which rustls refuses for that reason
/// alone), made with the `openssl` command (Debian's ca-certificates depends on it) in
/// `dir`; returns the CA's certificate.
fn make_certificates(dir: &Path) -> PathBuf {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let (ca, ca_key) = (p("ca.pem"), p("ca.key"));
    let ca_subject = ["-subj", "/CN=stagefs test CA"];
    run_tool(
        "openssl",
        [&["req", "-x509"][..], &ec, &ca_subject, &["-keyout", &ca_key, "-out", &ca, "-days", "2"]].concat(),
    );
    std::fs::write(dir.join("san.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    let (csr, key) = (p("server.csr"), p("server.key"));
    let subject = ["-subj", "/CN=localhost"];
    run_tool("openssl", [&["req"][..], &ec, &subject, &["-keyout", &key, "-out", &csr]].concat());
    let sign = ["x509", "-req", "-in", &csr, "-CA", &ca, "-CAkey", &ca_key, "-CAcreateserial", "-days", "2"];
    run_tool("openssl", [&sign[..], &["-out", &p("server.pem"), "-extfile", &p("san.cnf")]].concat());
    PathBuf::from(ca)
}

/// s3s-fs on 127.0.0.1 with one user (access key and secret) and its data directory:
/// each subdirectory is a bucket.
pub struct S3 {
    pub root: PathBuf,
    endpoint: String,
    _dir: TempDir,
    _child: KillOnDrop,
}

pub const ACCESS_KEY: &str = "AKIASTAGEFSTEST00001";
pub const SECRET_KEY: &str = "stagefs/test/Secret+Key/0123456789abcdef";

impl S3 {
    pub fn start(name: &str) -> S3 {
        let dir = TempDir::new(&format!("s3-{name}"));
        let root = dir.join("data");
        std::fs::create_dir_all(&root).unwrap();
        let port = free_port();
        let log = dir.join("s3s.log");
        let mut cmd = Command::new(require_tool("s3s-fs"));
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS_KEY])
            .args(["--secret-key", SECRET_KEY])
            .arg(&root);
        let what = "s3s-fs (cargo install s3s-fs --locked --features binary, as .ci/run does)";
        let child = serve(what, &mut cmd, std::fs::File::create(&log).unwrap().into(), ("127.0.0.1", port), &log);
        S3 { root, endpoint: format!("http://127.0.0.1:{port}"), _dir: dir, _child: child }
    }

    /// `more`, then the option that names this server: `--endpoint-url URL`.
    pub fn args<'a>(&'a self, more: &[&'a str]) -> Vec<&'a str> {
        more.iter().copied().chain(["--endpoint-url", &self.endpoint]).collect()
    }

    /// A bucket (a directory of the server's data).
    pub fn bucket(&self, name: &str) -> PathBuf {
        let path = self.root.join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }
}

/// Environment variables stagefs runs with: (name, value).
pub type Env = [(OsString, OsString)];

/// What every remote test runs stagefs with: its own index cache, no instance metadata
/// (the chain must never reach for 169.254.169.254), no credentials but the ones given.
pub fn base_env(cache: &Path) -> Vec<(OsString, OsString)> {
    vec![
        ("XDG_CACHE_HOME".into(), cache.into()),
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ("AWS_CONFIG_FILE".into(), "/nonexistent".into()),
        ("AWS_SHARED_CREDENTIALS_FILE".into(), "/nonexistent".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ]
}

/// [`base_env`] with the test user's keys.
pub fn s3_env(cache: &Path) -> Vec<(OsString, OsString)> {
    let mut env = base_env(cache);
    env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()));
    env.push(("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()));
    env
}

/// `stagefs ARGS` with `env` (and no AWS variables of the test's own environment).
pub fn stagefs_with(env: &Env, args: &[&str]) -> CmdOutput {
    run_cmd(&mut command_with(env, args), CMD_TIMEOUT * 2)
}

pub fn command_with(env: &Env, args: &[&str]) -> Command {
    let mut cmd = Command::new(stagefs_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v))).args(args);
    cmd
}
