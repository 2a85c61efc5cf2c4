"""Stores: where entry bytes live. One small protocol, one registry.

A store speaks in *names*: ``/``-separated relative paths such as
``"pkg.mod.f-1a2b3c4d/9f86d081884c7d65/0123...cdef"``. It never interprets
them. Optional powers are their own small protocols, checked once with
``isinstance`` by whoever uses the store (never probed with ``getattr``):

- :class:`LocalPaths`: the store can hand out a local file path for an entry,
  which memory-mapping needs (a remote store copies the entry on first use:
  :mod:`mlcache.store.cached`);
- :class:`LocalFolders`: its entries *are* the files under a local folder, so a
  folder's path joined with an entry's base name is that entry's path (no copy);
- :class:`Locking`: ``lock(name, timeout)``, one computation per key across
  processes;
- :class:`SharedCounters`: ``shared_counter(name)``, a number read and changed
  by one process at a time, which keeps ``bytes_limit`` across processes;
- :class:`ReadOnly`: ``read_only``, the store refuses writes (a cache on a
  read-only mount);
- :class:`Shared`: other machines use the store at the same time (an object
  store): a clear starts a new generation that stops every machine from
  serving its local copies, the key that signs its entries is recorded, and a
  server out of reach is said, not raised (:mod:`mlcache.store.fsspec`).

Register a backend with :func:`mlcache.register_store_backend`; it then works
as ``Memory(location, backend="name")``; a URL scheme can name it too
(:func:`register_url_scheme`). :class:`mlcache.testing.stores.StoreTests` is the
conformance suite a backend's tests subclass. A backend written for joblib (a
``StoreBackendBase`` subclass) registers as it is: an adapter (:data:`adapters`,
:mod:`mlcache.store.joblib_adapter`) makes it a store.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

from .._registry import Registry
from ..errors import InvalidRegistration, UnknownBackend

__all__ = [
    "EntryStat",
    "LocalFolders",
    "LocalPaths",
    "Locking",
    "ReadOnly",
    "Scheme",
    "Shared",
    "SharedCounter",
    "SharedCounters",
    "Store",
    "adapters",
    "backend_for",
    "check_name",
    "register_store_backend",
    "register_url_scheme",
    "schemes",
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
class LocalFolders(LocalPaths, Protocol):
    """A store whose entries are the files under the local folder ``local_root``:
    ``local_path`` is a path, never a copy, for a folder name as for an entry, so
    a caller may join a folder's path with entry base names (the function cache's
    hit path does). A remote store's local copies are :class:`LocalPaths` only."""

    local_root: str


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


@runtime_checkable
class Shared(Protocol):
    """A store other machines use at the same time, whose machines keep local
    copies of its entries (:class:`~mlcache.store.fsspec.FsspecStore`)."""

    @property
    def reachable(self) -> bool:
        """False while its server cannot be reached (reads are then misses and
        writes are refused, without a request; it is tried again now and then)."""
        ...

    def new_generation(self, *, forget_signer: bool = False) -> None:
        """After a clear: every machine stops serving its local copies (see
        :mod:`mlcache.store.fsspec`); ``forget_signer`` forgets the recorded key."""
        ...

    def claim_signer(self, key_id: str | None) -> str | None:
        """The id of the key the store's entries are signed with, recording
        ``key_id`` when none is recorded; None when none is."""
        ...


# joblib's wording starts each refusal: code written for joblib may match on it
_NOT_A_STORE = "Store backend should inherit StoreBackendBase (joblib's) or implement"


def _check_store(obj: object) -> None:
    if not isinstance(obj, type):
        raise TypeError(f"{_NOT_A_STORE} mlcache.store.Store, {obj!r} given (not a class)")
    missing = [
        m
        for m in ("open", "write", "exists", "delete", "list", "touch")
        if not callable(getattr(obj, m, None))
    ]
    if missing:
        raise TypeError(
            f"{_NOT_A_STORE} mlcache.store.Store, {obj.__qualname__} given: "
            f"it lacks {', '.join(missing)}"
        )


# a backend's name is only looked up, never written: any one-line str (joblib
# takes any str), so that code registering "GCS" or "my store" keeps working
_BACKEND_NAME = (re.compile(r"[^\x00-\x1f\x7f]{1,128}"), "a non-empty one-line str")
stores: Registry[type] = Registry("store backend", _check_store, UnknownBackend, _BACKEND_NAME)

_LAZY_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _check_adapter(obj: object) -> None:
    if not callable(obj):
        raise TypeError(
            f"a store adapter is a function (class -> store class or None), got {obj!r}"
        )


#: what makes another library's store backend class a :class:`Store` class: name ->
#: a function given the class registered, which returns a store class for it, or
#: None when the class is not that library's (tried in order, only for a class that
#: is not a store itself)
adapters: Registry[Callable[[type], type | None]] = Registry("store adapter", _check_adapter)
adapters.register("joblib", "mlcache.store.joblib_adapter:adapt")


