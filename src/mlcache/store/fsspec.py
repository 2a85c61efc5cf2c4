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
  map that copy; a second hit on the same machine reads locally. What this
  process writes is kept there too. A damaged copy is fetched again.
* **A clear on one machine reaches the others' local copies.** The location
  holds a small object, ``.mlcache-generation``, written when the store is
  first opened there and by every clear (:meth:`FsspecStore.new_generation`:
  ``Memory.clear()``, a function's ``clear()``, ``mlcache clear <url>``, any
  delete of a function's whole folder). Local copies live in a folder named
  after their generation (``<local_cache_dir>/g-<hash>/``): a process that opens
  the store after a clear, or on a new, empty bucket at the same URL, never
  serves an older copy; a running one reads the object again every
  ``revalidate_after`` seconds (default 30; the stores of one process share
  what they read), so a clear elsewhere stops its copies within that time. A
  hit pays a clock read, never a request. Removing one entry (eviction, a
  damaged or expired entry) starts no new generation: another machine may serve
  its copy of that entry, a value computed for the same key.
* **A server that cannot be reached never breaks a call.** When a request
  fails to reach it (no connection, a wrong endpoint, a timeout), at the first
  contact or later, one warning says so; reads are then misses and writes are
  refused, without a request, so calls compute and return their values
  uncached (local copies are not served: a clear could not be seen). Every
  ``revalidate_after`` seconds a background thread tries again (no call waits
  for it); caching resumes once it answers. The first failed request costs the
  client's retries (botocore's defaults: seconds;
  ``config_kwargs={"retries": {"max_attempts": 1}}`` shortens it). Other
  errors (permissions, a bucket that cannot be created) raise
  :class:`~mlcache.errors.StoreError` naming the URL.
* **One signing key per shared cache.** Every machine must sign with the same
  secret (``MLCACHE_SECRET``, see :mod:`mlcache.entry.signing`). The first
  ``Memory`` that stores a result records its key's id (not the key) in
  ``.mlcache-signer``; a ``Memory`` with another key (or none) then computes
  and returns its results without storing them, with one warning that names
  the fix, instead of overwriting the team's entries (:meth:`FsspecStore.claim_signer`).
  ``Memory.clear()`` forgets the record (how a team changes its key).
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
import copy
import hashlib
import json
import logging
import math
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from .._util import parse_bytes, parse_duration
from ..errors import EntryNotFound, StoreError, warn
from . import EntryStat, check_name
from .cached import LocalCopies, generation_of, is_unreachable
from .leases import LEASE, Leases, new_owner

__all__ = ["GENERATION", "REVALIDATE_AFTER", "SIGNER", "FsspecStore"]

logger = logging.getLogger("mlcache")

