//! How the client reads the files it needs (AWS config and credentials, a CA bundle, a web identity token, `~/.netrc`): through one door its caller supplies, which judges who could have written them.
//!
//! A credential or CA file that another user of the node could have put in place (a link
//! they planted, a directory on the way they may write) would hand them the user's
//! requests: their CA, their keys. The stagefs crate owns the one door for files from
//! outside (`places`); this crate opens no path by itself (a test of the stagefs crate
//! fails on any open here), so the door is handed in with the [`crate::Config`].

use std::path::Path;
use std::sync::Arc;

/// A file read through the door: its bytes and permission bits (`~/.netrc` is refused
/// when others may read it).
#[derive(Debug)]
pub struct ReadFile {
    pub bytes: Vec<u8>,
    pub mode: u32,
}

/// Why the door gives no file's bytes, or the text of the bytes it gave cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The door refused the file, or could not read it: its own error, shown as it is.
    #[error(transparent)]
    Refused(Box<dyn std::error::Error + Send + Sync>),
    #[error("this client was given no way to read files")]
    NoDoor,
    #[error("it is not UTF-8 text")]
    NotText,
}

type Door = dyn Fn(&Path, u64) -> Result<Option<ReadFile>, FileError> + Send + Sync;

/// The door: reads the file at a path, at most a given number of bytes, if it may be
/// trusted; `Ok(None)` when there is none, `Err(why)` when there is one it refuses or
/// cannot read.
#[derive(Clone)]
pub struct Files(Arc<Door>);

impl Files {
    pub fn new(door: impl Fn(&Path, u64) -> Result<Option<ReadFile>, FileError> + Send + Sync + 'static) -> Files {
        Files(Arc::new(door))
    }

    /// A door that opens nothing (the default): no credential file, CA bundle or netrc is
    /// read, and each says why.
    pub fn none() -> Files {
        Files::new(|_, _| Err(FileError::NoDoor))
    }

    /// The file at `path`, at most `cap` bytes (see [`Files`]).
    pub fn read(&self, path: &Path, cap: u64) -> Result<Option<ReadFile>, FileError> {
        (self.0)(path, cap)
    }

    /// The file's text (UTF-8), at most `cap` bytes.
    pub fn text(&self, path: &Path, cap: u64) -> Result<Option<String>, FileError> {
        match self.read(path, cap)? {
            Some(file) => String::from_utf8(file.bytes).map(Some).map_err(|_| FileError::NotText),
            None => Ok(None),
        }
    }
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Files(..)")
    }
}
