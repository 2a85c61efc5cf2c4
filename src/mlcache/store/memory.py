"""An in-memory store (backend ``"memory"``): entries in a dict of this process.

For tests and notebooks: nothing touches the disk, and every ``MemoryStore``
of one location in a process shares the same entries (so two ``Memory``
objects on one location see each other's results, as on a disk). Entries are
lost when the process ends, and a copy pickled to another process starts empty.
It has no local files (no :class:`~mlcache.store.LocalPaths`): results are read
into memory, never mapped. It can lock keys among the threads of the process.

It is also the smallest complete example of a backend for
:func:`~mlcache.register_store_backend`, and passes
:class:`mlcache.testing.stores.StoreTests`.

>>> from mlcache import Memory
>>> mem = Memory("scratch", backend="memory", verbose=0)
>>> square = mem.cache(lambda x: x * x)
>>> square(4)
16
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO, ClassVar

from ..errors import EntryNotFound
from . import EntryStat, check_name

__all__ = ["MemoryStore"]


class _Space:
    """The entries of one location: name -> (bytes, last use), and its key locks."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.objects: dict[str, tuple[bytes, float]] = {}
        self.locks: dict[str, threading.Lock] = {}


class MemoryStore:
    """Entries held in this process's memory, shared by every store of ``location``.

    Parameters
    ----------
    location:
        Any name: stores of the same name (in one process) share their entries.
    """

    _spaces: ClassVar[dict[str, _Space]] = {}
    _spaces_guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, location: str) -> None:
        self.location = str(location)
        with MemoryStore._spaces_guard:
            self._space = MemoryStore._spaces.setdefault(self.location, _Space())

    def __repr__(self) -> str:
        return f"MemoryStore({self.location!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (MemoryStore, (self.location,))

    @classmethod
    def forget_all(cls) -> None:
        """Drop the entries of every location (between tests)."""
        with cls._spaces_guard:
            cls._spaces.clear()

    def _under(self, name: str) -> list[str]:
        folder = name + "/"
        return [n for n in self._space.objects if n == name or n.startswith(folder)]

    # -- the Store protocol -------------------------------------------------------------
    def open(self, name: str) -> BinaryIO:
        check_name(name)
        try:
            data, _ = self._space.objects[name]
        except KeyError:
            raise EntryNotFound(name) from None
        return io.BytesIO(data)

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        check_name(name)
        buf = io.BytesIO()
        yield buf
        # published whole when the block ends: a reader sees the old bytes or the new
        with self._space.guard:
            self._space.objects[name] = (buf.getvalue(), time.time())

    def exists(self, name: str) -> bool:
        check_name(name)
        with self._space.guard:
            return bool(self._under(name))

    def delete(self, name: str) -> bool:
        check_name(name)
        with self._space.guard:
            found = self._under(name)
            for n in found:
                del self._space.objects[n]
        return bool(found)

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        if prefix:
            check_name(prefix)
        with self._space.guard:
            items = list(self._space.objects.items())
        for n, (data, used) in items:
            if not prefix or n.startswith(prefix + "/"):
                yield EntryStat(n, len(data), used)

    def touch(self, names: Iterable[str]) -> None:
        now = time.time()
        with self._space.guard:
            for n in names:
                check_name(n)
                if n in self._space.objects:
                    self._space.objects[n] = (self._space.objects[n][0], now)

    # -- Locking: among this process's threads ----------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the lock of ``name`` for the block (yields False after ``timeout`` s)."""
        check_name(name)
        with self._space.guard:
            key_lock = self._space.locks.setdefault(name, threading.Lock())
        got = key_lock.acquire(timeout=max(timeout, 0.0))
        try:
            yield got
        finally:
            if got:
                key_lock.release()
