"""A store on any fsspec URL (``s3://bucket/prefix``, ``gs://``, ``memory://``,
``file://``): a cache shared by a team or a cluster.

How it keeps the promises of a store on an object store:

* **Atomic writes.** An entry is written to a local temporary file, then sent
  with one PUT (object stores publish an object whole or not at all); on a file
  system it is sent to a temporary name and renamed. Each entry is one object
  and carries its own checksums (and signature), so a reader never trusts a
  partial one; there is nothing else to publish.
* **Memory maps need local files.** :meth:`FsspecStore.fetch` copies an entry
  once into a local read-through cache (``local_cache_dir``, with its own size
  limit, least recently used first), and reads map that copy; a second hit on
  the same machine reads locally. What this process writes is kept there too.
  Entry names are keys of results, so a local copy never goes stale; a damaged
  copy is fetched again.
* **One computation per key across machines.** :meth:`FsspecStore.lock` is a
  lease: a small object created with a conditional write (``If-None-Match``,
  fsspec's ``mode="create"``), holding its owner and expiry, renewed by a
  heartbeat while the key is computed and removed after. Waiters poll with
  backoff and load the result; a lease whose holder died expires and is taken
  over.
* **Last use** on an object store is the time an entry was written (objects
  cannot be touched cheaply): ``bytes_limit`` and ``reduce_size`` remove the
  least recently *written* first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from ..config import parse_bytes
from ..errors import EntryNotFound, StoreError
from . import EntryStat, check_name

__all__ = ["FsspecStore"]

logger = logging.getLogger("mlcache")
#: object stores publish whole objects; elsewhere, write aside and rename
_OBJECT_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "memory", "r2"}
_LEASE = ".lease"


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
        self._object_store = bool(
            set([protocol] if isinstance(protocol, str) else protocol) & _OBJECT_PROTOCOLS
        )
        from ..fingerprint import slug

        if local_cache_dir is None:
            from .._default import default_location

            local_cache_dir = os.path.join(default_location(), "remote", slug(self.location))
        self.local_cache_dir = os.path.abspath(os.fspath(local_cache_dir))
        os.makedirs(self.local_cache_dir, mode=0o700, exist_ok=True)
        limit = parse_bytes(local_cache_limit)
        if limit is None:
            raise StoreError("local_cache_limit must be a size, like 20GB")
        self.local_cache_limit: int = limit
        self.lease_seconds = float(lease_seconds)
        self._fetched = 0  # bytes copied in since the local cache was last trimmed
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
            return self.fs.open(self._path(name), "rb")
        except FileNotFoundError:
            raise EntryNotFound(name) from None

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = self._path(name)
        local = self._local(name)
        os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".mlcache-", dir=os.path.dirname(local))
        try:
            with os.fdopen(fd, "w+b") as f:
                yield f
            if self._object_store:
                self.fs.put_file(tmp, path)  # one PUT: whole or nothing
            else:
                aside = f"{path}.tmp-{secrets.token_hex(6)}"
                self.fs.makedirs(self.fs._parent(path), exist_ok=True)
                self.fs.put_file(tmp, aside)
                self.fs.mv(aside, path)
            os.replace(tmp, local)  # what we wrote is the local copy too
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._path(name)))

    def delete(self, name: str) -> bool:
        path = self._path(name)
        local = self._local(name)
        if os.path.isdir(local):
            import shutil

            shutil.rmtree(local, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
        try:
            if not self.fs.exists(path):
                return False
            self.fs.rm(path, recursive=self.fs.isdir(path))
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        base = self._path(prefix) if prefix else self._root
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return
        start = len(self._root) + 1
        for path, info in found.items():
            name = path[start:] if path.startswith(self._root + "/") else path
            if info.get("type") == "directory" or name.endswith(_LEASE):
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

    # -- the local read-through copy ----------------------------------------------------
    def _local(self, name: str) -> str:
        return os.path.join(self.local_cache_dir, check_name(name))

    def fetch(self, name: str) -> str:
        """A local file holding entry ``name`` (copied in on first use), for reading
        and mapping. Raises ``FileNotFoundError`` if the entry does not exist."""
        local = self._local(name)
        try:
            os.utime(local)  # last use, for the local cache's own LRU
            return local
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".mlcache-", dir=os.path.dirname(local))
        os.close(fd)
        try:
            self.fs.get_file(self._path(name), tmp)
            size = os.path.getsize(tmp)
            os.replace(tmp, local)
        except FileNotFoundError:
            raise FileNotFoundError(name) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._fetched += size
        if self._fetched > self.local_cache_limit // 10:
            self._fetched = 0
            self.trim_local()
        return local

    def forget_local(self, name: str) -> None:
        """Drop the local copy of ``name`` (a damaged copy is fetched again)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._local(name))

    def trim_local(self) -> int:
        """Remove least recently used local copies down to 90% of the local limit;
        return the bytes removed."""
        files = []
        for folder, _, names in os.walk(self.local_cache_dir):
            for n in names:
                if n.startswith("."):
                    continue
                path = os.path.join(folder, n)
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(path)
                    files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        removed = 0
        if total <= self.local_cache_limit:
            return 0
        for _, size, path in sorted(files):
            if total - removed <= int(self.local_cache_limit * 0.9):
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += size
        return removed

    # -- leases ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the lease of key ``name`` for the block (see the module docstring);
        yields False when it could not be had within ``timeout`` seconds."""
        lease = self._path(name) + _LEASE
        owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        held = self._acquire(lease, owner, timeout)
        if not held:
            yield False
            return
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(lease, owner, stop), daemon=True, name="mlcache-lease"
        )
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join()
            with contextlib.suppress(Exception):
                if self._lease_owner(lease) == owner:
                    self.fs.rm(lease)

    def _lease_body(self, owner: str) -> bytes:
        return json.dumps({"owner": owner, "expires": time.time() + self.lease_seconds}).encode()

    def _acquire(self, lease: str, owner: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                self.fs.pipe_file(lease, self._lease_body(owner), mode="create")
                return True
            except (FileExistsError, OSError):
                pass  # someone holds it (or held it and died)
            with contextlib.suppress(Exception):
                if self._lease_expires(lease) < time.time():
                    self.fs.rm(lease)  # its holder stopped renewing it: take it over
                    continue
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _lease_info(self, lease: str) -> dict[str, Any]:
        try:
            data = json.loads(self.fs.cat_file(lease))
        except FileNotFoundError:
            return {}
        except ValueError:  # half written by an old server, or garbage: expired
            return {"expires": 0}
        return data if isinstance(data, dict) else {"expires": 0}

    def _lease_expires(self, lease: str) -> float:
        info = self._lease_info(lease)
        return float(info.get("expires", float("inf"))) if info else float("inf")

    def _lease_owner(self, lease: str) -> str | None:
        return self._lease_info(lease).get("owner")

    def _heartbeat(self, lease: str, owner: str, stop: threading.Event) -> None:
        while not stop.wait(self.lease_seconds / 3):
            try:
                if self._lease_owner(lease) != owner:
                    return  # taken over: our computation goes on, unlocked
                self.fs.pipe_file(lease, self._lease_body(owner))
            except Exception as exc:  # the next beat tries again
                logger.debug("mlcache: lease heartbeat failed: %s", exc)


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
