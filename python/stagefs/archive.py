"""Archives read in process, without FUSE: :func:`open` and the fsspec filesystem ``stagefs://``.

``stagefs.open("train.tar")`` opens an archive (tar, compressed tar, zip, SquashFS, or a
shard pattern) exactly as ``stagefs mount`` would (the same format checks, trust rules,
staging and saved indexes, the daemon's own code in ``stagefs._native``) and serves its
tree and members to this process: no mount, no ``/dev/fuse``, no kernel round trip per
file. The result is an fsspec filesystem (``protocol = "stagefs"``), so fsspec users get
it by name too::

    fs = fsspec.filesystem("stagefs", fo="train.tar")
    with fsspec.open("stagefs://n01440764/x.JPEG", fo="train.tar") as f: ...
    with fsspec.open("stagefs://n01440764/x.JPEG::file:///data/train.tar") as f: ...
"""

from __future__ import annotations

import datetime
import errno
import io
import logging
import os
import re
import sys
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Union

import fsspec

from . import _native

__all__ = ["ArchiveFile", "ArchiveFileSystem", "ArchiveWarning", "open"]

PathLike = Union[str, "os.PathLike[str]"]

#: What opening and staging report (what ``stagefs mount`` prints as it goes): "indexed
#: 1,281,167 entries in 2.1 s", "fetched s3://... into RAM"; warnings are ArchiveWarnings.
log = logging.getLogger("stagefs")


class ArchiveWarning(UserWarning):
    """Something stagefs noticed while opening an archive, as ``stagefs mount`` logs it:
    a saved index ignored (another user's, or stale), names a later shard replaced,
    an archive that holds nothing."""


# One native archive per process for each (archive, options): fsspec keeps filesystem
# instances per thread, and every thread of a pool must not index the archive again.
_opened: "weakref.WeakValueDictionary[tuple, Any]" = weakref.WeakValueDictionary()
_opened_lock = threading.Lock()


#: The remote options of :func:`open`, :class:`Loader` and :func:`stagefs.mount`, named as
#: the command line's flags (``--endpoint-url`` is ``endpoint_url``).
REMOTE_OPTIONS = ("endpoint_url", "profile", "no_sign_request", "remote_concurrency", "bearer_token_file",
                  "remote_timeout", "remote_deadline", "remote_tries", "allow_http")  # fmt: skip


def _is_url(text: Union[str, bytes]) -> bool:
    """An object in a store or on a server (``s3://``, ``http://``, ``https://``)."""
    lower = (text.decode(errors="replace") if isinstance(text, bytes) else text)[:8].lower()
    return lower.startswith(("s3://", "http://", "https://"))


def _without_secrets(text: str) -> str:
    """``text`` with a URL's user information (``user:password@``) and query
    (a presigned URL's signature) shown as ``***``: what repr and messages may show."""
    return re.sub(r"(://)([^/?#@\s]*@)", r"\1***@", re.sub(r"(://[^\s]*?\?)([^#\s]*)", r"\1***", text))


def _has_secret(url: str) -> bool:
    """A URL carrying a credential: a ``user:password@`` or a query (a presigned signature)."""
    rest = url.split("://", 1)[-1]
    return "@" in rest.split("/", 1)[0] or "?" in rest


def _identity(path: str) -> tuple:
    """What changes when the file at ``path`` is replaced or rewritten (nothing for a pattern
    or an object: its version is pinned when it is opened)."""
    if _is_url(path):
        return ()
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open_native(path: str, stage: str, max_ram: Any, stage_dir: Optional[str], recursive: bool,
                 trust_shards: bool, remote: Dict[str, Any], progress: Optional[bool]) -> Any:  # fmt: skip
    where = path if _is_url(path) else os.path.abspath(path)
    key = (where, _identity(path), stage, max_ram, stage_dir, recursive, trust_shards, tuple(sorted(remote.items())))
    with _opened_lock:
        archive = _opened.get(key)
    if archive is not None:
        return archive
    # Opening may take long (a scan): no lock is held meanwhile; two threads racing here
    # both open, and the first one's is kept.
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    archive, logged = _native.open(path, stage=stage, max_ram=max_ram, stage_dir=stage_dir, recursive=recursive,
                                   trust_shards=trust_shards, remote=remote, progress=progress)  # fmt: skip
    for level, line in logged:
        if level in ("WARN", "ERROR"):
            warnings.warn(line, ArchiveWarning, stacklevel=_outside_stacklevel())
        else:
            log.info("%s", line)
    with _opened_lock:
        return _opened.setdefault(key, archive)


