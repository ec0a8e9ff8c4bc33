//! Saved indexes of objects: the key of one version (size, ETag, Last-Modified, content samples), the sidecar `KEY.stagefs-index` beside the object, the user's cache, and `stagefs index URL --upload`.
//!
//! A sidecar is trusted as far as the object: whoever may write it beside the object may
//! replace the object too, and it is used only when its key matches this version of the
//! object (and its checksum and bounds check out, as for any saved index).

use std::path::{Path, PathBuf};

use stagefs_remote::{Client, Object};

use crate::open::{OpenArchiveError, SavedIndexes};
use crate::saved_index::{self, Key};
use crate::stage::Loaded;
use stagefs_archive::index::Index;
use stagefs_archive::{Caches, Reader, SavedTables};
use std::sync::Arc;

/// The key of `object`'s version, its samples read by `read` (from the staged copy, or
/// by ranges).
pub fn key_of(
    object: &Object,
    read: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> Result<Key, OpenArchiveError> {
    let v = &object.version;
    let fingerprint = saved_index::fingerprint(v.size, read)
        .map_err(|source| stagefs_archive::OpenError::Io { path: PathBuf::from(object.url.shown()), source })?;
    let etag = stagefs_archive::hash::hash(v.etag.as_deref().unwrap_or("").as_bytes());
    Ok(Key::of_object(v.size, v.modified_unix().unwrap_or(0), etag, fingerprint))
}

/// The saved index beside the object (fetched), else the kept one (`--index-dir`, cache).
pub struct RemoteIndexes<'a> {
    pub client: &'a Client,
    pub object: &'a Object,
    pub key: Key,
    /// The object's name in messages and in the cache (its URL without a query).
    pub shown: &'a Path,
}

impl RemoteIndexes<'_> {
    fn sidecar(&self, flavor: &saved_index::Flavor) -> stagefs_remote::ObjectUrl {
        self.object.url.with_suffix(&format!("{}{}", saved_index::INDEX_SUFFIX, flavor.suffix()))
    }

    /// The saved index beside the object, for messages.
    pub fn sidecar_shown(&self, flavor: &saved_index::Flavor) -> String {
        self.sidecar(flavor).shown()
    }
}

impl SavedIndexes for RemoteIndexes<'_> {
    fn load(&self, loaded: &Loaded, flavor: &saved_index::Flavor, caches: &Caches) -> Option<(Index, Arc<dyn Reader>)> {
        // The kept copy first: mapped from the user's own disk, no request made.
        let staged = (&loaded.backing, loaded.codec);
        if let Some(opened) = saved_index::load_kept(self.shown, &self.key, staged, flavor, caches) {
            return Some(opened);
        }
        let sidecar = self.sidecar(flavor);
        // No larger than an index of this object can be, nor than 1 GiB (a tar of tens of
        // millions of members): the server says how long the body is, not this process.
        let cap = saved_index::size_cap(self.object.version.size).min(1 << 30);
        match self.client.get_small(&sidecar, cap) {
            Ok(Some(bytes)) => {
                let name = PathBuf::from(sidecar.shown());
                let checked = saved_index::decode_bytes(bytes.clone(), &name, &self.key, staged, flavor.depth, caches);
                match checked {
                    Ok(opened) => {
                        tracing::info!("using the saved index {}", sidecar.shown());
                        // Kept, and served from there mapped: not held whole in this process.
                        let kept = saved_index::keep_fetched(self.shown, &bytes, flavor)
                            .map_err(|e| tracing::debug!("not keeping the fetched index: {e}"))
                            .ok()
                            .and_then(|()| saved_index::load_kept(self.shown, &self.key, staged, flavor, caches));
                        return Some(kept.unwrap_or(opened));
                    }
                    Err(why) => tracing::warn!("ignoring the saved index {}: {why}", sidecar.shown()),
                }
            }
            Ok(None) => tracing::debug!("no saved index at {}", sidecar.shown()),
            Err(e) => tracing::info!("cannot read the saved index {}: {e}", sidecar.shown()),
        }
        saved_index::load_kept(self.shown, &self.key, staged, flavor, caches)
    }

    fn save(
        &self,
        index: &Index,
        tables: SavedTables,
        flavor: &saved_index::Flavor,
    ) -> std::io::Result<saved_index::Saved> {
        saved_index::save_kept(self.shown, &self.key, index, tables, flavor)
    }
}
