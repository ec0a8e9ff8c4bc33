//! Packing one epoch's file order into batches that each fit one ring slot.

use crate::error::{Error, Result};
use crate::files::FileList;

/// One batch: which files, and where each lands in the slot (back to back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedBatch {
    pub epoch: usize,
    pub index: usize,
    /// Indices into the [`FileList`].
    pub files: Vec<usize>,
    pub offsets: Vec<u64>,
    pub lengths: Vec<u64>,
    pub total: u64,
}

/// Splits `order` (indices into `files`) into batches.
///
/// With `batch_files = None` batches are packed greedily: files are appended
/// until the next one would overflow `slot_bytes`. With `Some(n)` every batch
/// has `n` files (the last may have fewer) and one that overflows a slot is an
/// error naming its first file.
pub(crate) fn plan_epoch(
    files: &FileList,
    order: &[usize],
    slot_bytes: usize,
    batch_files: Option<usize>,
    drop_last: bool,
    epoch: usize,
) -> Result<Vec<PlannedBatch>> {
    let entries = files.entries();
    let slot = slot_bytes as u64;
    let mut batches = Vec::new();
    let mut cur = PlannedBatch { epoch, index: 0, files: vec![], offsets: vec![], lengths: vec![], total: 0 };
    for &i in order {
        let len = entries[i].len;
        if len > slot {
            return Err(Error::FileTooLarge { path: entries[i].path.clone(), len, slot_bytes });
        }
        let full = match batch_files {
            Some(n) => cur.files.len() == n,
            None => cur.total.saturating_add(len) > slot,
        };
        if full {
            let index = cur.index + 1;
            batches.push(std::mem::replace(
                &mut cur,
                PlannedBatch { epoch, index, files: vec![], offsets: vec![], lengths: vec![], total: 0 },
            ));
        }
        cur.files.push(i);
        cur.offsets.push(cur.total);
        cur.lengths.push(len);
        // Saturating: a batch whose declared sizes overflow is reported as too large below.
        cur.total = cur.total.saturating_add(len);
    }
    let dropped = drop_last && batch_files.is_some_and(|n| cur.files.len() < n);
    if !cur.files.is_empty() && !dropped {
        batches.push(cur);
    }
    // Only fixed-count batches can overflow; greedy ones are bounded by construction.
    if let Some(b) = batches.iter().find(|b| b.total > slot) {
        return Err(Error::BatchTooLarge {
            epoch,
            index: b.index,
            first: entries[b.files[0]].path.clone(),
            files: b.files.len(),
            bytes: b.total,
            slot_bytes,
        });
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileEntry;

    fn list(sizes: &[u64]) -> FileList {
        FileList::from_entries_for_test(
            sizes.iter().enumerate().map(|(i, &len)| FileEntry { path: format!("/data/f{i}").into(), len }).collect(),
        )
    }

    #[test]
    fn greedy_packing_fills_slots_in_order_back_to_back() {
        let files = list(&[40, 30, 30, 50, 10, 100, 0]);
        let order: Vec<usize> = (0..7).collect();
        let b = plan_epoch(&files, &order, 100, None, false, 3).unwrap();
        let groups: Vec<_> = b.iter().map(|b| b.files.clone()).collect();
        assert_eq!(groups, vec![vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
        assert_eq!(b[0].offsets, vec![0, 40, 70]);
        assert_eq!(b[0].lengths, vec![40, 30, 30]);
        assert_eq!(b[0].total, 100);
        assert_eq!(b[1].offsets, vec![0, 50]);
        assert!(b.iter().enumerate().all(|(k, b)| b.index == k && b.epoch == 3));
    }

    #[test]
    fn packing_follows_the_given_order() {
        let files = list(&[10, 20, 30, 40]);
        let b = plan_epoch(&files, &[3, 1, 0, 2], 1000, None, false, 0).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].files, vec![3, 1, 0, 2]);
        assert_eq!(b[0].offsets, vec![0, 40, 60, 70]);
    }

    #[test]
    fn fixed_count_batches() {
        let files = list(&[1, 2, 3, 4, 5]);
        let order: Vec<usize> = (0..5).collect();
        let b = plan_epoch(&files, &order, 100, Some(2), false, 0).unwrap();
        let groups: Vec<_> = b.iter().map(|b| b.files.clone()).collect();
        assert_eq!(groups, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    #[test]
    fn drop_last_drops_only_a_short_final_batch() {
        let files = list(&[1, 2, 3, 4, 5]);
        let order: Vec<usize> = (0..5).collect();
        assert_eq!(plan_epoch(&files, &order, 100, Some(2), true, 0).unwrap().len(), 2);
        assert_eq!(plan_epoch(&files, &order[..4], 100, Some(2), true, 0).unwrap().len(), 2);
    }

    #[test]
    fn fixed_count_batch_larger_than_slot_names_first_file() {
        let files = list(&[60, 60, 10, 10]);
        let err = plan_epoch(&files, &[2, 3, 0, 1], 100, Some(2), false, 4).unwrap_err();
        match &err {
            Error::BatchTooLarge { epoch: 4, index: 1, first, files: 2, bytes: 120, slot_bytes: 100 } => {
                assert_eq!(first.to_str(), Some("/data/f0"))
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("/data/f0"), "{err}");
    }

    #[test]
    fn file_larger_than_slot_is_an_error_naming_it() {
        let files = list(&[10, 101]);
        let err = plan_epoch(&files, &[0, 1], 100, None, false, 0).unwrap_err();
        assert!(matches!(err, Error::FileTooLarge { len: 101, .. }));
        assert!(err.to_string().contains("/data/f1"), "{err}");
    }

    #[test]
    fn empty_order_gives_no_batches() {
        assert!(plan_epoch(&list(&[]), &[], 100, None, false, 0).unwrap().is_empty());
    }
}
