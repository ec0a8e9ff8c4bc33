//! Archives in object storage (`s3://bucket/key.tar`, `https://host/x.tar`): the command-line options, the one client of the process, and naming objects and shard sets (the client itself is `crates/stagefs-remote`).
//!
//! An object is fetched once per node straight into the private staged copy (a memfd, or
//! a nameless file on the local disk) with many range requests, then served like any
//! staged archive; with `--stage none` it is read in place by ranges. See doc/remote.md.

mod in_place;
mod index;
mod open;

use crate::places::Trust;
use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use open::{fetch_for_broadcast, open};
use stagefs_remote::{Client, Config, Secret};
pub use stagefs_remote::{ObjectUrl, RemoteError, LOG_FILTER};

/// How to reach objects in a store or on an HTTP(S) server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(
    feature = "clap",
    command(next_help_heading = "Archives in object storage (s3://BUCKET/KEY, https://HOST/PATH)")
)]
pub struct RemoteOptions {
    /// Range requests in flight while fetching an object, 1 to 256
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256)))]
    pub remote_concurrency: u16,
    /// Give up on a server silent this long (connecting, answering, each read; then retried), e.g. 30s;
    /// a whole request is bounded by --remote-deadline
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::duration::parse_duration))]
    pub remote_timeout: Duration,
    /// Give up on one request not done this long after it began, however steadily the server
    /// trickles (then retried, resuming where it stopped); --remote-timeout's partner, e.g. 5m
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::duration::parse_duration))]
    pub remote_deadline: Duration,
    /// Tries per request: timeouts, resets, 5xx and 429 are retried with backoff, a refused
    /// connection at most 4 times; a name that does not resolve, an untrusted certificate and
    /// 4xx never
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100)))]
    pub remote_tries: u32,
    /// An S3-compatible store (MinIO, Ceph, ...): its URL, addressed path-style.
    /// Default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the profile's endpoint_url, else AWS
    #[cfg_attr(feature = "clap", arg(long, value_name = "URL"))]
    pub endpoint_url: Option<String>,
    /// Send S3 requests unsigned (public buckets), like aws-cli's --no-sign-request
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_sign_request: bool,
    /// The AWS profile of ~/.aws/config and ~/.aws/credentials (default: AWS_PROFILE, else default)
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME"))]
    pub profile: Option<String>,
    /// A file holding a bearer token for https:// URLs (sent as Authorization: Bearer);
    /// a token is never taken on the command line, where other users see it
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub bearer_token_file: Option<PathBuf>,
    /// Allow plain http:// (unencrypted, unauthenticated bytes) to hosts other than this machine
    #[cfg_attr(feature = "clap", arg(long))]
    pub allow_http: bool,
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions {
            remote_concurrency: 16,
            remote_timeout: Duration::from_secs(30),
            remote_deadline: Duration::from_secs(300),
            remote_tries: 8,
            endpoint_url: None,
            no_sign_request: false,
            profile: None,
            bearer_token_file: None,
            allow_http: false,
        }
    }
}

/// The client of this process and the options it was made from: made once by a command
/// ([`configure`]); Python's `stagefs.open` may open objects with other options
/// ([`with_options`]). Readers of open objects keep the client they were opened with.
static CLIENT: std::sync::RwLock<Option<(RemoteOptions, Client)>> = std::sync::RwLock::new(None);
/// Held by an open under [`with_options`]: concurrent opens with other options wait.
static OPENING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes the process's client from `options` (the first call wins).
pub fn configure(options: &RemoteOptions) -> Result<(), RemoteFailure> {
    if CLIENT.read().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Ok(());
    }
    let client = make_client(options)?;
    CLIENT.write().unwrap_or_else(|p| p.into_inner()).get_or_insert((options.clone(), client));
    Ok(())
}

/// Runs `open` with the process's client made from `options` (a new one when they differ
/// from the current client's), one such open at a time: a Python program may open objects
/// of several endpoints, profiles or tokens.
pub fn with_options<T>(options: &RemoteOptions, open: impl FnOnce() -> T) -> Result<T, RemoteFailure> {
    let _one_at_a_time = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    let same = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|(o, _)| o == options);
    if !same {
        let client = make_client(options)?;
        *CLIENT.write().unwrap_or_else(|p| p.into_inner()) = Some((options.clone(), client));
    }
    Ok(open())
}

