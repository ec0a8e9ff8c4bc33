//! Read tar (plain, compressed, nested), zip and SquashFS archives and shard sets into one compact index, and serve their files' bytes — without FUSE.
//!
//! An [`Archive`] is an [`index::Index`] (the tree: names, attributes, where each file's
//! bytes are) plus a [`Reader`] that serves those bytes; every format is one implementation
//! of the trait (tar in [`tar`], zip in [`zip`], SquashFS in a private module opened
//! through [`Archive::from_backing`], a shard set over its shards' readers in [`set`]),
//! and compressed tars are read from restart points ([`seekable`]); [`codec`] makes every
//! decoder. Nothing here knows about FUSE, a command line or signals, and nothing
//! opens a path by itself: the caller opens the file (and decides whom to trust), the
//! crate maps it. Errors name the archive offset at fault; a damaged file fails its reads
//! alone.
//!
//! ```
//! use std::io::Write;
//! use stagefs_archive::{index::ROOT, tar::write, Archive, Caches};
//!
//! // A tar with one file, as any tar tool writes it.
//! let dir = std::env::temp_dir().join(format!("stagefs-archive-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("hello.tar");
//! let mut tar = std::fs::File::create(&path)?;
//! tar.write_all(&write::ustar_header("greeting.txt", b'0', 0o644, 6, ""))?;
//! tar.write_all(b"hello\n")?;
//! tar.write_all(&vec![0u8; write::padding(6)])?;
//! tar.write_all(&write::end())?;
//!
//! // Open it (what is decoded is kept within one memory budget: the open's caches),
//! // list the root, read the file.
//! let archive = Archive::open(&std::fs::File::open(&path)?, &path, &Caches::default())?;
//! let index = &archive.index;
//! let root = index.inode(ROOT)?;
//! let names: Vec<&[u8]> = index.children(&root)?.iter().map(|d| index.name(&d)).collect::<Result<_, _>>()?;
//! assert_eq!(names, [b"greeting.txt"]);
//! let id = index.lookup(&root, b"greeting.txt")?.expect("a member of that name");
//! let bytes = archive.read(id, &index.inode(id)?, 0, 4096)?;
//! assert_eq!(&*bytes, b"hello\n");
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod archive;
mod bytes;
mod caches;
pub mod codec;
mod error;
/// Text from outside shown escaped (the workspace's one escaping type, [`escape::Shown`]).
pub use stagefs_text as escape;
mod fault;
pub mod fill;
pub mod guard;
pub mod hash;
mod identity;
pub mod index;
mod page_cache;
mod reader;
mod saved;
pub mod seekable;
pub mod set;
mod source;
mod squashfs;
pub mod stop;
pub mod tar;
mod within;
pub mod zip;

pub use archive::{read_file, Archive, Format};
pub use bytes::Bytes;
pub use caches::{Blocks, Caches};
pub use error::{OpenError, ReadError};
pub use identity::FileId;
pub use page_cache::drop_file_cache;
pub use reader::{Access, Reader};
pub use saved::SavedTables;
pub use source::{map_file, map_shared_file, Backing, Changed, Ranged, Source, SourceCache, StageChunkError};

#[cfg(any(test, feature = "test-support"))]
pub mod test_kit;
#[cfg(any(test, feature = "test-support"))]
pub mod test_rng;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
