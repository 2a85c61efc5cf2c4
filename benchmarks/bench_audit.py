"""What the cache's self-check costs (issue 25, :mod:`mlcache.memo.audit`).

(a) The hit path's bookkeeping: a small call (two ints in, a small dict out)
    hit over and over, by a Memory with audits on (the default) and one with
    ``audit=False``, side by side. The function computes in microseconds, so it
    saves nothing and is never audited: the difference is the bookkeeping alone
    (two clock reads, a dict lookup, the budget's arithmetic). Target: on / off
    <= 1.05 (within noise).
(b) The audits' share of the time saved over a long run of hits: a 1 ms
    function (``time.sleep``) over 20 keys, hit 20,000 times (3,000 with
    ``--quick``) in one process; the seconds the audits spent computing against
    the seconds the hits saved, from the function's statistics (``mlcache ls``
    shows the same counts). Target: <= the budget, 2%.
(c) The dataset read path's bookkeeping (:mod:`mlcache.data.audit`): ``ds[i]`` of a
    sealed pack of 2,000 small samples (a 16-float array, an int, a str), through
    a ``CachedDataset`` with audits on (the default) and one with ``audit=False``
    over the same pack, side by side. Its ``load_item`` takes microseconds, so the
    pack saves too little to audit: the difference is the counter and the
    comparison a read adds. Target: on / off <= 1.05 (within noise).
(d) The dataset audits' share of the load time saved: 200 items of a 1 ms
    ``load_item`` (``time.sleep``) filled by a first pass, then read 40 passes
    (15 with ``--quick``) in one process; each load after the first pass is an audit's
    (the load logs its own time): their seconds against the loads the audited
    passes avoided (every pass from the third: the fill's pass and the next are
    never audited). Target: <= the budget, 2%.

    python benchmarks/bench_audit.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import mlcache
from _bench import (
    Contender,
    Outcome,
    Target,
    finish,
    machine_note,
    measure,
    outcome,
    parse_args,
    print_outcomes,
    report,
    scratch_dir,
)
from mlcache.data import CachedDataset

SHARE = mlcache.AuditPolicy().share


def small(a: int, b: int) -> dict[str, Any]:
    return {"a": a, "b": b, "sum": a + b, "name": "small"}


def slow(i: int) -> int:
    time.sleep(0.001)
    return i * i


class Small(CachedDataset):
    """2,000 small samples, loaded in microseconds: (c)."""

    def __init__(self, root: str, **kw: Any) -> None:
        super().__init__(cache_dir=root, progress=False, **kw)

    def source_items(self) -> range:
        return range(2000)

    def load_item(self, i: int) -> dict[str, Any]:
        return {"x": np.full(16, i, dtype=np.float32), "label": i % 10, "name": f"s{i}"}


class Timed(CachedDataset):
    """``n`` items of a 1 ms load, each load's seconds logged: (d)."""

    def __init__(self, root: str, n: int, **kw: Any) -> None:
        self.n = n
        self.took: list[float] = []
        super().__init__(cache_dir=root, progress=False, **kw)

    cache_ignore = ("took",)

    def source_items(self) -> range:
        return range(self.n)

    def load_item(self, i: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        time.sleep(0.001)
        sample = {"x": np.full(16, i, dtype=np.float32)}
        self.took.append(time.perf_counter() - t0)
        return sample


def datasets(root: str, trials: int, reps: int, passes: int) -> tuple[list[Outcome], Any]:
    """(c) and (d); returns their outcomes and (c)'s results."""
    Small(root)[0]  # filled (as read) and sealed by one pass
    filling = Small(root)
    for i in range(len(filling)):
        filling[i]
    on, off = Small(root), Small(root, audit=False)
    order = np.random.default_rng(0).permutation(len(on)).tolist()
    cursor = {"on": 0, "off": 0}

    def read(ds: Small, key: str) -> None:
        k = cursor[key]
        ds[order[k]]
        cursor[key] = (k + 1) % len(order)

    results = measure(
        [
            Contender("ds[i], audit on (the default)", lambda: read(on, "on"), trials, reps),
            Contender("ds[i], audit=False", lambda: read(off, "off"), trials, reps),
        ]
    )
    outcomes = report(
        "(c) The dataset read path's bookkeeping",
        results,
        [
            Target(
                "(c) ds[i]: audit on / off",
                "ds[i], audit on (the default)",
                "ds[i], audit=False",
                "<=",
                1.05,
            )
        ],
    )
    n = 200
    ds = Timed(os.path.join(root, "timed"), n)
    t0 = time.perf_counter()
    filled = 0
    for k in range(passes):
        for i in np.random.permutation(n).tolist():
            ds[i]
        if k == 0:  # the fill's loads, and the seal's probes (mlcache.data.frozen)
            filled = len(ds.took)
    wall = time.perf_counter() - t0
    fill, audits = ds.took[:n], ds.took[filled:]
    saved = (passes - 2) * n * (sum(fill) / n)
    share = sum(audits) / saved if saved else 0.0
    print(
        f"\n### (d) Audits over {passes} passes of {n} items of a 1 ms load_item\n\n"
        f"a load took {sum(fill) / n * 1e3:.2f} ms; {len(audits)} audit loads "
        f"({len(audits) / (n * (passes - 2)):.2%} of the audited passes' reads); the "
        f"audited passes saved {saved:.2f} s, the audits spent {sum(audits) * 1e3:.1f} ms: "
        f"**{share:.2%}** of the time saved (budget {SHARE:.0%}); the loop took {wall:.2f} s"
    )
    long_run = [outcome("(d) dataset audit seconds / seconds saved", share, share, "<=", SHARE)]
    print_outcomes(long_run)
    return outcomes + long_run, results


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    trials, reps, hits = (3, 300, 3000) if args.quick else (15, 2000, 20000)
    passes = 15 if args.quick else 40
    print(f"# bench_audit\n\n{machine_note()}")
    if os.environ.get("MLCACHE_AUDIT", "").strip().lower() in ("0", "false", "off", "no"):
        print("\nMLCACHE_AUDIT turns audits off: unset it to measure them")
    with scratch_dir(args.dir, "audit") as root:
        on = mlcache.Memory(os.path.join(root, "on"), verbose=0).cache(small)
        off = mlcache.Memory(os.path.join(root, "off"), verbose=0, audit=False).cache(small)
        for f in (on, off):
            for _ in range(3):  # stored, then kept by the in-process tier
                f(1, 2)
            time.sleep(0.05)
        results = measure(
            [
                Contender("small hit, audit on (the default)", lambda: on(1, 2), trials, reps),
                Contender("small hit, audit=False", lambda: off(1, 2), trials, reps),
            ]
        )
        outcomes = report(
            "(a) The hit path's bookkeeping",
            results,
            [
                Target(
                    "(a) small hit: audit on / off",
                    "small hit, audit on (the default)",
                    "small hit, audit=False",
                    "<=",
                    1.05,
                )
            ],
        )

        f = mlcache.Memory(os.path.join(root, "long"), verbose=0).cache(slow)
        t0 = time.perf_counter()
        for i in range(hits + 20):
            f(i % 20)
        wall = time.perf_counter() - t0
        st = f.stats()
        for g in (on, off):  # the usage notes, written now: not into a removed folder at exit
            g.memory.flush_usage()
        data_outcomes, data_results = datasets(os.path.join(root, "datasets"), trials, reps, passes)
    share = st.audited / st.saved if st.saved else 0.0
    print(
        f"\n### (b) Audits over {st.hits:,} hits of a 1 ms function (20 keys)\n\n"
        f"hits {st.hits:,}, misses {st.misses}, audits {st.audits} "
        f"({st.audits / max(st.hits, 1):.2%} of the hits), mismatches {st.mismatches}; "
        f"the hits saved {st.saved:.2f} s, the audits spent {st.audited * 1e3:.1f} ms: "
        f"**{share:.2%}** of the time saved (budget {SHARE:.0%}); the loop took {wall:.2f} s"
    )
    long_run: list[Outcome] = [
        outcome("(b) audit seconds / seconds saved", share, share, "<=", SHARE)
    ]
    print_outcomes(long_run)
    return finish(
        args,
        "bench_audit",
        {"hit": results, "read": data_results},
        outcomes + long_run + data_outcomes,
    )


if __name__ == "__main__":
    sys.exit(main())
