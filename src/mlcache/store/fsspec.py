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

from .._util import parse_bytes
from ..errors import EntryNotFound, StoreError
from . import EntryStat, check_name

__all__ = ["FsspecStore"]

logger = logging.getLogger("mlcache")
#: object stores publish whole objects; elsewhere, write aside and rename
_OBJECT_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "memory", "r2"}
# other remote file systems (sftp, hdfs...) write aside and rename entries, and
# make leases with fsspec's create mode, which is only as exclusive as they are
_LEASE = ".lease"  # <key>.lease.<n>


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
        #: a local file system: leases use os.link / os.replace
        self._local_fs = bool(protocols & {"file", "local"})
        from ..keys.identity import slug

        if local_cache_dir is None:
            from .local import default_location

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
            with _io(f"cannot read {name}"):
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
            with _io(f"cannot write {name}"):
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
        with _io(f"cannot look for {name}"):
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
            if info.get("type") == "directory" or _LEASE in name.rpartition("/")[2]:
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
            with _io(f"cannot fetch {name}"):
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
        yields False when it could not be had within ``timeout`` seconds.

        Leases are numbered: ``<key>.lease.<n>``, each made by a conditional
        create. Taking over an expired lease ``n`` means creating ``n + 1``, which
        only one waiter can do; a holder renews only its own object, and stops
        when a higher number exists. So two holders never overlap, short of a
        holder that stops beating for longer than ``lease_seconds``.
        """
        base = self._path(name) + _LEASE
        owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        with _io(f"cannot lease {name}"):
            mine = self._acquire(base, owner, timeout)
        if mine is None:
            yield False
            return
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat,
            args=(base, mine, owner, stop),
            daemon=True,
            name="mlcache-lease",
        )
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join()
            with contextlib.suppress(Exception):
                self.fs.rm(mine)

    def _lease_body(self, owner: str) -> bytes:
        return json.dumps({"owner": owner, "expires": time.time() + self.lease_seconds}).encode()

    def _leases(self, base: str) -> tuple[int, ...]:
        """The numbers of the leases of ``base`` that exist, in order."""
        self.fs.invalidate_cache(self.fs._parent(base))
        found = []
        for path in self.fs.glob(base + ".*"):
            with contextlib.suppress(ValueError):
                found.append(int(path.rpartition(".")[2]))
        return tuple(sorted(found))

    def _create(self, path: str, body: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it does."""
        if self._local_fs:
            # a file system: the body is written aside, then linked to the name,
            # which fails if the name exists; a reader never sees it empty
            local = self.fs._strip_protocol(path)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".mlcache-lease-", dir=os.path.dirname(local))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                os.link(tmp, local)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            return True
        try:
            self.fs.pipe_file(path, body, mode="create")  # If-None-Match: *
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if "condition" in str(exc).lower():  # 412 Precondition Failed
                return False
            raise

    def _renew(self, path: str, body: bytes) -> None:
        """Replace the lease ``path`` whole (a reader never sees it half written)."""
        if not self._local_fs:
            self.fs.pipe_file(path, body)  # a PUT replaces an object whole
            return
        local = self.fs._strip_protocol(path)
        fd, tmp = tempfile.mkstemp(prefix=".mlcache-lease-", dir=os.path.dirname(local))
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, local)

    def _acquire(self, base: str, owner: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            numbers = self._leases(base)
            top = numbers[-1] if numbers else 0
            expires = self._lease_expires(f"{base}.{top}") if numbers else 0.0
            if expires is None:
                time.sleep(0.01)  # released while we looked: look again
                continue
            if expires < time.time():
                mine = f"{base}.{top + 1}"
                if self._create(mine, self._lease_body(owner)):
                    # a listing is not a snapshot: it can miss a lease made or
                    # removed while it ran, and then our number is not the highest.
                    # The holder is the highest number: if ours is not, give way.
                    if any(n > top + 1 for n in self._leases(base)):
                        with contextlib.suppress(Exception):
                            self.fs.rm(mine)
                        continue
                    for n in numbers:  # the expired ones
                        with contextlib.suppress(Exception):
                            self.fs.rm(f"{base}.{n}")
                    return mine
                continue  # another waiter took it first: look again
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _lease_expires(self, lease: str) -> float | None:
        """When ``lease`` expires (0 for garbage), or None if it is gone."""
        try:
            data = json.loads(self.fs.cat_file(lease))
        except FileNotFoundError:
            return None  # released meanwhile
        except ValueError:
            return 0.0  # garbage: expired
        if not isinstance(data, dict):
            return 0.0
        try:
            return float(data.get("expires", 0.0))
        except (TypeError, ValueError):
            return 0.0

    def _heartbeat(self, base: str, mine: str, owner: str, stop: threading.Event) -> None:
        number = int(mine.rpartition(".")[2])
        while not stop.wait(self.lease_seconds / 3):
            try:
                if any(n > number for n in self._leases(base)):
                    return  # taken over (we stopped beating too long): stop renewing
                self._renew(mine, self._lease_body(owner))  # our own object only
            except Exception as exc:  # the next beat tries again
                logger.debug("mlcache: lease heartbeat failed: %s", exc)


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
