"""A local copy of what a remote store holds: memory maps need local files.

Two pieces, one mechanism:

* :class:`LocalCopies` is a local folder of copies of remote objects, by name:
  a copy is made once (to a temporary in a locked scratch folder, renamed into
  place: a reader of an older copy keeps its map, a failed copy leaves
  nothing), and, with a size limit, the least recently used copies go first.
  :class:`~mlcache.store.fsspec.FsspecStore` keeps its entries' copies in one
  (moving whole files with one GET or PUT), and so does the dataset fetcher
  (:mod:`mlcache.data.fetch`, which records each pack's remote version beside
  its copy).
* :class:`CachedStore` wraps any store (a backend registered with
  :func:`~mlcache.register_store_backend` that has no local files) and gives
  it :class:`~mlcache.store.LocalPaths`: ``local_path(name)`` copies entry
  ``name`` on first use, so that its results can be memory-mapped.

What this process writes through the store is kept as the local copy too.
Entry names are keys of results, but a clear says "compute these again": as
:class:`~mlcache.store.fsspec.FsspecStore` does, a :class:`CachedStore` keeps
its copies in a folder named after the wrapped store's generation (the object
:data:`GENERATION_NAME`, written when none is there and by every removal of a
function's whole folder: a clear), read when the wrapper is made and again every
``revalidate_after`` seconds: another machine's clear stops this one serving
its copies within that time, and a process made after it never serves them.

>>> import tempfile
>>> from pathlib import Path
>>> from mlcache.store.memory import MemoryStore
>>> remote = MemoryStore("doc-cached")
>>> store = CachedStore(remote, tempfile.mkdtemp(), "1GB")
>>> with remote.write("f/v/k") as f:
...     _ = f.write(b"payload")
>>> Path(store.local_path("f/v/k")).read_bytes()
b'payload'
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from .._atomic import open_regular, temporary_folder
from .._util import parse_bytes, parse_duration
from ..errors import EntryNotFound, StoreError
from . import EntryStat, Store, check_name

__all__ = [
    "GENERATION_NAME",
    "CachedStore",
    "Generation",
    "LocalCopies",
    "generation_of",
    "is_unreachable",
]

#: the object of a wrapped store whose content names its generation (not listed)
GENERATION_NAME = "_mlcache-generation"

#: an empty, "." or ".." segment (so also a leading "/"): such a name could leave the folder
_UNSAFE = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
_ALT_SEP = os.altsep or (os.sep if os.sep != "/" else "")
#: copies are moved in chunks of this many bytes when a store gives no whole-file transfer
_CHUNK = 1 << 22


class LocalCopies:
    """A local folder of copies of remote objects, each named by a relative name.

    Parameters
    ----------
    folder:
        Where the copies live (created, mode 0o700).
    limit:
        Size limit in bytes of all copies (None: no limit). Once a tenth of it has
        been copied in, the least recently used copies are removed down to 90%
        of it (:meth:`trim`); using a copy (:meth:`get`) counts as a use.
    """

    def __init__(self, folder: str | os.PathLike[str], limit: int | None = None) -> None:
        self.folder = os.path.abspath(os.fspath(folder))
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.limit = limit
        self._copied = 0  # bytes copied in since the copies were last trimmed

    def __repr__(self) -> str:
        return f"LocalCopies({self.folder!r}, limit={self.limit!r})"

    def path(self, name: str) -> str:
        """Where the copy of ``name`` lives (whether or not it is there); a name
        that could leave the folder is a ``ValueError``."""
        # on every remote hit: one regex, one join
        if _UNSAFE.search(name) is not None or (_ALT_SEP and _ALT_SEP in name):
            raise ValueError(f"invalid local copy name {name!r}")
        return os.path.join(self.folder, name)

    def get(self, name: str, fill: Callable[[str], None]) -> str:
        """The local copy of ``name``, made by ``fill(tmp)`` (which writes the whole
        object to the file path ``tmp``) when there is none. ``fill``'s errors
        propagate and leave no copy."""
        local = self.path(name)
        try:
            os.utime(local)  # last use, for the copies' own LRU
            return local
        except FileNotFoundError:
            pass
        with self.replacing(name) as tmp:
            fill(tmp)
            size = os.path.getsize(tmp)
        self._added(size)
        return local

    @contextlib.contextmanager
    def replacing(self, name: str) -> Iterator[str]:
        """A path to write the new copy of ``name`` to (an empty file, in a scratch
        folder locked while in use: see :func:`mlcache._atomic.temporary_folder`);
        it replaces the copy in one rename when the block ends without error (a
        reader of the old copy keeps its map), and is removed otherwise."""
        local = self.path(name)
        folder, base = os.path.split(local)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with temporary_folder(folder, base) as scratch:
            tmp = os.path.join(scratch, base)
            os.close(open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            yield tmp
            os.replace(tmp, local)

    def touch(self, name: str) -> None:
        """Record a use of the copy of ``name`` (raise ``FileNotFoundError`` if none)."""
        os.utime(self.path(name))

    def forget(self, name: str) -> None:
        """Remove the copy of ``name``, or every copy under a folder name (a damaged
        copy is fetched again)."""
        local = self.path(name)
        if os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)

    def _added(self, size: int) -> None:
        self._copied += size
        if self.limit is not None and self._copied > self.limit // 10:
            self._copied = 0
            self.trim()

    def trim(self) -> int:
        """Remove least recently used copies down to 90% of the limit when they are
        over it; return the bytes removed. Hidden files and folders (temporaries
        being written) are left alone."""
        if self.limit is None:
            return 0
        files = []
        for folder, dirs, names in os.walk(self.folder):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for n in names:
                if n.startswith("."):
                    continue
                path = os.path.join(folder, n)
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(path)
                    files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        removed = 0
        if total <= self.limit:
            return 0
        for _, size, path in sorted(files):
            if total - removed <= int(self.limit * 0.9):
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += size
        return removed


class CachedStore:
    """Any store, with a local read-through copy of its entries (:class:`LocalPaths`).

    Everything is read from and written to ``store``; ``local_path(name)`` copies
    entry ``name`` into ``local_dir`` on first use and returns the copy. A write
    keeps what was written as the local copy too. The wrapper has that one power:
    the wrapped store's others (:class:`~mlcache.store.Locking`,
    :class:`~mlcache.store.SharedCounters`, :class:`~mlcache.store.ReadOnly`)
    stay on ``store`` and are not the wrapper's, so a ``Memory`` over a
    ``CachedStore`` computes a key in every process that misses it, as joblib's
    do; give the backend class itself those powers when it needs them.

    Parameters
    ----------
    store:
        The store to wrap (any :class:`~mlcache.store.Store`).
    local_dir:
        Where the copies live.
    limit:
        Size limit of the copies (``"20GB"``, or bytes); least recently used go first.
    revalidate_after:
        Seconds between two looks at the wrapped store's generation (see the
        module docstring; default 30).
    """

    def __init__(
        self,
        store: Store,
        local_dir: str | os.PathLike[str],
        limit: int | str = "20GB",
        *,
        revalidate_after: float | str = 30.0,
    ) -> None:
        size = parse_bytes(limit)
        if size is None:
            raise StoreError("the local copy's limit must be a size, like 20GB")
        every = parse_duration(revalidate_after)
        assert every is not None
        self.store = store
        self.location = store.location
        self.copies = LocalCopies(local_dir, size)
        self.revalidate_after: float = every
        self._generation = ""
        self._look_at = 0.0
        with contextlib.suppress(OSError):  # a store failing now: its next use raises
            self._current()

    def _current(self) -> str:
        """The generation's folder name, read again once ``revalidate_after`` passed."""
        if time.monotonic() < self._look_at:
            return self._generation
        try:
            with self.store.open(GENERATION_NAME) as f:
                data = f.read()
        except EntryNotFound:
            data = secrets.token_hex(16).encode()
            try:
                with self.store.write(GENERATION_NAME) as f:
                    f.write(data)
            except PermissionError:  # read-only: no generation can be kept
                data = b"unmarked"
        generation = "g-" + hashlib.sha256(data).hexdigest()[:16]
        self._look_at = time.monotonic() + self.revalidate_after
        if generation != self._generation:
            self._generation = generation
            with contextlib.suppress(OSError), os.scandir(self.copies.folder) as found:
                for d in found:  # other generations' copies
                    if d.name.startswith("g-") and d.name != generation and d.is_dir():
                        shutil.rmtree(d.path, ignore_errors=True)
        return generation

    def new_generation(self) -> None:
        """Every process stops serving its copies (at once if made after this,
        within ``revalidate_after`` if running): what a clear calls."""
        with self.store.write(GENERATION_NAME) as f:
            f.write(secrets.token_hex(16).encode())
        self._look_at = 0.0

    def __repr__(self) -> str:
        return f"CachedStore({self.store!r}, {self.copies.folder!r})"

    # -- the Store protocol: the wrapped store's ---------------------------------------
    def open(self, name: str) -> BinaryIO:
        return self.store.open(name)

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        check_name(name)
        with self.copies.replacing(f"{self._current()}/{name}") as tmp, open(tmp, "w+b") as f:
            yield f
            f.seek(0)
            with self.store.write(name) as out:
                shutil.copyfileobj(f, out, _CHUNK)

    def exists(self, name: str) -> bool:
        return self.store.exists(name)

    def delete(self, name: str) -> bool:
        """Remove ``name``; removing a function's whole folder (a name without
        ``/``: what a clear removes) starts a new generation."""
        self.copies.forget(f"{self._generation or 'g-none'}/{check_name(name)}")
        removed = self.store.delete(name)
        if removed and "/" not in name and name != GENERATION_NAME:
            self.new_generation()
        return removed

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        return (e for e in self.store.list(prefix) if e.name != GENERATION_NAME)

    def touch(self, names: Iterable[str]) -> None:
        self.store.touch(names)

    # -- LocalPaths -----------------------------------------------------------------------
    def local_path(self, name: str) -> str:
        """A local copy of entry ``name`` (made on first use); ``FileNotFoundError``
        when the store has no such entry."""
        check_name(name)

        def fill(tmp: str) -> None:
            try:
                src = self.store.open(name)
            except EntryNotFound:
                raise FileNotFoundError(name) from None
            with src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)

        return self.copies.get(f"{self._current()}/{name}", fill)

    def forget_local(self, name: str) -> None:
        """Drop the local copy of ``name`` (a damaged copy is fetched again)."""
        self.copies.forget(f"{self._generation or 'g-none'}/{check_name(name)}")

    def trim_local(self) -> int:
        """Remove least recently used copies down to 90% of the limit; the bytes removed."""
        return self.copies.trim()


