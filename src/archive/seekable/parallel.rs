//! Independent units of a compressed file (bzip2 blocks) decoded on every core, handed out in order.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Decodes unit `i`.
pub(super) type DecodeUnit = dyn Fn(usize) -> Result<Vec<u8>, String> + Send + Sync;

/// Units decoded ahead of the consumer, at most this many per worker (bounds memory).
const AHEAD_PER_WORKER: usize = 2;

struct State {
    /// The next unit a worker takes.
    next_to_decode: usize,
    /// Units decoded and not yet taken.
    done: BTreeMap<usize, Result<Vec<u8>, String>>,
    /// Units the consumer has taken (all below this).
    taken: usize,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// `count` units decoded by worker threads, taken in order with [`Ordered::take`].
pub(super) struct Ordered {
    shared: Arc<Shared>,
    count: usize,
    next: usize,
    workers: Vec<JoinHandle<()>>,
}

impl Ordered {
    pub(super) fn new(count: usize, decode: Arc<DecodeUnit>) -> Ordered {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
        let state = State { next_to_decode: 0, done: BTreeMap::new(), taken: 0, stop: false };
        let shared = Arc::new(Shared { state: Mutex::new(state), changed: Condvar::new() });
        let ahead = threads * AHEAD_PER_WORKER;
        let workers = (0..threads.min(count))
            .map(|_| {
                let (shared, decode) = (shared.clone(), decode.clone());
                std::thread::spawn(move || work(&shared, &*decode, count, ahead))
            })
            .collect();
        Ordered { shared, count, next: 0, workers }
    }

    /// The next unit's bytes, or `None` after the last.
    pub(super) fn take(&mut self) -> Option<Result<Vec<u8>, String>> {
        if self.next == self.count {
            return None;
        }
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(unit) = state.done.remove(&self.next) {
                self.next += 1;
                state.taken = self.next;
                self.shared.changed.notify_all();
                return Some(unit);
            }
            state = self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn work(shared: &Shared, decode: &DecodeUnit, count: usize, ahead: usize) {
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        while !state.stop && state.next_to_decode < count && state.next_to_decode >= state.taken + ahead {
            state = shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.stop || state.next_to_decode >= count {
            return;
        }
        let unit = state.next_to_decode;
        state.next_to_decode += 1;
        drop(state);
        // A decoder that panics fails its unit: the consumer must never wait forever.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(unit)))
            .unwrap_or_else(|_| Err("the decoder panicked".into()));
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.done.insert(unit, decoded);
        shared.changed.notify_all();
    }
}

impl Drop for Ordered {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.changed.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
