"""Size limits: what goes when a cache must shrink (:func:`plan_eviction`), and the
guard that keeps a cache folder under ``bytes_limit`` as entries are written
(:class:`SizeGuard`).

What goes is what is worth least: the policy is GreedyDual-Size (Cao and Irani,
1997), the cost-aware policy of web caches. Each entry has a priority

    H = L + cost / size

where ``cost`` is the seconds its computation took (its metadata's
``duration``; a dataset pack's build time) and ``size`` its bytes: the compute
time keeping it saves per byte it occupies. The entry of lowest ``H`` goes
first, and ``L``, the *inflation*, is raised to the ``H`` of what went. An entry
used again gets ``H = L + cost / size`` with the ``L`` of that moment, so what
is no longer used falls behind what is, whatever it once cost: an expensive
result unused since many evictions ago goes before a cheap one used since.
With equal costs per byte it is least-recently-used eviction. Costs per byte
are compared in steps of :data:`STEP` (19%) centred on the median entry's, and
times below :data:`COST_FLOOR` as equal, so that timings of equal work, which
differ by the noise of measuring them, tie, and recency decides.

The textbook keeps ``H`` per entry and sets it at every hit; mlcache's hits
write nothing (DESIGN.md), so ``H`` is recomputed when an eviction plans,
from what is recorded off the hot path: each entry's last use (its file's
modification time, set in batches by :class:`~mlcache.memo.usage.UsageLog`),
its cost and size, and the inflation's history: ``L`` changes only when an
eviction runs, and each eviction appends ``(time, L)`` to a small entry of the
store (:data:`~mlcache.memo.layout.INFLATION`). The ``L`` an entry got at its
last use is the one in force at that time, a step of that history. So the
priorities are those GreedyDual-Size would hold had it run in one process, up
to the batching of last uses (a few seconds), in every process, without a
write on a hit. The history keeps its last :data:`HISTORY` steps; an entry last
used before them counts from ``L = 0``, the oldest being aged the most.

An entry whose cost is unknown (written by an older mlcache, a pack filled
sample by sample) is given the median cost per byte of the others: neither
kept nor sacrificed for the lack of a record.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..codecs import codecs
from ..entry import decode, open_entry, read_entry_info, write_entry
from ..errors import warn
from ..store import EntryStat, LocalFolders, SharedCounter, SharedCounters, Store
from ..store.holdings import Held, held_under
from .layout import INFLATION
from .layout import entries as result_entries
from .usage import UsageLog, renew_at_fork

__all__ = [
    "EntryCosts",
    "Inflation",
    "Plan",
    "SizeGuard",
    "Worth",
    "enforce_limits",
    "plan_eviction",
]

#: a store's size is re-read at least this often while writing (other processes write too)
RESCAN_SECONDS = 10.0
#: eviction goes down to this fraction of the limit, so that the next writes do not
#: each pay for a scan of the whole store
LOW_WATER = 0.9
#: steps of the inflation's history kept (one per eviction that raised it)
HISTORY = 512
#: compute times below this are not told apart (a hit itself costs about as much)
COST_FLOOR = 0.001
#: costs per byte are compared in steps of this ratio, so that times that differ
#: by the noise of measuring them tie, and the least recently used of them goes first
STEP = 2**0.25
#: the policies :func:`plan_eviction` knows: ``"worth"`` (GreedyDual-Size) and
#: ``"lru"`` (least recently used first, what mlcache did before; for comparisons)
POLICIES = ("worth", "lru")


@dataclasses.dataclass(frozen=True)
class Worth:
    """One entry (or pack) weighed for eviction."""

    name: str
    size: int
    last_used: float
    cost: float  #: seconds to make it again
    estimated: bool  #: ``cost`` is a guess: none was recorded
    priority: float  #: GreedyDual-Size's ``H``: the lowest goes first
    #: why it goes: ``"worth"`` (the lowest priority while over a limit) or
    #: ``"age"`` (unused for longer than ``age_limit``); "" while kept
    reason: str = ""

    @property
    def stat(self) -> EntryStat:
        return EntryStat(self.name, self.size, self.last_used)

    @property
    def seconds_per_mib(self) -> float:
        """Compute time saved per MiB it holds (its worth, without aging)."""
        return self.cost / max(self.size, 1) * 2**20

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"seconds_per_mib": self.seconds_per_mib}


@dataclasses.dataclass
class Plan:
    """What :func:`plan_eviction` chose, and the inflation after it."""

    chosen: list[Worth]
    #: ``L`` once the chosen are gone: the highest priority that went for a limit
    inflation: float

    @property
    def stats(self) -> list[EntryStat]:
        return [w.stat for w in self.chosen]


class Inflation:
    """GreedyDual-Size's ``L`` over time: ``(time, L)`` steps, one per eviction."""

    def __init__(self, steps: Iterable[tuple[float, float]] = ()) -> None:
        self.steps = sorted((float(t), float(v)) for t, v in steps)
        self._times = [t for t, _ in self.steps]

    def at(self, t: float) -> float:
        """``L`` in force at epoch seconds ``t`` (0 before the first step kept)."""
        i = bisect.bisect_right(self._times, t)
        return self.steps[i - 1][1] if i else 0.0

    @property
    def now(self) -> float:
        return self.steps[-1][1] if self.steps else 0.0

    @classmethod
    def load(cls, store: Store) -> Inflation:
        """The history kept in ``store`` (none when missing or unreadable: advisory)."""
        try:
            value = decode(open_entry(store, INFLATION), allow_pickle=False)
            steps = np.asarray(value, dtype=np.float64).reshape(-1, 2)
            return cls((t, v) for t, v in steps.tolist() if math.isfinite(t + v))
        except Exception:  # missing, damaged, written by a newer mlcache: start afresh
            return cls()

    def record(self, store: Store, when: float, value: float) -> None:
        """Append the step ``(when, value)`` and write the history to ``store``
        (a failure only loses the step: advisory)."""
        if value <= self.now:
            return  # L never goes down; an eviction for age alone leaves it
        self.steps = [*self.steps, (when, value)][-HISTORY:]
        self._times = [t for t, _ in self.steps]
        codec = codecs["npy"]
        with contextlib.suppress(Exception), store.write(INFLATION) as f:
            buf = codec.encode(np.asarray(self.steps, dtype=np.float64))
            write_entry(f, codec.name, buf, {"inflation": True}, None)


