"""Cache misses: a small function's (what a user meets first), and one that
stores an 800 MB array (what storing costs, against the disk).

(a) A small function (two ints in, a small dict out) missed 200 times per trial
in one process, each call a new key: mlcache against joblib. Target: mlcache's
miss <= joblib's. A breakdown row gives mlcache with ``durable=True`` (an fsync
of each entry and its folder: what survives a power cut costs).

(b) The cached function returns a precomputed (10000, 10000) float64 array, so
the miss is all store (its compute time is measured too, and is microseconds).
Reference: ``numpy.save`` into an open file, then ``f.flush()``, in the same
folder, i.e. what writing these bytes costs on this disk. mlcache's local store
does not fsync by default (a torn or lost write is a checksum miss, never a
wrong value); the fsynced rows, mlcache's ``durable=True`` and ``numpy.save``
with ``os.fsync``, are for information, as joblib's (no fsync).

Target: mlcache's miss <= 1.3x numpy.save.

Files are removed between trials; the scratch folder lives under the system
temp folder unless ``--dir`` says otherwise (``benchmarks/out/`` is gitignored).

    python benchmarks/bench_miss.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import shutil
import sys

import joblib
import numpy as np

import mlcache
from _bench import (
    Contender,
    Target,
    check_free_disk,
    finish,
    machine_note,
    measure,
    parse_args,
    report,
    scratch_dir,
)

ARRAY = np.empty(0)


def produce(i: int) -> np.ndarray:
    return ARRAY


def small(a: int, b: int) -> dict[str, object]:
    return {"sum": a + b, "pair": [a, b]}


def bench_small(root: str, trials: int, calls: int) -> tuple[dict, list]:
    """(a): ``calls`` new keys per trial; every trial's keys are new (a counter)."""
    fresh = iter(range(1 << 40))
    funcs = {
        "mlcache.Memory miss": mlcache.Memory(os.path.join(root, "s-ml"), verbose=0).cache(small),
        "joblib.Memory miss": joblib.Memory(os.path.join(root, "s-jl"), verbose=0).cache(small),
        "mlcache miss, durable=True (fsync)": mlcache.Memory(
            os.path.join(root, "s-ml-sync"), verbose=0, backend_options={"durable": True}
        ).cache(small),
    }

    def misses(f):
        def run() -> None:
            base = next(fresh) * calls
            for i in range(calls):
                f(base + i, 1)

        return run

    results = measure(
        [
            Contender(name, misses(f), trials, info="durable=True" in name)
            for name, f in funcs.items()
        ]
    )
    for r in results.values():  # per call
        r.times = [t / calls for t in r.times]
    outcomes = report(
        f"(a) a small function's miss (compute + store), {calls} new keys per trial",
        results,
        [
            Target(
                "(a) mlcache / joblib, small miss",
                "mlcache.Memory miss",
                "joblib.Memory miss",
                "<=",
                1,
            )
        ],
    )
    return results, outcomes


def _rm(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def main() -> int:
    global ARRAY
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        n, trials, info_trials = 1000, 3, 3
    else:
        n, trials, info_trials = 10000, 7, 5
    ARRAY = np.random.default_rng(0).random((n, n))
    print(f"# bench_miss: ({n}, {n}) float64, {ARRAY.nbytes / 1e6:.0f} MB\n\n{machine_note()}")
    with scratch_dir(args.dir, "miss") as root:
        # at most one file per contender exists at a time
        check_free_disk(root, 6 * ARRAY.nbytes)
        free_before = shutil.disk_usage(root).free
        print(f"\nscratch folder {root}: {free_before / 1e9:.1f} GB free")
        small_results, small_outcomes = bench_small(root, trials, 50 if args.quick else 200)
        ml = mlcache.Memory(os.path.join(root, "ml"), verbose=0).cache(produce)
        ml_sync = mlcache.Memory(
            os.path.join(root, "ml-sync"), verbose=0, backend_options={"durable": True}
        ).cache(produce)
        jl = joblib.Memory(os.path.join(root, "jl"), verbose=0).cache(produce)
        npy = os.path.join(root, "np.npy")
        npy_nosync = os.path.join(root, "np-nosync.npy")

        def np_save(path: str, sync: bool) -> None:
            with open(path, "wb") as f:
                np.save(f, ARRAY)
                f.flush()
                if sync:
                    os.fsync(f.fileno())

        # remove just the entry between trials (its folder stays, as in real use)
        shelves = {}
        for name, f in (("ml", ml), ("ml_sync", ml_sync), ("jl", jl)):
            f(0)  # fingerprint the function, create the folders
            shelves[name] = f.call_and_shelve(0)
            shelves[name].clear()
            assert not f.check_call_in_cache(0)
        ml_clear, ml_sync_clear, jl_clear = (shelves[k].clear for k in ("ml", "ml_sync", "jl"))

        results = measure(
            [
                Contender(
                    "mlcache.Memory miss", lambda: ml(0), trials, before=ml_clear, after=ml_clear
                ),
                Contender(
                    "numpy.save + flush",
                    lambda: np_save(npy_nosync, False),
                    trials,
                    before=lambda: _rm(npy_nosync),
                    after=lambda: _rm(npy_nosync),
                ),
                Contender(
                    "joblib.Memory miss", lambda: jl(0), trials, before=jl_clear, after=jl_clear
                ),
                Contender(
                    "mlcache miss, durable=True (fsync)",
                    lambda: ml_sync(0),
                    info_trials,
                    before=ml_sync_clear,
                    after=ml_sync_clear,
                    info=True,
                ),
                Contender(
                    "numpy.save + flush + fsync",
                    lambda: np_save(npy, True),
                    info_trials,
                    before=lambda: _rm(npy),
                    after=lambda: _rm(npy),
                    info=True,
                ),
                Contender(
                    "compute only (the function, uncached)",
                    lambda: produce(0),
                    trials,
                    reps=1000,
                    info=True,
                ),
            ]
        )
        print(f"{shutil.disk_usage(root).free / 1e9:.1f} GB free after the run", file=sys.stderr)
    compute = results["compute only (the function, uncached)"].median
    gb = ARRAY.nbytes / 1e9
    note = (
        f"The function's compute time is {compute * 1e6:.2f} µs (median), so a miss's time "
        "is its store time. Throughput at the median: "
        + ", ".join(
            f"{r.name} {gb / r.median:.2f} GB/s" for r in results.values() if r.median > 1e-3
        )
    )
    outcomes = report(
        f"(b) Miss storing a {ARRAY.nbytes / 1e6:.0f} MB array",
        results,
        [
            Target(
                "(b) mlcache store / numpy.save",
                "mlcache.Memory miss",
                "numpy.save + flush",
                "<=",
                1.3,
            )
        ],
        note=note,
    )
    return finish(
        args,
        "bench_miss",
        {"small": small_results, "miss": results},
        small_outcomes + outcomes,
    )


if __name__ == "__main__":
    sys.exit(main())
