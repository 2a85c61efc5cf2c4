"""Hits, misses and the compute time the hits saved, per function.

Counting happens in memory on the hot path (a dict update on a hit); the usage
log turns those notes into totals when it flushes (every couple of seconds of
activity, and at exit), and :class:`StatsLog` writes each function's running
totals for this process as one small entry, ``<function folder>/stats/<process>``
(see :mod:`mlcache.memo.layout`). Those entries are ordinary checksummed entries of
plain numbers: ``verify`` checks them; eviction and size limits count results
only; losing one loses statistics only, never a result. :func:`collect` sums them with what the
store lists (entries, bytes, last use).

So that a cache used by thousands of runs does not keep thousands of these,
a process that flushes a function's counts also folds the entries of processes
idle for more than a day into one ``<function folder>/stats/archive`` (once per
process and function, under the store's lock for that name). The archive lists
the names it has folded in, so a fold interrupted after writing the archive and
before removing them counts nothing twice. A process that finds its own entry
folded in goes on with the counts since.

Last use is a file's modification time, updated in batches by :class:`UsageLog`
(a hit only adds a name to a dict; the notes are written at most every
:data:`FLUSH_SECONDS`, before any eviction, and at exit). A lost batch only makes
eviction slightly less exact, never a result wrong.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import multiprocessing.util
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..codecs import codecs
from ..entry import decode, keep_verified, open_entry, read_entry_info, write_entry
from ..errors import EntryCorrupted, EntryNotFound, UnknownFormat
from ..store import LocalFolders, Locking, Store
from .layout import STATS, cached_objects, entry_folder, is_stats
from .tier import OPEN_AT_ONCE, tier

__all__ = ["FLUSH_SECONDS", "FunctionStats", "StatsLog", "UsageLog", "collect", "renew_at_fork"]

logger = logging.getLogger("mlcache")

#: seconds of activity between two flushes of the usage notes
FLUSH_SECONDS = 2.0
_LOGS: weakref.WeakSet[UsageLog] = weakref.WeakSet()
# objects holding locks that a child forked while another thread held them would
# inherit locked: they get fresh locks in the child
_FORK_SENSITIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_at_fork(obj: Any) -> None:
    """Call ``obj._after_fork()`` in every child this process forks (``obj`` is held
    weakly): it renews the locks it holds."""
    _FORK_SENSITIVE.add(obj)


def _renew_locks() -> None:
    for obj in list(_FORK_SENSITIVE):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)

_COUNTS = ("hits", "misses", "saved", "computed", "audits", "mismatches", "audited")
#: the statistics entry that holds the folded-in counts of idle processes
ARCHIVE = "archive"
#: entries of processes idle for longer than this are folded into the archive
FOLD_AFTER_SECONDS = 86400.0
#: ... once there are at least this many of them
FOLD_MIN = 8


@dataclasses.dataclass
class FunctionStats:
    """What one function has in a cache, and what the cache did for it."""

    folder: str  #: its folder in the store
    func: str = ""  #: its identity, e.g. ``"pipeline.features.extract"``
    entries: int = 0  #: cached results
    size: int = 0  #: bytes on disk
    last_used: float = 0.0  #: epoch seconds of the most recent use of any result
    hits: int = 0
    misses: int = 0  #: calls that computed (and stored) a result
    saved: float = 0.0  #: seconds of computing that the hits avoided
    computed: float = 0.0  #: seconds spent computing the misses
    audits: int = 0  #: hits computed again and compared (see :mod:`mlcache.memo.audit`)
    mismatches: int = 0  #: audits that found a different value
    audited: float = 0.0  #: seconds the audits spent computing

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _process_name() -> str:
    host = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:32] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


class StatsLog:
    """This process's running totals per function, written at each flush."""

    def __init__(self, store: Store, *, read_only: bool = False) -> None:
        self._store = store
        #: nothing can be written to the store: the totals stay in this process
        self._read_only = read_only
        self._totals: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._process = _process_name()
        self._written: dict[str, dict[str, Any]] = {}  # what our entry holds, by folder
        self._base: dict[str, dict[str, Any]] = {}  # counts already folded into the archive
        self._folded: set[str] = set()  # folders this process has tidied
        self._names: dict[str, str] = {}  # our entry's name, once one was folded in

    def add(
        self,
        folder: str,
        func: str,
        *,
        hits: int = 0,
        misses: int = 0,
        saved: float = 0.0,
        computed: float = 0.0,
        audits: int = 0,
        mismatches: int = 0,
        audited: float = 0.0,
    ) -> None:
        with self._lock:
            t = self._totals.get(folder)
            if t is None:
                t = self._totals[folder] = dict.fromkeys(_COUNTS, 0) | {"func": func}
            t["func"] = func or t["func"]
            t["hits"] += hits
            t["misses"] += misses
            t["saved"] += saved
            t["computed"] += computed
            t["audits"] += audits
            t["mismatches"] += mismatches
            t["audited"] += audited
            self._dirty.add(folder)

    def forget(self, folder: str | None = None) -> None:
        """Drop this process's totals for ``folder`` (all when None): its results
        were cleared, so its counts start again."""
        with self._lock:
            for known in (self._totals, self._written, self._base, self._names):
                if folder is None:
                    known.clear()
                else:
                    known.pop(folder, None)
            if folder is None:
                self._dirty.clear()
            else:
                self._dirty.discard(folder)

    def flush(self) -> None:
        if self._read_only:
            return
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            totals = {folder: dict(self._totals[folder]) for folder in dirty}
        for folder, value in totals.items():
            name = self._names.get(folder) or f"{folder}/{STATS}/{self._process}"
            try:
                if not self._store.exists(folder):
                    # the function's folder, or the whole cache, was removed (clear(),
                    # rm -rf, a temporary folder cleaned up): statistics are advisory
                    # and never make a folder again (an entry's write does)
                    continue
                if folder in self._written and not self._store.exists(name):
                    # another process folded our entry into the archive, which lists
                    # its name: count on from there, under a new name
                    self._base[folder] = self._written[folder]
                    name = self._names[folder] = f"{name}-{secrets.token_hex(2)}"
                base = self._base.get(folder)
                if base is not None:
                    value = value | {c: value[c] - base[c] for c in _COUNTS}
                value["updated"] = time.time()
                _write_stats(self._store, name, value)
                self._written[folder] = totals[folder]
                if folder not in self._folded:
                    self._folded.add(folder)
                    fold_idle(self._store, folder)
            except Exception:  # statistics are advisory (and this also runs at exit)
                pass

    def _after_fork(self) -> None:
        # the child counts its own calls, under its own name
        self._lock = threading.Lock()
        self._totals, self._dirty = {}, set()
        self._written, self._base, self._folded, self._names = {}, {}, set(), {}
        self._process = _process_name()


