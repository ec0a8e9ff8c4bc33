//! One archive being written: a temp file made with `O_EXCL` beside OUT, renamed into place only once complete.
//!
//! The temp file has an unpredictable name and mode 0600 while it is written, and is
//! opened without following symlinks, so nobody else's planted file or link is ever
//! written through (a world-writable directory on a login node). Renaming replaces what
//! is at OUT itself, never what a symlink there points to. Dropped before [`Output::install`],
//! the temp file is removed: an error or a signal leaves no partial archive.

use stagefs_archive::escape::Shown;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::compress::{Compression, Framer};
use super::errors::PackError;
use super::index::ShardIndex;
use stagefs_archive::tar::write as tar_writer;

/// An archive being written.
pub struct Output {
    pub final_path: PathBuf,
    tmp: PathBuf,
    file: BufWriter<File>,
    pos: u64,
    pub index: ShardIndex,
    /// Directories already written to this archive.
    pub dirs: std::collections::HashSet<Vec<u8>>,
    installed: bool,
    /// `--compress`: the tar goes through this into frames.
    pub framer: Option<Framer>,
}

impl Output {
    /// Creates the temp file for `final_path`.
    pub fn create(final_path: &Path, compress: Option<(Compression, Option<i32>)>) -> Result<Output, PackError> {
        let mut name = OsString::from(".");
        name.push(final_path.file_name().unwrap_or_default());
        name.push(format!(".{}.stagefs-pack", stagefs_open::places::random_suffix()));
        let tmp = final_path.with_file_name(name);
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|source| PackError::Output {
                path: final_path.to_owned(),
                what: format!("cannot create a temporary file in {}", dir_of(final_path).shown()),
                source,
            })?;
        Ok(Output {
            final_path: final_path.to_owned(),
            tmp,
            file: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            index: ShardIndex::default(),
            dirs: Default::default(),
            installed: false,
            framer: compress.map(|(compression, level)| Framer::new(compression, level)),
        })
    }

    fn error(&self, what: &str, source: std::io::Error) -> PackError {
        PackError::Output { path: self.final_path.clone(), what: what.into(), source }
    }

    /// Bytes written so far: where the next member starts.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// A member of `len` tar bytes starts here (`u64::MAX`: not known yet): where a
    /// compressed archive may cut a frame.
    pub fn member_starts(&mut self, len: u64) -> Result<(), PackError> {
        if let Some(framer) = &mut self.framer {
            framer.member_starts(len, &mut self.file).map_err(|e| self.error("cannot write", e))?;
        }
        Ok(())
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<(), PackError> {
        let written = match &mut self.framer {
            Some(framer) => framer.write(bytes, &mut self.file),
            None => self.file.write_all(bytes),
        };
        written.map_err(|e| self.error("cannot write", e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Pads content of `len` bytes to a whole block.
    pub fn pad(&mut self, len: u64) -> Result<(), PackError> {
        let zeros = [0u8; tar_writer::BLOCK as usize];
        self.write(&zeros[..tar_writer::padding(len)])
    }

    /// Drops everything from `pos` on (a member whose file changed while it was copied).
    pub fn truncate(&mut self, pos: u64) -> Result<(), PackError> {
        let file_pos = match &mut self.framer {
            Some(framer) => framer.truncate(pos, &mut self.file).map_err(|e| self.error("cannot write", e))?,
            None => pos,
        };
        self.file.flush().map_err(|e| self.error("cannot write", e))?;
        let file = self.file.get_mut();
        let result = file.set_len(file_pos).and_then(|()| file.seek(std::io::SeekFrom::Start(file_pos)));
        result.map_err(|e| self.error("cannot truncate", e))?;
        self.pos = pos;
        Ok(())
    }

    /// Ends the archive and gives it its final `mode`; still under the temp name. Not
    /// fsync'ed (tar does not either): the rename protects against errors and signals,
    /// not against a crash of the machine.
    pub fn finish(&mut self, mode: u32) -> Result<(), PackError> {
        self.member_starts(tar_writer::end().len() as u64)?;
        self.write(&tar_writer::end())?;
        if let Some(framer) = &mut self.framer {
            framer.finish(&mut self.file).map_err(|e| PackError::Output {
                path: self.final_path.clone(),
                what: "cannot write".into(),
                source: e,
            })?;
        }
        self.file.flush().map_err(|e| self.error("cannot write", e))?;
        let file = self.file.get_ref();
        file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| self.error("cannot chmod", e))
    }

    /// Checks, before any archive of a pack is renamed into place, that this one can be:
    /// its name is free, or an entry the rename may replace (in a sticky directory, only
    /// the user's own or the directory owner's entries can be replaced).
    pub fn check_installable(&self) -> Result<(), PackError> {
        use std::os::unix::fs::MetadataExt;
        let Ok(there) = std::fs::symlink_metadata(&self.final_path) else { return Ok(()) };
        let refuse = |why: &str| self.error(why, std::io::Error::from_raw_os_error(libc::EPERM));
        if there.is_dir() {
            return Err(refuse("a directory has this name"));
        }
        let dir =
            std::fs::metadata(dir_of(&self.final_path)).map_err(|e| self.error("cannot inspect its directory", e))?;
        let me = stagefs_open::places::my_uid();
        if dir.mode() & libc::S_ISVTX != 0 && there.uid() != me && dir.uid() != me && me != 0 {
            return Err(refuse(&format!(
                "cannot rename the finished archive into place: it exists and belongs to another user, {}, in a \
                 directory with the sticky bit; nothing was installed",
                stagefs_open::places::user_label(there.uid())
            )));
        }
        Ok(())
    }

    /// Takes an installed archive back out (a later shard of the same pack could not be
    /// installed): nothing partial is left. Only the file this pack wrote is removed.
    pub fn uninstall(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if !self.installed {
            return;
        }
        let ours = self.file.get_ref().metadata().map(|m| (m.dev(), m.ino()));
        let there = std::fs::symlink_metadata(&self.final_path).map(|m| (m.dev(), m.ino()));
        if let (Ok(ours), Ok(there)) = (ours, there) {
            if ours == there {
                let _ = std::fs::remove_file(&self.final_path);
            }
        }
        self.installed = false;
    }

    /// Renames the finished archive into place.
    pub fn install(&mut self) -> Result<(), PackError> {
        std::fs::rename(&self.tmp, &self.final_path).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (it exists and belongs to another user, in a directory with the sticky bit?)"
            } else {
                ""
            };
            self.error(&format!("cannot rename the finished archive into place{hint}"), e)
        })?;
        self.installed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.installed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
