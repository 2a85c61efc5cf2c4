"""The dataset cache checks itself: from a process's second pass over a pack on,
a few of the samples it reads are loaded again with ``load_item`` and compared.

A pack filled item by item (:mod:`mlcache.data.filling`) is keyed by each item's
fingerprint (a file's ``stat``, or ``item_fingerprint(item)``); what ``load_item``
reads besides (an environment variable, a file by a path built inside it, a
database, a model by name) is not in it, and a change of it is served stale, for
ever. The audit is how that is found.

What a read costs for it: ``ds[i]`` takes one from :attr:`DatasetAuditor.left` and
compares it with 0 (see
:meth:`CachedDataset.__getitem__ <mlcache.data.CachedDataset.__getitem__>`);
everything else runs only at the reads where that comparison says so (a few per
pass):

- **Passes.** The reads of a process are counted, ``len(ds)`` reads a pass. A
  pass that begins with the pack still being filled (its loads are this run's),
  and the pass after it, are left as they are: no audit, so their loads and
  their count are those of a dataset without the audit. From the next pass on
  (from the second, for a pack sealed by an earlier run), each pass plans its
  audits when it begins, at random reads of it (a private random generator: the
  user's ``random`` and numpy seeds are untouched). A DataLoader's worker counts
  its own reads (forked: from zero; spawned: the counts do not travel), so a
  persistent worker is audited once it has read the whole pack twice over, and
  workers made anew each epoch are not.
- **The budget** (:class:`~mlcache._audit.AuditBudget`): each audited pass
  avoids ``len(ds)`` loads; the seconds saved are those loads' time, counted
  with what a load takes: the less of the mean of the audits' own loads and
  the fill's (:class:`LoadTimer`: timed by the process that filled the pack, and
  recorded beside the packs, ``.<attributes>.loads``, when it seals). Audits
  wait until the passes saved ``after`` seconds (1 s), then spend at most
  ``share`` (2%) of them: 300 items of 1 ms save 0.3 s a pass, so the audits
  begin in the fourth audited pass, about 6 a pass from then on; a load of
  microseconds (a test's) is never audited in a short run. A read of the pack
  (microseconds) is not subtracted from a load. A pack whose load time is
  unknown (sealed by a process that loaded none of it) gets one audit, once
  ``share`` of the loads avoided make one load, which times it.
- **The comparison**: the fresh sample, in the form a pack reads it back
  (:func:`~mlcache.data.values.read_back`), against the sample the read served:
  :func:`~mlcache.data.frozen.same_sample` (exact; a comparison it cannot make
  counts as the same), else :func:`mlcache._audit.compare` with the policy's
  ``rtol``/``atol`` (its ``same`` and ``unknown`` pass).
- **A difference**: the item is loaded a third time. Two fresh loads that differ
  too: ``load_item`` is random (augmentation frozen in the pack): the warning of
  :func:`~mlcache.data.frozen.warn_frozen_randomness`, once per process, and the
  pack is still served. Two fresh loads that agree: its source changed unseen.
  One warning names ``load_item``, the item and what to suspect; the pack is
  *not trusted* from then on: since a change that one item shows rarely touches
  one item alone and no fingerprint says which, the pack file read (and any
  records of a filling under way) is removed, under the pack's build lock, so
  that no later open serves it (processes that mapped it keep reading their map
  until they open it again), and this process fills the pack anew as it reads
  it: every later ``ds[i]`` loads its item, records it and returns it, and the
  pack is sealed again once every item is in (the audited read returns its fresh
  sample too). The audits of that dataset stop for the process, as they do
  after randomness is found.
- A ``load_item`` that raises during an audit: logged, the read's sample is
  served, the audit is not counted.

Packs in a remote ``cache_dir`` are not audited (their refill is a whole build
on one machine); ``audit=False`` on the dataset, or ``MLCACHE_AUDIT=0``, turns
the audit off.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import Any

from .._atomic import write_bytes_atomic
from .._audit import SAME, UNKNOWN, AuditBudget, AuditPolicy, audit_policy, compare
from ..errors import warn_at_user
from .frozen import same_sample, warn_frozen_randomness
from .values import read_back

__all__ = [
    "DatasetAuditor",
    "LoadTimer",
    "dataset_auditor",
    "read_load_seconds",
    "write_load_seconds",
]

logger = logging.getLogger("mlcache")

#: ``due_at`` once a dataset is no longer audited in this process
_NEVER = sys.maxsize
#: an audit runs when the budget holds its load and half of another: a load that
#: takes longer than the mean (a busy machine) stays within the share
_SLACK = 0.5
#: what an audit that found the pack stale returns
_STALE = object()
#: the classes told that their pack was stale (one warning per class and process)
_SAID_STALE: set[str] = set()
#: every auditor of this process: a forked child starts counting from zero
_AUDITORS: weakref.WeakSet[DatasetAuditor] = weakref.WeakSet()


class LoadTimer:
    """``load_item``, timed: what filling the pack costs per item (the audit's
    budget is counted with it). Two clock reads around a load of milliseconds."""

    def __init__(self, load: Callable[[Any], Mapping[str, Any]]) -> None:
        self.load = load
        #: what the fill's probe and warnings name (``"Tiles.load_item"``)
        self.__qualname__ = getattr(load, "__qualname__", "load_item")
        self.count, self.seconds = 0, 0.0

    def __call__(self, item: Any) -> Mapping[str, Any]:
        t0 = perf_counter()
        try:
            return self.load(item)
        finally:  # (add's two lines: a call less for each of an epoch's loads)
            self.seconds += perf_counter() - t0
            self.count += 1

    def add(self, seconds: float, count: int) -> None:
        """``count`` loads took ``seconds`` (an up-front fill times its whole loop)."""
        self.seconds += seconds
        self.count += count

    @property
    def mean(self) -> float | None:
        """Seconds per load, None before one is timed."""
        return self.seconds / self.count if self.count else None


def write_load_seconds(path: str, seconds: float, root: str) -> None:
    """Record beside the packs (``path``: ``<folder>/.<attributes>.loads``) what a load
    of an item took when the pack was filled. Housekeeping: never raises."""
    try:  # below root, never through a planted link
        write_bytes_atomic(path, json.dumps({"load": seconds}).encode(), durable=False, root=root)
    except OSError as exc:
        logger.debug("mlcache: could not record the load time in %s: %s", path, exc)


def read_load_seconds(path: str) -> float | None:
    """What :func:`write_load_seconds` recorded, or None."""
    try:
        with open(path) as f:
            seconds = float(json.load(f)["load"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class DatasetAuditor:
    """The audits of one :class:`~mlcache.data.CachedDataset` in this process (see
    the module docstring).

    Parameters
    ----------
    policy:
        The budget (``share``) and tolerance (``rtol``, ``atol``).
    owner:
        ``"Tiles.load_item"``: what warnings name.
    size:
        ``len(ds)``: the reads of a pass.
    filling:
        Whether a pack being filled serves the reads now (then the pass is a
        filling pass, and the next one is the first over the sealed pack).
    load_seconds:
        What a load of an item takes, as the fill timed it (None: unknown).
    items:
        ``source_items()``: the item of each index (listed at the first audit).
    load:
        ``load_item``.
    allow_pickle:
        The dataset's: the fresh sample is read back as the pack reads it.
    fill_anew:
        ``fill_anew(i)``, on an unseen change: the pack is no longer trusted
        (removed, and filled again as it is read); returns sample ``i`` read anew.
    """

    def __init__(
        self,
        policy: AuditPolicy,
        owner: str,
        size: Callable[[], int],
        filling: Callable[[], bool],
        load_seconds: Callable[[], float | None],
        items: Callable[[], Iterable[Any]],
        load: Callable[[Any], Mapping[str, Any]],
        allow_pickle: bool,
        fill_anew: Callable[[int], Any],
    ) -> None:
        self.policy, self.owner = policy, owner
        self._size, self._filling, self._items_of, self._load = size, filling, items, load
        self._load_seconds_of = load_seconds
        self._allow_pickle, self._fill_anew = allow_pickle, fill_anew
        self.audits = 0  #: audits run (counted by tests and benchmarks)
        self.mismatches = 0
        self._start()
        _AUDITORS.add(self)

    def _start(self) -> None:
        """This process's counts, from zero (a new auditor, a forked or spawned worker)."""
        #: the reads left before the next audit (or the next pass's plan) is due:
        #: the read path's whole bookkeeping (reads = due_at - 1 - left)
        self.left, self.due_at = 0, 1
        self.budget = AuditBudget(self.policy.share, self.policy.after)
        self._known: float | None = None  # a load's time, as the fill timed it
        self.n = 0  # the reads of a pass (known at the first read)
        self._planned = 0  # the last pass planned
        self._origin = 0  # the last pass a pack being filled served (not audited)
        self._avoided = 0  # loads the passes planned avoid
        self._loads = 0  # audit loads timed, and their total time
        self._load_seconds = 0.0
        self._at: list[int] = []  # the reads of this pass to audit, last first
        self._items: list[Any] | None = None
        self._lock = threading.Lock()
        self._random = random.Random()  # not the user's generator: seeds stay theirs

    def __getstate__(self) -> dict[str, Any]:
        # to a spawned worker: the policy and the dataset's methods, not the counts
        state = self.__dict__.copy()
        for name in ("_lock", "_random", "_items", "_at", "budget"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()
        _AUDITORS.add(self)

    # -- the reads ----------------------------------------------------------------------
    @property
    def reads(self) -> int:
        """The reads of the dataset by this process."""
        return self.due_at - 1 - self.left

    def read(self, i: Any, sample: Any) -> Any:
        """The read of index ``i`` that served ``sample`` reached :attr:`due_at`:
        plan the pass it begins, audit it if planned; returns the sample to serve."""
        if not self._lock.acquire(blocking=False):
            return sample  # another thread audits: this read is served as it is
        reads = self.reads
        try:
            served = self._read(i, sample)
        except Exception as exc:  # the audit's own failure never fails the read
            logger.debug("mlcache: %s: audit skipped: %r", self.owner, exc)
            self.due_at = reads + 1 if self._at else self._planned * self.n + 1
            return sample
        finally:
            self.left = self.due_at - reads - 1
            self._lock.release()
        if served is _STALE:  # read from the pack being filled anew (a load_item error
            return self._fill_anew(int(i) % self.n)  # raises, as in the first epoch)
        return served

    def _read(self, i: Any, sample: Any) -> Any:
        if not self.n:
            self.n = self._size()
            if not self.n:
                self.due_at = _NEVER
                return sample
        reads, n = self.reads, self.n
        now = (reads - 1) // n + 1  # the pass this read belongs to
        if now > self._planned:
            self._plan(now)
        at = self._at
        while at and at[-1] < reads:  # planned reads this one overtook (another thread)
            at.pop()
        due = bool(at) and at[-1] == reads
        if due:
            at.pop()
        self.due_at = at[-1] if at else self._planned * n + 1
        if not due or (i.__class__ is not int and not hasattr(i, "__index__")):
            return sample  # ds[2:4]: a list of samples, not audited
        return self._audit(int(i) % n, sample)

    def _plan(self, now: int) -> None:
        """Pass ``now`` begins: its audits, at random reads, from the second pass over
        the sealed pack on (a pass that began with a pack being filled, and the one
        after it, have none: the samples are this run's loads)."""
        n = self.n
        if self._filling():
            self._origin = now
        audited = max(0, now - max(self._planned, self._origin + 1))
        self._planned = now
        self._at = []
        if not audited:
            return
        self._avoided += n * audited
        self._known = self._load_seconds_of()
        each, b = self._each(), self.budget
        if each is None:  # unknown (an old pack): one audit times a load, within the share
            count = min(1, int(b.share * self._avoided))
        elif b.saved <= b.after:
            count = 0
        else:
            count = int(b.available / each - _SLACK) if each > 0 else n
        count = max(0, min(count, n))
        first = (now - 1) * n + 1
        self._at = sorted(self._random.sample(range(first, first + n), count), reverse=True)

    def _each(self) -> float | None:
        """The time of a load (the less of the audits' mean and the fill's), or None;
        the budget's saving is counted with it (it changes as audits are timed)."""
        timed = [self._load_seconds / self._loads] if self._loads else []
        if self._known is not None:
            timed.append(self._known)
        if not timed:
            return None
        each = min(timed)  # the smaller saving: an audit's load also reads it back
        self.budget.saved = self._avoided * each
        return each

    # -- an audit -----------------------------------------------------------------------
    def _fresh(self, item: Any, index: int) -> Any:
        t0 = perf_counter()
        try:
            return read_back(self._load(item), self._allow_pickle, index)
        finally:
            took = perf_counter() - t0
            self.budget.spend(took)
            self._loads += 1
            self._load_seconds += took

    def _same(self, a: Any, b: Any) -> bool:
        if same_sample(a, b):
            return True
        try:
            verdict = compare(a, b, rtol=self.policy.rtol, atol=self.policy.atol)
        except Exception:  # a value no rule can compare is never reported
            return True
        return verdict in (SAME, UNKNOWN)

    def _audit(self, i: int, sample: Any) -> Any:
        """Load item ``i`` again and compare with the ``sample`` the read served."""
        each = self._each()
        if each is not None and self.budget.available < each * (1 + _SLACK):
            return sample  # the audits before this one cost more than planned
        if self._items is None:
            self._items = list(self._items_of())
        if not 0 <= i < len(self._items):
            return sample
        item = self._items[i]
        try:
            fresh = self._fresh(item, i)
        except Exception as exc:  # the user's load: the read is served, uncounted
            logger.debug("mlcache: %s: the audit's load of %r raised %r", self.owner, item, exc)
            return sample
        self.audits += 1
        if self._same(fresh, sample):
            logger.debug("mlcache: %s: audit of item %r: the same sample", self.owner, item)
            return sample
        try:
            again = self._fresh(item, i)
        except Exception:
            return sample  # cannot tell an unseen change from randomness: say nothing
        self.mismatches += 1
        self.due_at = _NEVER  # either way, the audits of this dataset end here
        self._at = []
        if not self._same(again, fresh):
            warn_frozen_randomness(self.owner, item)
            return sample
        self._stale(item)
        return _STALE

    def _stale(self, item: Any) -> None:
        if self.owner in _SAID_STALE:
            return
        _SAID_STALE.add(self.owner)
        shown = repr(item)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        warn_at_user(
            f"mlcache: an audit found a stale sample in the pack of {self.owner}: the item "
            f"{shown} loaded again gives another sample than the pack holds, and two fresh "
            "loads agree. load_item reads an input the items' fingerprints cannot see, "
            "which changed since the pack was filled: an environment variable, a file read "
            "by a path built inside it, a database, a model by name, the time? The pack is "
            "no longer served: it is filled anew as it is read (this process loads every "
            "sample again; a later open finds no stale pack). Name that input in "
            "item_fingerprint(item) or source_fingerprint(), or in an attribute."
        )


def dataset_auditor(
    audit: Any,
    owner: str,
    reads: tuple[
        Callable[[], int],
        Callable[[], bool],
        Callable[[], float | None],
        Callable[[], Iterable[Any]],
        Callable[[Any], Mapping[str, Any]],
    ],
    allow_pickle: bool,
    fill_anew: Callable[[int], Any],
) -> DatasetAuditor | None:
    """The auditor of a dataset made with ``audit=`` (see :class:`DatasetAuditor`;
    ``reads``: its ``size``, ``filling``, ``load_seconds``, ``items``, ``load``), or None when it
    is not audited (``audit=False``, ``MLCACHE_AUDIT=0``)."""
    policy = audit_policy(audit)
    if policy is None:
        return None
    return DatasetAuditor(policy, owner, *reads, allow_pickle, fill_anew)


def _forked() -> None:
    """In a forked child (a DataLoader worker): every auditor counts from zero."""
    for auditor in list(_AUDITORS):
        auditor._start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