# -- what a process knows of a shared location (FsspecStore's) --------------------------
#: client exceptions (by class name, anywhere in their MRO) that mean the server
#: was not reached: botocore's, aiohttp's
_UNREACHABLE = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ProxyConnectionError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)


class Generation:
    """What a process knows of one shared location: its generation, when it was
    last read, and whether its server answers (shared by its stores)."""

    __slots__ = ("fs", "generation", "lock", "looked", "probing", "unreachable")

    def __init__(self, fs: Any) -> None:
        self.fs = fs  # held: its id is in the key
        self.generation: str | None = None  # the last one read, ``g-<hash>``
        self.looked = -math.inf  # time.monotonic() of the last look (or failure)
        self.unreachable: str | None = None  # why, while the server cannot be reached
        self.lock = threading.Lock()
        self.probing = False  # a thread is trying an unreachable server again

    def start_probe(self) -> bool:
        """True for the one caller that is to try the server again now."""
        with self.lock:
            if self.probing:
                return False
            self.probing = True
            return True


_SEEN: dict[tuple[str, int], Generation] = {}
_SEEN_LOCK = threading.Lock()


def generation_of(location: str, fs: Any) -> Generation:
    """The one :class:`Generation` of ``location`` on file system ``fs`` in this process."""
    with _SEEN_LOCK:
        return _SEEN.setdefault((location, id(fs)), Generation(fs))


def _renew_locks() -> None:
    """In a forked child: fresh locks (a thread of the parent may have held one)."""
    global _SEEN_LOCK
    _SEEN_LOCK = threading.Lock()
    for seen in list(_SEEN.values()):
        seen.lock = threading.Lock()
        seen.probing = False  # its thread is not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)


def is_unreachable(exc: BaseException | None) -> bool:
    """``exc`` (or what caused it) says the server was not reached."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)):
            return True
        if any(k.__name__ in _UNREACHABLE for k in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
