"""Type stubs for ``stagefs._native``, the pyo3 binding over the ``stagefs-reader`` crate."""

from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

__version__: str

class FileChangedError(OSError):
    """A file changed size between listing and reading (``filename`` names it)."""

class ForkError(RuntimeError):
    """A Loader or epoch iterator was used in a process other than its creator."""

class CudaUnavailableError(RuntimeError):
    """``device='cuda'`` was asked for but cannot be served."""

def cuda_driver_present() -> bool:
    """Whether libcuda.so can be loaded (no CUDA call is made)."""

class BatchBuffer:
    """One batch's bytes (owned; 1-D uint8), exported with DLPack."""

    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    def tobytes(self) -> bytes: ...

RawBatch = Tuple[BatchBuffer, List[str], List[int], List[int], List[int]]

class EpochIter:
    """One epoch's batches as ``(buffer, paths, labels, offsets, lengths)``."""

    def __iter__(self) -> "EpochIter": ...
    def __next__(self) -> RawBatch: ...
    def close(self) -> None:
        """Stops and joins the epoch's threads."""

class Loader:
    """File list, labels and settings; starts nothing until an epoch is iterated."""

    def __init__(
        self,
        source: Union[str, Sequence[str]],
        *,
        batch_size: int,
        shuffle: bool,
        seed: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        device: str,
        io_threads: Optional[int] = None,
        depth: int = 3,
        slot_bytes: Optional[int] = None,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def num_files(self) -> int: ...
    @property
    def classes(self) -> List[str]: ...
    def epoch(self, epoch: int) -> EpochIter: ...
