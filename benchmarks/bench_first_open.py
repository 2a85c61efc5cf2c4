"""Issue 26: the first open of a file dataset (the construction of a
``CachedDataset`` on an empty cache), and its reopen, against the code before.

The dataset is ``bench_fill.py --parser read_patient``'s: ``source_items()`` lists
a folder that is also the attribute ``self.root`` (``os.listdir``, sorted, joined),
``load_item`` parses a file of :func:`mlcache.demo.synthetic.write_patients`
(20,000 by default, ``--files N``). What is timed, inside a fresh process after
its imports, is the constructor alone:

* ``empty``: on an empty cache folder (a new one each trial): the folder
  attribute walked, the items listed, keyed and fingerprinted (one ``stat`` a
  file), the names the items give, the records of the walk;
* ``reopen``: on a cache whose pack was filled (``fill="up-front"``, once, by the
  same code), with the default check (``check_source="open"``);
* ``floor``: what a plain loop over the files pays before its first sample (one
  ``os.listdir``), and ``listdir + stat``: one ``stat`` a file besides.

``--before SRC`` adds the same two with the ``src`` folder of another checkout
(the code before) on ``PYTHONPATH``; the contenders alternate, one of each a
round in an order rotated by the round, and min and median are reported. ::

    python benchmarks/bench_first_open.py [--quick] [--files N] [--rounds K]
        [--before SRC] [--data FOLDER] [--dir PARENT]

``--data`` reuses a folder of patient files (written there when missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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

#: the dataset, in its own small module (a class's code version walks its module)
PATIENTS = """
import os, time
from mlcache.data import CachedDataset
from mlcache.demo.synthetic import read_patient


class Patients(CachedDataset):
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        names = sorted(os.listdir(self.root))
        return [os.path.join(self.root, n) for n in names if n.endswith(".csv")]

    def load_item(self, item):
        return read_patient(item)


def write(root, n):
    from mlcache.demo.synthetic import write_patients

    write_patients(root, n)
    return 0.0


def fill(root, cache):
    Patients(root, cache_dir=cache, progress=False, fill="up-front")
    return 0.0


def construct(root, cache):
    t0 = time.perf_counter()
    Patients(root, cache_dir=cache, progress=False)
    return time.perf_counter() - t0


def floor(root, stat):
    t0 = time.perf_counter()
    names = sorted(os.listdir(root))
    if stat:
        for n in names:
            os.stat(os.path.join(root, n))
    return time.perf_counter() - t0
"""

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _in_new_process(where: str, src: str, code: str) -> float:
    """Run ``code`` (importing ``patients``) in a fresh interpreter with ``src`` on
    ``PYTHONPATH``; the float it prints last."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    out = subprocess.run(
        [sys.executable, "-c", f"import patients; print({code})"],
        env=env,
        cwd=where,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.split()[-1])


def main() -> int:
    def options(p: Any) -> None:
        p.add_argument("--files", type=int, default=None, help="patient files (20,000)")
        p.add_argument("--rounds", type=int, default=None, help="trials of each (7)")
        p.add_argument("--before", default=None, help="src folder of the code before")
        p.add_argument("--data", default=None, help="a folder of patient files to reuse")

    args = parse_args(__doc__.splitlines()[0], options)
    n = args.files or (300 if args.quick else 20_000)
    rounds = args.rounds or (2 if args.quick else 7)
    print(machine_note())
    versions = {"after": SRC, **({"before": args.before} if args.before else {})}
    with scratch_dir(args.dir, "first-open") as scratch:
        where = str(scratch)
        Path(where, "patients.py").write_text(PATIENTS)
        data = args.data or os.path.join(where, "patients")
        _in_new_process(where, SRC, f"patients.write({data!r}, {n})")
        for name, src in versions.items():  # each version fills its own pack
            cache = os.path.join(where, f"filled-{name}")
            _in_new_process(where, src, f"patients.fill({data!r}, {cache!r})")
            _in_new_process(where, src, f"patients.construct({data!r}, {cache!r})")
        runs: dict[str, tuple[str, str]] = {}
        for name, src in versions.items():
            runs[f"empty cache, {name}"] = (src, "empty")
            runs[f"reopen, {name}"] = (src, os.path.join(where, f"filled-{name}"))
        runs["floor: listdir"] = (SRC, "listdir")
        runs["floor: listdir + stat"] = (SRC, "stat")
        times: dict[str, list[float]] = {k: [] for k in runs}
        names = list(runs)
        for r in range(rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                src, what = runs[k]
                if what in ("listdir", "stat"):
                    code = f"patients.floor({data!r}, {what == 'stat'})"
                    times[k].append(_in_new_process(where, src, code))
                    continue
                cache = what
                if what == "empty":
                    cache = os.path.join(where, f"empty-{r}-{len(times[k])}")
                times[k].append(
                    _in_new_process(where, src, f"patients.construct({data!r}, {cache!r})")
                )
                if what == "empty":
                    shutil.rmtree(cache, ignore_errors=True)
        results = {k: Result(k, times[k]) for k in names}
        report(f"The construction of a file dataset, {n:,} files, fresh processes", results, [])
        outcomes = []
        for moment in ("empty cache", "reopen"):
            if args.before:
                a, b = results[f"{moment}, after"], results[f"{moment}, before"]
                bound = 1.0 if moment == "empty cache" else 1.1
                label = f"{moment}: after / before"
                outcomes.append(outcome(label, a.median / b.median, a.min / b.min, "<=", bound))
        if outcomes:
            print_outcomes(outcomes)
        floor = results["floor: listdir + stat"]
        for moment in ("empty cache", "reopen"):
            for name in versions:
                r = results[f"{moment}, {name}"]
                print(
                    f"{moment}, {name} / listdir + stat: {r.median / floor.median:.2f} (medians), "
                    f"{r.min / floor.min:.2f} (minima)"
                )
    return finish(args, "bench_first_open", {"first open": results}, outcomes)


if __name__ == "__main__":
    sys.exit(main())
