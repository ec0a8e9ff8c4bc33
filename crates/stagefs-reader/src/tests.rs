//! Pipeline tests on the host backend, using crate-internal hooks (slot event log, upload delay).

use crate::order::{epoch_order, shard};
use crate::ring::SlotEvent;
use crate::{Backend, BackendChoice, Config, DeviceBuffer, Error, FileList, Loader};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

// The integration tests' tree builder: files `d{i/10}/f{i:04}.bin` with index-derived
// content, removed on drop.
#[path = "../tests/common/mod.rs"]
mod common;
use common::{content, Tree};

/// Sizes for the 3000-byte slots of `host()`: some files empty, none larger than a slot.
fn sizes(n: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 397) % 900 + (i % 3) * 50).collect()
}

fn host() -> Config {
    Config::default().backend(BackendChoice::Host).slot_bytes(3000).depth(3).io_threads(3)
}

/// Runs a loader to the end and returns, per batch, (epoch, file indices);
/// also checks every file's bytes at its offset.
fn drain(loader: &mut Loader) -> Vec<(usize, Vec<usize>)> {
    drain_from(loader, Some(0))
}

/// [`drain`] whose first batch has sequence number `first` (any, for `None`: sequence
/// numbers run on over a loader's life, across `restart`).
fn drain_from(loader: &mut Loader, first: Option<u64>) -> Vec<(usize, Vec<usize>)> {
    let mut out = Vec::new();
    let mut expect_seq = first;
    while let Some(b) = loader.next_batch().unwrap() {
        assert_eq!(b.seq(), *expect_seq.get_or_insert(b.seq()), "batches out of order");
        expect_seq = Some(b.seq() + 1);
        #[allow(irrefutable_let_patterns)] // without the `cuda` feature Host is the only variant
        let DeviceBuffer::Host(bytes) = b.device().unwrap() else {
            panic!("host backend expected")
        };
        assert_eq!(bytes.len() as u64, b.total_bytes());
        for ((&f, &off), &len) in b.file_indices().iter().zip(b.offsets()).zip(b.lengths()) {
            let got = &bytes[off as usize..(off + len) as usize];
            assert!(got == content(f, len as usize).as_slice(), "file {f} corrupted in batch {}", b.seq());
        }
        out.push((b.epoch(), b.file_indices().to_vec()));
    }
    out
}

#[test]
fn pipeline_delivers_all_files_in_order_with_correct_bytes() {
    let t = Tree::new(&sizes(60));
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), host()).unwrap();
    assert_eq!(l.backend(), Backend::Host);
    let got = drain(&mut l);
    let flat: Vec<usize> = got.iter().flat_map(|(_, f)| f.clone()).collect();
    assert_eq!(flat, (0..60).collect::<Vec<_>>());
    assert!(got.len() > 3, "expected several batches, got {}", got.len());
    let s = l.stats();
    assert_eq!(s.files, 60);
    assert_eq!(s.batches, got.len() as u64);
    assert_eq!(s.bytes_read, sizes(60).iter().sum::<usize>() as u64);
    assert_eq!(s.bytes_uploaded, s.bytes_read);
    assert!(l.next_batch().unwrap().is_none(), "finished loader must stay finished");
}

#[test]
fn shuffled_epochs_follow_the_seeded_permutation() {
    let t = Tree::new(&sizes(40));
    let cfg = host().shuffle(Some(11)).epochs(3);
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), cfg).unwrap();
    let got = drain(&mut l);
    let mut per_epoch = vec![Vec::new(); 3];
    for (e, f) in got {
        per_epoch[e].extend(f);
    }
    for (e, files) in per_epoch.iter().enumerate() {
        assert_eq!(files, &epoch_order(40, Some(11), e), "epoch {e}");
    }
    assert_ne!(per_epoch[0], per_epoch[1]);
}

#[test]
fn ranks_read_disjoint_shards_that_cover_the_epoch() {
    let t = Tree::new(&sizes(31));
    let world = 3;
    let mut union = Vec::new();
    for rank in 0..world {
        let cfg = host().shuffle(Some(5)).shard(rank, world);
        let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), cfg).unwrap();
        let mine: Vec<usize> = drain(&mut l).into_iter().flat_map(|(_, f)| f).collect();
        assert_eq!(mine, shard(&epoch_order(31, Some(5), 0), rank, world), "rank {rank}");
        union.extend(mine);
    }
    union.sort_unstable();
    assert_eq!(union, (0..31).collect::<Vec<_>>());
}

