//! An object read once from start to end (a tar's index scan in place) with several range requests ahead of the reader, in bounded memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::client::{Client, Object};
use crate::error::RemoteError;
use crate::fetch::read_range;

/// Bytes per request of a stream.
const CHUNK: u64 = 4 << 20;

impl Client {
    /// Bytes `offset..offset + len` of `object` (fewer at its end), pinned to its version.
    pub fn get_range(&self, object: &Object, offset: u64, len: usize) -> Result<Vec<u8>, RemoteError> {
        let end = offset.saturating_add(len as u64).min(object.version.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        read_range(self, object, (offset, end, self.config().tries), &|| false, &mut |at, bytes| {
            let from = (at - offset) as usize;
            out[from..from + bytes.len()].copy_from_slice(bytes);
            Ok(())
        })?;
        Ok(out)
    }

    /// The whole object as a reader, with up to `config.concurrency` requests of 4 MiB
    /// ahead of it (memory: at most twice that many chunks). Dropping it stops them.
    pub fn stream(&self, object: &Object) -> ObjectStream {
        let ahead = self.config().concurrency.max(1) as u64;
        let shared = Arc::new(StreamShared {
            chunks: Mutex::new((BTreeMap::new(), None)),
            changed: Condvar::new(),
            next: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            ahead,
        });
        let chunks = object.version.size.div_ceil(CHUNK);
        for _ in 0..ahead.min(chunks) {
            let (shared, client, object) = (shared.clone(), self.clone(), object.clone());
            let _ =
                std::thread::Builder::new().name("stagefs-stream".into()).spawn(move || shared.work(&client, &object));
        }
        ObjectStream { shared, size: object.version.size, chunk: 0, current: Vec::new(), pos: 0 }
    }
}

/// Chunks fetched, by number, and the first error.
type Fetched = (BTreeMap<u64, Vec<u8>>, Option<RemoteError>);

struct StreamShared {
    /// Fetched chunks by number, and the first error.
    chunks: Mutex<Fetched>,
    changed: Condvar,
    next: AtomicU64,
    /// Chunks the reader has taken: workers stay within `ahead` of it.
    consumed: AtomicU64,
    stop: AtomicBool,
    ahead: u64,
}

impl StreamShared {
    fn work(&self, client: &Client, object: &Object) {
        let size = object.version.size;
        let stopped = || self.stop.load(Ordering::Relaxed);
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            if n * CHUNK >= size || stopped() {
                return;
            }
            // Wait until the reader is close enough (bounded memory).
            while n >= self.consumed.load(Ordering::Relaxed) + self.ahead && !stopped() {
                let guard = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
                let _ = self.changed.wait_timeout(guard, Duration::from_millis(50));
            }
            let (start, end) = (n * CHUNK, ((n + 1) * CHUNK).min(size));
            let mut buf = vec![0u8; (end - start) as usize];
            let result = read_range(client, object, (start, end, client.config().tries), &stopped, &mut |at, bytes| {
                let from = (at - start) as usize;
                buf[from..from + bytes.len()].copy_from_slice(bytes);
                Ok(())
            });
            let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(()) => {
                    chunks.0.insert(n, buf);
                }
                Err(e) => {
                    chunks.1.get_or_insert(e);
                    self.stop.store(true, Ordering::Relaxed);
                }
            }
            self.changed.notify_all();
        }
    }
}

/// See [`Client::stream`].
pub struct ObjectStream {
    shared: Arc<StreamShared>,
    size: u64,
    chunk: u64,
    current: Vec<u8>,
    pos: usize,
}

impl std::io::Read for ObjectStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.current.len() {
            if self.chunk * CHUNK >= self.size {
                return Ok(0);
            }
            let mut chunks = self.shared.chunks.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(bytes) = chunks.0.remove(&self.chunk) {
                    self.current = bytes;
                    self.pos = 0;
                    self.chunk += 1;
                    self.shared.consumed.store(self.chunk, Ordering::Relaxed);
                    self.shared.changed.notify_all();
                    break;
                }
                if let Some(e) = &chunks.1 {
                    return Err(std::io::Error::other(e.to_string()));
                }
                chunks = self
                    .shared
                    .changed
                    .wait_timeout(chunks, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for ObjectStream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
    }
}
