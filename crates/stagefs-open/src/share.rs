//! One copy per node: a process of the user that opens an archive which a daemon of theirs already serves from a copy in RAM maps that copy, and its saved index, instead of staging its own; both are handed over a Unix socket (SCM_RIGHTS).
//!
//! The daemon of a mount whose archive is one local file listens on `<hash of the
//! mountpoint>.share` beside its record, in the runtime directory that `places` checked to
//! be this user's alone. A caller is answered only when it is this user (SO_PEERCRED), and
//! answers only from this user's daemon are taken; nothing is read from the caller. The
//! answer is one message: the archive's identity as the daemon opened it, then the copy's
//! memfd (sealed against shrinking and growing first, so that no map of it can fault) and,
//! when the index is a saved file, that file. The caller takes them only when the identity
//! is the version of the archive it opened itself, and the saved index is keyed to it; it
//! maps both read-only (the pages are the daemon's: one copy, however many readers), and
//! keeps them when the daemon exits, as an open file stays open.
//!
//! Only a complete copy is handed on: `--stage copy` (a plain tar copied, a compressed one
//! decompressed whole) once the copy is in. A mount served in place shares through the
//! page cache already; a compressed tar served from restart points decodes per reader.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{fcntl_add_seals, fcntl_get_seals, SealFlags};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use stagefs_archive::escape::Shown;
use stagefs_archive::{Archive, FileId, Format};

use crate::open::{Indexing, Opened};
use crate::places::{self, OutsideFile};
use crate::sockets;
use crate::stage::Staging;

const MAGIC: &[u8; 16] = b"stagefs-share-1\0";
/// The answer: the magic, 1 (fds attached) or 0 (a reason follows), the identity.
const HEADER: usize = MAGIC.len() + 1 + 7 * 8;
/// How long a caller waits for a daemon's answer before it stages its own copy.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers one caller of a daemon's share socket with `copy`: the complete copy in RAM of
/// the archive `id` and, when its index is a saved file, that file; `None` when the mount
/// holds no such copy (in place, still staging, or decoded piece by piece). Only this user
/// is answered; the copy is sealed against changes of size before it is handed over.
pub fn answer(stream: &UnixStream, id: &FileId, copy: Option<(&File, Option<&File>)>) {
    let caller = sockets::peer_uid(stream);
    if caller != Some(places::my_uid()) {
        tracing::warn!(uid = ?caller, "refused to share this mount's copy with another user");
        return;
    }
    let _ = stream.set_write_timeout(Some(ANSWER_TIMEOUT));
    let refuse = |why: &str| {
        let _ = send(stream, &[&header(0, id)[..], why.as_bytes()].concat(), &[]);
    };
    let Some((copy, index)) = copy else {
        return refuse("this mount holds no complete copy in RAM (in place, still staging, or decoded piece by piece)");
    };
    if let Err(e) = seal(copy) {
        return refuse(&format!("cannot seal the copy: {e}"));
    }
    let mut fds = vec![copy.as_fd()];
    fds.extend(index.map(|f| f.as_fd()));
    if let Err(e) = send(stream, &header(1, id), &fds) {
        tracing::debug!("cannot hand the copy over: {e}");
    }
}

/// What [`seal`] seals a copy against: a change of its size.
const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// Seals the memfd `copy` against shrinking and growing: a process it is handed to maps it
/// knowing that no page of the map can ever be taken away (no SIGBUS).
fn seal(copy: &File) -> std::io::Result<()> {
    Ok(fcntl_add_seals(copy, SIZE_SEALS)?)
}

/// Whether the memfd `copy` is sealed as [`seal`] seals it.
fn is_sealed(copy: &File) -> bool {
    fcntl_get_seals(copy).is_ok_and(|seals| seals.contains(SIZE_SEALS))
}

fn header(status: u8, id: &FileId) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.push(status);
    for n in [id.dev, id.ino, id.size] {
        out.extend(n.to_le_bytes());
    }
    for n in [id.mtime.0, id.mtime.1, id.ctime.0, id.ctime.1] {
        out.extend(n.to_le_bytes());
    }
    out
}

/// The status and identity of an answer, if it is one.
fn parse_header(bytes: &[u8]) -> Option<(u8, FileId)> {
    let rest = bytes.strip_prefix(&MAGIC[..])?;
    let (&status, rest) = rest.split_first()?;
    let mut words = rest.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()));
    let mut next = || words.next();
    let (dev, ino, size) = (next()?, next()?, next()?);
    let (mtime, ctime) = ((next()? as i64, next()? as i64), (next()? as i64, next()? as i64));
    Some((status, FileId { dev, ino, size, mtime, ctime, nlink: 1 }))
}

fn send(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd]) -> std::io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one answer"));
    }
    Ok(sendmsg(stream, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?)
}

