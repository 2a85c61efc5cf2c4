"""The function cache checks itself: now and then a hit is computed again and
compared with what the cache would have returned.

What a hit costs for it (the hot path writes nothing): the time of the hit
(two clock reads), a dict lookup of the compute time its entry records, and
three float operations on the function's :class:`~mlcache._audit.AuditBudget`.
When the budget allows (see :mod:`mlcache._audit` for the arithmetic), the
call is an audit:

- at most one audit of a key at a time: in this process, and across processes
  through the store's lock for the key (tried once, not waited for: held by
  another process, the hit is served as it is);
- the function runs again and its result is returned (never the cached value);
- the fresh value is compared with the cached one by value
  (:func:`mlcache._audit.compare`). The same value: the audit is counted.
  Floats that differ in their last bits only: one warning per function naming
  the tolerance option; entries are still served. Different: the function is
  run a third time to tell an input its key cannot see (the two fresh results
  agree: an environment variable, a file, a database, the clock changed since
  the entry was stored) from a computation that is not deterministic (they
  differ too); one warning per function says which. The entries of that code
  version stored before then are removed, so none of them is served again, in
  this process or any other; the fresh result is stored; the function is
  audited ``boost`` times as often for the rest of the process. Later
  mismatches in the process replace their own entry only, so that a function
  that is never deterministic does not empty its folder at every audit.
- an audit whose computation raises is not counted; the cached value is
  returned, as the hit would have.

Audits and mismatches are counted in the function's usage statistics
(:mod:`mlcache.memo.usage`: ``mlcache ls`` and ``info`` show them).
Coroutine functions are not audited.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeGuard

from .._audit import CLOSE, DIFFERENT, AuditBudget, AuditPolicy, audit_policy, compare
from ..errors import warn
from .context import MemoContext
from .layout import entries
from .locking import MISS

__all__ = ["Auditor", "auditor"]

logger = logging.getLogger("mlcache")
#: compute times remembered per function (by entry name)
_DURATIONS_MAX = 4096


#: the compute time as mlcache's writer records it: the first key of the info
#: that reads ``"duration":`` (a quote inside a JSON string is escaped, so no
#: string holds it; the writer puts it before the arguments, whose names may)
_DURATION = re.compile(rb'"duration":(-?[0-9][0-9.eE+-]*)[,}]')


def recorded_duration(info: bytes) -> float:
    """The compute time (seconds) an entry's metadata ``info`` (JSON) records, 0.0
    when it records none. Read by one search, not a parse of the whole metadata
    (a first hit of a small entry paid ~6 µs for ``json.loads``); metadata of
    another shape is parsed. Only the audit budget reads it, never a value."""
    found = _DURATION.search(info)
    if found is not None:
        try:  # not contextlib.suppress: entering one cost twice the search
            return float(found[1])
        except ValueError:
            pass
    try:
        return float(json.loads(info).get("duration", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


class Auditor:
    """The audits of one memoized function in this process (``func_id`` names it
    in warnings)."""

    def __init__(self, policy: AuditPolicy, ctx: MemoContext, func_id: str) -> None:
        self.policy = policy
        self.func_id = func_id
        self.budget = AuditBudget(policy.share, policy.after)
        self._ctx = ctx
        self._durations: dict[str, float] = {}  # by entry name
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._said: set[str] = set()  # the warnings given (once per function)
        self._distrusted = False  # a mismatch removed the version's older entries

    def due(self, keyed: tuple[str, Any] | None, began: float) -> TypeGuard[tuple[str, Any]]:
        """Count the hit of ``keyed`` that began at ``began`` (``time.perf_counter``);
        True (the key is then this call's to audit) when its audit is due."""
        took = perf_counter() - began
        if keyed is None:
            return False
        name = keyed[0]
        duration = self._durations.get(name)
        if duration is None:
            duration = self._duration(name)
        # AuditBudget.hit, inlined: a method call is a tenth of this bookkeeping
        b = self.budget
        if duration > took:
            b.saved += duration - took
        if b.saved <= b.after or b.spent + duration > b.share * b.saved:
            return False
        with self._lock:
            if name in self._running:
                return False
            self._running.add(name)
        return True

    def _duration(self, name: str) -> float:
        """The compute time entry ``name`` records (from the metadata its hit noted)."""
        noted = self._ctx.usage.pending(name)
        if noted is None:  # just flushed: this hit counts as saving nothing
            return 0.0
        duration = recorded_duration(noted[1])
        if len(self._durations) >= _DURATIONS_MAX:
            self._durations.clear()
        self._durations[name] = duration
        return duration

    def check(
        self,
        keyed: tuple[str, Any],
        cached: Any,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        finish: Callable[..., tuple[Any, Any, str]],
    ) -> Any:
        """The audit of a hit of ``keyed`` (``cached`` its value): ``func(*args,
        **kwargs)`` runs again; a result that differed is stored by ``finish``
        (the memoized function's: ``(keyed, value, t0, args, kwargs)``, returning
        the value to return first). Returns what the call returns."""
        name = keyed[0]
        lock = self._key_lock(name)
        try:
            held = lock.__enter__()
        except Exception as exc:  # no lock here (a read-only folder): this process's guard
            logger.debug("mlcache: %s: auditing unlocked (%s)", self.func_id, exc)
            lock, held = contextlib.nullcontext(True), True
        try:
            if not held:  # another process computes or audits this key now
                return cached
            fresh, seconds = self._audit(name, cached, lambda: func(*args, **kwargs))
        finally:
            with contextlib.suppress(Exception):
                lock.__exit__(None, None, None)
            with self._lock:
                self._running.discard(name)
        if seconds is None:
            return fresh
        return finish(keyed, fresh, time.perf_counter() - seconds, args, kwargs)[0]

    def _key_lock(self, name: str) -> contextlib.AbstractContextManager[bool]:
        locking = self._ctx.locking
        if locking is None:
            return contextlib.nullcontext(True)
        try:
            return locking.lock(name, 0)
        except Exception as exc:  # no lock here (read-only): this process's own guard
            logger.debug("mlcache: %s: auditing unlocked (%s)", self.func_id, exc)
            return contextlib.nullcontext(True)

    def _timed(self, compute: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            value = compute()
        except Exception as exc:  # the hit would have returned: so does the audit
            logger.debug("mlcache: %s: the audit's computation raised %r", self.func_id, exc)
            value = MISS
        seconds = time.perf_counter() - t0
        self.budget.spend(seconds)
        return value, seconds

    def _audit(
        self, name: str, cached: Any, compute: Callable[[], Any]
    ) -> tuple[Any, float | None]:
        """(the value the call returns, the seconds it took to compute when it is
        to be stored: a mismatch; else None)."""
        fresh, seconds = self._timed(compute)
        if fresh is MISS:
            return cached, None
        p = self.policy
        verdict = self._compare(fresh, cached)
        if verdict == CLOSE:
            self._say(
                "close",
                f"mlcache: {self.func_id} is not deterministic in the last bits of its "
                "floats (computed again for an audit, its result differs from the cached "
                "one within rounding: a threaded or parallel reduction?); its results are "
                "still served. To count such differences as equal, pass "
                "audit=mlcache.AuditPolicy(rtol=1e-6) (or audit={'rtol': 1e-6}) to "
                "Memory or cache()",
            )
        if verdict != DIFFERENT:
            self._ctx.usage.audited(name, self.func_id, seconds)
            return fresh, None
        total = seconds
        if "mismatch" not in self._said:
            again, more = self._timed(compute)
            total += more
            random = again is not MISS and self._compare(again, fresh) == DIFFERENT
            self._say("mismatch", self._mismatch_message(random))
        self._ctx.usage.audited(name, self.func_id, total, mismatch=True)
        self._durations.pop(name, None)  # the entry is replaced
        if not self._distrusted:
            self._distrusted = True
            self._distrust(name)
            self.budget.share = min(1.0, p.share * p.boost)
        return fresh, seconds

    def _compare(self, fresh: Any, cached: Any) -> str:
        try:
            return compare(fresh, cached, rtol=self.policy.rtol, atol=self.policy.atol)
        except Exception as exc:  # a value no rule can compare is never reported
            logger.debug("mlcache: %s: cannot compare for the audit: %r", self.func_id, exc)
            return "unknown"

    def _mismatch_message(self, random: bool) -> str:
        head = (
            f"mlcache: an audit found a wrong cached result of {self.func_id}: computed "
            "again with the same arguments and code, it gives another value. "
        )
        if random:
            why = (
                "It is not deterministic (two fresh computations differ too): random "
                "numbers without a fixed seed, the time, or unordered parallel work? "
                "Its cached result is one draw among many: fix the seed, or do not "
                "cache it (audit=False keeps the audits quiet)."
            )
        else:
            why = (
                "It reads an input its key cannot see, which changed since the result "
                "was stored: an environment variable, a file read by a path built "
                "inside it, a database, the clock? Pass that input as an argument (or "
                "its version, or set cache(version=...) when it changes)."
            )
        return (
            head + why + " The results of its current code stored before now are no "
            "longer served; it is audited more often for the rest of this process."
        )

    def _say(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            # stacklevel: warn, _say, _audit, check, the function's __call__, its caller
            warn(message, stacklevel=5)

    def _distrust(self, name: str) -> None:
        """Remove the entries of ``name``'s code version (stored before now)."""
        store = self._ctx.store
        if self._ctx.writes.refuses_writes():
            return
        try:
            for e in list(entries(store, name.rpartition("/")[0])):
                with contextlib.suppress(OSError, ValueError):
                    store.delete(e.name)
        except Exception as exc:  # a listing that failed: the entry itself at least
            logger.debug("mlcache: %s: cannot remove the distrusted entries: %s", self.func_id, exc)
            with contextlib.suppress(Exception):
                store.delete(name)


def auditor(audit: Any, ctx: MemoContext, func_id: str) -> Auditor | None:
    """The auditor of a function memoized with ``audit=`` (None: the Memory's
    policy), or None when it is not audited."""
    policy = ctx.audit if audit is None else audit_policy(audit)
    return None if policy is None else Auditor(policy, ctx, func_id)
