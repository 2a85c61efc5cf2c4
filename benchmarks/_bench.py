"""Shared machinery of the benchmarks: interleaved trials, tables, targets.

How a measurement is taken (the machine the figures come from is a shared
2-core VM whose freed memory goes back to the host after about a second, and
touching it again then runs ~15x slower; its idle file pages are evicted after
about a minute):

* every contender runs in the same process, side by side;
* trials are interleaved: round ``i`` runs one trial of each contender, in an
  order rotated by ``i``, so drifts of the machine hit everyone alike;
* every timed trial is immediately preceded by an untimed warm-up run of the
  same contender (it makes recently freed memory and the cache files hot);
* we report the minimum and the median per call, and ratios of both.

A target ``num / den >= bound`` (or ``<=``) *holds* when both the ratio of the
medians and the ratio of the minima satisfy it, is *marginal* when only one
does, and *fails* when neither does. In a full run the script exits with 1
unless every target holds; ``--quick`` runs never fail on targets.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "MIB",
    "Contender",
    "Outcome",
    "Result",
    "Target",
    "check_free_disk",
    "disk_size",
    "finish",
    "machine_note",
    "mb",
    "measure",
    "outcome",
    "parse_args",
    "print_outcomes",
    "report",
    "scratch_dir",
]

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
MIB = 1 << 20


@dataclass
class Contender:
    """One thing to time.

    ``call`` is run ``reps`` times per trial (the per-call time is reported);
    ``before``, if given, runs untimed before the warm-up and again before the
    timed trial (e.g. to remove the files a miss wrote), and ``after`` runs
    untimed after the timed trial.
    """

    name: str
    call: Callable[[], Any]
    trials: int
    reps: int = 1
    before: Callable[[], Any] | None = None
    after: Callable[[], Any] | None = None
    info: bool = False  # a breakdown row, not a contender of any target


@dataclass
class Result:
    name: str
    times: list[float] = field(default_factory=list)  # seconds per call, one per trial
    info: bool = False

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@dataclass
class Target:
    """``time(num) / time(den) <op> bound``."""

    label: str
    num: str
    den: str
    op: str  # ">=" or "<="
    bound: float

    def ok(self, ratio: float) -> bool:
        return ratio >= self.bound if self.op == ">=" else ratio <= self.bound


@dataclass
class Outcome:
    label: str
    ratio_median: float
    ratio_min: float
    op: str
    bound: float
    verdict: str  # "holds", "marginal" or "fails"


def parse_args(
    description: str, extra: Callable[[argparse.ArgumentParser], Any] | None = None
) -> argparse.Namespace:
    """The common options (``--quick``, ``--dir``, ``--json``); ``extra`` adds a script's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny smoke run (a few seconds)")
    p.add_argument(
        "--dir",
        default=None,
        help="parent folder of the scratch cache folder (default: the system temp folder)",
    )
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    if extra is not None:
        extra(p)
    return p.parse_args()


@contextlib.contextmanager
def scratch_dir(parent: str | None, tag: str) -> Iterator[str]:
    """A fresh folder for the caches of one run, removed afterwards."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f"mlcache-bench-{tag}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_free_disk(path: str, need: int) -> None:
    """Stop before filling the disk: ``need`` bytes plus a 2 GB margin must be free."""
    free = shutil.disk_usage(path).free
    if free < need + (2 << 30):
        sys.exit(
            f"not enough free disk space under {path}: {free / 1e9:.1f} GB free, "
            f"{need / 1e9:.1f} GB needed plus a 2 GB margin"
        )


def _source_state() -> str:
    """The commit of mlcache measured, and whether ``src/`` differs from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "source state unknown"
    if not head:
        return "source state unknown"
    return f"commit {head}" + (" + uncommitted changes in src/" if dirty else "")


def machine_note() -> str:
    import joblib
    import numpy

    import mlcache

    return (
        f"{_dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {os.cpu_count()} CPUs "
        f"(shared VM), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, numpy {numpy.__version__}, "
        f"joblib {joblib.__version__}, mlcache {mlcache.__version__} ({_source_state()})"
    )


def _timed(c: Contender) -> float:
    call, reps = c.call, c.reps
    gc.disable()  # as timeit does: a collection inside the loop is noise
    try:
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        dt = time.perf_counter() - t0
    finally:
        gc.enable()
    return dt / reps