class EntryCosts:
    """The compute time of each result entry, read from its metadata once per
    process (an entry's cost never changes; its header is small)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: dict[str, float | None] = {}

    def __call__(self, names: Iterable[str]) -> dict[str, float | None]:
        names = list(names)
        for name in names:
            if name not in self._known:
                self._known[name] = _duration(self._store, name)
        # forget the entries gone, so that the dict follows the store's size
        self._known = {n: self._known[n] for n in names}
        return dict(self._known)


def _duration(store: Store, name: str) -> float | None:
    try:
        d = float(read_entry_info(store, name)["duration"])
    except Exception:  # damaged, gone, no duration recorded: unknown
        return None
    return d if math.isfinite(d) and d >= 0 else None


def _rate(cost: float, size: int, typical: float) -> float:
    """Cost per byte, rounded to ``typical`` times a power of :data:`STEP` (the grid
    centred on the typical entry, where timings of equal work gather)."""
    rate = max(cost, COST_FLOOR) / max(size, 1)
    return float(typical * STEP ** round(math.log(rate / typical, STEP)))


def weigh(
    items: Iterable[EntryStat],
    costs: Mapping[str, float | None],
    inflation: Inflation,
    policy: str = "worth",
) -> list[Worth]:
    """Each of ``items`` with its cost (from ``costs``, by name) and priority,
    lowest priority first."""
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}: expected one of {POLICIES}")
    items = list(items)
    rates = sorted(
        max(c, COST_FLOOR) / max(e.size, 1) for e in items if (c := costs.get(e.name)) is not None
    )
    typical = rates[len(rates) // 2] if rates else 1.0  # the median cost per byte
    weighed = []
    for e in items:
        cost = costs.get(e.name)
        guess = cost is None
        if cost is None:
            cost = typical * max(e.size, 1) if rates else 0.0
        if policy == "lru":
            priority = e.last_used
        else:
            priority = inflation.at(e.last_used) + _rate(cost, e.size, typical)
        weighed.append(Worth(e.name, e.size, e.last_used, cost, guess, priority))
    weighed.sort(key=lambda w: (w.priority, w.last_used))
    return weighed


def plan_eviction(
    entries: Iterable[EntryStat],
    *,
    costs: Mapping[str, float | None] | None = None,
    inflation: Inflation | None = None,
    bytes_limit: int | None = None,
    items_limit: int | None = None,
    age_limit: float | None = None,
    protect: Iterable[str] = (),
    policy: str = "worth",
    now: float | None = None,
) -> Plan:
    """What to delete for ``entries`` to fit the limits: everything unused for
    ``age_limit`` seconds, then the lowest priority first (see the module
    docstring) while over ``bytes_limit`` or ``items_limit``.

    ``costs`` maps names to compute seconds (None or missing: unknown);
    ``inflation`` is the store's history (:meth:`Inflation.load`); names in
    ``protect`` are counted and kept.
    """
    keep = set(protect)
    now = time.time() if now is None else now
    inflation = inflation if inflation is not None else Inflation()
    weighed = weigh(entries, costs or {}, inflation, policy)
    total = sum(w.size for w in weighed)
    count = len(weighed)
    chosen: list[Worth] = []
    level = inflation.now
    for w in weighed:  # age first: it does not depend on the order
        if age_limit is not None and now - w.last_used > age_limit and w.name not in keep:
            chosen.append(dataclasses.replace(w, reason="age"))
            total -= w.size
            count -= 1
    gone = {w.name for w in chosen}
    for w in weighed:
        too_big = bytes_limit is not None and total > bytes_limit
        too_many = items_limit is not None and count > items_limit
        if not (too_big or too_many):
            break
        if w.name in keep or w.name in gone:
            continue
        total -= w.size
        count -= 1
        chosen.append(dataclasses.replace(w, reason="worth"))
        if policy == "worth":
            level = max(level, w.priority)
    return Plan(chosen, level)


class SizeGuard:
    """Keeps a cache folder under ``bytes_limit`` as entries are written.

    Room is made *before* an entry is written (:meth:`reserve`), so the cache
    never holds more than the limit while entries are being added, whatever the
    number of writers. The budget is one for results and for the dataset packs
    a :class:`~mlcache.data.CachedDataset` built under the same local folder
    (:mod:`mlcache.store.holdings`); a pack a process has open is counted and
    never removed.

    Scanning the store costs O(entries) (about 12 ms per thousand here), so it is
    not done at every write: each write adds its size to the total of the last
    scan, and the store is scanned and the entries worth least evicted (down
    to ``LOW_WATER`` of the limit) only when that total would pass the limit or
    the last scan is older than ``RESCAN_SECONDS``. Where the store shares a
    counter between processes (:class:`~mlcache.store.SharedCounters`: the local
    store; given as ``counters``), the total is
    that counter, changed by one writer at a time, so that concurrent writers
    from many processes keep within the limit together (and the inflation's
    history is written by one at a time); elsewhere each process
    keeps its own total and sees the others' writes at its next scan.
    """

    #: seconds a write waits for the shared total before keeping the limit alone
    counter_timeout = 30.0
    #: the eviction policy (see :data:`POLICIES`); ``"lru"`` is for comparisons
    policy = "worth"

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
        self._costs = EntryCosts(store)
        renew_at_fork(self)

    def reserve(self, name: str, size: int) -> list[EntryStat]:
        """Make room for ``size`` bytes about to be written under ``name`` (which may
        replace an entry); return the entries (and packs) evicted for it."""
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
        held = packs_held(self._store)
        total = sum(e.size for e in entries) + sum(h.size for h in held)
        removed: list[EntryStat] = []
        if total + size > self.bytes_limit:
            target = min(int(self.bytes_limit * LOW_WATER), self.bytes_limit - size)
            removed = evict(
                self._store,
                entries,
                held,
                self._costs,
                bytes_limit=max(target, 0),
                policy=self.policy,
                now=now,
            )
            total -= sum(e.size for e in removed)
        counter.value, counter.stamp = total + size, now
        return removed

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


def packs_held(store: Store) -> list[Held]:
    """The dataset packs (and anything else registered) under a local store's
    folder, which share its budget; none for another store."""
    if not isinstance(store, LocalFolders):
        return []
    try:
        return held_under(store.local_root)
    except Exception as exc:  # the budget then counts results only, this once
        warn(f"mlcache: could not count the dataset packs beside the cache ({exc})")
        return []


def evict(
    store: Store,
    entries: list[EntryStat],
    held: list[Held],
    costs: Callable[[Iterable[str]], Mapping[str, float | None]],
    *,
    policy: str = "worth",
    now: float | None = None,
    **limits: int | float | None,
) -> list[EntryStat]:
    """Plan (see :func:`plan_eviction`) over result ``entries`` and ``held``
    packs, delete what the plan chose, record the new inflation; what was
    removed."""
    known = dict(costs(e.name for e in entries))
    known.update((h.name, h.cost) for h in held)
    removers = {h.name: h.remove for h in held}
    inflation = Inflation.load(store) if policy == "worth" else Inflation()
    plan = plan_eviction(
        [*entries, *(EntryStat(h.name, h.size, h.last_used) for h in held)],
        costs=known,
        inflation=inflation,
        protect={h.name for h in held if h.in_use},
        policy=policy,
        now=now,
        **limits,  # type: ignore[arg-type]
    )
    removed = []
    for w in plan.chosen:
        try:
            remover = removers.get(w.name)
            if remover is not None:
                remover()
            else:
                store.delete(w.name)
        except (OSError, ValueError):
            continue
        removed.append(w.stat)
    if policy == "worth":
        inflation.record(store, time.time() if now is None else now, plan.inflation)
    return removed


def enforce_limits(
    store: Store,
    *,
    bytes_limit: int | None = None,
    items_limit: int | None = None,
    age_limit: float | None = None,
    entries: Iterable[EntryStat] | None = None,
    policy: str = "worth",
) -> list[EntryStat]:
    """Delete the result entries and dataset packs worth least until the cache
    fits the limits (see :func:`plan_eviction`; the packs as in
    :class:`SizeGuard`). ``entries`` is a listing of results just made, if any.
    Returns what was removed."""
    found = list(result_entries(store) if entries is None else entries)
    return evict(
        store,
        found,
        packs_held(store),
        EntryCosts(store),
        policy=policy,
        bytes_limit=bytes_limit,
        items_limit=items_limit,
        age_limit=age_limit,
    )