#: the object (under the location) whose content names the cache's generation
GENERATION = ".mlcache-generation"
#: the object holding the id of the key the cache's entries are signed with
SIGNER = ".mlcache-signer"
#: default seconds between two looks at the generation (and at an unreachable server)
REVALIDATE_AFTER = 30.0
#: the generation of a cache without a generation object that cannot make one
#: (read-only credentials on a cache made by an older mlcache)
_UNMARKED = "g-unmarked"

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
    revalidate_after:
        Seconds (or ``"30s"``, ``"2m"``) between two looks at the cache's
        generation: a clear on another machine stops this process from serving
        its local copies within this time (default 30). Also how often an
        unreachable server is tried again (in the background).
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
        revalidate_after: float | str = REVALIDATE_AFTER,
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
        try:  # botocore rewrites a config dict given to it: give it a copy
            given = copy.deepcopy(storage_options)
        except Exception:  # a session or another object that cannot be copied
            given = storage_options
        try:
            self.fs, root = fsspec.core.url_to_fs(self.location, **given)
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
        every = parse_duration(revalidate_after)
        assert every is not None
        #: seconds between two looks at the generation (see the module docstring)
        self.revalidate_after: float = every
        #: what this process knows of the location's generation, shared by its
        #: stores of the same location and file system (a Memory unpickled again
        #: within revalidate_after sends no request)
        self._seen = generation_of(self.location, self.fs)
        #: the generation of this store's copies (``g-<hash>``), and their folder
        self._generation: str | None = None
        self._copies_at = ""  # with a final separator
        self._current(first=True)

    def __repr__(self) -> str:
        return f"FsspecStore({self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        options = {
            **self._options,
            "local_cache_dir": self.local_cache_dir,
            "local_cache_limit": self.local_cache_limit,
            "lease_seconds": self.lease_seconds,
            "revalidate_after": self.revalidate_after,
        }
        return (_rebuild, (self.location, options))

    def _path(self, name: str) -> str:
        return f"{self._root}/{check_name(name)}"

    # -- the generation, and a server out of reach -------------------------------------
    @property
    def reachable(self) -> bool:
        """False while the server cannot be reached (reads miss, writes are refused)."""
        return self._seen.unreachable is None

    @property
    def generation(self) -> str | None:
        """The generation last read (its copies' folder), None while unreachable."""
        return self._current()

    def _current(self, *, first: bool = False) -> str | None:
        """The generation, looked at again when ``revalidate_after`` has passed (on
        every hit: one clock read and a compare)."""
        seen = self._seen
        if first or time.monotonic() - seen.looked >= self.revalidate_after:
            if seen.unreachable is None or first:
                self._look(first=first)
            elif seen.start_probe():  # no call waits for a server that is down
                threading.Thread(target=self._probe, daemon=True, name="mlcache-probe").start()
        if seen.unreachable is not None:
            return None
        if seen.generation is not self._generation:  # a new one: its own folder
            generation = seen.generation
            assert generation is not None
            self._copies_at = os.path.join(self.copies.folder, generation, "")
            self._generation = generation
            self._drop_other_generations(generation)
        return self._generation

    def _look(self, *, first: bool = False) -> None:
        """Read the generation object (making it in a new location); a server that
        cannot be reached is said once and tried again later."""
        seen = self._seen
        with seen.lock:
            now = time.monotonic()
            known = seen.generation is not None or seen.unreachable is not None
            if now - seen.looked < self.revalidate_after and (known or not first):
                return  # another thread, or store of this location, just looked
            try:
                generation = self._read_generation()
            except Exception as exc:
                seen.looked = now
                if not is_unreachable(exc):
                    if first:
                        raise StoreError(
                            f"cannot open the cache location {self.location!r}: {exc}"
                        ) from exc
                    # the object cannot be read now: a clear could not be seen
                    logger.debug("mlcache: no generation of %s: %s", self.location, exc)
                self._went_unreachable(exc)
                return
            seen.looked = now
            if seen.unreachable is not None:
                seen.unreachable = None
                logger.warning("mlcache: the shared cache at %s is reachable again", self.location)
            if generation != seen.generation:
                seen.generation = generation

    def _probe(self) -> None:
        try:
            self._look()
        finally:
            self._seen.probing = False

    def _went_unreachable(self, exc: BaseException) -> None:
        seen = self._seen
        if seen.unreachable is None:
            seen.unreachable = f"{type(exc).__name__}: {exc}"
            warn(
                f"mlcache: the shared cache at {self.location} cannot be reached "
                f"({seen.unreachable}); calls compute and return their results "
                f"uncached, and it is tried again every {self.revalidate_after:g} s",
                stacklevel=4,
            )

    def _read_generation(self) -> str:
        path = f"{self._root}/{GENERATION}"
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:  # a new location (or a new bucket at the same URL)
            try:
                self.fs.makedirs(self._root, exist_ok=True)
            except Exception as exc:  # a bucket that cannot be created (permissions)
                if is_unreachable(exc) or not self.fs.exists(self._root):
                    raise
            try:
                self.leases.create(path, _marker())  # made first elsewhere: that one
            except OSError as exc:  # read-only credentials, or mount, on a cache without one
                if is_unreachable(exc):
                    raise
                return _UNMARKED
            data = self.fs.cat_file(path)
        return "g-" + hashlib.sha256(data).hexdigest()[:16]

    def _drop_other_generations(self, current: str) -> None:
        """Remove the local copies of other generations (a process of this machine
        still in an older one fetches what it needs again)."""
        with contextlib.suppress(OSError), os.scandir(self.copies.folder) as found:
            for d in found:
                if (
                    d.name.startswith("g-")
                    and d.name != current
                    and d.is_dir(follow_symlinks=False)
                ):
                    shutil.rmtree(d.path, ignore_errors=True)

    def new_generation(self, *, forget_signer: bool = False) -> None:
        """Start a new generation: every process stops serving its local copies
        (at once for a process that opens the store after this, within
        ``revalidate_after`` seconds for one running). A clear calls it after
        removing what it removes; ``forget_signer`` also forgets which key the
        cache's entries are signed with (``Memory.clear()``)."""
        self._check_reachable(f"cannot clear {self.location}")
        with self._io(f"cannot start a new generation of {self.location}"):
            if forget_signer:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(f"{self._root}/{SIGNER}")
            self.leases.renew(f"{self._root}/{GENERATION}", _marker())
        self._seen.looked = -math.inf  # this process too, at its next use

    def claim_signer(self, key_id: str | None) -> str | None:
        """The id of the key this cache's entries are signed with, recording
        ``key_id`` (a hex str; None: this process does not sign) as that key when
        none is recorded yet; None when no key is recorded."""
        self._check_reachable(f"cannot reach {self.location}")
        path = f"{self._root}/{SIGNER}"
        with self._io(f"cannot read the signing key id of {self.location}"):
            try:
                return self.fs.cat_file(path).decode("ascii", "replace").strip() or None
            except FileNotFoundError:
                pass
            if key_id is None:
                return None
            if self.leases.create(path, key_id.encode()):  # one creator wins
                return key_id
            return self.fs.cat_file(path).decode("ascii", "replace").strip() or None

    def _check_reachable(self, what: str) -> None:
        if self._current() is None and (why := self._seen.unreachable) is not None:
            raise StoreError(f"{what}: the server cannot be reached ({why})")

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """:func:`_io`, and a server that cannot be reached is noted (said once)."""
        try:
            with _io(what):
                yield
        except Exception as exc:
            if is_unreachable(exc):
                self._went_unreachable(exc)
                self._seen.looked = time.monotonic()
            raise

    # -- the Store protocol -------------------------------------------------------------
    def open(self, name: str) -> BinaryIO:
        path = self._path(name)
        if self._current() is None:
            raise EntryNotFound(name)  # the server cannot be reached: a miss
        try:
            with self._io(f"cannot read {name}"):
                return self.fs.open(path, "rb")
        except FileNotFoundError:
            raise EntryNotFound(name) from None
        except StoreError:
            if self._seen.unreachable is not None:
                raise EntryNotFound(name) from None
            raise

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = self._path(name)
        self._check_reachable(f"cannot write {name}")
        generation = self._generation or _UNMARKED
        # written locally first: sent in one PUT, and kept as the local copy after
        with self.copies.replacing(f"{generation}/{name}") as tmp:
            with open(tmp, "w+b") as f:
                yield f
            with self._io(f"cannot write {name}"):
                if self._object_store:
                    self.fs.put_file(tmp, path)  # one PUT: whole or nothing
                else:
                    aside = f"{path}.tmp-{secrets.token_hex(6)}"
                    self.fs.makedirs(self.fs._parent(path), exist_ok=True)
                    self.fs.put_file(tmp, aside)
                    self.fs.mv(aside, path)

    def exists(self, name: str) -> bool:
        path = self._path(name)
        if self._current() is None:
            return False  # the server cannot be reached: a miss
        try:
            with self._io(f"cannot look for {name}"):
                return bool(self.fs.exists(path))
        except StoreError:
            if self._seen.unreachable is not None:
                return False
            raise

    def delete(self, name: str) -> bool:
        """Remove ``name``; removing a function's whole folder (a name without
        ``/``: what a clear removes) starts a new generation (:meth:`new_generation`)."""
        path = self._path(name)
        self._check_reachable(f"cannot remove {name}")
        self.copies.forget(f"{self._generation or _UNMARKED}/{name}")
        try:
            with self._io(f"cannot remove {name}"):
                if not self.fs.exists(path):
                    return False
                self.fs.rm(path, recursive=self.fs.isdir(path))
                self.fs.invalidate_cache(path)
        except FileNotFoundError:
            return False
        if "/" not in name:
            self.new_generation()
        return True

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        base = self._path(prefix) if prefix else self._root
        self._check_reachable(f"cannot list {self.location}")
        try:
            with self._io(f"cannot list {self.location}"):
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
        check_name(name)  # so the name cannot leave the copies' folder
        seen = self._seen
        looks = (
            time.monotonic() - seen.looked >= self.revalidate_after
            or seen.unreachable is not None
            or seen.generation is not self._generation
        )
        if looks and self._current() is None:
            raise FileNotFoundError(name)  # the server cannot be reached: a miss
        local = self._copies_at + name
        try:  # a hit: one clock read above, one utime (its last use, for the copies' LRU)
            os.utime(local)
            return local
        except FileNotFoundError:
            pass

        def fill(tmp: str) -> None:
            try:
                with self._io(f"cannot fetch {name}"):
                    self.fs.get_file(self._path(name), tmp)
            except FileNotFoundError:
                raise FileNotFoundError(name) from None
            except StoreError:
                if self._seen.unreachable is not None:
                    raise FileNotFoundError(name) from None
                raise

        return self.copies.get(f"{self._generation}/{name}", fill)

    def forget_local(self, name: str) -> None:
        """Drop the local copy of ``name`` (a damaged copy is fetched again)."""
        self.copies.forget(f"{self._generation or _UNMARKED}/{check_name(name)}")

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
        self._check_reachable(f"cannot lease {name}")
        with self._io(f"cannot lease {name}"):
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


def _marker() -> bytes:
    """A new generation object's content (its hash names the generation)."""
    return json.dumps({"generation": secrets.token_hex(16), "written": time.time()}).encode()


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
