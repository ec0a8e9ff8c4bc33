//! Maps of files that someone else may shrink: a SIGBUS inside one becomes a page of zeros and a flag on that map, never a dead process.
//!
//! A shared map of a file raises SIGBUS, on whichever thread touches it, at any page past
//! the file's end; a file served in place, a shard added to a growing mount or a saved
//! index may belong to another user, who can truncate it while stagefs scans it. Reading
//! through `pread` everywhere would cost every scan its zero-copy walk, and a private copy
//! would cost the RAM stagefs exists to save. So every map of such a file is a
//! `GuardedMap`: it is registered in a table that a process-wide SIGBUS handler
//! searches. A fault inside a registered map is answered by mapping a private page of
//! zeros over the faulting page (the access then reads zeros) and marking the map torn;
//! whoever read the map checks `GuardedMap::torn` (with the file's identity, see
//! `Source::check_intact`) before trusting anything it derived, and reports the file as
//! changed. A fault anywhere else goes on to the handler that was there before (Rust's
//! own, Python's faulthandler, or the default action), so real bugs still crash.
//!
//! The handler is installed by the first guarded map and put back on top by every later
//! one (a Python program may enable `faulthandler` after stagefs was imported). The table
//! is a fixed array of chunks allocated on demand and never freed, read with atomics
//! only: the handler may run at any instruction of any thread, so it takes no lock and
//! allocates nothing.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// A read-only shared map of a file, guarded against truncation (see the module doc).
/// Dereferences to the mapped bytes; pages lost to a truncation read as zeros.
pub(crate) struct GuardedMap {
    map: memmap2::Mmap,
    /// The table entry while the map is registered (`None`: an empty map, or one that
    /// needs no guard).
    slot: Option<&'static Slot>,
}

impl std::fmt::Debug for GuardedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedMap").field("len", &self.map.len()).field("torn", &self.torn()).finish()
    }
}

impl GuardedMap {
    /// Maps `file` read-only and registers the map with the SIGBUS guard.
    pub fn file(file: &std::fs::File) -> std::io::Result<GuardedMap> {
        install()?;
        // SAFETY: a read-only shared map. A truncation under it is turned into zero pages by
        // the guard registered below (never SIGBUS); a rewrite changes bytes that every
        // reader checks against the file's identity after use (`Source::check_intact`).
        let map = unsafe { memmap2::Mmap::map(file) }?;
        let slot = (!map.is_empty()).then(|| register(map.as_ptr() as usize, map.len()));
        Ok(GuardedMap { map, slot })
    }

    /// A map that needs no guard: anonymous memory, or a memfd only this process holds.
    pub fn private(map: memmap2::Mmap) -> GuardedMap {
        GuardedMap { map, slot: None }
    }

    /// Whether a page of the map was lost to a truncation (and now reads as zeros).
    pub fn torn(&self) -> bool {
        self.slot.is_some_and(|slot| slot.torn.load(Ordering::Acquire))
    }

    /// The map itself, for advice to the kernel.
    pub fn map(&self) -> &memmap2::Mmap {
        &self.map
    }
}

impl std::ops::Deref for GuardedMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // Out of the table before the range is unmapped (by the map's own drop, after
            // this): a fault there afterwards is nobody's business of ours.
            slot.start.store(0, Ordering::Release);
            slot.len.store(0, Ordering::Release);
            slot.torn.store(false, Ordering::Release);
            slot.used.store(false, Ordering::Release);
            FIRST_WITH_ROOM.fetch_min(slot.chunk, Ordering::AcqRel);
        }
    }
}

/// One registered map: `[start, start + len)`; `start == 0` while free or being filled.
struct Slot {
    /// The chunk it lies in.
    chunk: usize,
    used: AtomicBool,
    start: AtomicUsize,
    len: AtomicUsize,
    torn: AtomicBool,
}

const SLOTS_PER_CHUNK: usize = 1024;
/// At most 1,048,576 maps registered at once (shards of a set each hold one).
const CHUNKS: usize = 1024;

type Chunk = [Slot; SLOTS_PER_CHUNK];

static TABLE: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];
/// No chunk before this one has a free slot (a hint kept low by every slot freed): a set of
/// 10,000 shards registers each map without a search of all the maps before it.
static FIRST_WITH_ROOM: AtomicUsize = AtomicUsize::new(0);