/// A client made from `options`.
fn make_client(options: &RemoteOptions) -> Result<Client, RemoteFailure> {
    let bearer_token = match &options.bearer_token_file {
        Some(file) => Some(read_token(file)?),
        None => None,
    };
    let timeout = options.remote_timeout.max(Duration::from_millis(100));
    if options.remote_deadline < timeout {
        return Err(RemoteFailure::Usage(format!(
            "--remote-deadline ({} s) bounds a whole request, --remote-timeout ({} s) each wait within it: the \
             deadline must not be shorter",
            options.remote_deadline.as_secs_f64(),
            timeout.as_secs_f64()
        )));
    }
    let config = Config {
        concurrency: options.remote_concurrency.into(),
        timeout,
        deadline: options.remote_deadline,
        tries: options.remote_tries,
        endpoint_url: options.endpoint_url.clone(),
        no_sign_request: options.no_sign_request,
        profile: options.profile.clone(),
        bearer_token,
        allow_http: options.allow_http,
        // One line per retry on a terminal: a slow or failing server is never silent.
        on_retry: Some(stagefs_remote::RetryHook::new(crate::report::notice)),
        files: files(),
        ..Config::default()
    };
    Ok(Client::new(config)?)
}

/// The process's client (made with default options if no command configured it): a
/// handle on it, cheap to clone.
pub fn client() -> Result<Client, RemoteError> {
    if let Some((_, client)) = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(client.clone());
    }
    let client = Client::new(Config { files: files(), ..Config::default() })?;
    let mut slot = CLIENT.write().unwrap_or_else(|p| p.into_inner());
    Ok(slot.get_or_insert((RemoteOptions::default(), client)).1.clone())
}

/// The door the client reads its files through (credentials, CA bundles, tokens,
/// `~/.netrc`): `places::read_own_file`, the user's own files only.
fn files() -> stagefs_remote::Files {
    stagefs_remote::Files::new(|path, cap| match crate::places::read_own_file(path, cap) {
        Ok(file) => Ok(file.map(|(bytes, mode)| stagefs_remote::ReadFile { bytes, mode })),
        Err(e) => Err(stagefs_remote::FileError::Refused(Box::new(e))),
    })
}

/// A token file, read as the user's own files are (`places::read_own_file`) and checked as
/// ssh checks keys: a token others can read is no secret.
fn read_token(file: &Path) -> Result<Secret, RemoteFailure> {
    let usage = |why: String| RemoteFailure::Usage(format!("--bearer-token-file {}: {why}", file.shown()));
    let read = crate::places::read_own_file(file, 1 << 20).map_err(|e| usage(e.to_string()))?;
    let (bytes, mode) = read.ok_or_else(|| usage("it does not exist".into()))?;
    if mode & 0o077 != 0 {
        return Err(usage(format!("other users can read it (mode {mode:04o}); chmod 600 it first")));
    }
    let text = String::from_utf8(bytes).map_err(|_| usage("it is not text".into()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(['\n', '\r']) {
        return Err(usage("it must hold one token on one line".into()));
    }
    Ok(Secret::new(token))
}

/// A remote spec or option that cannot be used, or the store's answer to it (exit codes
/// are given in `error.rs`, with every other failure's; opening an object fails with
/// `OpenArchiveError::Remote`).
#[derive(Debug, thiserror::Error)]
pub enum RemoteFailure {
    #[error("{0}")]
    Store(#[from] RemoteError),
    /// A wrong option or spec (exit 2).
    #[error("{0}")]
    Usage(String),
}

/// The object `archive` names, to broadcast (`--broadcast`); `None` for a local archive.
pub fn to_broadcast(archive: &Path) -> Option<crate::stage::broadcast::Object> {
    if !is_url(archive) {
        return None;
    }
    let url = archive.to_owned();
    Some(crate::stage::broadcast::Object {
        shown: parse(archive).map(|u| u.shown()).unwrap_or_default(),
        fetch: Box::new(move |stage_dir| fetch_for_broadcast(&url, stage_dir)),
    })
}

/// True for a path that is an object URL (`s3://`, `http://`, `https://`).
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(stagefs_remote::is_url)
}

/// An object's URL for messages and exceptions: no user, no query, escaped.
pub fn shown(path: &Path) -> String {
    match parse(path) {
        Ok(url) => url.shown(),
        Err(_) => stagefs_remote::url::display_unparsed(&path.to_string_lossy()),
    }
}

/// The URL in `path`.
pub fn parse(path: &Path) -> Result<ObjectUrl, RemoteError> {
    let text = path.to_str().ok_or_else(|| RemoteError::BadUrl("a URL must be UTF-8".into()))?;
    let allow_http = CLIENT.read().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|(o, _)| o.allow_http);
    ObjectUrl::parse(text, allow_http).map_err(|e| RemoteError::BadUrl(e.to_string()))
}

/// The text a shard path holds for `url`: what [`parse`] reads back (no user; the query
/// only of an URL that had one: the process that fetches the shard must send it).
pub fn request_text(url: &ObjectUrl) -> String {
    match url {
        ObjectUrl::S3 { bucket, key } => format!("s3://{bucket}/{key}"),
        ObjectUrl::Http(u) => u.request_url().expose().to_string(),
    }
}

/// Sizes the listing gave, so that a set's shards need no request each for it.
static LISTED: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());