class UsageLog:
    """Batches what happens to one store's entries, off the hot path.

    A hit notes the entry's name and its metadata bytes (a dict update); a miss
    notes its compute time. Every ``FLUSH_SECONDS`` of activity, and at exit, the
    notes become last-use times (one ``touch`` of the names) and per-function
    statistics (:class:`StatsLog`). Notes racing with a flush may be lost: both
    are advisory.

    ``local`` is the store when its entries are local files (see
    :class:`mlcache.store.LocalFolders`): the touch then keeps this process's
    marks of verified files.
    """

    def __init__(
        self, store: Store, *, read_only: bool = False, local: LocalFolders | None = None
    ) -> None:
        self._store = store
        self._local = local
        #: nothing can be written to the store: last-use times are not kept
        self._read_only = read_only
        #: whether the cache refuses writes now (the Memory's WriteGate): records
        #: are written only where entries could be
        self.refuses: Callable[[], bool] | None = None
        self._hits: dict[str, tuple[int, bytes]] = {}
        self.stats = StatsLog(store, read_only=read_only)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        _LOGS.add(self)
        renew_at_fork(self)

    def note(self, name: str, info: bytes = b"") -> None:
        """Entry ``name`` was just read; ``info`` is its metadata (JSON bytes)."""
        seen = self._hits.get(name)
        self._hits[name] = (1 if seen is None else seen[0] + 1, info)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush(last=False)

    def miss(self, name: str, func: str, duration: float) -> None:
        """A call of ``func`` computed entry ``name`` in ``duration`` seconds."""
        self.stats.add(entry_folder(name), func, misses=1, computed=duration)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush(last=False)

    def pending(self, name: str) -> tuple[int, bytes] | None:
        """(hits, metadata) noted of entry ``name`` since the last flush, if any."""
        return self._hits.get(name)

    def audited(self, name: str, func: str, seconds: float, *, mismatch: bool = False) -> None:
        """A hit of entry ``name`` was computed again in ``seconds`` and compared."""
        folder = entry_folder(name)
        self.stats.add(folder, func, audits=1, mismatches=int(mismatch), audited=seconds)

    def forget(self, folder: str | None = None) -> None:
        """Drop the pending notes and totals of ``folder`` (all when None): its
        results were cleared, so its statistics start again."""
        with self._lock:
            if folder is None:
                self._hits = {}
            else:
                self._hits = {n: v for n, v in self._hits.items() if entry_folder(n) != folder}
        self.stats.forget(folder)

    def flush(self, *, last: bool = True) -> None:
        """Write the pending notes now: last-use times, then statistics. ``last``
        is false for the flushes a hit or a miss makes on its way: the records
        whose rows only carried a touch over wait for a later one (at exit)."""
        with self._lock:
            hits, self._hits = self._hits, {}
            self._last = time.monotonic()
        if hits and not self._read_only:
            try:
                # the touch sets the entries' mtime: keep this process's marks of
                # verified files (mlcache.entry), or the next mapped hit re-checks
                # and the hit tier's entries, whose rows the next run's records hold
                # (the tier holds each file it carries open over the touch: batches)
                local = self._local
                names = list(hits)
                for at in range(0, len(names), OPEN_AT_ONCE):
                    self._touch(names[at : at + OPEN_AT_ONCE], local)
            except Exception:  # last-use times are advisory: a store's error never fails a hit
                logger.debug("mlcache: recording last use failed", exc_info=True)
        if self._local is not None and not self._read_only:
            try:  # the records of the code folders whose small entries were read
                if self.refuses is None or not self.refuses():
                    tier.save(self._local.local_root, touched=last)
            except Exception:  # a cache of the next run only: never fails a hit
                logger.debug("mlcache: writing the records failed", exc_info=True)
        if hits and not self._read_only:
            for name, (count, info) in list(hits.items()):  # a late note may still land
                func, duration = _func_and_duration(info)
                self.stats.add(entry_folder(name), func, hits=count, saved=count * duration)
        self.stats.flush()

    def _touch(self, names: list[str], local: LocalFolders | None) -> None:
        paths = [local.local_path(n) for n in names] if local is not None else []
        touch = lambda: self._store.touch(names)  # noqa: E731
        keep_verified(paths, lambda: tier.retouch(paths, touch))

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._hits = {}
        self.stats._after_fork()

    def __del__(self) -> None:
        # a Memory dropped before the process ends (a worker's local) keeps its notes
        try:
            self.flush()
        except Exception:  # nothing can be reported from a finalizer
            pass


