"""Size limits: least-recently-used eviction and the off-hot-path record of use.

Last use is a file's modification time, updated in batches by
:class:`UsageLog` (a hit only adds a name to a set; the set is written at most
every :data:`FLUSH_SECONDS`, before any eviction, and at exit). A lost batch
only makes eviction slightly less exact, never a result wrong.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from .store import EntryStat, Store

__all__ = ["FLUSH_SECONDS", "SizeGuard", "UsageLog", "enforce_limits"]

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
    """Batches "this entry was used" notes for one store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._names: set[str] = set()
        self._last = time.monotonic()
        self._lock = threading.Lock()
        _LOGS.add(self)
        _FORK_SENSITIVE.add(self)

    def note(self, name: str) -> None:
        self._names.add(name)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            # list() of a set is one step under the GIL: a note() racing with this
            # swap lands in either set and is never iterated while it changes
            names, self._names = list(self._names), set()
            self._last = time.monotonic()
        if names:
            try:
                self._store.touch(names)
            except (OSError, ValueError):
                pass  # last-use times are advisory

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


class SizeGuard:
    """Keeps a store under ``bytes_limit`` as entries are written.

    Scanning the store costs O(entries) (about 12 ms per thousand here), so it is
    not done at every write: the guard adds each write's size to the total of the
    last scan, and scans and evicts (least recently used first, down to
    ``LOW_WATER`` of the limit) only when that estimate passes the limit or the
    last scan is older than ``RESCAN_SECONDS``. Writes by other processes are
    therefore seen at the latest ``RESCAN_SECONDS`` later.
    """

    def __init__(self, store: Store, bytes_limit: int, usage: UsageLog) -> None:
        self._store = store
        self.bytes_limit = bytes_limit
        self._usage = usage
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes, as of the last scan plus our writes
        self._scanned = 0.0
        _FORK_SENSITIVE.add(self)

    def after_write(self, name: str, size: int) -> list[EntryStat]:
        """Account for ``size`` new bytes under ``name``; evict if needed."""
        # the lock guards the counters only, never a scan: a process forked during
        # a scan must not inherit a held lock
        with self._lock:
            fresh = self._estimate is not None and time.monotonic() - self._scanned < RESCAN_SECONDS
            if fresh:
                self._estimate = (self._estimate or 0) + size
                if self._estimate <= self.bytes_limit:
                    return []
        self._usage.flush()
        entries = list(self._store.list())
        total = sum(e.size for e in entries)
        removed: list[EntryStat] = []
        if total > self.bytes_limit:
            removed = enforce_limits(
                self._store,
                bytes_limit=int(self.bytes_limit * LOW_WATER),
                protect=(name,),
                entries=entries,
            )
            total -= sum(e.size for e in removed)
        with self._lock:
            self._estimate, self._scanned = total, time.monotonic()
        return removed

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


@atexit.register
def _flush_all() -> None:
    for log in list(_LOGS):
        log.flush()


def enforce_limits(
    store: Store,
    *,
    bytes_limit: int | None = None,
    items_limit: int | None = None,
    age_limit: float | None = None,
    protect: Iterable[str] = (),
    entries: Iterable[EntryStat] | None = None,
) -> list[EntryStat]:
    """Delete least-recently-used entries until the store fits the limits.

    ``age_limit`` is in seconds since last use. Names in ``protect`` (the entry
    just written) are never removed. ``entries`` is a listing just made, if any.
    Returns what was removed.
    """
    keep = set(protect)
    entries = sorted(store.list() if entries is None else entries, key=lambda e: e.last_used)
    total = sum(e.size for e in entries)
    count = len(entries)
    now = time.time()
    removed = []
    for e in entries:
        too_old = age_limit is not None and now - e.last_used > age_limit
        too_big = bytes_limit is not None and total > bytes_limit
        too_many = items_limit is not None and count > items_limit
        if not (too_old or too_big or too_many):
            if age_limit is None:
                break  # sorted by last use: nothing later is older
            continue
        if e.name in keep:
            continue
        try:
            store.delete(e.name)
        except (OSError, ValueError):
            continue
        total -= e.size
        count -= 1
        removed.append(e)
    return removed