/// The size of the object at `path` (a shard): from its listing, else by asking.
pub fn listed_size(path: &Path) -> Result<u64, RemoteError> {
    let text = path.to_string_lossy();
    if let Some((_, size)) = LISTED.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(t, _)| *t == text) {
        return Ok(*size);
    }
    Ok(client()?.stat(&parse(path)?)?.version.size)
}

/// The archives a remote spec names, as a pattern names local files: one object
/// (labelled by its URL without query or user), or a set (a brace range or a glob over
/// an S3 listing, expanded here, with `more`).
pub fn resolve(spec: &Path, more: &[PathBuf], growing: bool) -> Result<crate::places::ArchiveSet, RemoteFailure> {
    if growing {
        return Err(RemoteFailure::Usage(
            "--growing and --watch follow local shards; an object store's shards are mounted as a fixed set".into(),
        ));
    }
    let specs: Vec<&Path> = std::iter::once(spec).chain(more.iter().map(PathBuf::as_path)).collect();
    if let Some(local) = specs.iter().find(|s| !is_url(s)) {
        return Err(RemoteFailure::Usage(format!(
            "{}: a set mixes local archives and objects; mount them separately",
            local.shown()
        )));
    }
    let first = parse(spec)?;
    let is_set = |url: &ObjectUrl| stagefs_remote::list::is_pattern(&url_key(url));
    if specs.len() == 1 && !is_set(&first) {
        let label = PathBuf::from(first.shown());
        return Ok(crate::places::ArchiveSet { label, shards: vec![spec.to_owned()], trust: Trust::Named });
    }
    let client = client()?;
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut digest = stagefs_archive::hash::Hasher::default();
    for one in &specs {
        let url = parse(one)?;
        let found: Vec<(ObjectUrl, Option<u64>)> = match is_set(&url) {
            true => stagefs_remote::list::resolve(&client, &url)?,
            false => vec![(url, None)],
        };
        for (url, size) in found {
            let text = request_text(&url);
            if let Some(size) = size {
                LISTED.lock().unwrap_or_else(|p| p.into_inner()).push((text.clone(), size));
            }
            digest.write(text.as_bytes());
            digest.write(b"\0");
            if !shards.iter().any(|s| s.as_os_str() == text.as_str()) {
                shards.push(PathBuf::from(text));
            }
        }
    }
    if shards.len() == 1 {
        return Ok(crate::places::ArchiveSet {
            label: PathBuf::from(parse(&shards[0])?.shown()),
            shards,
            trust: Trust::Named,
        });
    }
    let mut text = first.shown();
    if !more.is_empty() {
        text += &format!(" + {} more", more.len());
    }
    let label = format!("{text} ({} shards, set {:016x})", shards.len(), digest.finish());
    // Objects are judged by the store's own access rules and pinned to their version.
    Ok(crate::places::ArchiveSet { label: PathBuf::from(label), shards, trust: Trust::Named })
}

fn url_key(url: &ObjectUrl) -> String {
    match url {
        ObjectUrl::S3 { key, .. } => key.clone(),
        ObjectUrl::Http(u) => u.path.clone(),
    }
}