def _outside_stacklevel() -> int:
    """The stacklevel of the first caller outside stagefs and fsspec (the user's line)."""
    import sys

    ours = (os.path.dirname(__file__), os.path.dirname(fsspec.__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


def _archive_of(fo: Any, target_protocol: Optional[str], target_options: Optional[dict]) -> str:
    """The archive fsspec hands over (``fo``): a local path (maybe behind a caching layer),
    or an object's ``s3://`` or ``https://`` URL, which stagefs reads itself."""
    if hasattr(fo, "__fspath__"):
        fo = os.fspath(fo)
    if not isinstance(fo, str) or not fo:
        raise TypeError(
            f"stagefs needs an archive's path or URL (or a pattern, or an @list) as fo, not {type(fo).__name__}"
        )
    if target_protocol in ("s3", "http", "https"):
        # Chained (``stagefs://member::s3://bucket/key``): stagefs's own client reads it.
        return fo if "://" in fo else f"{target_protocol}://{fo}"
    if target_protocol in (None, "file", "local"):
        return fo[len("file://"):] if fo.startswith("file://") else fo
    target = fsspec.filesystem(target_protocol, **(target_options or {}))
    if getattr(target, "local_file", False):
        # A caching layer (simplecache::, filecache::) downloads the archive: serve its copy.
        with target.open(fo, "rb") as f:
            return f.name
    raise ValueError(
        f"stagefs reads local archives and s3://, http:// and https:// objects; {target_protocol}:// is neither. "
        f"Chain a cache in front of it (stagefs://PATH::simplecache::{target_protocol}://...) or copy the archive "
        "to a local disk"
    )


class ArchiveFile(io.BufferedIOBase):
    """A member of an archive, open for reading: ``read``, ``readinto``, ``seek``, ``tell``,
    and :meth:`getbuffer`, the whole member as a read-only memoryview (no copy where its
    bytes lie in memory). Reads release the GIL."""

    def __init__(self, member: Any, path: str, fs: "ArchiveFileSystem") -> None:
        super().__init__()
        self._member = member
        self.path = path
        self.fs = fs
        self.size: int = member.size
        self.mode = "rb"

    @property
    def name(self) -> str:
        return self.path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: Optional[int] = -1) -> bytes:
        return self._member.read(-1 if size is None else size)

    read1 = read

    def readinto(self, buffer: Any) -> int:
        return self._member.readinto(buffer)

    readinto1 = readinto

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the position (at least one, unless at the end) without moving it."""
        pos = self._member.tell()
        data = self._member.read(max(size, 8192))
        self._member.seek(pos)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._member.seek(offset, whence)

    def tell(self) -> int:
        return self._member.tell()

    def getbuffer(self) -> memoryview:
        """The whole member as a read-only memoryview (position unchanged). Where its bytes
        lie in memory (a staged copy, a decompressed block) the view shows them in place,
        no copy; they stay valid as long as the view lives, after ``close`` too."""
        pos = self._member.tell()
        self._member.seek(0)
        try:
            return self._member.read_view()
        finally:
            self._member.seek(pos)

    def close(self) -> None:
        self._member.close()
        super().close()

    def __repr__(self) -> str:
        return f"<stagefs.ArchiveFile {self.path!r} of {self.fs.fo!r} ({self.size} bytes)>"


def _reopen(cls: type, args: tuple, options: dict, identity: list) -> "ArchiveFileSystem":
    """Unpickles an :class:`ArchiveFileSystem` (see its ``__reduce__``)."""
    fs = cls(*args, **options)
    changed = fs.archive.changed_since(identity)
    if changed is not None:
        raise OSError(
            errno.ESTALE,
            f"{fs.label}: changed since this filesystem was pickled ({changed}); this process would serve "
            "another version than the one that pickled it: open the archive again in every process",
        )
    return fs


class ArchiveFileSystem(fsspec.AbstractFileSystem):
    """A read-only fsspec filesystem over one archive (or shard set), served in process.

    Paths are relative to the archive's root (``"n01440764/x.JPEG"``; the root is
    ``""``); symbolic links inside the archive are followed as on the mount. Made by
    :func:`stagefs.open` or by fsspec (``fsspec.filesystem("stagefs", fo=...)``,
    ``stagefs://`` URLs); use it as a context manager or call :meth:`close`.
    """

    protocol = "stagefs"
    root_marker = ""

    def __init__(self, fo: Any = "", *, stage: str = "none", max_ram: Union[int, str, None] = None,
                 stage_dir: Optional[PathLike] = None, recursive: bool = False, trust_shards: bool = False,
                 target_protocol: Optional[str] = None, target_options: Optional[dict] = None,
                 progress: Optional[bool] = None, **kwargs: Any) -> None:  # fmt: skip
        remote = {k: kwargs.pop(k) for k in REMOTE_OPTIONS if k in kwargs}
        if "bearer_token_file" in remote and remote["bearer_token_file"] is not None:
            remote["bearer_token_file"] = os.fspath(remote["bearer_token_file"])
        super().__init__(**kwargs)
        self.fo = _archive_of(fo, target_protocol, target_options)
        self.stage = stage
        stage_dir = os.fspath(stage_dir) if stage_dir is not None else None
        self._archive: Any = _open_native(self.fo, stage, max_ram, stage_dir, recursive, trust_shards, remote,
                                          progress)  # fmt: skip

    # -- what the archive is -----------------------------------------------------------

    @property
    def archive(self) -> Any:
        """The native archive (``stagefs._native.Archive``); raises once closed."""
        if self._archive is None:
            raise ValueError("this stagefs archive filesystem is closed")
        return self._archive

    @property
    def label(self) -> str:
        """The archive's resolved path, or a shard set's label."""
        return str(self.archive.label)

    @property
    def format(self) -> str:
        """``"tar"``, ``"zip"`` or ``"squashfs"``."""
        return self.archive.format

    @property
    def staging(self) -> str:
        """How its bytes reach RAM: ``"in place"``, ``"page cache"``, ``"copy"``, ``"local disk"``,
        or ``"shared"``: the copy in RAM that a ``stagefs mount --stage copy`` of this user
        holds of the same archive, mapped (one copy on the node, however many processes)."""
        return self.archive.staging

    @property
    def fsid(self) -> str:
        return f"stagefs:{self.label}"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        # Member paths are relative to the archive's root.
        return super()._strip_protocol(path).lstrip("/")

    # -- the fsspec API ----------------------------------------------------------------

    def info(self, path: Any, **kwargs: Any) -> Dict[str, Any]:
        """``name``, ``size``, ``type`` ("file", "directory", "other", or "link" for a link
        leading nowhere) and ``mode``, ``uid``, ``gid``, ``mtime``, ``nlink``, ``ino``,
        ``islink`` (and ``destination``) as ``os.stat`` shows them on the mount."""
        return self.archive.info(self._strip_protocol(path))

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> Union[List[Dict[str, Any]], List[str]]:
        entries = self.archive.ls(self._strip_protocol(path))
        return entries if detail else [e["name"] for e in entries]

    def find(self, path: Any, maxdepth: Optional[int] = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Union[List[str], Dict[str, Dict[str, Any]]]:  # fmt: skip
        path = self._strip_protocol(path)
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        try:
            info = self.info(path)
        except (FileNotFoundError, NotADirectoryError):
            return {} if detail else []  # as fsspec's own find: nothing there
        if info["type"] != "directory":
            found = [info]
        else:
            found = self.archive.find(path, maxdepth, withdirs)
            if withdirs and path:
                found.insert(0, info)
        if detail:
            return {e["name"]: e for e in found}
        return [e["name"] for e in found]

    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> ArchiveFile:  # fmt: skip
        path = self._strip_protocol(path)
        if mode != "rb":
            raise OSError(errno.EROFS, f"stagefs archives are read-only (mode {mode!r})", path)
        return ArchiveFile(self.archive.open(path), path, self)

    def cat_file(self, path: Any, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        return self.archive.cat(self._strip_protocol(path), start, end)

    def view(self, path: Any) -> memoryview:
        """The whole member at ``path`` as a read-only memoryview (see :meth:`ArchiveFile.getbuffer`)."""
        return self.archive.view(self._strip_protocol(path))

    def modified(self, path: Any) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def ukey(self, path: Any) -> str:
        info = self.info(path)
        return fsspec.utils.tokenize(self.label, info["name"], info["ino"], info["size"], info["mtime"])

    def _rm(self, path: Any) -> None:
        raise OSError(errno.EROFS, "stagefs archives are read-only", path)

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "stagefs archives are read-only", path)

    # -- life --------------------------------------------------------------------------

    def __reduce__(self) -> Any:
        """Pickled (for a DataLoader worker, say) as its arguments plus the identity of
        every file it serves: the copy made in the other process opens the archive by path
        again, and refuses it (``OSError(ESTALE)``) unless it is the very same version. A
        file replaced in between must never be served beside the old one."""
        if _is_url(self.fo) and _has_secret(self.fo):
            # A credential in the URL must not travel in a pickle: another process would
            # hold it (and whoever can read the pickle).
            raise TypeError(
                f"{self.label}: a filesystem whose URL carries a password or a signature is not pickled; give the "
                "credentials another way (~/.netrc, bearer_token_file, the AWS chain), or use fork workers"
            )
        identity = self.archive.identity
        return _reopen, (type(self), self.storage_args, self.storage_options, identity)

    def close(self) -> None:
        """Lets go of the archive (its map or staged copy goes once no open member, view or
        Loader of this process uses it) and takes this filesystem out of fsspec's cache."""
        self._archive = None
        cache = type(self)._cache
        for token, inst in list(cache.items()):
            if inst is self:
                cache.pop(token, None)

    def __enter__(self) -> "ArchiveFileSystem":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        """Every file's path, sorted."""
        return iter(self.find(""))

    def __repr__(self) -> str:
        if self._archive is None:
            return f"<stagefs.ArchiveFileSystem {_without_secrets(self.fo)!r} (closed)>"
        return f"<stagefs.ArchiveFileSystem {self.label!r} ({self.format}, {self.staging})>"

    __str__ = __repr__


def open(archive: PathLike, *, stage: str = "none", max_ram: Union[int, str, None] = None,
         stage_dir: Optional[PathLike] = None, recursive: bool = False, trust_shards: bool = False,
         progress: Optional[bool] = None, **remote: Any) -> ArchiveFileSystem:  # fmt: skip
    """Opens ``archive`` in this process, without FUSE, and returns it as a read-only
    fsspec filesystem (see :class:`ArchiveFileSystem`).

    ``archive`` is a tar (plain, or compressed with gzip, bzip2, xz, zstd or lz4), a zip,
    a SquashFS image, a glob pattern of shards (``"train-*.tar"``, expanded by stagefs,
    sorted) or an ``@list`` file, as for ``stagefs mount``; or an object in a store or on
    a server: ``"s3://bucket/key.tar"``, ``"https://host/path/data.tar"``, a brace range or
    glob of them, read by stagefs's own client (parallel ranged fetches, the AWS
    credential chain, ``~/.netrc``; see doc/remote.md). Options:

    * ``stage``: ``"none"`` (default): served in place from the file; every process of the
      node that opens it shares one copy, the page cache's. ``"ram"``: the same, after
      reading the archive once so its pages are in the cache when ``open`` returns (checked
      against the RAM budget first). ``"copy"``: a private copy in this process's RAM
      (compressed tars decompressed whole), immune to changes of the file, but one copy
      *per process*. ``"auto"`` and ``"disk"`` (with ``stage_dir``): as ``stagefs mount``.
      Whatever ``stage`` says, a local archive that a mount of yours holds a complete copy
      of in RAM (``stagefs mount --stage copy``) is read from that copy, mapped: no copy of
      its own, no FUSE (``staging`` is then ``"shared"``; the copy stays readable after
      the mount ends, until this filesystem is closed).
    * ``max_ram``: the RAM budget (bytes, or e.g. ``"64G"``), as ``--max-ram``.
    * ``recursive``: uncompressed tars inside the archive open as directories.
    * ``trust_shards``: use shards that other users could have put in a pattern's
      directory (refused by default, with :class:`PermissionError`).
    * ``progress``: progress bars on stderr while fetching, staging and indexing (default:
      when stderr is a terminal). What the steps report goes to the logger ``stagefs``
      (``logging``); what the user should act on, to ``warnings`` (:class:`ArchiveWarning`).
    * For objects, ``stage="ram"`` or ``"copy"`` fetches the object into this process's
      RAM (within ``max_ram``), ``"none"`` reads it in place by ranges through a bounded
      cache, ``"disk"`` (with ``stage_dir``) fetches it to the local disk; an archive made
      by ``stagefs pack --compress`` is read in place frame by frame. The remote options
      are keyword arguments named as ``stagefs mount``'s flags: ``endpoint_url``,
      ``profile``, ``no_sign_request``, ``remote_concurrency``, ``bearer_token_file``,
      ``remote_timeout``, ``remote_deadline`` (seconds or e.g. ``"5m"``), ``remote_tries``,
      ``allow_http``. One process reaches objects with one set of them.

    Refusals raise what the same failure would on a file: ``FileNotFoundError``,
    ``IsADirectoryError``, ``PermissionError`` (another user's shard), ``OSError``, and
    :class:`stagefs.ArchiveError` (an ``OSError``) for a damaged archive, with ``offset``.
    The GIL is released while indexing, and Ctrl-C interrupts it.
    """
    return _filesystem(archive, True, stage=stage, max_ram=max_ram, stage_dir=stage_dir, recursive=recursive,
                       trust_shards=trust_shards, progress=progress, **remote)  # fmt: skip


def _filesystem(archive: Union[str, "os.PathLike[str]"], cached: bool, stage: str = "none", max_ram: Any = None,
                stage_dir: Optional[Union[str, "os.PathLike[str]"]] = None, recursive: bool = False,
                trust_shards: bool = False, progress: Optional[bool] = None,
                **remote: Any) -> ArchiveFileSystem:  # fmt: skip
    """:func:`open`; ``cached=False`` gives a filesystem of the caller's own, outside
    fsspec's instance cache (a :class:`Loader`'s: what it staged goes with the Loader)."""
    unknown = set(remote) - set(REMOTE_OPTIONS)
    if unknown:
        raise TypeError(f"open() got unexpected keyword arguments {sorted(unknown)}")
    return ArchiveFileSystem(os.fspath(archive), stage=stage, max_ram=max_ram,
                             stage_dir=None if stage_dir is None else os.fspath(stage_dir),
                             recursive=recursive, trust_shards=trust_shards, progress=progress,
                             skip_instance_cache=not cached, **remote)  # fmt: skip
