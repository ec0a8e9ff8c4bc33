//! `stagefs._native`: a thin pyo3 layer over `stagefs-reader`.
//!
//! Like `src/fuse.rs` over `src/fs.rs`, this file only translates: Python
//! arguments to a [`stagefs_reader::Config`], reader batches to Python objects,
//! reader errors to Python exceptions. Ordering, sharding, labels and batching
//! all live in the reader crate, shared with its `stagefs-reader` CLI.
//!
//! Design choices the Python side relies on:
//! * **Lazy start.** Building a `Loader` lists the files and nothing else: no
//!   thread, no CUDA. The I/O threads start on the first `next()` of an epoch.
//! * **Owned batches.** Each host batch is copied out of the ring into a buffer
//!   of its own before the ring slot is released, so a tensor the user keeps
//!   stays valid however far the ring moves on (one memcpy per batch).
//! * **GIL released while waiting**, in short timed waits with a signal check
//!   between them, so Ctrl-C raises `KeyboardInterrupt` promptly; the epoch's
//!   threads are then stopped and joined.
//! * **Fork safety.** Objects record the pid that created them; used in another
//!   process they raise `ForkError`, and dropping them there leaks instead of
//!   joining threads that do not exist in the child.

mod dlpack;

use dlpack::{Storage, KDL_CPU, KDL_CUDA};
use pyo3::exceptions::PyValueError;
use pyo3::exceptions::{PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use stagefs_reader::{BackendChoice, ClassFolders, Config, Error, FileList, Next, Sharding};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pyo3::create_exception!(stagefs, FileChangedError, PyOSError, "A file changed size between listing and reading.");
pyo3::create_exception!(
    stagefs,
    ForkError,
    PyRuntimeError,
    "A Loader (or epoch iterator) was used in a process other than the one that created it."
);
pyo3::create_exception!(
    stagefs,
    CudaUnavailableError,
    PyRuntimeError,
    "device='cuda' was asked for but no usable GPU."
);

/// How long one wait for a batch may hold off signal handling.
const POLL: Duration = Duration::from_millis(50);

fn pid() -> u32 {
    std::process::id()
}

fn check_pid(created: u32, what: &str) -> PyResult<()> {
    let now = pid();
    if now == created {
        return Ok(());
    }
    Err(ForkError::new_err(format!(
        "this stagefs {what} was created in process {created} and cannot be used in process {now} \
         (a fork child, e.g. a DataLoader worker): its threads and GPU state do not survive fork. \
         Create the Loader inside the process that iterates it."
    )))
}

/// One translation of reader errors into Python exceptions; every file error carries `filename`.
fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match &e {
        Error::Io { path, source, .. } => {
            let args = (source.raw_os_error().unwrap_or(0), msg, path.to_string_lossy().into_owned());
            match source.kind() {
                std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
                std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
                _ => PyOSError::new_err(args),
            }
        }
        Error::NotAFile { path } => {
            let p = path.to_string_lossy().into_owned();
            if path.is_dir() {
                PyIsADirectoryError::new_err((libc::EISDIR, msg, p))
            } else {
                PyOSError::new_err((libc::EINVAL, msg, p))
            }
        }
        Error::SizeChanged { path, .. } => {
            FileChangedError::new_err((libc::ESTALE, msg, path.to_string_lossy().into_owned()))
        }
        Error::FileTooLarge { .. } | Error::BatchTooLarge { .. } | Error::Config(_) => PyValueError::new_err(msg),
        Error::CudaUnavailable(_) => CudaUnavailableError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Host bytes of one batch, owned (copied out of the ring slot).
struct HostBytes(Vec<u8>);

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
}

/// Device bytes of one batch, owned: copied on the GPU out of the ring slot (microseconds),
/// so the ring can move on while the user keeps the tensor. `ready` is recorded after the
/// copy; a consumer's stream waits on it in `__dlpack__`.
struct DeviceBytes {
    slice: Option<cudarc::driver::CudaSlice<u8>>,
    ptr: u64,
    len: usize,
    ready: cudarc::driver::CudaEvent,
    stream: Arc<cudarc::driver::CudaStream>,
}

impl DeviceBytes {
    /// Copies `view` (`len` bytes of a ring slot) into a new device allocation on `stream`.
    fn copy_of(
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
    fn as_device(&self) -> Option<&DeviceBytes> {
        Some(self)
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
struct BatchBuffer {
    storage: Arc<dyn Storage>,
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
        match self.storage.as_device() {
            None if stream.is_some() => {
                return Err(PyValueError::new_err("stream must be None for a host (kDLCPU) buffer"));
            }
            None => {}
            // None: the consumer uses the legacy default stream (DLPack's rule for CUDA).
            Some(device) => py.detach(|| device.order_before(stream.unwrap_or(1))).map_err(to_py)?,
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

/// The file list, its labels and the settings; starts nothing.
#[pyclass(module = "stagefs._native", frozen)]
struct Loader {
    files: FileList,
    labels: Arc<Vec<i64>>,
    classes: Vec<String>,
    config: Config,
    created: u32,
    /// The last epoch's reader, halted, for the next epoch to restart: its ring (pinned and
    /// device buffers) is allocated once per Loader, not once per epoch.
    spare: Spare,
}

/// A halted reader kept between epochs.
type Spare = Arc<Mutex<Option<stagefs_reader::Loader>>>;

impl Drop for Loader {
    fn drop(&mut self) {
        if pid() != self.created {
            // In a fork child the reader's threads do not exist: leak it (see EpochIter).
            if let Some(reader) = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take() {
                std::mem::forget(reader);
            }
        }
    }
}

fn slot_for(files: &FileList, batch_size: usize, world_size: usize, padded: bool) -> usize {
    let mut lens: Vec<u64> = files.entries().iter().map(|e| e.len).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let max = lens.first().copied().unwrap_or(0);
    let bytes = if files.len() < world_size {
        // Padding repeats the few files cyclically: any file may appear many times.
        max * batch_size as u64
    } else {
        // At most one padded (repeated) file per rank and epoch.
        lens.iter().take(batch_size).sum::<u64>() + if padded { max } else { 0 }
    };
    (bytes as usize).max(1)
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (source, *, batch_size, shuffle, seed, rank, world_size, drop_last, device,
                        io_threads=None, depth=3, slot_bytes=None, _upload_delay_ms=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: Bound<'_, PyAny>,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        rank: usize,
        world_size: usize,
        drop_last: bool,
        device: &str,
        io_threads: Option<usize>,
        depth: usize,
        slot_bytes: Option<usize>,
        _upload_delay_ms: u64,
    ) -> PyResult<Self> {
        if batch_size == 0 {
            return Err(PyValueError::new_err("batch_size must be >= 1"));
        }
        if world_size == 0 || rank >= world_size {
            return Err(PyValueError::new_err(format!("rank {rank} is not in world_size {world_size}")));
        }
        let backend = match device {
            "cpu" => BackendChoice::Host,
            "cuda" | "cuda:0" => {
                if !stagefs_reader::cuda_driver_present() {
                    return Err(CudaUnavailableError::new_err(
                        "device='cuda' but libcuda.so cannot be loaded (no NVIDIA driver here); \
                         use device='cpu'",
                    ));
                }
                BackendChoice::Cuda
            }
            other => return Err(PyValueError::new_err(format!("unknown device {other:?} (cpu, cuda)"))),
        };
        // A str or os.PathLike is a root directory; anything else an iterable of paths.
        let root: Option<PathBuf> =
            if source.is_instance_of::<pyo3::types::PyString>() || source.hasattr("__fspath__")? {
                Some(source.extract()?)
            } else {
                None
            };
        let (files, labels, classes) = match root {
            Some(root) => {
                let c = py.detach(|| ClassFolders::from_dir(&root)).map_err(to_py)?;
                let labels = c.labels.iter().map(|l| l.map_or(-1, |l| l as i64)).collect();
                (c.files, labels, c.classes)
            }
            None => {
                let paths: Vec<PathBuf> =
                    source.try_iter()?.map(|p| p.and_then(|p| p.extract::<PathBuf>())).collect::<PyResult<_>>()?;
                let files = py.detach(|| FileList::from_paths(paths)).map_err(to_py)?;
                let n = files.len();
                (files, vec![-1; n], Vec::new())
            }
        };
        let sharding = if drop_last { Sharding::DropTail } else { Sharding::Padded };
        let slot = slot_bytes.unwrap_or_else(|| slot_for(&files, batch_size, world_size, !drop_last));
        let mut config = Config::default()
            .slot_bytes(slot)
            .depth(depth)
            .batch_files(Some(batch_size))
            .shuffle(shuffle.then_some(seed))
            .shard(rank, world_size)
            .sharding(sharding)
            .drop_last_batch(drop_last)
            .backend(backend)
            // Test hook only (the Ctrl-C test needs a pipeline that is slow to deliver).
            .slow_uploads_for_tests(Duration::from_millis(_upload_delay_ms));
        if let Some(n) = io_threads {
            config = config.io_threads(n);
        }
        Ok(Loader { files, labels: Arc::new(labels), classes, config, created: pid(), spare: Spare::default() })
    }

    /// Batches per epoch for this rank.
    fn __len__(&self) -> PyResult<usize> {
        check_pid(self.created, "Loader")?;
        Ok(self.config.batches_per_epoch(self.files.len()).unwrap_or(0))
    }

    /// Number of files listed (all ranks).
    #[getter]
    fn num_files(&self) -> usize {
        self.files.len()
    }

    /// Class names (sorted subdirectories of the root); empty for a path list.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.classes.clone()
    }

    /// An iterator over one epoch's batches; starts its threads on the first `next()`.
    fn epoch(&self, epoch: usize) -> PyResult<EpochIter> {
        check_pid(self.created, "Loader")?;
        let pending = Some((self.files.clone(), self.config.clone().first_epoch(epoch).epochs(1)));
        Ok(EpochIter {
            state: Mutex::new(Pipeline { pending, epoch, spare: Arc::clone(&self.spare), ..Pipeline::default() }),
            labels: Arc::clone(&self.labels),
            created: pid(),
        })
    }
}

/// One epoch's batches: `(BatchBuffer, paths, labels, offsets, lengths)` tuples.
#[pyclass(module = "stagefs._native")]
struct EpochIter {
    state: Mutex<Pipeline>,
    labels: Arc<Vec<i64>>,
    created: u32,
}

/// The epoch's pipeline, built on the first `next()`.
#[derive(Default)]
struct Pipeline {
    /// What to build the pipeline from, until the first `next()`.
    pending: Option<(FileList, Config)>,
    loader: Option<stagefs_reader::Loader>,
    /// A batch received whose upload had not finished when the last wait timed out.
    held: Option<stagefs_reader::Batch>,
    epoch: usize,
    /// Where the reader goes when the epoch ends, and where it comes from if one is there.
    spare: Spare,
}

impl Pipeline {
    /// Drops the batch and the reader: stops and joins every thread of the epoch.
    fn stop(&mut self) {
        self.pending = None;
        self.held = None;
        self.loader = None;
    }

    /// The epoch ran to its end: its reader (threads joined, nothing in flight) becomes
    /// the Loader's spare for the next epoch. An epoch left early (Ctrl-C, `close`, an
    /// error) drops it instead, so stopping never waits for uploads still queued.
    fn finish(&mut self) {
        self.pending = None;
        self.held = None;
        if let Some(mut reader) = self.loader.take() {
            if reader.halt().is_ok() {
                self.spare.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(reader);
            }
        }
    }

    /// One bounded wait: the next batch copied out of the ring, the end, or `Pending`.
    fn step(&mut self) -> Result<Step, Error> {
        if self.loader.is_none() {
            let Some((files, config)) = self.pending.take() else {
                return Ok(Step::End);
            };
            let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.loader = Some(match spare {
                Some(mut reader) => {
                    reader.restart(self.epoch)?;
                    reader
                }
                None => stagefs_reader::Loader::new(files, config)?,
            });
        }
        if self.held.is_none() {
            let loader = self.loader.as_mut().expect("set above");
            match loader.next_batch_timeout(POLL)? {
                Next::Pending => return Ok(Step::Pending),
                Next::End => return Ok(Step::End),
                Next::Batch(b) => self.held = Some(b),
            }
        }
        let b = self.held.as_ref().expect("set above");
        // The reader hands batches out with the upload queued. A host batch is filled by a
        // thread: wait for it in bounded steps too. A CUDA batch is not waited for here: its
        // copy below is queued on the upload's own stream, so the GPU orders it after the
        // upload, and a host wait would only stall the pipeline (the slot's reuse waits on
        // its upload in the reader, the consumer on `ready` in `__dlpack__`).
        if b.cuda_stream().is_none() && !b.synchronize_timeout(POLL)? {
            return Ok(Step::Pending);
        }
        let bytes: Arc<dyn Storage> = match b.device()? {
            stagefs_reader::DeviceBuffer::Host(h) => Arc::new(HostBytes(h.to_vec())),
            stagefs_reader::DeviceBuffer::Cuda(view) => {
                let stream = b.cuda_stream().ok_or_else(|| Error::Cuda("a device batch without its stream".into()))?;
                Arc::new(DeviceBytes::copy_of(&view, stream)?)
            }
            _ => return Err(Error::Config("a batch on a device this binding does not know".into())),
        };
        let owned = Owned {
            bytes,
            paths: b.paths().map(|p| p.to_string_lossy().into_owned()).collect(),
            files: b.file_indices().to_vec(),
            offsets: b.offsets().to_vec(),
            lengths: b.lengths().to_vec(),
        };
        // Dropping the batch returns its slot to the ring; the copy stays with the user.
        self.held = None;
        Ok(Step::Batch(owned))
    }
}

/// A batch copied out of the ring, with its table; built without the GIL.
struct Owned {
    bytes: Arc<dyn Storage>,
    paths: Vec<String>,
    files: Vec<usize>,
    offsets: Vec<u64>,
    lengths: Vec<u64>,
}

enum Step {
    Batch(Owned),
    End,
    Pending,
}

#[pymethods]
impl EpochIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(mut slf: PyRefMut<'py, Self>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        check_pid(slf.created, "epoch iterator")?;
        let py = slf.py();
        let this = &mut *slf;
        let pipeline = this.state.get_mut().unwrap_or_else(|p| p.into_inner());
        loop {
            match py.detach(|| pipeline.step()) {
                Ok(Step::Pending) => {
                    if let Err(e) = py.check_signals() {
                        // Ctrl-C (or another signal handler raising): stop and join now.
                        py.detach(|| pipeline.stop());
                        return Err(e);
                    }
                }
                Ok(Step::End) => {
                    py.detach(|| pipeline.finish());
                    return Ok(None);
                }
                Err(e) => {
                    py.detach(|| pipeline.stop());
                    return Err(to_py(e));
                }
                Ok(Step::Batch(o)) => {
                    let labels: Vec<i64> = o.files.iter().map(|&i| this.labels[i]).collect();
                    let buffer = BatchBuffer { storage: o.bytes };
                    let t = (Py::new(py, buffer)?, o.paths, labels, o.offsets, o.lengths);
                    return Ok(Some(t.into_pyobject(py)?));
                }
            }
        }
    }

    /// Stops the epoch's threads (joins them) and ends the iteration.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        check_pid(self.created, "epoch iterator")?;
        let pipeline = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        py.detach(|| pipeline.stop());
        Ok(())
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        if pid() != self.created {
            // In a fork child the pipeline's threads do not exist; joining them
            // would hang. Leak the parent's copy instead.
            let pipeline = std::mem::take(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
            std::mem::forget(pipeline);
        }
    }
}

/// Whether libcuda.so can be loaded (no CUDA call is made).
#[pyfunction]
fn cuda_driver_present() -> bool {
    stagefs_reader::cuda_driver_present()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Loader>()?;
    m.add_class::<EpochIter>()?;
    m.add_class::<BatchBuffer>()?;
    m.add_function(wrap_pyfunction!(cuda_driver_present, m)?)?;
    m.add("FileChangedError", py.get_type::<FileChangedError>())?;
    m.add("ForkError", py.get_type::<ForkError>())?;
    m.add("CudaUnavailableError", py.get_type::<CudaUnavailableError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
