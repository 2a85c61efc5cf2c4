"""Size limits: least-recently-used eviction (:func:`enforce_limits`) and the
guard that keeps a store under ``bytes_limit`` as entries are written
(:class:`SizeGuard`). What was used when is recorded off the hot path by
:class:`mlcache.memo.usage.UsageLog`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from ..errors import warn
from ..store import EntryStat, SharedCounter, SharedCounters, Store
from .layout import entries as result_entries
from .usage import UsageLog, renew_at_fork

__all__ = ["SizeGuard", "enforce_limits", "plan_eviction"]

#: a store's size is re-read at least this often while writing (other processes write too)
RESCAN_SECONDS = 10.0
#: eviction goes down to this fraction of the limit, so that the next writes do not
#: each pay for a scan of the whole store
LOW_WATER = 0.9


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
    counter between processes (:class:`~mlcache.store.SharedCounters`: the local
    store; given as ``counters``), the total is
    that counter, changed by one writer at a time, so that concurrent writers
    from many processes keep within the limit together; elsewhere each process
    keeps its own total and sees the others' writes at its next scan.
    """

    #: seconds a write waits for the shared total before keeping the limit alone
    counter_timeout = 30.0

    def __init__(
        self,
        store: Store,
        bytes_limit: int,
        usage: UsageLog,
        *,
        counters: SharedCounters | None = None,
    ) -> None:
        self._store = store
        self.bytes_limit = bytes_limit
        self._usage = usage
        self._shared = counters.shared_counter if counters is not None else None
        self._lock = threading.Lock()
        self._own = SharedCounter(0, 0.0)  # the total of a store that cannot share one
        self._stuck_warned = False
        renew_at_fork(self)

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