def _func_and_duration(info: bytes) -> tuple[str, float]:
    try:
        meta = json.loads(info) if info else {}
        return str(meta.get("func", "")), float(meta.get("duration", 0.0))
    except (ValueError, TypeError, AttributeError):
        return "", 0.0


@atexit.register
def _flush_all() -> None:
    for log in list(_LOGS):
        with contextlib.suppress(Exception):  # at exit: never a traceback for a statistic
            log.flush()


def _flush_at_process_exit(_: object = None) -> None:
    # multiprocessing children end with os._exit, which skips atexit; they run
    # multiprocessing's own exit finalizers instead (forked children get a fresh
    # registry, hence the re-registration after each fork)
    multiprocessing.util.Finalize(None, _flush_all, exitpriority=0)


_flush_at_process_exit()
multiprocessing.util.register_after_fork(_flush_all, _flush_at_process_exit)


def _write_stats(store: Store, name: str, value: dict[str, Any]) -> None:
    codec = codecs["npy"]
    with store.write(name) as f:
        write_entry(f, codec.name, codec.encode(value), {"stats": True}, None)


def _read_stats(store: Store, name: str) -> dict[str, Any]:
    value = decode(open_entry(store, name), allow_pickle=False)
    if not isinstance(value, dict):
        raise ValueError(f"{name}: not a statistics entry")
    return value