/// Takes a free slot (allocating a chunk when all are taken) and fills it.
fn register(start: usize, len: usize) -> &'static Slot {
    let first = FIRST_WITH_ROOM.load(Ordering::Acquire).min(CHUNKS - 1);
    for (c, entry) in TABLE.iter().enumerate().skip(first) {
        let mut chunk = entry.load(Ordering::Acquire);
        if chunk.is_null() {
            let fresh: Box<Chunk> = Box::new(std::array::from_fn(|_| Slot {
                chunk: c,
                used: AtomicBool::new(false),
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                torn: AtomicBool::new(false),
            }));
            let fresh = Box::into_raw(fresh);
            chunk = match entry.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` came from Box::into_raw above and was never shared.
                    drop(unsafe { Box::from_raw(fresh) });
                    theirs
                }
            };
        }
        // SAFETY: chunks are never freed once published.
        let chunk: &'static Chunk = unsafe { &*chunk };
        for slot in chunk {
            if slot.used.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                slot.torn.store(false, Ordering::Release);
                slot.len.store(len, Ordering::Release);
                // Last: the handler matches a slot by its start.
                slot.start.store(start, Ordering::Release);
                // Chunks before `c` were full when looked at; a slot freed since lowers it.
                let _ = FIRST_WITH_ROOM.compare_exchange(first, c, Ordering::AcqRel, Ordering::Relaxed);
                return slot;
            }
        }
    }
    // A million maps at once: beyond what any mount holds; fail loudly rather than unguarded.
    panic!("stagefs: more than {} files mapped at once", CHUNKS * SLOTS_PER_CHUNK)
}

/// The registered map holding `addr`, if any. Runs inside the signal handler: atomics only.
fn find(addr: usize) -> Option<&'static Slot> {
    for entry in &TABLE {
        let chunk = entry.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: chunks are never freed once published.
        let chunk: &'static Chunk = unsafe { &*chunk };
        for slot in chunk {
            let start = slot.start.load(Ordering::Acquire);
            if start != 0 && addr >= start && addr - start < slot.len.load(Ordering::Acquire) {
                return Some(slot);
            }
        }
    }
    None
}

/// The action that was in place before ours, for faults that are not ours.
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// Puts the handler in place unless it is there already (see the module doc).
fn install() -> std::io::Result<()> {
    // SAFETY: sigaction reads and writes only the structures passed; `current` is written
    // by the first call before it is read.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut current) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if current.sa_sigaction == handler_address() {
            return Ok(());
        }
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = handler_address();
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        let mut before: libc::sigaction = std::mem::zeroed();
        // Published before ours is installed, so the handler always finds a previous action.
        // The old one is leaked: a handler on another thread may be reading it (a few bytes,
        // once per reinstallation).
        let mut replaced = Box::new(current);
        PREVIOUS.store(&mut *replaced, Ordering::Release);
        std::mem::forget(replaced);
        if libc::sigaction(libc::SIGBUS, &ours, &mut before) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if before.sa_sigaction != current.sa_sigaction {
            // Someone installed theirs between the two calls: chain to that one.
            let mut replaced = Box::new(before);
            PREVIOUS.store(&mut *replaced, Ordering::Release);
            std::mem::forget(replaced);
        }
    }
    Ok(())
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; only
    // async-signal-safe work follows (atomics, mmap, a call of the previous handler).
    unsafe {
        // si_code > 0: the kernel raised it for a memory access (not kill/raise).
        if !info.is_null() && (*info).si_code > 0 {
            let addr = (*info).si_addr() as usize;
            if let Some(slot) = find(addr) {
                let page = page_size();
                let zeros = libc::mmap(
                    (addr & !(page - 1)) as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if zeros != libc::MAP_FAILED {
                    slot.torn.store(true, Ordering::Release);
                    // Returning re-runs the access, which now reads the zero page.
                    return;
                }
            }
        }
        let previous = PREVIOUS.load(Ordering::Acquire);
        let action = if previous.is_null() { libc::SIG_DFL } else { (*previous).sa_sigaction };
        if action == libc::SIG_IGN {
            return;
        }
        if action == libc::SIG_DFL || action == handler_address() {
            // The default action: put it back; returning re-runs the access, which faults
            // again and ends the process as it would have without us.
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(signal);
            }
            return;
        }
        if (*previous).sa_flags & libc::SA_SIGINFO != 0 {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(action);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(libc::c_int) = std::mem::transmute(action);
            handler(signal);
        }
    }
}

/// Our handler as `sigaction` names handlers: an address.
fn handler_address() -> libc::sighandler_t {
    on_sigbus as *const () as libc::sighandler_t
}

fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf has no preconditions.
            let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
            PAGE.store(page, Ordering::Relaxed);
            page
        }
        page => page,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_truncation_under_the_map_reads_zeros_and_tears_it() {
        let _ = page_size(); // the handler must not be the first to ask
        let path = std::env::temp_dir().join(format!("stagefs-guard-test-{}", std::process::id()));
        let page = page_size();
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 3 * page]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = GuardedMap::file(&file).unwrap();
        assert_eq!(map[2 * page], 7);
        assert!(!map.torn());
        std::fs::File::options().write(true).open(&path).unwrap().set_len(page as u64).unwrap();
        // Past the new end: SIGBUS without the guard; zeros and a torn map with it.
        let sum: u64 = map[page..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 0);
        assert!(map.torn());
        assert_eq!(map[0], 7, "pages before the new end are the file's");
        let other = GuardedMap::file(&file).unwrap();
        assert!(!other.torn(), "a map is torn alone");
        drop(map);
        drop(other);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn slots_are_reused_and_found_by_address() {
        let a = register(0x1000_0000, 0x2000);
        assert!(std::ptr::eq(find(0x1000_1fff).unwrap(), a));
        assert!(find(0x1000_2000).is_none_or(|s| !std::ptr::eq(s, a)));
        a.start.store(0, Ordering::Release);
        a.used.store(false, Ordering::Release);
        assert!(find(0x1000_0000).is_none_or(|s| !std::ptr::eq(s, a)));
    }
}
