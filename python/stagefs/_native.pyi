"""Type stubs for ``stagefs._native``, the pyo3 binding over the ``stagefs-reader`` crate
and the daemon's archive code (archives read in process)."""

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

_Path = Union[str, bytes, "os.PathLike[str]"]

__version__: str

class FileChangedError(OSError):
    """A file changed size between listing and reading (``filename`` names it)."""

class ForkError(RuntimeError):
    """A Loader or epoch iterator was used in a process other than its creator."""

class CudaUnavailableError(RuntimeError):
    """``device='cuda'`` was asked for but cannot be served."""

class ArchiveError(OSError):
    """An archive stagefs cannot serve: damaged (errno EIO) or not an archive it knows (EINVAL)."""

    offset: Optional[int]
    """The archive byte at fault (compressed byte for a compressed stream), or None."""

def open(
    spec: _Path,
    *,
    stage: str = "none",
    max_ram: Union[int, str, None] = None,
    stage_dir: Optional[_Path] = None,
    recursive: bool = False,
    trust_shards: bool = False,
    remote: Optional[Dict[str, Any]] = None,
    progress: bool = False,
) -> Tuple["Archive", List[Tuple[str, str]]]:
    """Opens an archive, a glob pattern of shards, an @list or an object's URL as
    ``stagefs mount`` would (trust rules, client and credentials, staging, saved indexes);
    ``remote`` holds the remote options named as the command's flags; ``progress`` draws
    bars on stderr (a terminal). Returns it and what opening it logged, (level, line). Releases the GIL; Ctrl-C raises KeyboardInterrupt at once."""

def open_mounted(path: _Path) -> Optional[Tuple["Archive", str, str]]:
    """The stagefs mount of this user holding ``path``, when the copy in RAM it serves can
    be read in process: the archive read from that copy, the mountpoint, and the directory
    of the archive ``path`` is (``""``: its root); ``None``: read through the mount.
    Releases the GIL."""

Info = Dict[str, Any]

class Archive:
    """An open archive: its tree and members, read in process."""

    @property
    def label(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def staging(self) -> str: ...
    @property
    def staged_bytes(self) -> int: ...
    @property
    def shards(self) -> int: ...
    @property
    def identity(self) -> List[Tuple[int, int, int, int, int, int, int]]:
        """Each file served as it was when opened: (device, inode, size, mtime s, mtime ns,
        ctime s, ctime ns)."""
    def changed_since(self, identity: List[Tuple[int, int, int, int, int, int, int]]) -> Optional[str]:
        """What changed since an earlier ``identity``, in words; None when nothing did."""
    def info(self, path: _Path) -> Info:
        """fsspec's description of the entry (links followed; ``islink`` says if it is one)."""
    def ls(self, path: _Path) -> List[Info]: ...
    def find(self, path: _Path, maxdepth: Optional[int] = None, withdirs: bool = False) -> List[Info]: ...
    def open(self, path: _Path) -> "Member": ...
    def cat(self, path: _Path, start: Optional[int] = None, end: Optional[int] = None) -> bytes: ...
    def view(self, path: _Path) -> memoryview:
        """The whole member, read-only, without a copy where its bytes lie in memory."""

class Member:
    """An open member: a position and reads that release the GIL."""

    @property
    def size(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def read(self, size: Optional[int] = -1) -> bytes: ...
    def readinto(self, buffer: Any) -> int: ...
    def read_view(self, size: Optional[int] = -1) -> memoryview: ...
    def seek(self, offset: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...
    def close(self) -> None: ...

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
        source: Union[str, Sequence[str], Archive],
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
        root: Optional[_Path] = None,
        members: Optional[Sequence[_Path]] = None,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def num_files(self) -> int: ...
    @property
    def classes(self) -> List[str]: ...
    def epoch(self, epoch: int) -> EpochIter: ...