def fold_idle(store: Store, folder: str, now: float | None = None) -> int:
    """Fold the statistics entries of processes idle for FOLD_AFTER_SECONDS into the
    function's archive; return how many were folded (0 when there were fewer than
    FOLD_MIN, or another process holds the archive's lock)."""
    now = time.time() if now is None else now
    prefix = f"{folder}/{STATS}/"
    archive_name = prefix + ARCHIVE
    present = [e for e in store.list(prefix[:-1]) if is_stats(e.name)]
    idle = [
        e.name for e in present if e.name != archive_name and now - e.last_used > FOLD_AFTER_SECONDS
    ]
    if len(idle) < FOLD_MIN:
        return 0
    # once per process and function: the Protocol check costs nothing here
    lock = store.lock(archive_name, 0) if isinstance(store, Locking) else None
    with lock if lock is not None else contextlib.nullcontext(True) as held:
        if not held:
            return 0
        try:
            archive = _read_stats(store, archive_name)
        except EntryNotFound:
            archive = dict.fromkeys(_COUNTS, 0) | {"merged": []}
        except (EntryCorrupted, UnknownFormat, ValueError):
            return 0  # leave it for `verify --fix` (or a newer mlcache); never count twice
        merged = set(archive.get("merged", []))
        names = {e.name.rpartition("/")[2] for e in present}
        for name in idle:
            short = name.rpartition("/")[2]
            if short in merged:
                continue  # folded before, its removal was interrupted
            try:
                value = _read_stats(store, name)
            except Exception:
                continue
            archive["func"] = archive.get("func") or value.get("func", "")
            for c in _COUNTS:  # an archive of an older mlcache lacks the newer counts
                archive[c] = archive.get(c, 0) + value.get(c, 0)
            merged.add(short)
        archive["merged"] = sorted(merged & names)  # forget what is gone
        _write_stats(store, archive_name, archive)
        for name in idle:
            with contextlib.suppress(OSError, ValueError):
                store.delete(name)
    return len(idle)


def collect(store: Store, folder: str = "") -> dict[str, FunctionStats]:
    """Every function in ``store`` (or only the one in ``folder``), by folder: its
    entries, size and last use (one listing), plus the counts of every process's
    statistics entry."""
    found: dict[str, FunctionStats] = {}
    some_entry: dict[str, list[str]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for e in cached_objects(store, folder):
        folder = entry_folder(e.name)
        st = found.get(folder)
        if st is None:
            st = found[folder] = FunctionStats(folder)
        if is_stats(e.name):
            try:
                stats[e.name] = _read_stats(store, e.name)
            except Exception:  # damaged or removed meanwhile: statistics only
                continue
        else:
            st.entries += 1
            st.size += e.size
            st.last_used = max(st.last_used, e.last_used)
            some_entry.setdefault(folder, []).append(e.name)
    folded = {  # entries an archive already counts (a fold was interrupted)
        f"{name.rpartition('/')[0]}/{short}"
        for name, value in stats.items()
        if name.endswith("/" + ARCHIVE)
        for short in value.get("merged", [])
    }
    for name, value in stats.items():
        if name not in folded:
            st = found[entry_folder(name)]
            st.func = st.func or str(value.get("func", ""))
            st.hits += int(value.get("hits", 0))
            st.misses += int(value.get("misses", 0))
            st.saved += float(value.get("saved", 0.0))
            st.computed += float(value.get("computed", 0.0))
            st.audits += int(value.get("audits", 0))
            st.mismatches += int(value.get("mismatches", 0))
            st.audited += float(value.get("audited", 0.0))
    for folder, st in found.items():
        for name in some_entry.get(folder, [])[:8] if not st.func else []:
            try:  # the first entry that reads names the function
                st.func = str(read_entry_info(store, name).get("func", ""))
            except Exception:
                continue
            if st.func:
                break
        st.func = st.func or folder
    return found
