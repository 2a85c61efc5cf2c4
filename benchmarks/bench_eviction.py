"""Eviction by worth: the compute time a cache under a byte budget spends again.

Three traces of calls of one cached function whose results have their own cost
(a sleep: the recorded compute time is what the policy reads) and size (an
array), under a ``bytes_limit`` of a quarter of all the results:

* **uniform**: costs (1-20 ms, log-uniform) and sizes (2-128 KiB, log-uniform)
  independent, every key equally likely at each call;
* **equal costs**: every result costs the same, sizes as above;
* **hot set**: as uniform, but a fifth of the keys take four calls in five.

Each trace runs end to end twice, on a fresh cache folder each time: mlcache's
policy (GreedyDual-Size, :mod:`mlcache.memo.eviction`) and plain LRU (the same
guard ordering by last use), with real ``Memory``, real ``bytes_limit``, real
files. Every key is called once first (those computations are no policy's);
the figure is the compute time the trace then spends computing again, as the
cache's own statistics recorded it (``computed``). A simulation of both policies on the
same trace (exact, in memory, nominal costs) is shown beside it.

Then the bookkeeping a hit pays: the median hit with and without
``bytes_limit``, and the files a run of hits writes before the usage log's
batch (none: a hit writes nothing synchronously).

    python benchmarks/bench_eviction.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import numpy as np

from _bench import (
    Result,
    finish,
    machine_note,
    outcome,
    parse_args,
    print_outcomes,
    report,
    scratch_dir,
)
from mlcache import Memory
from mlcache.memo import eviction


def work(key: int, cost: float, size: int) -> np.ndarray:
    """A result that takes ``cost`` seconds to make and holds ``size`` bytes."""
    time.sleep(cost)
    return np.full(max(size // 8, 1), key, dtype=np.float64)


def make_trace(
    kind: str, n: int, calls: int, seed: int, cost_range: tuple[float, float]
) -> tuple[list[float], list[int], list[int]]:
    """(costs per key, sizes per key, the keys called in order)."""
    rng = random.Random(seed)
    lo, hi = cost_range

    def log_uniform(a: float, b: float) -> float:
        return float(a * (b / a) ** rng.random())

    sizes = [int(log_uniform(2048, 128 * 1024)) for _ in range(n)]
    if kind == "equal costs":
        costs = [(lo * hi) ** 0.5] * n
    else:
        costs = [log_uniform(lo, hi) for _ in range(n)]
    if kind == "hot set":
        hot = rng.sample(range(n), n // 5)
        trace = [rng.choice(hot) if rng.random() < 0.8 else rng.randrange(n) for _ in range(calls)]
    else:
        trace = [rng.randrange(n) for _ in range(calls)]
    return costs, sizes, trace


def run(
    folder: str, policy: str, costs: list[float], sizes: list[int], trace: list[int], limit: int
) -> tuple[float, int]:
    """(compute seconds, misses) that the trace's recomputations cost through a real
    cache, after a first call of every key (those first computations are no policy's)."""
    eviction.SizeGuard.policy = policy
    mem = Memory(folder, verbose=0, bytes_limit=limit)
    f = mem.cache(work)
    for key in range(len(costs)):
        f(key, costs[key], sizes[key])
    mem.flush_usage()
    first = f.stats()
    for key in trace:
        f(key, costs[key], sizes[key])
    mem.flush_usage()
    st = f.stats()
    return st.computed - first.computed, st.misses - first.misses


def simulate(
    policy: str, costs: list[float], sizes: list[int], trace: list[int], limit: int
) -> float:
    """The same trace through an exact, in-memory policy (nominal costs)."""
    held: dict[int, float] = {}  # key -> priority
    level, clock, spent, total = 0.0, 0, 0.0, 0
    for clock, key in enumerate([*range(len(costs)), *trace]):
        if key not in held:
            spent += costs[key] if clock >= len(costs) else 0.0  # the trace's only
            total += sizes[key]
            while total > limit and held:
                out = min(held, key=held.__getitem__)
                lowest = held.pop(out)
                level = max(level, lowest) if policy == "worth" else level
                total -= sizes[out]
        held[key] = level + costs[key] / sizes[key] if policy == "worth" else float(clock)
    return spent


def hot_path(folder: str, hits: int) -> dict[str, float]:
    """Median hit with and without bytes_limit; files written during a run of hits."""
    out: dict[str, float] = {}
    for name, limit in (("no limit", None), ("bytes_limit", 1 << 30)):
        mem = Memory(os.path.join(folder, name), verbose=0, bytes_limit=limit)
        f = mem.cache(work)
        for k in range(20):
            f(k, 0.0, 4096)
        mem.flush_usage()
        before = _mtimes(mem.location)
        times = []
        for i in range(hits):
            t0 = time.perf_counter()
            f(i % 20, 0.0, 4096)
            times.append(time.perf_counter() - t0)
        out[f"written during {hits} hits, {name}"] = float(_changed(mem.location, before))
        out[name] = statistics.median(times)
        mem.flush_usage()
    return out


def _mtimes(root: str) -> dict[str, int]:
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            found[path] = os.stat(path).st_mtime_ns
    return found


def _changed(root: str, before: dict[str, int]) -> int:
    after = _mtimes(root)
    return sum(1 for p, t in after.items() if before.get(p) != t)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        n, calls, trials, cost_range, hits = 20, 80, 1, (0.001, 0.004), 300
    else:
        n, calls, trials, cost_range, hits = 120, 1000, 3, (0.001, 0.020), 2000
    print(f"# bench_eviction\n\n{machine_note()}")
    kinds = ("uniform", "equal costs", "hot set")
    rows: dict[str, Result] = {}
    for kind in kinds:
        for who in ("mlcache", "LRU", "simulated GDS", "simulated LRU"):
            rows[f"{kind}: {who}"] = Result(f"{kind}: {who}", info=who.startswith("simulated"))
    misses: dict[str, list[int]] = {}
    with scratch_dir(args.dir, "eviction") as scratch:
        for trial in range(trials):
            for i, kind in enumerate(kinds):
                costs, sizes, trace = make_trace(kind, n, calls, 1000 * trial + i, cost_range)
                limit = sum(sizes) // 4
                order = ("worth", "lru") if trial % 2 == 0 else ("lru", "worth")
                for policy in order:
                    folder = os.path.join(scratch, f"{trial}-{i}-{policy}")
                    spent, missed = run(folder, policy, costs, sizes, trace, limit)
                    who = "mlcache" if policy == "worth" else "LRU"
                    rows[f"{kind}: {who}"].times.append(spent)
                    misses.setdefault(f"{kind}: {who}", []).append(missed)
                for policy, who in (("worth", "simulated GDS"), ("lru", "simulated LRU")):
                    spent = simulate(policy, costs, sizes, trace, limit)
                    rows[f"{kind}: {who}"].times.append(spent)
            print(f"  trial {trial + 1}/{trials} done", file=sys.stderr, flush=True)
        eviction.SizeGuard.policy = "worth"
        hot = hot_path(os.path.join(scratch, "hot-path"), hits)
    report(
        f"compute seconds spent again: {n} keys, {calls} calls, bytes_limit a quarter "
        f"of the results, {trials} trace(s) per kind",
        rows,
        [],
        note="Times are the seconds of computing results again (what the cache recorded), "
        "not per call; each trial is another trace. Misses per run: "
        + "; ".join(f"{k} {statistics.median(v):.0f}" for k, v in misses.items()),
    )
    # both policies ran the same traces: the ratio is taken trace by trace (minima of
    # different traces would compare different work); "of minima" is here the ratio
    # of the seconds summed over every trace
    out = []
    for kind, bound in (("uniform", 0.6), ("equal costs", 1.0), ("hot set", 1.0)):
        ours, lru = rows[f"{kind}: mlcache"].times, rows[f"{kind}: LRU"].times
        per_trace = statistics.median(a / b for a, b in zip(ours, lru, strict=True))
        out.append(outcome(f"{kind}: mlcache / LRU", per_trace, sum(ours) / sum(lru), "<=", bound))
    print_outcomes(out, "ratio (median of traces | of sums)")
    for kind in kinds:
        sim = rows[f"{kind}: simulated GDS"].median / rows[f"{kind}: simulated LRU"].median
        print(f"\nsimulated, {kind}: GDS / LRU = {sim:.2f}")
    print("\n### the hot path: a hit with the policy's bookkeeping\n")
    print("| | median hit | files written during the hits |")
    print("|---|---:|---:|")
    for name in ("no limit", "bytes_limit"):
        written = hot[f"written during {hits} hits, {name}"]
        print(f"| {name} | {hot[name] * 1e6:.1f} µs | {written:.0f} of {hits} hits |")
    if any(v for k, v in hot.items() if k.startswith("written")):
        print("\nbench_eviction: a hit wrote a file")
        return 1
    return finish(args, "bench_eviction", {"eviction": rows}, out)


if __name__ == "__main__":
    sys.exit(main())
