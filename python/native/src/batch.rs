//! One batch's bytes, owned by the batch (copied out of the ring slot, on the host or the GPU) and exported through DLPack.

use crate::dlpack::{self, Storage, KDL_CPU, KDL_CUDA};
use crate::errors::reader_error;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use stagefs_reader::Error;
use std::sync::Arc;

/// Host bytes of one batch, owned (copied out of the ring slot).
pub struct HostBytes(pub Vec<u8>);

impl Storage for HostBytes {
    fn ptr(&self) -> *mut u8 {
        // DLPack wants a mutable pointer; consumers that write get their own
        // copy of the semantics they asked for (the buffer belongs to the batch).
        self.0.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn device(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Device bytes of one batch, owned: copied on the GPU out of the ring slot (microseconds),
/// so the ring can move on while the user keeps the tensor. `ready` is recorded after the
/// copy; a consumer's stream waits on it in `__dlpack__`.
pub struct DeviceBytes {
    slice: Option<cudarc::driver::CudaSlice<u8>>,
    ptr: u64,
    len: usize,
    ready: cudarc::driver::CudaEvent,
    stream: Arc<cudarc::driver::CudaStream>,
}

impl DeviceBytes {
    /// Copies `view` (`len` bytes of a ring slot) into a new device allocation on `stream`.
    pub fn copy_of(
        view: &cudarc::driver::CudaView<'_, u8>,
        stream: &Arc<cudarc::driver::CudaStream>,
    ) -> Result<Self, Error> {
        use cudarc::driver::DevicePtr;
        let len = view.len();
        // SAFETY: every byte of the allocation's first `len` is written by the copy below
        // before any consumer can see it (consumers wait on `ready`); one spare byte keeps
        // the allocation non-empty for empty batches and is never exported.
        let mut slice = unsafe { stream.alloc::<u8>(len.max(1)) }?;
        stream.memcpy_dtod(view, &mut slice.slice_mut(..len))?;
        let ready = stream.record_event(None)?;
        let ptr = slice.device_ptr(stream).0;
        Ok(DeviceBytes { slice: Some(slice), ptr, len, ready, stream: Arc::clone(stream) })
    }

    /// Makes `consumer` (a CUstream handle as DLPack passes it; 1 and 2 are the legacy and
    /// per-thread default streams) wait for the copy; -1 means the consumer synchronises.
    fn order_before(&self, consumer: i64) -> Result<(), Error> {
        if consumer == -1 {
            return Ok(());
        }
        self.stream.context().bind_to_thread()?;
        // SAFETY: a stream handle the consumer gave us for this purpose, and our own event.
        unsafe {
            cudarc::driver::result::stream::wait_event(
                consumer as usize as cudarc::driver::sys::CUstream,
                self.ready.cu_event(),
                cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )?;
        }
        Ok(())
    }
}

impl Storage for DeviceBytes {
    fn ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> (i32, i32) {
        (KDL_CUDA, self.stream.context().ordinal() as i32)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        // The DLPack deleter may run on any thread: freeing needs the context there.
        let _ = self.stream.context().bind_to_thread();
        drop(self.slice.take());
    }
}

/// One batch's bytes, packed back to back; export with `__dlpack__`.
#[pyclass(module = "stagefs._native", frozen)]
pub struct BatchBuffer {
    pub storage: Arc<dyn Storage>,
}

#[pymethods]
impl BatchBuffer {
    /// DLPack export (1-D uint8). `stream` must be None for host memory; for device memory
    /// the consumer's stream (an int, DLPack's convention) is made to wait for the batch.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dev = self.storage.device();
        if let Some(want) = dl_device {
            if want != dev {
                return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                    "the batch lives on DLPack device {dev:?}; export to {want:?} is not supported"
                )));
            }
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err("copy=True is not supported; copy after import"));
        }
        let stream: Option<i64> = match stream {
            Some(s) if !s.is_none() => Some(s.extract()?),
            _ => None,
        };
        match self.storage.as_any().downcast_ref::<DeviceBytes>() {
            None if stream.is_some() => {
                return Err(PyValueError::new_err("stream must be None for a host (kDLCPU) buffer"));
            }
            None => {}
            // None: the consumer uses the legacy default stream (DLPack's rule for CUDA).
            Some(device) => py.detach(|| device.order_before(stream.unwrap_or(1))).map_err(reader_error)?,
        }
        dlpack::export(py, &self.storage, max_version.is_some_and(|(major, _)| major >= 1))
    }

    /// `(device_type, device_id)`: `(1, 0)` (kDLCPU) for host batches, `(2, n)` (kDLCUDA) for GPU n.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.storage.device()
    }

    fn __len__(&self) -> usize {
        self.storage.len()
    }

    /// A copy of the bytes (host buffers only).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        if self.storage.device().0 != KDL_CPU {
            return Err(PyValueError::new_err("tobytes() needs a host buffer"));
        }
        // SAFETY: host storage, alive for the duration of the borrow of self.
        let bytes = unsafe { std::slice::from_raw_parts(self.storage.ptr(), self.storage.len()) };
        Ok(pyo3::types::PyBytes::new(py, bytes))
    }

    fn __repr__(&self) -> String {
        format!("BatchBuffer({} bytes on DLPack device {:?})", self.storage.len(), self.storage.device())
    }
}