/// Checks the slot log: every refill of a slot comes after the completion of
/// that slot's previous upload. Returns the violations found.
fn reuse_violations(log: &[SlotEvent]) -> Vec<String> {
    let mut last_fill: HashMap<usize, u64> = HashMap::new();
    let mut completed = std::collections::HashSet::new();
    let mut bad = Vec::new();
    for ev in log {
        match *ev {
            SlotEvent::FillStart { slot, seq } => {
                if let Some(prev) = last_fill.insert(slot, seq) {
                    if !completed.contains(&prev) {
                        bad.push(format!(
                            "slot {slot} refilled for batch {seq} before upload of batch {prev} completed"
                        ));
                    }
                }
            }
            SlotEvent::UploadComplete { seq, .. } => {
                completed.insert(seq);
            }
            SlotEvent::UploadSubmitted { .. } => {}
        }
    }
    bad
}

fn run_with_log(skip_wait: bool) -> (Vec<SlotEvent>, usize) {
    let t = Tree::new(&sizes(60));
    let mut cfg = host().depth(2).epochs(2);
    cfg.record_slot_events = true;
    // Slow uploads: the consumer gets each batch while its copy is still
    // queued and drops it at once, so a refill that did not wait would race.
    cfg.upload_delay = Duration::from_millis(3);
    cfg.skip_reuse_wait = skip_wait;
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), cfg).unwrap();
    let mut n = 0;
    while let Some(b) = l.next_batch().unwrap() {
        n += 1;
        drop(b);
    }
    let log = l.shared().log.as_ref().unwrap().lock().unwrap().clone();
    (log, n)
}

#[test]
fn ring_slot_is_not_reused_before_its_upload_completed() {
    let (log, batches) = run_with_log(false);
    assert!(batches > 4);
    let fills = log.iter().filter(|e| matches!(e, SlotEvent::FillStart { .. })).count();
    assert_eq!(fills, batches);
    let v = reuse_violations(&log);
    assert!(v.is_empty(), "{v:#?}");
    // Each upload was submitted before it completed, once.
    for ev in &log {
        if let SlotEvent::UploadComplete { slot, seq } = *ev {
            let sub = log.iter().position(|e| *e == SlotEvent::UploadSubmitted { slot, seq }).unwrap();
            let done = log.iter().position(|e| e == ev).unwrap();
            assert!(sub < done);
        }
    }
}

#[test]
fn reuse_check_catches_a_refill_without_waiting() {
    // Negative control: proves the log-based check above can fail.
    let (log, _) = run_with_log(true);
    assert!(!reuse_violations(&log).is_empty(), "the checker saw no violation without the wait");
}

#[test]
fn holding_every_slot_is_an_error_not_a_hang() {
    let t = Tree::new(&sizes(30));
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), host().depth(2)).unwrap();
    let a = l.next_batch().unwrap().unwrap();
    let b = l.next_batch().unwrap().unwrap();
    assert!(matches!(l.next_batch(), Err(Error::RingExhausted { depth: 2 })));
    drop(a);
    let c = l.next_batch().unwrap().unwrap();
    assert_eq!(c.seq(), b.seq() + 1);
}

#[test]
fn dropping_the_loader_mid_epoch_joins_every_thread() {
    let t = Tree::new(&sizes(200));
    let mut cfg = host().depth(4).io_threads(4);
    cfg.upload_delay = Duration::from_millis(1);
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), cfg).unwrap();
    let shared = std::sync::Arc::clone(l.shared());
    assert_eq!(shared.live_workers.load(Ordering::SeqCst), 4);
    let held = l.next_batch().unwrap().unwrap();
    drop(l);
    assert_eq!(shared.live_workers.load(Ordering::SeqCst), 0, "I/O threads still running");
    // The copy thread is gone too: new uploads are refused.
    assert!(matches!(shared.ring.upload(0, 1, 99), Err(Error::Stopped)));
    // A batch that outlives the loader still reads its data.
    assert!(held.to_vec().is_ok());
}

#[test]
fn io_error_propagates_and_stops_the_pipeline() {
    let t = Tree::new(&sizes(50));
    let list = FileList::from_paths(&t.files).unwrap();
    std::fs::remove_file(&t.files[37]).unwrap();
    let mut l = Loader::new(list, host()).unwrap();
    let shared = std::sync::Arc::clone(l.shared());
    let err = loop {
        match l.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("epoch finished despite a missing file"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.path(), Some(t.files[37].as_path()), "{err}");
    assert!(err.to_string().contains("f0037"), "{err}");
    assert_eq!(shared.live_workers.load(Ordering::SeqCst), 0);
    assert!(matches!(l.next_batch(), Err(Error::Stopped)));
}

#[test]
fn missing_driver_falls_back_to_host_for_auto() {
    let t = Tree::new(&sizes(20));
    let mut cfg = host().backend(BackendChoice::Auto);
    cfg.assume_no_driver = true;
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), cfg).unwrap();
    assert_eq!(l.backend(), Backend::Host);
    assert_eq!(drain(&mut l).iter().map(|(_, f)| f.len()).sum::<usize>(), 20);
}

