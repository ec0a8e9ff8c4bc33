//! DLPack export of an owned byte buffer, written out by hand.
//!
//! The C layout is small (dlpack.h, v1.x) and stable; writing it here avoids
//! tying the binding to a crate that pins another pyo3 version. A capsule holds a
//! `DLManagedTensor` (legacy, name `dltensor`) or a `DLManagedTensorVersioned`
//! (name `dltensor_versioned`, when the consumer passes `max_version >= (1, 0)`).
//! The tensor owns an `Arc` of the buffer: the memory lives until the consumer
//! calls the deleter, which may happen on any thread and without the GIL — the
//! deleter therefore only drops Rust values and never touches Python.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const KDL_CUDA: i32 = 2;
const KDL_UINT: u8 = 1;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// Memory a tensor points into; kept alive by the tensors exported from it.
pub trait Storage: Send + Sync + 'static {
    /// Start of the bytes (host or device address).
    fn ptr(&self) -> *mut u8;
    /// Number of bytes.
    fn len(&self) -> usize;
    /// DLPack device (type, ordinal).
    fn device(&self) -> (i32, i32);
    /// The storage itself, for its owner to find out what it is (the batch code looks
    /// for GPU memory behind it, for stream ordering).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What the manager context owns: the storage and the shape array the tensor points at.
struct Ctx {
    _owner: Arc<dyn Storage>,
    shape: [i64; 1],
}

fn tensor(ctx: &mut Ctx, storage: &dyn Storage) -> DLTensor {
    let (device_type, device_id) = storage.device();
    DLTensor {
        data: storage.ptr().cast(),
        device: DLDevice { device_type, device_id },
        ndim: 1,
        dtype: DLDataType { code: KDL_UINT, bits: 8, lanes: 1 },
        shape: ctx.shape.as_mut_ptr(),
        // NULL strides: compact row-major (for 1-D, stride 1).
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its ctx were created by Box::into_raw in `export` and are
    // deleted exactly once (by the consumer, or by our capsule destructor if unused).
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: the context `export` boxed for this tensor, freed here once with it.
    drop(unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) });
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in delete_legacy.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: as in delete_legacy.
    drop(unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) });
}

/// Capsule destructor: frees the tensor only if no consumer took it (a consumer
/// renames the capsule to `used_dltensor[_versioned]` and owns the deleter call).
unsafe extern "C" fn capsule_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; IsValid sets no error.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
            delete_legacy(m);
        }
    }
}

unsafe extern "C" fn capsule_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in capsule_legacy.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
            delete_versioned(m);
        }
    }
}

/// A DLPack capsule over `storage` as a 1-D uint8 tensor; versioned when the
/// consumer accepts DLPack >= 1.0.
pub fn export<'py>(py: Python<'py>, storage: &Arc<dyn Storage>, versioned: bool) -> PyResult<Bound<'py, PyAny>> {
    let mut ctx = Box::new(Ctx { _owner: Arc::clone(storage), shape: [storage.len() as i64] });
    let dl_tensor = tensor(&mut ctx, storage.as_ref());
    let ctx = Box::into_raw(ctx).cast::<c_void>();
    let capsule = if versioned {
        let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx,
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        }));
        // SAFETY: m is a valid pointer; the name is a static C string as the capsule API requires.
        let c = unsafe { ffi::PyCapsule_New(m.cast(), NAME_VERSIONED.as_ptr(), Some(capsule_versioned)) };
        if c.is_null() {
            // SAFETY: the capsule was not created, so we still own m.
            unsafe { delete_versioned(m) };
        }
        c
    } else {
        let m = Box::into_raw(Box::new(DLManagedTensor { dl_tensor, manager_ctx: ctx, deleter: Some(delete_legacy) }));
        // SAFETY: as above.
        let c = unsafe { ffi::PyCapsule_New(m.cast(), NAME.as_ptr(), Some(capsule_legacy)) };
        if c.is_null() {
            // SAFETY: the capsule was not created, so we still own m.
            unsafe { delete_legacy(m) };
        }
        c
    };
    // SAFETY: PyCapsule_New returns a new reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
}
