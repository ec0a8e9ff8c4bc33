"""stagefs: read tar / zip / SquashFS archives with or without FUSE, and load files as batches.

* :func:`mount` runs the native ``stagefs mount`` command (installed with this
  package) and unmounts on exit: ``with stagefs.mount("data.tar") as root: ...``.
* :func:`open` opens an archive in this process, without a mount (no ``/dev/fuse``
  needed), as a read-only fsspec filesystem (``stagefs://``).
* :class:`Loader` streams the files of a directory (e.g. the mount) or of an archive
  in shuffled, rank-sharded batches, read by native threads and handed to torch or
  numpy through DLPack without a copy through Python.

This module is a thin face: ordering, sharding, labels and reading live in the
Rust crate ``stagefs-reader`` (shared with its CLI), exposed by ``stagefs._native``.
Importing it starts no thread and touches no GPU, so it is safe before
``DataLoader`` workers fork. torch and numpy are optional.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import _native
from ._native import ArchiveError, CudaUnavailableError, FileChangedError, ForkError
from .archive import (REMOTE_OPTIONS, ArchiveFile, ArchiveFileSystem, ArchiveWarning, _filesystem, _is_url,
                      _without_secrets, log, open)

__version__: str = _native.__version__

__all__ = [
    "ArchiveError",
    "ArchiveFile",
    "ArchiveFileSystem",
    "ArchiveWarning",
    "Batch",
    "CudaUnavailableError",
    "FileChangedError",
    "ForkError",
    "Loader",
    "Mount",
    "MountError",
    "executable",
    "mount",
    "open",
]

PathLike = Union[str, "os.PathLike[str]"]

# ---------------------------------------------------------------------------------------
# mount()
# ---------------------------------------------------------------------------------------


class MountError(OSError):
    """``stagefs mount`` or ``stagefs umount`` failed.

    ``code`` is the command's exit code (2 usage, 3 bad archive, 4 mountpoint
    problem, 5 mount busy, 6 not mounted, 7 FUSE unavailable, 8 not enough RAM, 9 staging
    failed);
    ``message`` is what it printed on stderr.
    """

    def __init__(self, message: str, code: int, command: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.command = list(command)

    def __str__(self) -> str:
        return f"{self.message} (stagefs exit code {self.code})"


def executable() -> str:
    """Path of the native ``stagefs`` command this package installed.

    Looked up in ``$STAGEFS_BIN``, then this interpreter's scripts directory
    (where pip put it, also for ``--user`` installs), then ``PATH``.
    """
    env = os.environ.get("STAGEFS_BIN")
    if env:
        return env
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    try:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for d in dirs:
        if d:
            candidate = os.path.join(d, "stagefs")
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which("stagefs")
    if found:
        return found
    raise FileNotFoundError("the native `stagefs` command was not found (is the stagefs wheel installed?)")


_live: "set[Mount]" = set()
_live_lock = threading.Lock()


@atexit.register
def _unmount_all() -> None:
    with _live_lock:
        mounts = list(_live)
    for m in mounts:
        try:
            m.unmount()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _duration(value: Union[str, int, float]) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{int(value * 1000)}ms"
    return str(value)


def _run(cmd: List[str], timeout: Optional[float], stdin: Optional[str] = None) -> str:
    """Runs a stagefs command (``stdin``: a line for its standard input, such as an
    archive URL kept out of the command line); returns its stdout, raises MountError on
    failure."""
    proc = subprocess.run(cmd, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)  # fmt: skip
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip() or f"{cmd[1]} failed").replace("\n", "; ")
        raise MountError(message, proc.returncode, cmd)
    return proc.stdout


class Mount:
    """A live stagefs mount. Unmounts on :meth:`unmount`, at the end of a ``with``
    block (also on exceptions and KeyboardInterrupt) and at interpreter exit.

    When several processes of a node mount the same archive (torchrun or SLURM ranks),
    one of them mounts (:attr:`owner`) and the others use its mount. Only the owner
    unmounts, and it first waits (up to ``wait_for_others`` seconds) until no other
    process has a file or directory open inside; the others' ``unmount`` only lets go.
    """

    def __init__(self, archive: Path, path: Path, command: List[str], owner: bool = True) -> None:
        self.archive = archive
        self.path = path
        self.command = command
        self.owner = owner
        self._mounted = True

    @property
    def mounted(self) -> bool:
        """True until :meth:`unmount` succeeded."""
        return self._mounted

    def status(self) -> dict:
        """What ``stagefs status --json`` says of this mount: ``staging``, ``ram_bytes`` (the
        RAM it holds, each byte once: ``private_bytes`` of the daemon, ``staged_bytes`` of a
        private copy, ``warmed_bytes`` of page cache), ``reads``, ``errors``,
        ``last_error``, ``staging_progress`` (``state``: ``"copying"``, ``"warming"``,
        ``"done"`` or ``"failed"``, ``done_bytes`` of ``total_bytes``, ``error``; ``None``
        when nothing is staged in the background), ... Raises :class:`MountError` if it
        is no longer mounted."""
        out = _run([executable(), "status", "--json"], None)
        for line in out.splitlines():
            record = json.loads(line)
            if record.get("mountpoint") == str(self.path) and record.get("state") == "live":
                return record
        raise MountError(f"{self.path} is not mounted", 6, ["stagefs", "status", "--json"])

    def wait_staged(self, timeout: Optional[float] = None) -> None:
        """Waits until the mount has staged what its ``stage`` promises, as ``stagefs wait
        --staged`` does. A staged mount serves from the moment it is mounted: ``"copy"`` and
        ``"disk"`` copy the archive in the background (what is not copied yet is read from
        the archive in place), ``"ram"`` and ``warm`` fill the page cache in the background;
        :meth:`status` shows how far (``staging_progress``). Returns at once when nothing is
        staged. Raises :class:`MountError`: code 9 if staging failed (the archive changed
        while it was copied; the message says why), 6 if the mount went away or
        ``timeout`` (seconds) passed first."""
        cmd = [executable(), "wait", "--staged", str(self.path)]
        if timeout is not None:
            cmd += ["--timeout", _duration(timeout)]
        _run(cmd, None)

    def add(self, *shards: PathLike, trust_shards: bool = False) -> str:
        """Adds shards (archives, glob patterns expanded by stagefs, or ``@list`` files) to a mount
        made with ``growing=True`` or ``watch``, as ``stagefs add`` does: the tree shows
        them at once, later shards winning shared paths. Returns the command's summary;
        raises :class:`MountError` (e.g. code 3 for a damaged shard, code 2 for a mount
        made without ``growing``), and then nothing changed."""
        cmd = [executable(), "add", str(self.path), *(os.fspath(s) for s in shards)]
        return _run(cmd + (["--trust-shards"] if trust_shards else []), None).strip()

    def remove(self, *shards: PathLike) -> str:
        """Removes shards from a growing mount, as ``stagefs remove`` does: their files
        leave the tree at once; files a process has open keep reading until closed."""
        return _run([executable(), "remove", str(self.path), *(os.fspath(s) for s in shards)], None).strip()

    def unmount(self, lazy: bool = False, timeout: Optional[float] = 120, wait_for_others: float = 60) -> None:
        """Runs ``stagefs umount`` (owner only, see the class docs); a mount that is
        already gone is not an error. While it is busy (exit 5) it retries for up to
        ``wait_for_others`` seconds, then detaches it lazily."""
        if not self._mounted:
            return
        if self.owner:
            cmd = [self.command[0], "umount", str(self.path)]
            deadline = time.monotonic() + wait_for_others
            while True:
                try:
                    _run(cmd + (["--lazy"] if lazy else []), timeout)
                    break
                except MountError as e:
                    if e.code == 6:  # not mounted (already gone)
                        break
                    if e.code != 5:  # 5: busy, another process is still inside
                        raise
                    if time.monotonic() >= deadline:
                        lazy = True
                    else:
                        time.sleep(0.5)
        self._mounted = False
        with _live_lock:
            _live.discard(self)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        self.unmount()

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        state = "mounted" if self._mounted else "unmounted"
        return f"<stagefs.Mount {_without_secrets(str(self.archive))!r} on {str(self.path)!r} ({state})>"


def _remote_flags(remote: dict) -> List[str]:
    """``stagefs mount``'s flags for the remote options of :func:`mount` (see ``REMOTE_OPTIONS``)."""
    unknown = set(remote) - set(REMOTE_OPTIONS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    flags: List[str] = []
    for name, value in remote.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif name in ("remote_timeout", "remote_deadline"):
            flags += [flag, _duration(value)]
        else:
            flags += [flag, os.fspath(value) if name == "bearer_token_file" else str(value)]
    return flags


def mount(
    archive: PathLike,
    mountpoint: Optional[PathLike] = None,
    *,
    stage: Optional[str] = None,
    max_ram: Union[int, str, None] = None,
    warm: Optional[str] = None,
    threads: Optional[int] = None,
    idle_timeout: Union[int, float, str, None] = None,
    log_file: Optional[PathLike] = None,
    recursive: bool = False,
    growing: bool = False,
    watch: Union[bool, int, float, str] = False,
    timeout: Optional[float] = None,
    **remote: Any,
) -> Mount:
    """Mounts ``archive`` read-only and returns once the mount is usable.

    Use as a context manager (``with stagefs.mount("data.tar") as root:``, where
    ``root`` is the mountpoint as a :class:`pathlib.Path`) or keep the returned
    :class:`Mount` and call ``.unmount()``. Options are the ``stagefs mount``
    options: ``stage`` (auto|ram|copy|disk|none), ``max_ram`` (bytes or e.g. "64G"),
    ``warm`` (auto|yes|no), ``threads``, ``idle_timeout`` (seconds or e.g. "30m"),
    ``log_file``, ``recursive`` (tars inside the archive, such as ImageNet's
    per-class tars, appear as directories), ``growing`` (a shard set that takes
    :meth:`Mount.add` and :meth:`Mount.remove` while mounted), ``watch`` (True, or an
    interval in seconds or e.g. "2s": follow the glob pattern ``archive``, adding shards
    once complete and removing deleted ones). ``mountpoint`` defaults to the command's own default,
    ``/dev/shm/$USER/stagefs/<stem>``, which it prints.

    A compressed tar is mounted as it is: ``.tar.gz``, ``.tar.bz2``, a multi-block
    ``.tar.xz`` and a multi-frame ``.tar.zst`` are served from the compressed file
    (decoded piece by piece as read, RAM bounded by a 128 MiB cache); ``stage="copy"``
    decompresses one whole into RAM instead.

    ``archive`` may be an object in a store or on a server: ``"s3://bucket/key.tar"``,
    ``"https://host/path/data.tar"`` (or a brace range or glob of them); it is fetched
    once into RAM or the local disk (``stage="none"`` reads it in place by ranges).
    Credentials come from the usual AWS chain (environment, ``~/.aws``, instance role)
    or ``~/.netrc``; see doc/remote.md. The remote options are keyword arguments named as
    the command's flags: ``endpoint_url``, ``profile``, ``no_sign_request``,
    ``remote_concurrency``, ``bearer_token_file``, ``remote_timeout``, ``remote_deadline``,
    ``remote_tries``, ``allow_http`` (``no_sign_request=True`` is ``--no-sign-request``).
    A URL reaches the command on its standard input, never its command line.

    Raises :class:`MountError` (an ``OSError``) with the command's message and
    exit code, e.g. code 3 for a missing or unreadable archive.
    """
    archive_text = os.fspath(archive)
    # An object URL (s3://, https://) stays text: a Path would fold its "//". It reaches
    # the command on its standard input, never its command line, which every user of the
    # node can read (`ps`): it may carry a password or a presigned signature.
    url = _is_url(archive_text)
    archive_path = archive_text if url else Path(archive_text)
    cmd = [executable(), "mount", "--json", "-" if url else str(archive_path)]
    if mountpoint is not None:
        cmd.append(os.fspath(mountpoint))
    for flag, value in (("--stage", stage), ("--warm", warm), ("--threads", threads), ("--log-file", log_file)):
        if value is not None:
            cmd += [flag, os.fspath(value) if flag == "--log-file" else str(value)]
    if max_ram is not None:
        cmd += ["--max-ram", str(max_ram)]
    if idle_timeout is not None:
        cmd += ["--idle-timeout", _duration(idle_timeout)]
    if recursive:
        cmd.append("--recursive")
    if growing:
        cmd.append("--growing")
    if watch is True:
        cmd.append("--watch")
    elif watch is not False:
        cmd.append(f"--watch={_duration(watch)}")
    cmd += _remote_flags(remote)
    # Interrupted (Ctrl-C, timeout) while the daemon is coming up, subprocess kills the
    # command; the daemon follows its parent and leaves nothing mounted or staged.
    out = _run(cmd, timeout, stdin=archive_text + "\n" if url else None)
    # The command prints where it mounted and whether this call mounted (else another
    # process of the node did, and owns the mount).
    result = json.loads(out.strip().splitlines()[-1])
    handle = Mount(archive_path, Path(result["mountpoint"]), cmd, owner=bool(result["mounted"]))
    with _live_lock:
        _live.add(handle)
    return handle


# ---------------------------------------------------------------------------------------
# Loader
# ---------------------------------------------------------------------------------------


def _rank_world(rank: Optional[int], world_size: Optional[int]) -> "tuple[int, int]":
    """Explicit values, else torch.distributed (if initialised), RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, 0/1."""
    r, w = 0, 1
    dist = sys.modules.get("torch.distributed")  # never import torch just to ask
    env = os.environ
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    elif "RANK" in env and "WORLD_SIZE" in env:
        r, w = int(env["RANK"]), int(env["WORLD_SIZE"])
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        r, w = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    return (r if rank is None else int(rank), w if world_size is None else int(world_size))


_warned_host_tensors = False


def _warn_host_tensors(why: str) -> None:
    """Says once per process that a Loader without ``device`` gives host tensors."""
    global _warned_host_tensors
    if not _warned_host_tensors:
        _warned_host_tensors = True
        warnings.warn(
            f"stagefs.Loader gives host (CPU) tensors: {why}. Pass device='cpu' to say so and "
            "silence this, or device='cuda' to require a GPU.",
            RuntimeWarning,
            stacklevel=3,
        )


def _pick_output(output: Optional[str]) -> str:
    if output is not None:
        if output not in ("torch", "numpy", "dlpack"):
            raise ValueError(f"output must be 'torch', 'numpy' or 'dlpack', not {output!r}")
        return output
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return "torch"
    if importlib.util.find_spec("numpy") is not None:
        return "numpy"
    return "dlpack"


class Batch:
    """One batch of files.

    * ``paths``: the files (list of str), ``labels``: their class indices (list of int;
      ImageFolder's rule, -1 for files outside a class folder or from a path list);
    * ``buffer``: all files' bytes back to back in one 1-D uint8 tensor / array;
    * ``offsets``, ``lengths``: int64 tensors / arrays locating file ``i`` in ``buffer``;
    * ``data``: one 1-D uint8 view per file (``buffer[offsets[i]:offsets[i]+lengths[i]]``).

    The buffer belongs to this batch alone: it stays valid as long as you hold it.
    """

    __slots__ = ("paths", "labels", "buffer", "offsets", "lengths", "data", "epoch", "index")

    def __init__(self, paths: List[str], labels: List[int], buffer: Any, offsets: Any, lengths: Any,
                 data: List[Any], epoch: int, index: int) -> None:  # fmt: skip
        self.paths = paths
        self.labels = labels
        self.buffer = buffer
        self.offsets = offsets
        self.lengths = lengths
        self.data = data
        self.epoch = epoch
        self.index = index

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"<stagefs.Batch epoch={self.epoch} index={self.index} files={len(self.paths)}>"


class Loader:
    """Streams the files of a directory, of an archive, or of a list of paths in batches.

    ``Loader(root, batch_size=64, shuffle=True, seed=0, device="cpu")`` lists ``root``
    once (recursively, sorted; classes are its sorted immediate subdirectories, as
    torchvision's ImageFolder). ``root`` may also be an archive (a path that is not a
    directory: tar, compressed tar, zip, SquashFS, a shard pattern or ``@list``, opened
    with :func:`open`'s defaults) or a filesystem :func:`open` returned: its members are
    listed and labelled the same way (below the archive directory ``archive_root``, by
    default its root) and read straight from the archive's bytes by the native threads,
    with no mount; ``Batch.paths`` are then the members' paths in the archive. ``root`` may
    be an object's URL too (``"s3://bucket/train.tar"``, ``"https://..."``), opened by
    :func:`open` with the remote options given here as keyword arguments
    (``endpoint_url``, ``profile``, ``no_sign_request``, ...) and ``stage`` (default
    ``"ram"`` for an object: fetched once into RAM with parallel ranges). Each epoch the order is shuffled with ``seed`` and
    the epoch number (the same permutation on every rank), then sharded like
    ``DistributedSampler``: rank ``r`` of ``world_size`` takes every
    ``world_size``-th file; with ``drop_last=False`` the order is padded by
    repeating its start so every rank gets the same number of files, with
    ``drop_last=True`` the tail is cut instead and a short last batch dropped.

    Iterating yields :class:`Batch` objects for the current epoch; call
    :meth:`set_epoch` before each epoch (as with ``DistributedSampler``).
    ``rank``/``world_size`` default to torch.distributed when initialised, else
    ``RANK``/``WORLD_SIZE``, else ``SLURM_PROCID``/``SLURM_NTASKS``, else 0/1.

    Files are read by native threads (``io_threads``, default: one per CPU this
    process may use) into a ring of ``depth`` slots; threads start on the first
    batch. The GIL is released while waiting and Ctrl-C interrupts promptly.
    ``device="cuda"`` uploads each batch from the pinned ring to the GPU and gives torch
    CUDA tensors (DLPack, ordered on the consumer's current stream); it raises
    :class:`CudaUnavailableError` without a usable GPU. Without ``device``, a Loader
    takes the GPU when there is one and otherwise gives host tensors, with one
    :class:`RuntimeWarning` per process. ``device="cpu"`` gives host
    tensors: the right choice for ``torchvision.io.decode_jpeg(batch.data, device="cuda")``,
    whose input must be on the CPU.

    A directory in a stagefs mount of yours whose archive the mount holds a complete copy
    of in RAM (``stagefs mount --stage copy``, once the copy is in) is read from that copy
    in this process, with no FUSE request and no copy of its own (the daemon hands it
    over; see :func:`open`): the same files, labels, classes and ``Batch.paths`` as
    reading through the mount. ``in_process=False`` reads through the mount instead.

    A Loader must be iterated in the process that created it; in a fork child it
    raises :class:`ForkError`.
    """

    def __init__(
        self,
        source: Union[PathLike, Iterable[PathLike]],
        batch_size: int = 64,
        shuffle: bool = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        device: Optional[str] = None,
        *,
        io_threads: Optional[int] = None,
        depth: int = 3,
        slot_bytes: Optional[int] = None,
        output: Optional[str] = None,
        archive_root: Optional[str] = None,
        in_process: bool = True,
        _upload_delay_ms: int = 0,
        **remote: Any,
    ) -> None:
        r, w = _rank_world(rank, world_size)
        self._archive: Optional[ArchiveFileSystem] = None
        # A directory in a stagefs mount of this user that holds its archive's copy in RAM:
        # (the directory as given, its directory in the archive), read from that copy.
        self._mounted: Optional[Tuple[str, str]] = None
        native_archive: Any = None
        if isinstance(source, ArchiveFileSystem):
            self._archive = source
        elif isinstance(source, (str, os.PathLike)) and (_is_url(os.fspath(source)) or not os.path.isdir(source)):
            text = os.fspath(source)
            if _is_url(text):
                remote.setdefault("stage", "ram")
            # A filesystem of its own, outside fsspec's instance cache: what it staged (an
            # object fetched into RAM) goes when the Loader does, not at the process's exit.
            self._archive = _filesystem(source, False, **remote)
        elif remote:
            raise TypeError(f"remote options ({', '.join(sorted(remote))}) apply to an archive or object source")
        elif archive_root is not None:
            raise ValueError("archive_root applies to an archive source only")
        elif isinstance(source, (str, os.PathLike)) and in_process:
            found = _native.open_mounted(os.fspath(source))
            if found is not None:
                native_archive, _mountpoint, archive_root = found
                self._mounted = (os.fspath(source), archive_root)
                log.info("reading %s from the copy its mount holds in RAM, in this process", os.fspath(source))
        if self._archive is not None:
            native_archive = self._archive.archive
        self._native_archive = native_archive
        if native_archive is not None:
            src: Any = native_archive
        elif isinstance(source, (str, os.PathLike)):
            src = os.fspath(source)
        else:
            src = [os.fspath(p) for p in source]
        self._archive_root = archive_root
        self._output = _pick_output(output)
        # No device asked for: the GPU when there is one (and torch to hand its tensors
        # to), else the CPU with one warning.
        chosen = device or ("cuda" if self._output == "torch" else "cpu")
        self._settings = dict(
            batch_size=batch_size, shuffle=shuffle, seed=seed, rank=r, world_size=w,
            drop_last=drop_last, device=chosen, io_threads=io_threads, depth=depth, slot_bytes=slot_bytes,
            _upload_delay_ms=_upload_delay_ms,  # test hook: a slow pipeline for the Ctrl-C test
        )  # fmt: skip
        self._source: Any = src
        try:
            self._native = _native.Loader(src, root=archive_root, **self._settings)
        except CudaUnavailableError as e:
            if device is not None:
                raise
            chosen = self._settings["device"] = "cpu"
            self._native = _native.Loader(src, root=archive_root, **self._settings)
            # Said as what happened: no device was asked for, none could be used.
            _warn_host_tensors(f"no GPU could be used ({str(e).split(': ', 1)[0]})")
        if device is None and chosen == "cpu" and self._output != "torch":
            _warn_host_tensors("torch is not installed, so batches come as numpy arrays")
        self._classes: List[str] = list(self._native.classes)
        self._relabel: Optional[List[int]] = None
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = r
        self.world_size = w
        self.drop_last = drop_last
        self.device = chosen
        self.epoch = 0
        if chosen != "cpu" and self._output != "torch":
            raise ValueError(f"device={device!r} gives torch CUDA tensors: install torch, or use device='cpu'")

    @property
    def classes(self) -> List[str]:
        """Class names (sorted subdirectories of the root; a class that appears at a later
        :meth:`set_epoch` is appended); empty for a path list."""
        return list(self._classes)

    @property
    def num_files(self) -> int:
        """Number of files listed (all ranks together)."""
        return self._native.num_files

    def set_epoch(self, epoch: int, files: Optional[Iterable[PathLike]] = None) -> None:
        """Selects the epoch whose order the next iteration streams, and lists its files.

        A directory source is listed again, so the epoch reads the files there now: a
        dataset that grows between epochs (shards added with ``stagefs add`` to a
        ``--growing`` mount, or by ``--watch``) is seen whole, and files of removed shards
        are not read. ``files`` gives the epoch a new list of paths instead (from then on
        the source is that list). Listing a directory costs one walk of it; a path list
        costs nothing. An archive source is not listed again (it does not change while
        open); ``files`` then names members of it.

        Labels stay stable across epochs: a class already seen keeps its index, and a
        class folder that appears later is appended to :attr:`classes` (ImageFolder's
        sorted order holds for the first listing only, so a model's outputs keep their
        meaning). Call it between epochs: an iteration under way keeps its own list.
        """
        if self._native_archive is not None:
            # An archive does not change while open; `files` names members of it (or, for a
            # mount read in process, files in the mount).
            if files is not None:
                members = [self._member_of(os.fspath(p)) for p in files]
                self._native = _native.Loader(self._native_archive, members=members, **self._settings)
                self._relabel = None
            self.epoch = int(epoch)
            return
        if files is not None:
            self._source = [os.fspath(p) for p in files]
        if files is not None or isinstance(self._source, str):
            native = _native.Loader(self._source, **self._settings)
            listed = list(native.classes)
            # ImageNet-21k has 21,841 classes: index them once, not a list search each.
            index = {name: i for i, name in enumerate(self._classes)}
            for name in listed:
                if name not in index:
                    index[name] = len(self._classes)
                    self._classes.append(name)
            relabel = [index[name] for name in listed]
            self._relabel = None if relabel == list(range(len(relabel))) else relabel
            self._native = native
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self._native)

    def __iter__(self) -> Iterator[Batch]:
        it = self._native.epoch(self.epoch)
        epoch, pid, index, relabel = self.epoch, os.getpid(), 0, self._relabel
        try:
            for buf, paths, labels, offsets, lengths in it:
                if self._mounted is not None:
                    paths = [self._path_of(member) for member in paths]
                if relabel is not None:
                    labels = [relabel[label] if label >= 0 else label for label in labels]
                yield self._batch(buf, paths, labels, offsets, lengths, epoch, index)
                index += 1
        finally:
            if os.getpid() == pid:  # in a fork child there is nothing of ours to stop
                it.close()

    def _path_of(self, member: str) -> str:
        """The path in the mount of a member read in process (as a walk of it names it)."""
        source, root = self._mounted  # type: ignore[misc]
        return os.path.join(source, member[len(root) + 1 :] if root else member)

    def _member_of(self, path: str) -> str:
        """The member a path is: in the mount read in process, or already a member."""
        if self._mounted is None:
            return path
        source, root = self._mounted
        rel = os.path.relpath(path, source)
        return rel if not root else f"{root}/{rel}"

    def _batch(self, buf: Any, paths: List[str], labels: List[int], offsets: List[int], lengths: List[int],
               epoch: int, index: int) -> Batch:  # fmt: skip
        out = self._output
        if out == "torch":
            import torch

            buffer = torch.from_dlpack(buf)
            offs = torch.tensor(offsets, dtype=torch.int64)
            lens = torch.tensor(lengths, dtype=torch.int64)
        elif out == "numpy":
            import numpy as np

            buffer = np.from_dlpack(buf)
            offs = np.asarray(offsets, dtype=np.int64)
            lens = np.asarray(lengths, dtype=np.int64)
        else:
            buffer, offs, lens = buf, list(offsets), list(lengths)
        # Files lie back to back in the buffer: one native split gives every view at once
        # (a Python loop of slices costs microseconds per file, hundreds per batch).
        if out == "torch":
            data = list(buffer.split(list(lengths)))
        elif out == "numpy":
            data = np.split(buffer, offsets[1:]) if offsets else []
        else:
            data = [memoryview(buf.tobytes())[o : o + n] for o, n in zip(offsets, lengths)]
        return Batch(paths, labels, buffer, offs, lens, data, epoch, index)

    def __repr__(self) -> str:
        return (f"<stagefs.Loader files={self.num_files} batch_size={self.batch_size} rank={self.rank}/"
                f"{self.world_size} epoch={self.epoch} device={self.device!r}>")  # fmt: skip
