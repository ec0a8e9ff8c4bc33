//! Without libcuda.so the loader must fall back to the host backend and still run full epochs.
//! `Config::assume_no_cuda_driver` makes the missing driver real on every machine, so these
//! run (and can fail) on GPU nodes too.

mod common;

use common::{check_batch, sizes, Tree};
use stagefs_reader::{Backend, BackendChoice, Config, DeviceBuffer, Error, FileList, Loader};

#[test]
fn full_epoch_without_libcuda_falls_back_to_host() {
    let t = Tree::new(&sizes(120));
    let cfg = Config::default().assume_no_cuda_driver(true).slot_bytes(64 << 10).depth(3).io_threads(4).epochs(2);
    let mut l = Loader::from_dir(&t.dir, cfg).unwrap();
    assert_eq!(l.backend(), Backend::Host);
    let mut seen = vec![0usize; 120];
    while let Some(b) = l.next_batch().unwrap() {
        let DeviceBuffer::Host(bytes) = b.device().unwrap() else { panic!("expected host buffer") };
        assert_eq!(b.to_vec().unwrap(), bytes);
        for i in check_batch(&b, bytes) {
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 2), "every file once per epoch");
    assert_eq!(l.stats().files, 240);
}

#[test]
fn explicit_cuda_request_without_driver_is_a_clear_error() {
    let t = Tree::new(&sizes(3));
    let cfg = Config::default().assume_no_cuda_driver(true).backend(BackendChoice::Cuda);
    let err = Loader::from_dir(&t.dir, cfg).unwrap_err();
    assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
}

#[test]
fn directory_walk_is_sorted_and_recursive() {
    let t = Tree::new(&sizes(25));
    let list = FileList::from_dir(&t.dir).unwrap();
    let got: Vec<_> = list.entries().iter().map(|e| e.path.clone()).collect();
    assert_eq!(got, t.files, "walk must find d0/.., d1/.., d2/.. in sorted order");
}

#[test]
fn host_backend_can_be_forced() {
    let t = Tree::new(&sizes(10));
    let mut l = Loader::from_dir(&t.dir, Config::default().backend(BackendChoice::Host).slot_bytes(1 << 20)).unwrap();
    assert_eq!(l.backend(), Backend::Host);
    let b = l.next_batch().unwrap().unwrap();
    assert_eq!(b.len(), 10);
    drop(b);
    assert!(l.next_batch().unwrap().is_none());
}
