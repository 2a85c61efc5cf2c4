"""Stores: where entry bytes live. One small protocol, one registry.

A store speaks in *names*: ``/``-separated relative paths such as
``"pkg.mod.f-1a2b3c4d/9f86d081884c7d65/0123...cdef"``. It never interprets
them. Optional powers are their own small protocols, checked once with
``isinstance`` by whoever uses the store (never probed with ``getattr``):

- :class:`LocalPaths`: the store can hand out a local file path for an entry,
  which memory-mapping needs;
- :class:`Locking`: ``lock(name, timeout)``, one computation per key across
  processes;
- :class:`SharedCounters`: ``shared_counter(name)``, a number read and changed
  by one process at a time, which keeps ``bytes_limit`` across processes;
- :class:`ReadOnly`: ``read_only``, the store refuses writes (a cache on a
  read-only mount).

Register a backend with :func:`mlcache.register_store_backend`; it then works
as ``Memory(location, backend="name")``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

from .._registry import Registry
from ..errors import InvalidRegistration, UnknownBackend

__all__ = [
    "EntryStat",
    "LocalPaths",
    "Locking",
    "ReadOnly",
    "SharedCounter",
    "SharedCounters",
    "Store",
    "backend_for",
    "check_name",
    "register_store_backend",
    "stores",
]

# segments never start with "." (so no "..", no hidden files) and never are empty
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe relative entry name, else raise ``ValueError``."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(f"invalid entry name {name!r}")
    return name


@dataclass
class SharedCounter:
    """A number shared by every process using a store (see ``shared_counter``):
    ``value`` and the ``stamp`` (epoch seconds) of when it was last set."""

    value: int
    stamp: float


@dataclass(frozen=True)
class EntryStat:
    """One stored object: its name, size in bytes and last-use time (epoch seconds)."""

    name: str
    size: int
    last_used: float


@runtime_checkable
class Store(Protocol):
    """Where bytes live. Every write is atomic: readers see all of it or nothing."""

    location: str

    def open(self, name: str) -> BinaryIO:
        """Open ``name`` for reading; raise :class:`~mlcache.errors.EntryNotFound`."""
        ...

    def write(self, name: str) -> AbstractContextManager[BinaryIO]:
        """A seekable file whose content replaces ``name`` atomically when the block ends
        without error."""
        ...

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str) -> bool:
        """Remove ``name`` (a file, or everything under a folder name); True if it existed."""
        ...

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        """Every stored object under ``prefix`` (recursively), temporaries excluded."""
        ...

    def touch(self, names: Iterable[str]) -> None:
        """Record that ``names`` were just used (for least-recently-used eviction)."""
        ...


@runtime_checkable
class LocalPaths(Protocol):
    """A store whose objects are local files (so they can be memory-mapped)."""

    def local_path(self, name: str) -> str:
        """A local file holding entry ``name`` (for a remote store, a local copy made
        on first use); raise ``FileNotFoundError`` when there is no such entry."""
        ...


@runtime_checkable
class Locking(Protocol):
    """A store that can hold one lock per entry name across processes."""

    def lock(self, name: str, timeout: float) -> AbstractContextManager[bool]:
        """Hold the lock of ``name`` for the block; the context yields False when it
        could not be had within ``timeout`` seconds (the caller goes on unlocked).
        A dead holder never blocks the name forever."""
        ...


@runtime_checkable
class SharedCounters(Protocol):
    """A store that keeps numbers every process using it reads and changes one at
    a time (the total size behind ``bytes_limit``)."""

    def shared_counter(
        self, name: str, timeout: float = 30.0
    ) -> AbstractContextManager[SharedCounter | None]:
        """Hold counter ``name`` for the block; the context yields None when it could
        not be had within ``timeout`` seconds."""
        ...


@runtime_checkable
class ReadOnly(Protocol):
    """A store that says whether it refuses writes (``read_only`` is True)."""

    read_only: bool


def _check_store(obj: object) -> None:
    if not isinstance(obj, type):
        raise TypeError(f"a store backend must be a class, got {obj!r}")
    missing = [
        m
        for m in ("open", "write", "exists", "delete", "list", "touch")
        if not callable(getattr(obj, m, None))
    ]
    if missing:
        raise TypeError(
            f"{obj.__qualname__} is not a store: it lacks {', '.join(missing)} "
            "(see mlcache.store.Store)"
        )


# a backend's name is only looked up, never written: any one-line str (joblib
# takes any str), so that code registering "GCS" or "my store" keeps working
_BACKEND_NAME = (re.compile(r"[^\x00-\x1f\x7f]{1,128}"), "a non-empty one-line str")
stores: Registry[type] = Registry("store backend", _check_store, UnknownBackend, _BACKEND_NAME)

_LAZY_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def register_store_backend(name: str, backend_class: type | str, *, replace: bool = False) -> None:
    """Make ``backend_class`` usable as ``Memory(location, backend=name)``.

    The class is called as ``backend_class(location, **backend_options)`` and must
    implement :class:`Store`; ``"package.module:Class"`` registers it lazily
    (imported on first use).

    Raises
    ------
    mlcache.errors.InvalidRegistration
        (a ``ValueError`` and a ``TypeError``, as joblib's) when ``name`` is not a
        short lowercase name, ``backend_class`` is not a store class, or ``name``
        is taken by another class and ``replace`` is false. Registering the same
        class again (a module reloaded, a notebook cell run again) replaces it,
        as joblib does.

    Examples
    --------
    >>> from mlcache.store.local import LocalStore
    >>> register_store_backend("mydisk", LocalStore)  # doctest: +SKIP
    """
    if isinstance(backend_class, str) and not _LAZY_TARGET.fullmatch(backend_class):
        raise InvalidRegistration(
            f"cannot register store backend {name!r}: expected a store class or "
            f"'package.module:Class', got {backend_class!r}"
        )
    stores.register(name, backend_class, replace=replace)


stores.register("local", "mlcache.store.local:LocalStore")
stores.register("fsspec", "mlcache.store.fsspec:FsspecStore")


def backend_for(location: str, backend: str) -> str:
    """The backend a location asks for: a URL (``s3://...``) is fsspec's unless a
    backend was named."""
    return "fsspec" if backend == "local" and "://" in location else backend