def measure(contenders: list[Contender], *, progress: bool = True) -> dict[str, Result]:
    """Interleaved trials of every contender, each preceded by a warm-up run."""
    results = {c.name: Result(c.name, info=c.info) for c in contenders}
    rounds = max(c.trials for c in contenders)
    for i in range(rounds):
        active = [c for c in contenders if c.trials > i]
        k = i % len(active)
        for c in active[k:] + active[:k]:
            if c.before is not None:
                c.before()
            gc.collect()
            for _ in range(c.reps):  # warm-up: untimed, same work
                c.call()
            if c.before is not None:
                c.before()
            results[c.name].times.append(_timed(c))
            if c.after is not None:
                c.after()
        if progress:
            print(f"  round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    return results


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


def report(
    title: str, results: dict[str, Result], targets: list[Target], *, note: str = ""
) -> list[Outcome]:
    """Print a markdown table of the results and one of the target ratios."""
    print(f"\n### {title}\n")
    if note:
        print(f"{note}\n")
    print("| contender | trials | min | median |")
    print("|---|---:|---:|---:|")
    for r in results.values():
        name = f"_{r.name}_ (breakdown)" if r.info else r.name
        print(f"| {name} | {len(r.times)} | {_fmt(r.min)} | {_fmt(r.median)} |")
    outcomes = []
    if targets:
        print("\n| ratio | of medians | of minima | target | verdict |")
        print("|---|---:|---:|---:|---|")
    for t in targets:
        num, den = results[t.num], results[t.den]
        r_med = num.median / den.median
        r_min = num.min / den.min
        n_ok = t.ok(r_med) + t.ok(r_min)
        verdict = "holds" if n_ok == 2 else "marginal" if n_ok == 1 else "fails"
        outcomes.append(Outcome(t.label, r_med, r_min, t.op, t.bound, verdict))
        shown = verdict if verdict == "holds" else f"**{verdict.upper()}**"
        print(
            f"| {t.label} | {r_med:.2f} | {r_min:.2f} | {t.op} {t.bound:g} | {shown} |",
            flush=True,
        )
    return outcomes


def outcome(label: str, med: float, mn: float, op: str, bound: float) -> Outcome:
    """The verdict on a figure other than a ratio of two contenders' times (an absolute
    time, a ratio of memory figures): ``med`` from medians, ``mn`` from minima."""

    def ok(r: float) -> bool:
        return r >= bound if op == ">=" else r <= bound

    n_ok = ok(med) + ok(mn)
    verdict = "holds" if n_ok == 2 else "marginal" if n_ok == 1 else "fails"
    return Outcome(label, med, mn, op, bound, verdict)


def print_outcomes(outcomes: list[Outcome], first: str = "ratio") -> None:
    """A table of outcomes, as ``report`` prints its targets; ``first`` heads the label column."""
    print(f"\n| {first} | of medians | of minima | target | verdict |")
    print("|---|---:|---:|---:|---|")
    for o in outcomes:
        shown = o.verdict if o.verdict == "holds" else f"**{o.verdict.upper()}**"
        print(
            f"| {o.label} | {o.ratio_median:.2f} | {o.ratio_min:.2f} | {o.op} {o.bound:g} "
            f"| {shown} |",
            flush=True,
        )


def mb(n: float) -> str:
    """``n`` bytes in MiB (a decimal below 10 MiB)."""
    return f"{n / MIB:,.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.1f} MiB"


def disk_size(path: str) -> int:
    """The bytes of a file, or of every file under a folder."""
    if os.path.isdir(path):
        return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return os.path.getsize(path)


def finish(
    args: argparse.Namespace,
    script: str,
    results: dict[str, dict[str, Result]],
    outcomes: list[Outcome],
) -> int:
    """Write the JSON record if asked; the exit status (1 if a full-run target misses)."""
    if args.json:
        record = {
            "script": script,
            "quick": args.quick,
            "machine": machine_note(),
            "sections": {
                sec: {
                    name: {"times": r.times, "min": r.min, "median": r.median, "info": r.info}
                    for name, r in res.items()
                }
                for sec, res in results.items()
            },
            "targets": [o.__dict__ for o in outcomes],
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    missed = [o for o in outcomes if o.verdict != "holds"]
    if missed and not args.quick:
        labels = ", ".join(o.label for o in missed)
        print(f"\n{script}: {len(missed)} target(s) not held: {labels}")
        return 1
    if args.quick:
        print(f"\n{script}: quick run (sizes too small for the targets to mean anything)")
    return 0