/// This user's live mounts that may hand over a copy: one archive, staged as a copy (a
/// growing set, a mount in place or on the local disk offers none).
pub fn offering() -> Vec<crate::registry::Record> {
    let records = crate::registry::list().unwrap_or_default();
    records.into_iter().filter(|r| r.shards.is_none() && r.staging == Staging::Copy.name()).collect()
}

/// The archive `file` from the copy a daemon of this user serves of it, if one does (see
/// the module doc); `None`: stage and index it as usual. `indexing`: the levels of tars
/// inside opened as directories (a saved index is only used for the same), and the
/// caches what is decoded goes to.
pub fn receive(file: &OutsideFile, indexing: &Indexing) -> Option<Opened> {
    for record in offering() {
        match receive_from(&record.mountpoint, file, indexing) {
            Ok(Some(opened)) => {
                tracing::info!(mountpoint = %record.mountpoint.shown(), "reading the copy this mount holds in RAM");
                return Some(opened);
            }
            Ok(None) => {}
            Err(why) => tracing::debug!(mountpoint = %record.mountpoint.shown(), "not using its copy: {why}"),
        }
    }
    None
}

fn receive_from(mountpoint: &Path, file: &OutsideFile, indexing: &Indexing) -> Result<Option<Opened>, String> {
    let Some(stream) = sockets::connect(mountpoint, "share") else { return Ok(None) };
    if sockets::peer_uid(&stream) != Some(places::my_uid()) {
        return Err("the share socket is not served by you".into());
    }
    let (bytes, fds) = receive_message(&stream)?;
    let (status, id) = parse_header(&bytes).ok_or("not an answer of this stagefs version")?;
    if !id.same_version(&file.id()) {
        return Ok(None); // another archive, or another version of it
    }
    if status != 1 {
        return Err(String::from_utf8_lossy(bytes.get(HEADER..).unwrap_or_default()).into_owned());
    }
    let mut fds = fds.into_iter().map(File::from);
    let copy = fds.next().ok_or("no copy came with the answer")?;
    if !is_sealed(&copy) {
        return Err("the copy is not sealed against changes of size".into());
    }
    let path = file.resolved();
    let backing = stagefs_archive::Source::shared_copy(&copy).map_err(|e| format!("cannot map the copy: {e}"))?;
    let archive = match fds.next() {
        Some(index) => {
            let key = crate::saved_index::Key::of(file.file()).map_err(|e| e.to_string())?;
            let (index, reader) =
                crate::saved_index::decode_file(&index, mountpoint, &key, indexing.depth, &backing, &indexing.caches)
                    .map_err(|e| format!("its saved index: {e}"))?;
            Archive::new(index, Format::Tar, reader)
        }
        None => Archive::from_backing(path, backing, &indexing.caches).map_err(|e| e.to_string())?,
    };
    Ok(Some(Opened::handed_over(archive, 0, Staging::Shared, vec![file.id()])))
}

/// One answer: its bytes and the descriptors that came with it (at most two).
fn receive_message(stream: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), String> {
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg =
        recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC).map_err(|e| format!("no answer: {e}"))?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    let (len, truncated) = (msg.bytes, msg.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC));
    if truncated {
        return Err("the answer did not fit".into());
    }
    buf.truncate(len);
    Ok((buf, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_s_header_round_trips_and_anything_else_is_no_answer() {
        let id = FileId { dev: 1, ino: u64::MAX, size: 3, mtime: (-4, 5), ctime: (6, 999_999_999), nlink: 1 };
        let bytes = header(1, &id);
        assert_eq!(bytes.len(), HEADER);
        assert_eq!(parse_header(&bytes), Some((1, id)));
        let refused = [&header(0, &id)[..], b"why"].concat();
        assert_eq!(parse_header(&refused).map(|(status, _)| status), Some(0));
        assert_eq!(parse_header(&bytes[..HEADER - 1]), None, "short");
        assert_eq!(parse_header(b"stagefs-share-2\0\x01"), None, "another version");
        assert_eq!(parse_header(b""), None);
    }

    #[test]
    fn only_a_memfd_sealed_against_changes_of_size_is_taken() {
        let path = Path::new("/tmp/share-test.tar");
        let copy = crate::stage::ram::memfd(path, 4096).unwrap();
        assert!(!is_sealed(&copy));
        seal(&copy).unwrap();
        assert!(is_sealed(&copy));
        assert!(copy.set_len(0).is_err(), "a sealed copy cannot shrink");
        let file = tempfile_in_tmp();
        assert!(seal(&file).is_err() && !is_sealed(&file), "a plain file has no seals");
    }

    fn tempfile_in_tmp() -> File {
        let path = std::env::temp_dir().join(format!("stagefs-share-unit-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
