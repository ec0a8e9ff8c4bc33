//! `stagefs.Loader`'s native half: the file list (a directory, paths, or an archive's members), its labels and settings, and the epochs streamed from a reader kept between them.

use crate::archive::Archive;
use crate::batch::{BatchBuffer, DeviceBytes, HostBytes};
use crate::dlpack::Storage;
use crate::errors::{reader_error, CudaUnavailableError, ForkError};
use crate::members;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use stagefs_archive::escape::Shown;
use stagefs_reader::{BackendChoice, ClassFolders, Config, Error, FileList, Next, Sharding};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// The file list, its labels and the settings; starts nothing.
#[pyclass(module = "stagefs._native", frozen)]
pub struct Loader {
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

/// Largest ring slot a Loader sizes by itself: the ring is `depth` slots (twice, staging and
/// device) allocated and touched up front, and the sizes it would follow are what files or
/// archive members declare (a 16-byte zip member may declare 1 GiB). Larger batches need
/// `slot_bytes`, said on purpose.
const AUTO_SLOT_CAP: u64 = 256 << 20;

/// The ring slot for batches of `batch_size` of `files` (see [`AUTO_SLOT_CAP`]).
fn auto_slot(files: &FileList, batch_size: usize, world_size: usize, padded: bool) -> PyResult<usize> {
    let bytes = slot_for(files, batch_size, world_size, padded);
    if bytes > AUTO_SLOT_CAP {
        let largest = files.entries().iter().max_by_key(|e| e.len).map(|e| (e.path.shown().to_string(), e.len));
        let (name, len) = largest.unwrap_or_default();
        return Err(PyValueError::new_err(format!(
            "a batch of {batch_size} of these files needs a ring slot of {bytes} bytes (the largest, {name}, says it \
             has {len} bytes), more than the {} MiB a Loader sizes by itself; pass slot_bytes= for larger batches, \
             or a smaller batch_size",
            AUTO_SLOT_CAP >> 20
        )));
    }
    Ok(bytes as usize)
}

fn slot_for(files: &FileList, batch_size: usize, world_size: usize, padded: bool) -> u64 {
    let mut lens: Vec<u64> = files.entries().iter().map(|e| e.len).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let max = lens.first().copied().unwrap_or(0);
    let bytes = if files.len() < world_size {
        // Padding repeats the few files cyclically: any file may appear many times.
        max.saturating_mul(batch_size as u64)
    } else {
        // At most one padded (repeated) file per rank and epoch.
        lens.iter().take(batch_size).fold(0u64, |a, &b| a.saturating_add(b)).saturating_add(if padded {
            max
        } else {
            0
        })
    };
    bytes.max(1)
}

/// The files, their labels (-1: no class) and the class names.
fn labelled(c: ClassFolders) -> (FileList, Vec<i64>, Vec<String>) {
    let labels = c.labels.iter().map(|l| l.map_or(-1, |l| l as i64)).collect();
    (c.files, labels, c.classes)
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (source, *, batch_size, shuffle, seed, rank, world_size, drop_last, device,
                        io_threads=None, depth=3, slot_bytes=None, root=None, members=None, _upload_delay_ms=0))]
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
        root: Option<PathBuf>,
        members: Option<Vec<PathBuf>>,
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
                        "libcuda.so cannot be loaded (no NVIDIA driver here): no GPU can take the batches; \
                         use device='cpu'",
                    ));
                }
                BackendChoice::Cuda
            }
            other => return Err(PyValueError::new_err(format!("unknown device {other:?} (cpu, cuda)"))),
        };
        let (files, labels, classes) = match source.cast::<Archive>() {
            // An open archive: its members, below `root` or as listed in `members`.
            Ok(archive) => match (archive.get(), members) {
                (archive, Some(paths)) => {
                    let files = py.detach(|| members::listed(archive, paths))?;
                    let n = files.len();
                    (files, vec![-1; n], Vec::new())
                }
                (archive, None) => {
                    let root = root.unwrap_or_default();
                    labelled(py.detach(|| members::class_folders(archive, &root))?)
                }
            },
            // A str or os.PathLike is a root directory; anything else an iterable of paths.
            Err(_) if source.is_instance_of::<pyo3::types::PyString>() || source.hasattr("__fspath__")? => {
                let root: PathBuf = source.extract()?;
                labelled(py.detach(|| ClassFolders::from_dir(&root)).map_err(reader_error)?)
            }
            Err(_) => {
                let paths: Vec<PathBuf> =
                    source.try_iter()?.map(|p| p.and_then(|p| p.extract::<PathBuf>())).collect::<PyResult<_>>()?;
                let files = py.detach(|| FileList::from_paths(paths)).map_err(reader_error)?;
                let n = files.len();
                (files, vec![-1; n], Vec::new())
            }
        };
        let sharding = if drop_last { Sharding::DropTail } else { Sharding::Padded };
        let slot = match slot_bytes {
            Some(slot) => slot,
            None => auto_slot(&files, batch_size, world_size, !drop_last)?,
        };
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
pub struct EpochIter {
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
                    return Err(reader_error(e));
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
