"""The in-process pass of issue 26: ``ds[i]`` over an open pack of the synthetic
patients (vitals float32[T, 6], age, label, sex, id), in random order, against
the same samples in a Python list, today's reader beside a revision's.

Two passes over 20,000 patients (``--patients``): one reads one value of each
sample (``s["label"]``: what ``ds[i]`` itself costs), the other touches every
field as ``bench_data.py``'s (e) row does. Contenders: the list in memory, the
pack with today's reader, and with the reader of ``--before`` (its ``reader`` and
``regions``, loaded from git as ``bench_reader.py`` does), all in one process.

Timed in CPU time of this process (``time.process_time``), not wall time: the
figures come from a shared 2-core VM whose other jobs steal the CPU for whole
milliseconds, which a wall clock counts and a pass of 20-60 ms cannot absorb.
Rounds are interleaved, their order rotated; min and median per sample, and
the ratios pack / list and after / before.

    python benchmarks/bench_pass.py [--quick] [--dir PARENT] [--before REV] [--patients N]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from _bench import machine_note, parse_args, scratch_dir
from bench_reader import _old_reader
from mlcache.data import pack
from mlcache.data import reader as now
from mlcache.demo.synthetic import read_patient, write_patients


def touch(s: dict[str, Any]) -> float:
    """Use every field of a sample (as bench_data.py's pass does)."""
    return float(s["vitals"].sum()) + s["age"] + s["label"] + len(s["sex"]) + len(s["id"])


def _options(p: Any) -> None:
    p.add_argument("--before", default="9f0a687", help="git revision of 'before'")
    p.add_argument("--patients", type=int, default=20_000, help="patients in the pack")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _options)
    n = 500 if args.quick else args.patients
    rounds = 3 if args.quick else 21
    old = _old_reader(args.before)
    with scratch_dir(args.dir, "pass") as where:
        files = write_patients(os.path.join(where, "src"), n, seed=0)
        samples = [read_patient(f) for f in files]
        path = pack(samples, os.path.join(where, "p.pack"), progress=False).path
        order = np.random.default_rng(1).permutation(n).tolist()
        sources: dict[str, Any] = {"list": samples, "after": now.PackedDataset(path)}
        if old is not None:
            sources["before"] = old.PackedDataset(path)

        def one(ds: Any) -> Callable[[], float]:
            return lambda: sum(ds[i]["label"] for i in order)

        def every(ds: Any) -> Callable[[], float]:
            return lambda: sum(touch(ds[i]) for i in order)

        calls = {
            f"{kind}: {name}": make(ds)
            for kind, make in (("one value", one), ("every field", every))
            for name, ds in sources.items()
        }
        totals = {label: call() for label, call in calls.items()}  # warm-up, and the check
        for label, total in totals.items():
            kind = label.partition(":")[0]
            if total != totals[f"{kind}: list"]:
                raise AssertionError(
                    f"{label}: total {total}, the list gives {totals[kind + ': list']}"
                )
        times: dict[str, list[float]] = {label: [] for label in calls}
        labels = list(calls)
        for r in range(rounds):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                t0 = time.process_time()
                calls[label]()
                times[label].append(time.process_time() - t0)
    print(f"\n### The in-process pass, {n:,} patients, CPU µs per sample ({machine_note()})\n")
    head = ["pass", "trials", "min", "median", "/ list (min)", "(median)"]
    print("| " + " | ".join([*head, "after / before (min)", "(median)"]) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, ts in times.items():
        kind, _, name = label.partition(": ")
        mn, med = min(ts), statistics.median(ts)
        base = times[f"{kind}: list"]
        cells = [f"{mn / n * 1e6:.2f}", f"{med / n * 1e6:.2f}"]
        cells += [f"{mn / min(base):.2f}", f"{med / statistics.median(base):.2f}"]
        before = times.get(f"{kind}: before")
        if name == "after" and before is not None:
            cells += [f"{mn / min(before):.2f}", f"{med / statistics.median(before):.2f}"]
        else:
            cells += ["", ""]
        print(f"| {label} | {len(ts)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