def _adapted(backend_class: object) -> object:
    """``backend_class`` as a store class: itself, or what an adapter makes of it."""
    if not isinstance(backend_class, type):
        return backend_class
    try:
        _check_store(backend_class)
    except TypeError:
        for name in adapters:
            store_class = adapters[name](backend_class)
            if store_class is not None:
                return store_class
    return backend_class


def register_store_backend(name: str, backend_class: type | str, *, replace: bool = False) -> None:
    """Make ``backend_class`` usable as ``Memory(location, backend=name)``.

    The class is called as ``backend_class(location, **backend_options)`` and must
    implement :class:`Store`; ``"package.module:Class"`` registers it lazily
    (imported on first use). A joblib backend class (a subclass of joblib's
    ``StoreBackendBase``) is registered through its adapter
    (:mod:`mlcache.store.joblib_adapter`): code that registers its backend with
    joblib works with mlcache unchanged.

    Raises
    ------
    mlcache.errors.InvalidRegistration
        (a ``ValueError`` and a ``TypeError``, as joblib's, in joblib's words)
        when ``name`` is not a one-line str, ``backend_class`` is not a store class, or ``name``
        is taken by another class and ``replace`` is false. Registering the same
        class again (a module reloaded, a notebook cell run again) replaces it,
        as joblib does.

    Examples
    --------
    A backend is a class with the six methods of :class:`Store` (and any optional
    power it has: :class:`LocalPaths`, :class:`Locking`, ...);
    :class:`~mlcache.store.memory.MemoryStore` is a complete small one. Its tests
    subclass the conformance suite, then it is registered::

        # test_mystore.py
        from mlcache.testing.stores import StoreTests

        class TestMyStore(StoreTests):
            def make_store(self, tmp_path):
                return MyStore(str(tmp_path / "cache"))

        # mypackage/__init__.py
        register_store_backend("mystore", "mypackage.store:MyStore")  # lazy
        Memory("team-space", backend="mystore", backend_options={...})

    >>> from mlcache.store.local import LocalStore
    >>> register_store_backend("mydisk", LocalStore)  # doctest: +SKIP
    """
    if not isinstance(name, str):  # joblib's wording
        raise InvalidRegistration(f"Store backend name should be a string, {name!r} given")
    if isinstance(backend_class, str) and not _LAZY_TARGET.fullmatch(backend_class):
        raise InvalidRegistration(
            f"cannot register store backend {name!r}: expected a store class or "
            f"'package.module:Class', got {backend_class!r}"
        )
    stores.register(name, _adapted(backend_class), replace=replace)  # type: ignore[arg-type]


stores.register("local", "mlcache.store.local:LocalStore")
stores.register("fsspec", "mlcache.store.fsspec:FsspecStore")
stores.register("memory", "mlcache.store.memory:MemoryStore")


@dataclass(frozen=True)
class Scheme:
    """What serves the URLs of one scheme: the name of a store backend."""

    backend: str

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise TypeError(f"a scheme's backend must be a backend name, got {self.backend!r}")


def _check_scheme(obj: object) -> None:
    if not isinstance(obj, Scheme):
        raise TypeError(f"a URL scheme maps to a Scheme(backend=...), got {obj!r}")


#: URL scheme (``"s3"`` of ``s3://bucket/cache``) -> the backend that serves it; a
#: scheme not listed here is fsspec's, which knows many more
schemes: Registry[Scheme] = Registry("URL scheme", _check_scheme, UnknownBackend)
#: the backend of a URL whose scheme is not registered
DEFAULT_URL_BACKEND = "fsspec"
for _scheme in ("file", "memory", "s3", "s3a", "gs", "gcs", "abfs", "az", "r2", "sftp", "hdfs"):
    schemes.register(_scheme, Scheme("fsspec"))


def register_url_scheme(scheme: str, backend: str, *, replace: bool = False) -> None:
    """Send URLs ``<scheme>://...`` to the store backend ``backend`` (a name given
    to :func:`register_store_backend`), so that ``Memory("<scheme>://...")``
    needs no ``backend=``.

    >>> register_url_scheme("mystore", "mydisk")  # doctest: +SKIP
    """
    schemes.register(scheme, Scheme(backend), replace=replace)


def backend_for(location: str, backend: str) -> str:
    """The backend a location asks for: a URL (``s3://...``) is its scheme's
    (:data:`schemes`; fsspec's when the scheme is not registered) unless a
    backend was named."""
    if backend != "local" or "://" not in location:
        return backend
    scheme = location.partition("://")[0].lower()
    return schemes[scheme].backend if scheme in schemes else DEFAULT_URL_BACKEND
