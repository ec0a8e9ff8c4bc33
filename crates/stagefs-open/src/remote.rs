//! Archives in object storage (`s3://bucket/key.tar`, `https://host/x.tar`): the command-line options, the one client of the process, and naming objects and shard sets (the client itself is `crates/stagefs-remote`).
//!
//! An object is fetched once per node straight into the private staged copy (a memfd, or
//! a nameless file on the local disk) with many range requests, then served like any
//! staged archive; with `--stage none` it is read in place by ranges. See doc/remote.md.

mod client;
mod in_place;
mod index;
mod open;

use crate::places::Trust;
use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};

pub use client::{client, configure, parse, with_options, RemoteFailure, RemoteOptions};
pub use open::{fetch_for_broadcast, open};
pub use stagefs_remote::{ObjectUrl, RemoteError, LOG_FILTER};

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
    let mut objects: Vec<PathBuf> = Vec::new();
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
            if !objects.iter().any(|s| s.as_os_str() == text.as_str()) {
                objects.push(PathBuf::from(text));
            }
        }
    }
    if objects.len() == 1 {
        return Ok(crate::places::ArchiveSet {
            label: PathBuf::from(parse(&objects[0])?.shown()),
            shards: objects,
            trust: Trust::Named,
        });
    }
    let mut text = first.shown();
    if !more.is_empty() {
        text += &format!(" + {} more", more.len());
    }
    let label = format!("{text} ({} shards, set {:016x})", objects.len(), digest.finish());
    // Objects are judged by the store's own access rules and pinned to their version.
    Ok(crate::places::ArchiveSet { label: PathBuf::from(label), shards: objects, trust: Trust::Named })
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
