"""Size limits: least-recently-used eviction and the off-hot-path record of use.

Last use is a file's modification time, updated in batches by
:class:`UsageLog` (a hit only adds a name to a set; the set is written at most
every :data:`FLUSH_SECONDS`, before any eviction, and at exit). A lost batch
only makes eviction slightly less exact, never a result wrong.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing.util
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from ..entry import keep_verified
from ..errors import warn
from ..store import EntryStat, SharedCounter, Store
from .layout import entries as result_entries
from .layout import entry_folder

__all__ = ["FLUSH_SECONDS", "SizeGuard", "UsageLog", "enforce_limits", "plan_eviction"]

FLUSH_SECONDS = 2.0
#: a store's size is re-read at least this often while writing (other processes write too)
RESCAN_SECONDS = 10.0
#: eviction goes down to this fraction of the limit, so that the next writes do not
#: each pay for a scan of the whole store
LOW_WATER = 0.9
_LOGS: weakref.WeakSet[UsageLog] = weakref.WeakSet()
# objects holding locks that a child forked while another thread held them would
# inherit locked: they get fresh locks in the child
_FORK_SENSITIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _renew_locks() -> None:
    for obj in list(_FORK_SENSITIVE):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)


class UsageLog:
    """Batches what happens to one store's entries, off the hot path.

    A hit notes the entry's name and its metadata bytes (a dict update); a miss
    notes its compute time. Every ``FLUSH_SECONDS`` of activity, and at exit, the
    notes become last-use times (one ``touch`` of the names) and per-function
    statistics (:class:`mlcache.memo.usage.StatsLog`). Notes racing with a flush may
    be lost: both are advisory.
    """

    def __init__(self, store: Store, *, read_only: bool = False) -> None:
        from .usage import StatsLog

        self._store = store
        #: nothing can be written to the store: last-use times are not kept
        self._read_only = read_only
        self._hits: dict[str, tuple[int, bytes]] = {}
        self.stats = StatsLog(store, read_only=read_only)
        self._last = time.monotonic()
        self._lock = threading.Lock()
        _LOGS.add(self)
        _FORK_SENSITIVE.add(self)

    def note(self, name: str, info: bytes = b"") -> None:
        """Entry ``name`` was just read; ``info`` is its metadata (JSON bytes)."""
        seen = self._hits.get(name)
        self._hits[name] = (1 if seen is None else seen[0] + 1, info)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush()

    def miss(self, name: str, func: str, duration: float) -> None:
        """A call of ``func`` computed entry ``name`` in ``duration`` seconds."""
        self.stats.add(entry_folder(name), func, misses=1, computed=duration)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush()

    def forget(self, folder: str | None = None) -> None:
        """Drop the pending notes and totals of ``folder`` (all when None): its
        results were cleared, so its statistics start again."""
        with self._lock:
            if folder is None:
                self._hits = {}
            else:
                self._hits = {n: v for n, v in self._hits.items() if entry_folder(n) != folder}
        self.stats.forget(folder)

    def flush(self) -> None:
        with self._lock:
            hits, self._hits = self._hits, {}
            self._last = time.monotonic()
        if hits and not self._read_only:
            try:
                # the touch sets the entries' mtime: keep this process's marks of
                # verified files (mlcache.entry), or the next mapped hit re-checks
                local = getattr(self._store, "local_path", None)
                paths = [local(n) for n in hits] if local is not None else []
                keep_verified(paths, lambda: self._store.touch(list(hits)))
            except (OSError, ValueError):
                pass  # last-use times are advisory
            for name, (count, info) in list(hits.items()):  # a late note may still land
                func, duration = _func_and_duration(info)
                self.stats.add(entry_folder(name), func, hits=count, saved=count * duration)
        self.stats.flush()

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


class SizeGuard:
    """Keeps a store under ``bytes_limit`` as entries are written.

    Room is made *before* an entry is written (:meth:`reserve`), so the cache
    never holds more than the limit while entries are being added, whatever the
    number of writers.

    Scanning the store costs O(entries) (about 12 ms per thousand here), so it is
    not done at every write: each write adds its size to the total of the last
    scan, and the store is scanned and least-recently-used entries evicted (down
    to ``LOW_WATER`` of the limit) only when that total would pass the limit or
    the last scan is older than ``RESCAN_SECONDS``. Where the store shares a
    counter between processes (``shared_counter``: the local store), the total is
    that counter, changed by one writer at a time, so that concurrent writers
    from many processes keep within the limit together; elsewhere each process
    keeps its own total and sees the others' writes at its next scan.
    """

    #: seconds a write waits for the shared total before keeping the limit alone
    counter_timeout = 30.0

    def __init__(self, store: Store, bytes_limit: int, usage: UsageLog) -> None:
        self._store = store
        self.bytes_limit = bytes_limit
        self._usage = usage
        self._shared = getattr(store, "shared_counter", None)
        self._lock = threading.Lock()
        self._own = SharedCounter(0, 0.0)  # the total of a store that cannot share one
        self._stuck_warned = False
        _FORK_SENSITIVE.add(self)

    def reserve(self, name: str, size: int) -> list[EntryStat]:
        """Make room for ``size`` bytes about to be written under ``name`` (which may
        replace an entry); return the entries evicted for it."""
        if self._shared is not None:
            with self._shared("size", self.counter_timeout) as counter:
                if counter is not None:
                    return self._reserve(name, size, counter)
            if not self._stuck_warned:
                self._stuck_warned = True
                warn(
                    "mlcache: the cache's shared size total has been locked for too long "
                    "(a stopped process?); this process keeps bytes_limit on its own meanwhile"
                )
        with self._lock:
            return self._reserve(name, size, self._own)

    def _reserve(self, name: str, size: int, counter: SharedCounter) -> list[EntryStat]:
        now = time.time()
        fresh = 0 <= now - counter.stamp < RESCAN_SECONDS and counter.value >= 0
        if fresh and counter.value + size <= self.bytes_limit:
            counter.value += size
            return []
        self._usage.flush()
        # the entry being replaced, if any, goes with the write: not counted, not evicted
        entries = [e for e in result_entries(self._store) if e.name != name]
        total = sum(e.size for e in entries)
        removed: list[EntryStat] = []
        if total + size > self.bytes_limit:
            target = min(int(self.bytes_limit * LOW_WATER), self.bytes_limit - size)
            removed = enforce_limits(self._store, bytes_limit=max(target, 0), entries=entries)
            total -= sum(e.size for e in removed)
        counter.value, counter.stamp = total + size, now
        return removed

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


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


def plan_eviction(
    entries: Iterable[EntryStat],
    *,
    bytes_limit: int | None = None,
    items_limit: int | None = None,
    age_limit: float | None = None,
    protect: Iterable[str] = (),
) -> list[EntryStat]:
    """What to delete, least recently used first, for ``entries`` to fit the limits.

    ``age_limit`` is in seconds since last use; names in ``protect`` are kept.
    """
    keep = set(protect)
    ordered = sorted(entries, key=lambda e: e.last_used)
    total = sum(e.size for e in ordered)
    count = len(ordered)
    now = time.time()
    chosen = []
    for e in ordered:
        too_old = age_limit is not None and now - e.last_used > age_limit
        too_big = bytes_limit is not None and total > bytes_limit
        too_many = items_limit is not None and count > items_limit
        if not (too_old or too_big or too_many):
            if age_limit is None:
                break  # sorted by last use: nothing later is older
            continue
        if e.name in keep:
            continue
        total -= e.size
        count -= 1
        chosen.append(e)
    return chosen


def enforce_limits(
    store: Store,
    *,
    bytes_limit: int | None = None,
    items_limit: int | None = None,
    age_limit: float | None = None,
    protect: Iterable[str] = (),
    entries: Iterable[EntryStat] | None = None,
) -> list[EntryStat]:
    """Delete least-recently-used entries until the store fits the limits (see
    :func:`plan_eviction`). ``entries`` is a listing just made, if any. Returns
    what was removed."""
    plan = plan_eviction(
        result_entries(store) if entries is None else entries,
        bytes_limit=bytes_limit,
        items_limit=items_limit,
        age_limit=age_limit,
        protect=protect,
    )
    removed = []
    for e in plan:
        try:
            store.delete(e.name)
        except (OSError, ValueError):
            continue
        removed.append(e)
    return removed
