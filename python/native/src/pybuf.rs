//! Python buffers by hand: filling a caller's writable buffer, and read-only `memoryview`s over bytes kept alive by the views.
//!
//! pyo3 offers neither to an `abi3-py39` module: the buffer protocol joined the limited API
//! in Python 3.11. Its pieces are older than that, unchanged, and exported by every CPython
//! this wheel supports: `PyObject_GetBuffer`/`PyBuffer_Release`/`PyBuffer_FillInfo` and the
//! `Py_buffer` layout (the same since 3.3), and buffer slots in `PyType_FromSpec` (accepted
//! since 3.9, bpo-40724). 3.11 only promised to keep them; this file relies on them on 3.9
//! and 3.10 too, and the Python tests run it there (see doc/python.md).

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `Py_buffer`, as CPython lays it out (Include/pybuffer.h).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
    fn PyBuffer_FillInfo(
        view: *mut RawBuffer,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// `PyBUF_WRITABLE` (with `PyBUF_SIMPLE`, 0: one contiguous run of bytes).
const BUF_WRITABLE: c_int = 0x0001;

/// A caller's writable buffer (a `bytearray`, a `memoryview`, a numpy array), locked
/// against resizing while held; released on drop, which needs the GIL (drop it in the
/// method that took it, not inside `detach`).
pub struct Writable {
    view: RawBuffer,
}

impl Writable {
    /// The buffer of `obj`, which must be writable and contiguous.
    pub fn of(obj: &Bound<'_, PyAny>) -> PyResult<Writable> {
        // SAFETY: an all-zero Py_buffer is the empty state GetBuffer expects to fill.
        let mut view: RawBuffer = unsafe { std::mem::zeroed() };
        // SAFETY: `obj` is a live object and the GIL is held (we have a Bound).
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut view, BUF_WRITABLE) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Writable { view })
    }

    /// The bytes, for filling (outside the GIL too: the export keeps them in place).
    pub fn bytes(&mut self) -> &mut [u8] {
        if self.view.len <= 0 || self.view.buf.is_null() {
            return &mut [];
        }
        // SAFETY: a successful writable, contiguous export of `len` bytes at `buf`, held
        // (so neither freed nor resized) until `self` is dropped.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), self.view.len as usize) }
    }
}

impl Drop for Writable {
    fn drop(&mut self) {
        // SAFETY: the view came from a successful PyObject_GetBuffer and is released once.
        unsafe { PyBuffer_Release(&mut self.view) };
    }
}

/// Bytes a view shows and whatever keeps them valid (the archive's map, a cached block,
/// a buffer of their own).
pub struct Held {
    pub keep: Box<dyn std::any::Any + Send + Sync>,
    pub ptr: *const u8,
    pub len: usize,
}

// SAFETY: `ptr` points into memory owned by `keep` (Send + Sync) and is only read.
unsafe impl Send for Held {}

/// The object behind a view: a Python object header and the held bytes.
#[repr(C)]
struct HeldObject {
    ob_base: ffi::PyObject,
    held: *mut Held,
}

/// A read-only `memoryview` of `held`'s bytes, no copy: the bytes live as long as the
/// view or any slice of it does.
pub fn memoryview(py: Python<'_>, held: Held) -> PyResult<Bound<'_, PyAny>> {
    let tp = held_type(py)?.as_ptr().cast::<ffi::PyTypeObject>();
    // SAFETY: the GIL is held; `tp` is our heap type, whose alloc slot is generic allocation
    // of `basicsize` zeroed bytes; `held` moves into the object, freed by `dealloc`.
    unsafe {
        let alloc: ffi::allocfunc = std::mem::transmute(ffi::PyType_GetSlot(tp, ffi::Py_tp_alloc));
        let obj = alloc(tp, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        (*obj.cast::<HeldObject>()).held = Box::into_raw(Box::new(held));
        let view = ffi::PyMemoryView_FromObject(obj);
        ffi::Py_DECREF(obj);
        Bound::from_owned_ptr_or_err(py, view)
    }
}

/// The type of the objects views hold, made once.
fn held_type(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    static TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let mut slots = [
            ffi::PyType_Slot { slot: ffi::Py_bf_getbuffer, pfunc: getbuffer as *mut c_void },
            ffi::PyType_Slot { slot: ffi::Py_tp_dealloc, pfunc: dealloc as *mut c_void },
            ffi::PyType_Slot {
                slot: ffi::Py_tp_doc,
                pfunc: c"Bytes a stagefs memoryview shows.".as_ptr() as *mut c_void,
            },
            ffi::PyType_Slot { slot: 0, pfunc: std::ptr::null_mut() },
        ];
        let mut spec = ffi::PyType_Spec {
            name: c"stagefs._native.HeldBytes".as_ptr(),
            basicsize: std::mem::size_of::<HeldObject>() as c_int,
            itemsize: 0,
            flags: ffi::Py_TPFLAGS_DEFAULT as c_uint,
            slots: slots.as_mut_ptr(),
        };
        // SAFETY: the GIL is held; the spec and slots are copied into the new type (its
        // name is a static string, as tp_name keeps pointing into it).
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&mut spec)) }.map(Bound::unbind)
    })
}

unsafe extern "C" fn getbuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int {
    // SAFETY (caller): `obj` is one of our objects, so `held` was set when it was made.
    let held = &*(*obj.cast::<HeldObject>()).held;
    // Read-only: a request for a writable buffer fails with BufferError.
    PyBuffer_FillInfo(view, obj, held.ptr as *mut c_void, held.len as ffi::Py_ssize_t, 1, flags)
}

unsafe extern "C" fn dealloc(obj: *mut ffi::PyObject) {
    // SAFETY (caller): the last reference is gone; no view can export the bytes any more.
    let this = obj.cast::<HeldObject>();
    if !(*this).held.is_null() {
        drop(Box::from_raw((*this).held));
    }
    let tp = ffi::Py_TYPE(obj);
    let free: ffi::freefunc = std::mem::transmute(ffi::PyType_GetSlot(tp, ffi::Py_tp_free));
    free(obj.cast());
    // Instances of a heap type hold a reference to it.
    ffi::Py_DECREF(tp.cast());
}
