"""A store on any fsspec URL (``s3://bucket/prefix``, ``gs://``, ``memory://``,
``file://``): a cache shared by a team or a cluster.

How it keeps the promises of a store on an object store:

* **Atomic writes.** An entry is written to a local temporary file, then sent
  with one PUT (object stores publish an object whole or not at all); on a file
  system it is sent to a temporary name and renamed. Each entry is one object
  and carries its own checksums (and signature), so a reader never trusts a
  partial one; there is nothing else to publish.
* **Memory maps need local files** (:class:`~mlcache.store.LocalPaths`; not
  :class:`~mlcache.store.LocalFolders`: a folder has no copy).
  :meth:`FsspecStore.local_path` copies an entry once (one GET) into a local
  read-through cache (``local_cache_dir``, with its own size limit, least
  recently used first: :class:`~mlcache.store.cached.LocalCopies`), and reads
  map that copy; a second hit on the same machine reads locally. What this process writes is
  kept there too. Entry names are keys of results, so a local copy never goes
  stale; a damaged copy is fetched again.
* **One computation per key across machines.** :meth:`FsspecStore.lock` is a
  numbered lease (:mod:`mlcache.store.leases`): a small object created with a
  conditional write, renewed by a heartbeat while the key is computed and
  removed after; a lease whose holder died expires and is taken over.
* **Last use** on an object store is the time an entry was written (objects
  cannot be touched cheaply): ``bytes_limit`` and ``reduce_size`` remove the
  least recently *written* first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from .._util import parse_bytes
from ..errors import EntryNotFound, StoreError
from . import EntryStat, check_name
from .cached import LocalCopies
from .leases import LEASE, Leases, new_owner

__all__ = ["FsspecStore"]

#: object stores publish whole objects; elsewhere, write aside and rename
_OBJECT_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "memory", "r2"}
# other remote file systems (sftp, hdfs...) write aside and rename entries, and
# make leases with fsspec's create mode, which is only as exclusive as they are


class FsspecStore:
    """Entries as objects under an fsspec URL.

    Parameters
    ----------
    location:
        The URL, e.g. ``"s3://bucket/team-cache"``.
    local_cache_dir:
        Where entries are copied to be memory-mapped (default: the user cache
        folder, ``<mlcache cache>/remote/<slug of the URL>``).
    local_cache_limit:
        Size limit of that local copy (default ``"20GB"``); least recently used
        copies go first.
    lease_seconds:
        How long a lease on a key lasts without its holder's heartbeat.
    **storage_options:
        Passed to fsspec (``key=``, ``secret=``, ``client_kwargs={"endpoint_url":
        ...}``, ``anon=``...).
    """

    def __init__(
        self,
        location: str,
        *,
        local_cache_dir: str | os.PathLike[str] | None = None,
        local_cache_limit: int | str = "20GB",
        lease_seconds: float = 60.0,
        **storage_options: Any,
    ) -> None:
        try:
            import fsspec
        except ImportError:
            raise StoreError(
                f"the cache location {location!r} needs fsspec: pip install 'mlcache[s3]'"
            ) from None
        self.location = str(location).rstrip("/")
        self._options = dict(storage_options)
        try:
            self.fs, root = fsspec.core.url_to_fs(self.location, **storage_options)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"cannot open the cache location {location!r}: {exc}") from exc
        self._root = root.rstrip("/")
        protocol = self.fs.protocol
        protocols = set([protocol] if isinstance(protocol, str) else protocol)
        self._object_store = bool(protocols & _OBJECT_PROTOCOLS)
        if local_cache_dir is None:
            from .._util import slug
            from .local import default_location

            local_cache_dir = os.path.join(default_location(), "remote", slug(self.location))
        limit = parse_bytes(local_cache_limit)
        if limit is None:
            raise StoreError("local_cache_limit must be a size, like 20GB")
        #: the local read-through copies of entries (for memory maps)
        self.copies = LocalCopies(local_cache_dir, limit)
        self.local_cache_dir = self.copies.folder
        self.local_cache_limit: int = limit
        #: the numbered leases of keys (a local file system: made with os.link)
        self.leases = Leases(
            self.fs, seconds=lease_seconds, local=bool(protocols & {"file", "local"})
        )
        try:
            self.fs.makedirs(self._root, exist_ok=True)
        except Exception as exc:  # a bucket that cannot be created (permissions)
            if not self.fs.exists(self._root):
                raise StoreError(f"cannot create the cache location {location!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FsspecStore({self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        options = {
            **self._options,
            "local_cache_dir": self.local_cache_dir,
            "local_cache_limit": self.local_cache_limit,
            "lease_seconds": self.lease_seconds,
        }
        return (_rebuild, (self.location, options))

    def _path(self, name: str) -> str:
        return f"{self._root}/{check_name(name)}"

    # -- the Store protocol -------------------------------------------------------------
    def open(self, name: str) -> BinaryIO:
        try:
            with _io(f"cannot read {name}"):
                return self.fs.open(self._path(name), "rb")
        except FileNotFoundError:
            raise EntryNotFound(name) from None

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = self._path(name)
        # written locally first: sent in one PUT, and kept as the local copy after
        with self.copies.replacing(name) as tmp:
            with open(tmp, "w+b") as f:
                yield f
            with _io(f"cannot write {name}"):
                if self._object_store:
                    self.fs.put_file(tmp, path)  # one PUT: whole or nothing
                else:
                    aside = f"{path}.tmp-{secrets.token_hex(6)}"
                    self.fs.makedirs(self.fs._parent(path), exist_ok=True)
                    self.fs.put_file(tmp, aside)
                    self.fs.mv(aside, path)

    def exists(self, name: str) -> bool:
        with _io(f"cannot look for {name}"):
            return bool(self.fs.exists(self._path(name)))

    def delete(self, name: str) -> bool:
        path = self._path(name)
        self.copies.forget(name)
        try:
            with _io(f"cannot remove {name}"):
                if not self.fs.exists(path):
                    return False
                self.fs.rm(path, recursive=self.fs.isdir(path))
                self.fs.invalidate_cache(path)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        base = self._path(prefix) if prefix else self._root
        try:
            with _io(f"cannot list {self.location}"):
                self.fs.invalidate_cache(base)  # other machines write too
                found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return
        start = len(self._root) + 1
        for path, info in found.items():
            name = path[start:] if path.startswith(self._root + "/") else path
            if info.get("type") == "directory" or LEASE in name.rpartition("/")[2]:
                continue
            try:
                check_name(name)
            except ValueError:
                continue  # temporaries, hidden objects
            yield EntryStat(name, int(info.get("size") or 0), _modified(info))

    def touch(self, names: Iterable[str]) -> None:
        # an object cannot be touched without rewriting it: last use is the last write
        for name in names:
            check_name(name)

    # -- LocalPaths: the local read-through copy ------------------------------------------
    def local_path(self, name: str) -> str:
        """A local file holding entry ``name`` (copied in on first use, in one GET),
        for reading and mapping. Raises ``FileNotFoundError`` if the entry does not
        exist."""
        check_name(name)

        def fill(tmp: str) -> None:
            try:
                with _io(f"cannot fetch {name}"):
                    self.fs.get_file(self._path(name), tmp)
            except FileNotFoundError:
                raise FileNotFoundError(name) from None

        return self.copies.get(name, fill)

    def forget_local(self, name: str) -> None:
        """Drop the local copy of ``name`` (a damaged copy is fetched again)."""
        self.copies.forget(check_name(name))

    def trim_local(self) -> int:
        """Remove least recently used local copies down to 90% of the local limit;
        return the bytes removed."""
        return self.copies.trim()

    # -- Locking: leases ----------------------------------------------------------------------
    @property
    def lease_seconds(self) -> float:
        """How long a lease on a key lasts without its holder's heartbeat."""
        return self.leases.seconds

    @lease_seconds.setter
    def lease_seconds(self, seconds: float) -> None:
        self.leases.seconds = float(seconds)

    def lease_path(self, name: str) -> str:
        """The path the leases of key ``name`` are numbered after (``<path>.<n>``)."""
        return self._path(name) + LEASE

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the lease of key ``name`` for the block (see
        :mod:`mlcache.store.leases`); yields False when it could not be had within
        ``timeout`` seconds."""
        base = self.lease_path(name)
        owner = new_owner()
        with _io(f"cannot lease {name}"):
            mine = self.leases.acquire(base, owner, timeout)
        if mine is None:
            yield False
            return
        with self.leases.keep(base, mine, owner):
            yield True


@contextlib.contextmanager
def _io(what: str) -> Iterator[None]:
    """Let OSErrors (and EntryNotFound) through; turn a client library's own
    exceptions (botocore's, aiohttp's, a closed event loop at exit) into a
    StoreError, so that callers handle every store failure as an OSError."""
    try:
        yield
    except (OSError, EntryNotFound, ValueError):  # ValueError: a name check_name refused
        raise
    except Exception as exc:
        raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _modified(info: dict[str, Any]) -> float:
    for key in ("LastModified", "mtime", "created", "last_modified"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
    return time.time()


def _rebuild(location: str, options: dict[str, Any]) -> FsspecStore:
    return FsspecStore(location, **options)
