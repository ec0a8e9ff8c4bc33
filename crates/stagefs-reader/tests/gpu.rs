//! GPU tests, compiled only with `--features gpu-tests`. They FAIL when no
//! usable CUDA device is present: enabling the feature asserts there is one.
//! Run them with `cargo test -p stagefs-reader --features gpu-tests --test gpu` (README).
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

/// The probe uploads what it says it does; how fast is a benchmark's business
/// (`benches/gpu-h2d.sh` prints the rate), not a test's.
#[test]
fn gpu_h2d_probe_uploads_full_slots() {
    require_gpu();
    let t = Tree::new(&sizes(5));
    let mut l = Loader::from_dir(&t.dir, gpu_cfg().slot_bytes(32 << 20)).unwrap();
    while l.next_batch().unwrap().is_some() {}
    let (bytes, dt) = l.measure_h2d(10).unwrap();
    assert_eq!(bytes, 10 * (32 << 20), "10 uploads of a 32 MiB slot");
    assert!(dt.as_nanos() > 0, "the probe must time its uploads");
    // Probe copies are not pipeline uploads.
    assert_eq!(l.stats().bytes_uploaded, l.stats().bytes_read);
}

/// The fallback seam also holds where a GPU is: `assume_no_cuda_driver` picks the host.
#[test]
fn gpu_machine_can_still_be_told_to_fall_back() {
    require_gpu();
    let t = Tree::new(&sizes(5));
    let l = Loader::from_dir(&t.dir, Config::default().assume_no_cuda_driver(true).slot_bytes(1 << 20)).unwrap();
    assert_eq!(l.backend(), Backend::Host);
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
