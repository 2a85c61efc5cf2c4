"""One computation per key at a time: the lock loop of memoized functions.

A call that missed tries the key's lock (the store's :class:`~mlcache.store.Locking`
power), without blocking. Held, it looks once more (another process may have
stored the result meanwhile) and computes under the lock. Not held, it waits,
looks for the result, and tries again, until ``lock_timeout``; then it computes
too, with one warning. Where no lock can be made at all (a read-only cache
folder) it computes unlocked: the cache never fails the call.

The loop is written once, as a generator that yields how long to wait between
tries (doubling from 2 ms to 0.1 s, and at least ten times what a try cost, so
that waiters on an object store, where a try is a request, poll it gently);
:meth:`KeyLocks.claim` sleeps those waits (plain functions) and
:meth:`KeyLocks.aclaim` awaits them (``async def`` functions: other tasks run
meanwhile). :func:`mlcache._util.backoff` is not used: it sleeps itself, which
an event loop cannot afford.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any

from ..errors import warn
from ..store import Locking

__all__ = ["MISS", "Claim", "KeyLocks"]

logger = logging.getLogger("mlcache")
#: what a load returns when the entry is not (or not validly) there
MISS: Any = object()
#: the first wait between two tries of a held lock, and the longest (seconds)
FIRST_WAIT, LONGEST_WAIT = 0.002, 0.1
#: a wait is at least this many times what the last try cost, up to SLOWEST_WAIT:
#: a try on an object store (a listing, a GET) costs milliseconds, where a local
#: try costs microseconds, so a waiter on a shared store does not flood it
TRY_COST_FACTOR, SLOWEST_WAIT = 10.0, 1.0


class Claim:
    """What waiting for a key gave: :attr:`value`, a result another process or
    thread stored meanwhile (``MISS`` if none), else the right to compute it.
    As a context manager the block is the computation: it holds the key's lock,
    when one could be had, and releases it at the end."""

    def __init__(self, value: Any = MISS, held: AbstractContextManager[bool] | None = None):
        self.value = value
        self._held = held

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: Any) -> Any:
        held, self._held = self._held, None
        return held.__exit__(*exc) if held is not None else None


_UNLOCKED = Claim()


class KeyLocks:
    """The lock loop of one memoized function (``func_id`` names it in messages)
    over a store that can lock (``locking``; None: every call computes, as
    joblib's do)."""

    def __init__(self, locking: Locking | None, func_id: str) -> None:
        self._locking = locking
        self._func_id = func_id

    def claim(self, name: str, timeout: float, load: Callable[[], Any]) -> Claim:
        """Wait (sleeping) for the right to compute key ``name``, or for its result
        (``load()``, which returns ``MISS`` while there is none)."""
        if self._locking is None:
            return _UNLOCKED
        steps = self._attempts(name, timeout, load)
        try:
            while True:
                time.sleep(next(steps))
        except StopIteration as done:
            claim: Claim = done.value
            return claim

    async def aclaim(self, name: str, timeout: float, load: Callable[[], Any]) -> Claim:
        """:meth:`claim` for a coroutine: the waits do not block the event loop."""
        if self._locking is None:
            return _UNLOCKED
        steps = self._attempts(name, timeout, load)
        try:
            while True:
                await asyncio.sleep(next(steps))
        except StopIteration as done:
            claim: Claim = done.value
            return claim

    def _attempts(
        self, name: str, timeout: float, load: Callable[[], Any]
    ) -> Generator[float, None, Claim]:
        """The one lock loop: yields the seconds to wait before the next try."""
        assert self._locking is not None
        deadline = time.monotonic() + timeout
        wait = FIRST_WAIT
        while True:
            began = time.monotonic()
            try:
                lock = self._locking.lock(name, 0)
                held = lock.__enter__()
            except OSError as exc:  # no lock can be made here (a read-only folder)
                logger.debug("mlcache: %s: cannot lock (%s); going on unlocked", self._func_id, exc)
                return _UNLOCKED
            except Exception as exc:  # a store's bug never fails the call
                warn(
                    f"mlcache: {self._func_id}: the store's lock raised "
                    f"{type(exc).__name__}: {exc}; computing unlocked",
                    stacklevel=4,
                )
                return _UNLOCKED
            if held:
                try:  # another process or thread may have stored it while we waited
                    value = load()
                except BaseException as exc:
                    lock.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                if value is not MISS:
                    lock.__exit__(None, None, None)
                    return Claim(value)
                return Claim(MISS, lock)
            lock.__exit__(None, None, None)
            if time.monotonic() >= deadline:
                if timeout > 0:  # lock_timeout=0 asks not to wait: nothing to say
                    # stacklevel: this, claim or aclaim, the function's __call__, its caller
                    warn(
                        f"mlcache: {self._func_id}: another process has computed this call "
                        f"for more than {timeout:g} s (lock_timeout); computing it here too",
                        stacklevel=4,
                    )
                return _UNLOCKED
            cost = time.monotonic() - began
            yield min(max(wait, TRY_COST_FACTOR * cost), SLOWEST_WAIT)
            wait = min(wait * 2, LONGEST_WAIT)
            value = load()
            if value is not MISS:
                return Claim(value)
