"""Size limits: least-recently-used eviction and the off-hot-path record of use.

Last use is a file's modification time, updated in batches by
:class:`UsageLog` (a hit only adds a name to a set; the set is written at most
every :data:`FLUSH_SECONDS`, before any eviction, and at exit). A lost batch
only makes eviction slightly less exact, never a result wrong.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Iterable

from .store import EntryStat, Store

__all__ = ["FLUSH_SECONDS", "UsageLog", "enforce_limits"]

FLUSH_SECONDS = 2.0
_LOGS: weakref.WeakSet[UsageLog] = weakref.WeakSet()


class UsageLog:
    """Batches "this entry was used" notes for one store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._names: set[str] = set()
        self._last = time.monotonic()
        self._lock = threading.Lock()
        _LOGS.add(self)

    def note(self, name: str) -> None:
        self._names.add(name)
        if time.monotonic() - self._last > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            names, self._names = self._names, set()
            self._last = time.monotonic()
        if names:
            try:
                self._store.touch(names)
            except OSError:
                pass  # last-use times are advisory


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
    prefix: str = "",
) -> list[EntryStat]:
    """Delete least-recently-used entries until the store fits the limits.

    ``age_limit`` is in seconds since last use. Names in ``protect`` (the entry
    just written) are never removed. Returns what was removed.
    """
    keep = set(protect)
    entries = sorted(store.list(prefix), key=lambda e: e.last_used)
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
        except OSError:
            continue
        total -= e.size
        count -= 1
        removed.append(e)
    return removed