/// The default mountpoint for an object or a pattern of them: its name up to the first
/// pattern character, without extensions (`s3://b/train-{000..009}.tar` mounts at
/// `.../stagefs/train`); `None` for a local path.
pub fn default_mountpoint(spec: &Path) -> Option<PathBuf> {
    if !is_url(spec) {
        return None;
    }
    let url = parse(spec).ok()?;
    let name = url.file_name();
    let literal = &name[..name.find(['*', '?', '[', '{']).unwrap_or(name.len())];
    let stem = match literal.is_empty() {
        true => String::new(),
        false => crate::places::archive_stem(Path::new(literal)),
    };
    let stem = stem.trim_matches(|c| "-_.".contains(c));
    let name = match (stem.is_empty(), &url) {
        (false, _) => stem.to_string(),
        (true, ObjectUrl::S3 { bucket, .. }) => bucket.clone(),
        (true, ObjectUrl::Http(_)) => "shards".into(),
    };
    // A name from outside becomes one path component, never a path.
    let name = name.replace(['/', '\0'], "_");
    let name = if name == "." || name == ".." { "shards".into() } else { name };
    Some(crate::places::default_mount_root().join(name))
}

/// `stagefs index URL`: indexes each object of `set` (staged as a mount would, `auto`),
/// saves the index to the cache and, with `upload`, beside the object
/// (`KEY.stagefs-index`), where every node's mount finds it.
pub fn index_command(
    set: &crate::places::ArchiveSet,
    indexing: &crate::open::Indexing,
    upload: bool,
) -> Result<(), crate::open::OpenArchiveError> {
    let started = std::time::Instant::now();
    for shard in &set.shards {
        let url = parse(shard)?;
        let client = client()?;
        let indexing = crate::open::Indexing { force_save: true, ..indexing.clone() };
        let opened = open(shard, crate::stage::StageMode::Auto, (None, None), None, &indexing, set.shards.len())?;
        let Some(tables) = opened.archive.saved() else {
            println!("{}: a {:?} archive carries its own index; nothing to save", url.shown(), opened.archive.format);
            continue;
        };
        let mut saved = opened.saved_index.as_ref().map(|p| p.shown().to_string()).into_iter().collect::<Vec<_>>();
        if upload {
            let object = client.stat(&url)?;
            let key = index::key_of(&object, &mut |offset, buf| {
                let got =
                    client.get_range(&object, offset, buf.len()).map_err(|e| std::io::Error::other(e.to_string()))?;
                buf.copy_from_slice(&got);
                Ok(())
            })?;
            let flavor = crate::saved_index::Flavor { depth: indexing.depth, ..Default::default() };
            let sidecar = url.with_suffix(&format!("{}{}", crate::saved_index::INDEX_SUFFIX, flavor.suffix()));
            client.put(
                &sidecar,
                &crate::saved_index::encode_bytes(&key, indexing.depth, &opened.archive.index, tables),
            )?;
            saved.push(sidecar.shown());
        }
        println!(
            "indexed {} in {:.2} s: {} entries; saved to {}",
            url.shown(),
            started.elapsed().as_secs_f64(),
            opened.archive.index.entry_count(),
            saved.join(" and ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_name_mountpoints_and_labels() {
        let mp = |s: &str| default_mountpoint(Path::new(s)).unwrap();
        assert!(mp("s3://bucket/sets/train-{000..009}.tar").ends_with("stagefs/train"));
        assert!(mp("s3://bucket/sets/*.tar").ends_with("stagefs/bucket"));
        assert!(mp("https://h/x/imagenet.tar.gz?sig=1").ends_with("stagefs/imagenet"));
        assert!(default_mountpoint(Path::new("/local/a.tar")).is_none());
        let set = resolve(Path::new("https://h.example/a.tar?sig=secret"), &[], false).unwrap();
        assert_eq!(set.label, PathBuf::from("https://h.example/a.tar"), "no query in the label");
        assert_eq!(set.shards, [PathBuf::from("https://h.example/a.tar?sig=secret")]);
        let usage =
            |e: RemoteFailure| matches!(e, RemoteFailure::Usage(_) | RemoteFailure::Store(RemoteError::BadUrl(_)));
        assert!(usage(resolve(Path::new("s3://bucket/a.tar"), &[PathBuf::from("/local.tar")], false).unwrap_err()));
        assert!(usage(resolve(Path::new("http://example.org/a.tar"), &[], false).unwrap_err()));
    }
}
