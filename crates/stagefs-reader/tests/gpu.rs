//! GPU tests, compiled only with `--features gpu-tests`. They FAIL when no
//! usable CUDA device is present: enabling the feature asserts there is one.
#![cfg(feature = "gpu-tests")]

mod common;

use common::{check_batch, sizes, Tree};
use stagefs_reader::{cuda_driver_present, Backend, BackendChoice, Config, DeviceBuffer, Loader};

fn gpu_cfg() -> Config {
    Config::default().backend(BackendChoice::Cuda).slot_bytes(64 << 10).depth(3).io_threads(4)
}

fn require_gpu() {
    assert!(cuda_driver_present(), "feature `gpu-tests` is on but libcuda.so cannot be loaded: these tests need a GPU");
}

#[test]
fn gpu_backend_is_selected_automatically() {
    require_gpu();
    let t = Tree::new(&sizes(5));
    let l = Loader::from_dir(&t.dir, Config::default().slot_bytes(1 << 20)).unwrap();
    assert_eq!(l.backend(), Backend::Cuda, "Auto must pick CUDA when a GPU is present");
}

#[test]
fn gpu_epochs_round_trip_through_device_memory() {
    require_gpu();
    let t = Tree::new(&sizes(300));
    let mut l = Loader::from_dir(&t.dir, gpu_cfg().shuffle(Some(3)).epochs(2)).unwrap();
    assert_eq!(l.backend(), Backend::Cuda);
    let mut files = 0;
    while let Some(b) = l.next_batch().unwrap() {
        assert!(matches!(b.device().unwrap(), DeviceBuffer::Cuda(_)));
        assert!(b.cuda_stream().is_some() && b.upload_event().is_some());
        let bytes = b.to_vec().unwrap();
        check_batch(&b, &bytes);
        files += b.len();
    }
    assert_eq!(files, 600);
    let s = l.stats();
    assert_eq!(s.bytes_uploaded, s.bytes_read);
    assert!(s.upload_busy.as_nanos() > 0);
}

#[test]
fn gpu_h2d_probe_reports_a_plausible_bandwidth() {
    require_gpu();
    let t = Tree::new(&sizes(5));
    let mut l = Loader::from_dir(&t.dir, gpu_cfg().slot_bytes(32 << 20)).unwrap();
    while l.next_batch().unwrap().is_some() {}
    let (bytes, dt) = l.measure_h2d(10).unwrap();
    let gbps = bytes as f64 / dt.as_secs_f64() / 1e9;
    eprintln!("H2D {gbps:.1} GB/s");
    assert!(gbps > 1.0, "H2D {gbps} GB/s is implausibly low for pinned memory");
}

#[test]
fn gpu_write_combined_ring_also_works() {
    require_gpu();
    let t = Tree::new(&sizes(50));
    let mut l = Loader::from_dir(&t.dir, gpu_cfg().write_combined(true)).unwrap();
    let mut n = 0;
    while let Some(b) = l.next_batch().unwrap() {
        b.synchronize().unwrap();
        n += b.len();
    }
    assert_eq!(n, 50);
}