#[test]
fn h2d_probe_needs_an_idle_ring_and_measures_it() {
    let t = Tree::new(&sizes(20));
    let mut l = Loader::new(FileList::from_paths(&t.files).unwrap(), host()).unwrap();
    let b = l.next_batch().unwrap().unwrap();
    assert!(l.measure_h2d(2).is_err());
    drop(b);
    while l.next_batch().unwrap().is_some() {}
    let (bytes, t) = l.measure_h2d(4).unwrap();
    assert_eq!(bytes, 4 * 3000);
    assert!(t > Duration::ZERO);
    // Probe copies do not count as pipeline uploads.
    assert_eq!(l.stats().bytes_uploaded, l.stats().bytes_read);
}

/// `restart` streams the next epoch on the same ring: the same batches as a fresh loader
/// started at that epoch, also after a run left early with batches in flight (slow
/// uploads keep them queued), and never a slot refilled before its upload completed.
#[test]
fn restart_reuses_the_ring_and_matches_a_fresh_loader() {
    let t = Tree::new(&sizes(60));
    let files = FileList::from_paths(&t.files).unwrap();
    let mut cfg = host().shuffle(Some(5));
    cfg.record_slot_events = true;
    cfg.upload_delay = Duration::from_millis(2);
    let mut l = Loader::new(files.clone(), cfg.clone()).unwrap();
    let first = drain(&mut l);
    assert!(first.iter().all(|(e, _)| *e == 0));
    let ring = std::sync::Arc::as_ptr(l.shared());

    l.restart(1).unwrap();
    let again = drain_from(&mut l, None);
    let fresh = drain(&mut Loader::new(files.clone(), cfg.clone().first_epoch(1)).unwrap());
    assert_eq!(again, fresh, "epoch 1 on the reused ring differs from a fresh loader's");
    assert_eq!(std::sync::Arc::as_ptr(l.shared()), ring, "restart allocated a new ring");

    // Leave early: one batch taken, the others still in flight.
    let b = l.restart(2).and_then(|()| l.next_batch()).unwrap().expect("a batch");
    assert_eq!(b.epoch(), 2);
    drop(b);
    l.restart(3).unwrap();
    let fresh = drain(&mut Loader::new(files, cfg.first_epoch(3)).unwrap());
    assert_eq!(drain_from(&mut l, None), fresh);
    let log = l.shared().log.as_ref().unwrap().lock().unwrap().clone();
    assert_eq!(reuse_violations(&log), Vec::<String>::new());
}

/// Bytes of a [`crate::FileSource`] that holds its files in memory: the loader reads
/// them through it, never through a path (the paths name no file on disk).
#[derive(Debug)]
struct Memory {
    fail_at: Option<usize>,
}

impl crate::FileSource for Memory {
    fn read_at(&self, index: usize, entry: &crate::FileEntry, offset: u64, dst: &mut [u8]) -> crate::Result<()> {
        if self.fail_at == Some(index) {
            let source = std::io::Error::from_raw_os_error(5); // EIO: a damaged member
            return Err(Error::Io { path: entry.path.clone(), op: "read", source });
        }
        let bytes = content(index, entry.len as usize);
        dst.copy_from_slice(&bytes[offset as usize..offset as usize + dst.len()]);
        Ok(())
    }
}

fn memory_list(n: usize, fail_at: Option<usize>) -> FileList {
    let entries = sizes(n)
        .into_iter()
        .enumerate()
        .map(|(i, len)| crate::FileEntry { path: format!("member/{i}").into(), len: len as u64 })
        .collect();
    FileList::from_source(entries, std::sync::Arc::new(Memory { fail_at }))
}

#[test]
fn a_file_source_other_than_paths_feeds_the_same_pipeline() {
    let mut l = Loader::new(memory_list(40, None), host().shuffle(Some(3))).unwrap();
    let got = drain(&mut l);
    let mut flat: Vec<usize> = got.iter().flat_map(|(_, f)| f.clone()).collect();
    assert_ne!(flat, (0..40).collect::<Vec<_>>(), "shuffled");
    flat.sort_unstable();
    assert_eq!(flat, (0..40).collect::<Vec<_>>());
    let mut failing = Loader::new(memory_list(40, Some(7)), host()).unwrap();
    let err = std::iter::from_fn(|| Some(failing.next_batch())).find_map(|r| r.err()).unwrap();
    assert!(matches!(&err, Error::Io { path, .. } if path.to_str() == Some("member/7")), "{err}");
}
