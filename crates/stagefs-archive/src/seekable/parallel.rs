//! Independent units of a compressed file (bzip2 blocks, zstd frames) decoded on every core, handed out in order.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Decodes unit `i`.
pub(super) type DecodeUnit<T> = dyn Fn(usize) -> T + Send + Sync;

/// Units decoded ahead of the consumer, at most this many per worker (bounds memory).
pub(super) const AHEAD_PER_WORKER: usize = 2;

/// Worker threads: one per core, at most 16.
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16)
}

struct State<T> {
    /// The next unit a worker takes.
    next_to_decode: usize,
    /// Units decoded and not yet taken.
    done: BTreeMap<usize, T>,
    /// Units the consumer has taken (all below this).
    taken: usize,
    stop: bool,
    /// A decoder panicked: the pass fails rather than wait for a unit that never comes.
    panicked: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
}

/// `count` units decoded by worker threads, taken in order with [`Ordered::take`].
pub(super) struct Ordered<T> {
    shared: Arc<Shared<T>>,
    count: usize,
    next: usize,
    workers: Vec<JoinHandle<()>>,
}

impl<T: Send + 'static> Ordered<T> {
    /// Decodes `count` units with `decode`, at most `ahead` of them (at least 1) done and
    /// not yet taken (which bounds memory), on at most [`threads`] threads.
    pub(super) fn new(count: usize, decode: Arc<DecodeUnit<T>>, ahead: usize) -> Ordered<T> {
        let ahead = ahead.max(1);
        let threads = threads().min(ahead);
        let state = State { next_to_decode: 0, done: BTreeMap::new(), taken: 0, stop: false, panicked: false };
        let shared = Arc::new(Shared { state: Mutex::new(state), changed: Condvar::new() });
        let workers = (0..threads.min(count))
            .map(|_| {
                let (shared, decode) = (shared.clone(), decode.clone());
                std::thread::spawn(move || work(&shared, &*decode, count, ahead))
            })
            .collect();
        Ordered { shared, count, next: 0, workers }
    }

    /// Whether [`Ordered::take`] would return without waiting.
    pub(super) fn ready(&self) -> bool {
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        self.next == self.count || state.panicked || state.done.contains_key(&self.next)
    }

    /// The next unit, or `None` after the last; an error if a decoder panicked.
    pub(super) fn take(&mut self) -> Option<Result<T, String>> {
        if self.next == self.count {
            return None;
        }
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(unit) = state.done.remove(&self.next) {
                self.next += 1;
                state.taken = self.next;
                self.shared.changed.notify_all();
                return Some(Ok(unit));
            }
            if state.panicked {
                return Some(Err(format!("the decoder of unit {} panicked", self.next)));
            }
            state = self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn work<T>(shared: &Shared<T>, decode: &DecodeUnit<T>, count: usize, ahead: usize) {
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
        // A decoder that panics ends the pass (`stop`): the consumer must never wait forever.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(unit)));
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        match decoded {
            Ok(decoded) => {
                state.done.insert(unit, decoded);
            }
            Err(_) => (state.stop, state.panicked) = (true, true),
        }
        shared.changed.notify_all();
    }
}

impl<T> Drop for Ordered<T> {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.changed.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
