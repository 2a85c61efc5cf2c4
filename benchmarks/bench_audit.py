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

    python benchmarks/bench_audit.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

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

SHARE = mlcache.AuditPolicy().share


def small(a: int, b: int) -> dict[str, Any]:
    return {"a": a, "b": b, "sum": a + b, "name": "small"}


def slow(i: int) -> int:
    time.sleep(0.001)
    return i * i


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    trials, reps, hits = (3, 300, 3000) if args.quick else (15, 2000, 20000)
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
    return finish(args, "bench_audit", {"hit": results}, outcomes + long_run)


if __name__ == "__main__":
    sys.exit(main())
