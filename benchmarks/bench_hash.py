"""Hashing a (10000, 10000) float64 array (800 MB): mlcache vs joblib vs a plain scan.

The scan, ``x.view(np.uint64).max()``, reads every byte once on one core and
does almost nothing with it: the speed of memory, the ceiling for any hash.

Targets: ``mlcache.hash_value`` at least 20x faster than ``joblib.hash``, and at
least 0.6 of the scan's speed.

    python benchmarks/bench_hash.py [--quick]
"""

from __future__ import annotations

import sys

import joblib
import numpy as np

import mlcache
from _bench import Contender, Target, finish, machine_note, measure, parse_args, report


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n = 1000 if args.quick else 10000
    fast_trials, slow_trials = (3, 3) if args.quick else (21, 5)
    x = np.random.default_rng(0).random((n, n))
    print(f"# bench_hash: ({n}, {n}) float64, {x.nbytes / 1e6:.0f} MB\n\n{machine_note()}")

    contenders = [
        Contender("mlcache.hash_value", lambda: mlcache.hash_value(x), fast_trials),
        Contender("joblib.hash", lambda: joblib.hash(x), slow_trials),
        Contender("scan x.view(np.uint64).max()", lambda: x.view(np.uint64).max(), fast_trials),
    ]
    results = measure(contenders)
    gb = x.nbytes / 1e9
    note = "Throughput at the median: " + ", ".join(
        f"{r.name} {gb / r.median:.2f} GB/s" for r in results.values()
    )
    targets = [
        Target("joblib.hash / mlcache", "joblib.hash", "mlcache.hash_value", ">=", 20),
        Target(
            "mlcache speed / scan speed",
            "scan x.view(np.uint64).max()",
            "mlcache.hash_value",
            ">=",
            0.6,
        ),
    ]
    outcomes = report(f"Hashing a {x.nbytes / 1e6:.0f} MB array", results, targets, note=note)
    return finish(args, "bench_hash", {"hash": results}, outcomes)


if __name__ == "__main__":
    sys.exit(main())
