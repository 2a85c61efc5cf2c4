"""Datasets (issue 17): the first epoch, later epochs and one edited file, against
reading the files and the hand-written pickled list.

The source: per-patient CSV files (3,000 by default, ``--files N``; 100 with
``--quick``, a smoke run without warm-ups), generated once into the scratch
folder: 24 to 48 hourly rows of the six vitals of :mod:`mlcache.demo.synthetic`
(floats) and a ``label`` column, each parsed by ``pandas.read_csv`` into
``{"x": float32[T, 6], "label": int}``. The mlcache dataset is a
``CachedDataset`` with ``source_items()`` (the sorted paths) and
``load_item(path)`` (that same parse); ``--source declared`` uses a declared
``source_dir`` + ``source_glob`` with ``load_item`` instead. An epoch reads
every sample once and sums one value of each (a trivial pass).

Contenders, side by side in one run (each trial in a fresh process, so no module
cache, no open pack and no code-version memo of an earlier trial helps; the
figures are timed inside that process, after its imports):

* ``files``: ``read_csv`` of each file, in order, and the pass;
* ``pickled list``: the hand-rolled cache; its first run loads every file, dumps
  the list into one file with ``pickle`` and makes the pass; a later run is
  ``pickle.load`` and the pass;
* ``mlcache, empty cache``: the first epoch, from the construction of the dataset
  on an empty cache folder: the **time to the first sample** (construction and
  ``ds[0]``, or the first index of the shuffled order) and the **whole epoch**
  (construction and ``ds[i]`` of every index), in order and in a shuffled order;
* ``mlcache, later epoch``: a new process opens the full cache and reads every index;
* ``mlcache, one file edited``: one file of a copy of the source rewritten with new
  values (a new modification time) before the trial, then the open and the epoch,
  with the **number of items re-read** and a check that the edited sample comes
  back with its new values. ``load_item`` counts its calls: in memory in the
  trials that load in their own process (no cost a user's loader would not pay,
  as the files contender pays none), and by a byte appended to a counter file in
  the DataLoader trials, whose workers load (~2 µs an item there);
* with torch installed: one epoch through ``torch.utils.data.DataLoader``
  (``num_workers=2``, batches of 64, shuffled) over the files, over mlcache with an
  empty cache (the first epoch, construction included) and over the full cache.

Every timed trial is preceded by an untimed warm-up run of the same contender
(a fresh empty cache for first epochs; another edited file for the edit), so the
source files are in the page cache for every contender alike (the VM evicts file
pages idle for about a minute). Trials are interleaved, one of each contender a
round, in an order rotated by the round; min and median are reported.

* ``mlcache: up-front build + epoch``: ``fill="up-front"`` on an empty cache (the
  pack built at the construction), then every ``ds[i]``: the build + first epoch of
  a dataset that is built before it is read.

``--parser read_patient`` (issue 26) uses the demo's files and parser instead
(:func:`mlcache.demo.synthetic.write_patients`: 12 to 96 hourly rows and a header
of demographics, parsed by :func:`~mlcache.demo.synthetic.read_patient`, ~0.15-0.45
ms a file, three to ten times cheaper than ``read_csv``), which shows what filling
itself costs; ``--fill-only`` times only the files, the pickled list's first run
and the first epochs (no later epoch, no edit, no DataLoader). Each epoch in one
process also gives the time *outside* ``load_item``, a sample (the epoch less the
time its process spent in the loads, the count included): what the
cache costs beside the parse, less at the mercy of a busy machine than a ratio
of two epochs (the parse is the bulk of either).

Targets (issue 17): the first sample within 1 s of the construction; the whole
first epoch at most 1.3x the epoch over the files (in order and shuffled); a later
epoch at least 20x faster than the files; at most 5 items re-read after one edit.
With ``read_patient`` (issue 26): the first epoch at most 1.15x the files, and
the build + first epoch (the first epoch of an empty cache builds the pack) no
slower than the pickled list's first run (load every file, ``pickle.dump`` the
list, an epoch over it).
The up-front parallel build (``num_workers=0`` and ``2``) is ``bench_build.py``'s. ::

    python benchmarks/bench_fill.py [--quick] [--files N] [--trials K] [--dir PARENT]
        [--source items|declared] [--parser pandas|read_patient] [--fill-only]
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from _bench import (
    Result,
    Target,
    finish,
    machine_note,
    outcome,
    parse_args,
    print_outcomes,
    report,
    scratch_dir,
)
from mlcache.data import CachedDataset
from mlcache.demo.synthetic import VITALS, read_patient, write_patients

COLUMNS = [*VITALS, "label"]
_MEAN = np.array([80.0, 120.0, 75.0, 97.0, 37.0, 16.0])
_SPREAD = np.array([12.0, 15.0, 10.0, 2.0, 0.6, 3.0])
#: the seed of the shuffled order of every shuffled epoch
ORDER_SEED = 17


# -- the source -------------------------------------------------------------------------
def write_patient(path: Path, rng: np.random.Generator) -> None:
    """One patient's CSV file: 24 to 48 hourly rows of the vitals and a label."""
    hours = int(rng.integers(24, 49))
    vitals = _MEAN + _SPREAD * rng.normal(0, 1, size=(hours, len(VITALS)))
    label = int(rng.integers(0, 2))
    rows = "\n".join(",".join(f"{v:.2f}" for v in row) + f",{label}" for row in vitals)
    path.write_text(",".join(COLUMNS) + "\n" + rows + "\n")


def write_source(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` patient files ``p00000.csv``... in ``folder``; their sorted paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = [folder / f"p{i:05d}.csv" for i in range(n)]
    for p in paths:
        write_patient(p, rng)
    return paths


def read_with_pandas(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse one patient file with pandas, as a user's loader would."""
    import pandas as pd

    df = pd.read_csv(path)
    return {"x": df[list(VITALS)].to_numpy(np.float32), "label": int(df["label"].iat[0])}


#: the parser of this process's trial (``--parser``): pandas, or the demo's own
PARSERS = {"pandas": read_with_pandas, "read_patient": read_patient}
#: the field of a sample the trivial pass touches, by parser
ARRAY_FIELD = {"pandas": "x", "read_patient": "vitals"}
_parser = "pandas"


def load_patient(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse one patient file with this trial's parser."""
    return PARSERS[_parser](path)


def listing(folder: str) -> list[str]:
    """The source's files, sorted (one ``listdir``)."""
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".csv")]


#: the ``counter`` of the trials that load in their own process: counted in memory
IN_PROCESS = "in-process"
#: loads counted in memory (:data:`IN_PROCESS`)
_loaded = [0]


def _count(counter: str | None) -> None:
    """Count a load: in memory (:data:`IN_PROCESS`), or one byte appended to the
    counter file (a load in whichever process made it: DataLoader workers)."""
    if counter == IN_PROCESS:
        _loaded[0] += 1
    elif counter is not None:
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)


#: seconds this trial's process spent inside ``load_item`` (the count and the parse)
_inside = [0.0]


def timed_load(item: str, counter: str | None) -> dict[str, Any]:
    """The count and the parse of one item, their time added to :data:`_inside`:
    what is left of an epoch is what the cache (or the pass) costs."""
    t0 = time.perf_counter()
    try:
        _count(counter)
        return load_patient(item)
    finally:
        _inside[0] += time.perf_counter() - t0


class Patients(CachedDataset):
    """``source_items()`` and ``load_item()``: issue 17's dataset."""

    cache_ignore = ("counter",)

    def __init__(self, root: str, counter: str | None = None, **kw: Any) -> None:
        self.root, self.counter = root, counter
        super().__init__(**kw)

    def source_items(self) -> list[str]:
        return listing(self.root)

    def load_item(self, item: str) -> dict[str, Any]:
        return timed_load(item, self.counter)


class DeclaredPatients(CachedDataset):
    """The same dataset with a declared source (``source_dir`` + ``source_glob``)."""

    cache_ignore = ("counter",)
    source_glob = "*.csv"

    def __init__(self, root: str, counter: str | None = None, **kw: Any) -> None:
        self.source_dir, self.counter = root, counter
        super().__init__(**kw)

    def load_item(self, item: str) -> dict[str, Any]:
        return timed_load(item, self.counter)


class Files:
    """The baseline as a map-style dataset: parse the file at each read."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return load_patient(self.paths[i])


def as_list(batch: list[Any]) -> list[Any]:
    """The DataLoader's collate: the samples as they are (variable lengths)."""
    return batch


def _touch(sample: Any) -> float:
    """The trivial pass's work on one sample."""
    return float(sample[ARRAY_FIELD[_parser]][0, 0])


# -- one trial, in a fresh process ------------------------------------------------------
def _order(n: int, shuffled: bool) -> list[int]:
    if not shuffled:
        return list(range(n))
    return [int(i) for i in np.random.default_rng(ORDER_SEED).permutation(n)]


def _loads(counter: str | None) -> int:
    if counter == IN_PROCESS:
        return _loaded[0]
    try:
        return os.path.getsize(counter) if counter else 0
    except FileNotFoundError:
        return 0


def _same(a: Any, b: dict[str, Any]) -> bool:
    x = ARRAY_FIELD[_parser]
    return bool(np.array_equal(np.asarray(a[x]), b[x]) and int(a["label"]) == b["label"])


def _loader_epoch(dataset: Any, t0: float) -> tuple[float, float]:
    """One DataLoader epoch (2 workers, batches of 64, shuffled): seconds from
    ``t0`` to the first batch and to the end."""
    import torch

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=2,
        collate_fn=as_list,
        generator=torch.Generator().manual_seed(ORDER_SEED),
    )
    first, total = None, 0.0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        total += sum(_touch(s) for s in batch)
    return first or 0.0, time.perf_counter() - t0


def trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one trial as ``spec`` says; its figures (seconds, loads, checks)."""
    global _parser
    kind, src = spec["kind"], spec["src"]
    _parser = spec.get("parser", "pandas")
    cls = DeclaredPatients if spec.get("source") == "declared" else Patients
    counter = spec.get("counter")
    if counter and counter != IN_PROCESS:
        Path(counter).unlink(missing_ok=True)
    opts: dict[str, Any] = {"cache_dir": spec.get("cache"), "progress": False}
    if spec.get("fill"):
        opts["fill"] = spec["fill"]
    if kind in ("files-loader", "mlcache-loader"):
        import torch  # noqa: F401 (imported before the timing, as a training script has)
    t0 = time.perf_counter()
    if kind == "files":
        paths = listing(src)
        total = sum(_touch(timed_load(p, None)) for p in paths)
        took = time.perf_counter() - t0
        return {"total": took, "sum": total, "outside": (took - _inside[0]) / len(paths)}
    if kind == "pickle-first":
        samples = [load_patient(p) for p in listing(src)]
        with open(spec["pickle"], "wb") as f:
            pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)
        total = sum(_touch(s) for s in samples)
        return {"total": time.perf_counter() - t0, "sum": total}
    if kind == "pickle-later":
        with open(spec["pickle"], "rb") as f:
            samples = pickle.load(f)
        total = sum(_touch(s) for s in samples)
        return {"total": time.perf_counter() - t0, "sum": total}
    if kind == "files-loader":
        first, took = _loader_epoch(Files(listing(src)), t0)
        return {"first": first, "total": took}
    if kind == "mlcache-loader":
        first, took = _loader_epoch(cls(src, counter, **opts), t0)
        return {"first": first, "total": took, "loads": _loads(counter)}
    # mlcache, ds[i]: the construction, the first sample, then the rest
    ds = cls(src, counter, **opts)
    opened = time.perf_counter() - t0
    order = _order(len(ds), spec.get("shuffled", False))
    total = _touch(ds[order[0]])
    first = time.perf_counter() - t0
    for i in order[1:]:
        total += _touch(ds[i])
    took = time.perf_counter() - t0
    result: dict[str, Any] = {
        "open": opened,
        "first": first,
        "total": took,
        "loads": _loads(counter),
        "sum": total,
        "outside": (took - _inside[0]) / len(order),  # a sample: beside its load
    }
    paths = listing(src)
    checked = {0, len(paths) - 1, *spec.get("check", [])}
    result["wrong"] = [k for k in sorted(checked) if not _same(ds[k], load_patient(paths[k]))]
    result["samples"] = len(ds)
    return result


def run_trial(spec: dict[str, Any], scratch: str) -> dict[str, Any]:
    """:func:`trial` in a fresh ``python bench_fill.py --trial`` process."""
    out = os.path.join(scratch, "trial.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--trial", json.dumps(spec), out]
    env = None
    if spec.get("pythonpath"):  # another version of mlcache (--before)
        env = {**os.environ, "PYTHONPATH": spec["pythonpath"]}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"trial {spec['kind']} failed ({res.returncode}):\n{res.stderr}")
    if res.stderr.strip():  # a warning the cache gave: shown, never hidden
        print(f"  [{spec['kind']}] {res.stderr.strip()[:2000]}", file=sys.stderr)
    with open(out) as f:
        figures: dict[str, Any] = json.load(f)
    os.unlink(out)
    return figures


# -- the run ----------------------------------------------------------------------------
class Bench:
    """The contenders of one run, their folders and what their trials recorded."""

    def __init__(
        self,
        scratch: str,
        n: int,
        source: str,
        torch_too: bool,
        quick: bool,
        parser: str = "pandas",
        fill_only: bool = False,
        before: str | None = None,
    ) -> None:
        self.scratch, self.source, self.quick, self.parser = scratch, source, quick, parser
        self.src = os.path.join(scratch, "source")
        self.edited_src = os.path.join(scratch, "source-edited")
        self.pickle = os.path.join(scratch, "patients.pkl")
        self.counter = os.path.join(scratch, "loads")
        self.rng = np.random.default_rng(1)
        self.edits = 0
        self.results: dict[str, Result] = {}
        self.loads: dict[str, list[int]] = {}
        self.wrong: dict[str, list[int]] = {}
        self.runs = 0
        t0 = time.perf_counter()
        if parser == "read_patient":
            write_patients(self.src, n, seed=0)
        else:
            write_source(Path(self.src), n)
        if not fill_only:
            shutil.copytree(self.src, self.edited_src)
        print(f"wrote {n:,} patient CSV files in {time.perf_counter() - t0:.1f} s", flush=True)
        self.contenders: list[tuple[str, dict[str, Any]]] = [
            ("files", {"kind": "files"}),
            ("pickled list: first run", {"kind": "pickle-first"}),
            ("mlcache: empty cache, in order", {"kind": "mlcache", "fresh": True}),
            (
                "mlcache: empty cache, shuffled",
                {"kind": "mlcache", "fresh": True, "shuffled": True},
            ),
            (
                "mlcache: up-front build + epoch",
                {"kind": "mlcache", "fresh": True, "fill": "up-front"},
            ),
        ]
        if before:  # the same first epochs with another version of mlcache, interleaved
            self.contenders += [
                (f"before: {name}", {**spec, "pythonpath": os.path.abspath(before)})
                for name, spec in self.contenders
                if name.startswith("mlcache")
            ]
        if fill_only:
            return
        self.contenders += [
            ("pickled list: later run", {"kind": "pickle-later"}),
            ("mlcache: later epoch", {"kind": "mlcache", "cache": "full"}),
            ("mlcache: one file edited", {"kind": "mlcache", "cache": "edit", "edit": True}),
        ]
        if torch_too:
            self.contenders += [
                ("DataLoader(2 workers): files", {"kind": "files-loader"}),
                (
                    "DataLoader(2 workers): mlcache, empty cache",
                    {"kind": "mlcache-loader", "fresh": True},
                ),
                (
                    "DataLoader(2 workers): mlcache, full cache",
                    {"kind": "mlcache-loader", "cache": "full-loader"},
                ),
            ]
        # the caches later runs open, and the pickle, made once, untimed
        self._run({"kind": "pickle-first"})
        for name in ("full", "full-loader", "edit"):
            src = self.edited_src if name == "edit" else self.src
            for _ in range(1 if quick else 2):  # the first may fill it, the second open it
                self._run({"kind": "mlcache", "cache": self._cache(name), "src": src})

    def _cache(self, name: str) -> str:
        return os.path.join(self.scratch, "caches", name)

    def _run(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        spec = {
            "src": self.src,
            "pickle": self.pickle,
            "source": self.source,
            "parser": self.parser,
            **spec,
        }
        return run_trial(spec, self.scratch)

    def _edit(self) -> int:
        """Rewrite one file of the edited copy with new values; its index."""
        paths = listing(self.edited_src)
        k = (self.edits * 7919 + len(paths) // 2) % len(paths)
        self.edits += 1
        if self.parser == "read_patient":  # the demo's format: a new patient in its place
            new = write_patients(os.path.join(self.scratch, "new"), 1, seed=1000 + self.edits)
            shutil.move(str(new[0]), paths[k])
        else:
            write_patient(Path(paths[k]), self.rng)
        return k

    def once(self, name: str, template: dict[str, Any], timed: bool) -> None:
        spec = {k: v for k, v in template.items() if k not in ("fresh", "edit")}
        if template.get("fresh"):
            spec["cache"] = os.path.join(self.scratch, "caches", f"empty-{self.runs}")
        elif "cache" in spec:
            spec["cache"] = self._cache(spec["cache"])
        if spec["kind"] == "mlcache":  # loads in the trial's process (num_workers=0)
            spec["counter"] = IN_PROCESS
        elif spec["kind"] == "mlcache-loader":
            spec["counter"] = self.counter
        if template.get("edit"):
            spec["src"] = self.edited_src
            spec["check"] = [self._edit()]
        figures = self._run(spec)
        if template.get("fresh"):
            shutil.rmtree(spec["cache"], ignore_errors=True)  # one empty cache a trial
        if not timed:
            return
        self._record(name, figures)

    def _record(self, name: str, figures: dict[str, Any]) -> None:
        rows = {name: figures["total"]}
        if "first" in figures and not name.endswith(("later epoch", "edited", "full cache")):
            what = "first batch" if "DataLoader" in name else "first sample"
            rows[f"{name}: {what}"] = figures["first"]
        elif "open" in figures:  # how much of a later epoch is the construction
            rows[f"{name}: construction"] = figures["open"]
        if "outside" in figures:  # the epoch less the time inside load_item, a sample
            rows[f"{name}: outside load_item, a sample"] = figures["outside"]
        for row, seconds in rows.items():
            self.results.setdefault(row, Result(row, info=row != name)).times.append(seconds)
        if "loads" in figures:
            self.loads.setdefault(name, []).append(figures["loads"])
        if figures.get("wrong"):
            self.wrong.setdefault(name, []).extend(figures["wrong"])

    def rounds(self, trials: int) -> None:
        for i in range(trials):
            k = i % len(self.contenders)
            for name, template in self.contenders[k:] + self.contenders[:k]:
                if not self.quick:  # warm-up: the same work, untimed (a smoke run has none)
                    self.once(name, template, timed=False)
                self.once(name, template, timed=True)
            print(f"  round {i + 1}/{trials} done", file=sys.stderr, flush=True)


def main() -> int:
    def extra(p: Any) -> None:
        p.add_argument("--files", type=int, default=None, help="patient files (default 3,000)")
        p.add_argument("--trials", type=int, default=None, help="timed trials (default 3)")
        p.add_argument(
            "--source",
            choices=("items", "declared"),
            default="items",
            help="the dataset: source_items() + load_item() (default), or a declared source",
        )
        p.add_argument(
            "--parser",
            choices=tuple(PARSERS),
            default="pandas",
            help="the files and their parser: pandas.read_csv (default), or the demo's "
            "read_patient (issue 26)",
        )
        p.add_argument(
            "--before",
            default=None,
            help="the src/ folder of another version of mlcache: its first epochs are "
            "timed too, interleaved with this one's (before and after in one run)",
        )
        p.add_argument(
            "--fill-only",
            action="store_true",
            help="only the files, the pickled list's first run and the first epochs",
        )

    args = parse_args(__doc__.splitlines()[0], extra)
    n = args.files or (100 if args.quick else 3000)
    trials = args.trials or (1 if args.quick else 3)
    try:
        import torch  # noqa: F401 (only whether it is installed)

        torch_too = True
    except ImportError:
        torch_too = False
        print("torch is not installed: the DataLoader epochs are not timed")
    import mlcache

    print(f"# bench_fill: {machine_note()}; mlcache imported from {mlcache.__file__}")
    with scratch_dir(args.dir, "fill") as scratch:
        bench = Bench(
            scratch,
            n,
            args.source,
            torch_too,
            args.quick,
            parser=args.parser,
            fill_only=args.fill_only,
            before=args.before,
        )
        bench.rounds(trials)
    res = bench.results
    first, shuffled = "mlcache: empty cache, in order", "mlcache: empty cache, shuffled"
    bound = 1.15 if args.parser == "read_patient" else 1.3  # issue 26 / issue 17
    pickled_first = "pickled list: first run"
    targets = [
        Target("first epoch in order / files", first, "files", "<=", bound),
        Target("first epoch shuffled / files", shuffled, "files", "<=", bound),
    ]
    if args.parser == "read_patient":
        targets += [
            Target("build + first epoch / pickled list's", first, pickled_first, "<=", 1.0),
            Target(
                "up-front build + epoch / pickled list's",
                "mlcache: up-front build + epoch",
                pickled_first,
                "<=",
                1.0,
            ),
        ]
    if args.before:
        targets += [
            Target(f"before: {t.label}", f"before: {t.num}", t.den, t.op, t.bound)
            for t in list(targets)
        ]
    if not args.fill_only:
        targets.append(Target("files / later epoch", "files", "mlcache: later epoch", ">=", 20))
    title = (
        f"{n:,} per-patient CSV files ({args.parser}), dataset by "
        f"{'source_items() + load_item()' if args.source == 'items' else 'a declared source'}"
        f"; {bench.runs} fresh processes"
    )
    outcomes = report(title, res, targets, note="Seconds per epoch (or to the first sample).")
    for name in (f"{first}: first sample", f"{shuffled}: first sample"):
        r = res[name]
        outcomes.append(outcome(f"{name} (s)", r.median, r.min, "<=", 1.0))
    if not args.fill_only:
        edited = bench.loads.get("mlcache: one file edited", [0])
        outcomes.append(
            outcome("items re-read after one edit", float(np.median(edited)), min(edited), "<=", 5)
        )
    print_outcomes(outcomes[len(targets) :], first="figure")
    print("\nload_item calls a trial (every trial):")
    for name, counts in bench.loads.items():
        print(f"  {name}: {', '.join(f'{c:,}' for c in counts)}")
    if not args.fill_only:
        later, pickled = res["mlcache: later epoch"], res["pickled list: later run"]
        print(
            f"\nlater epoch: mlcache {later.median / pickled.median:.2f}x / "
            f"{later.min / pickled.min:.2f}x the pickled list's load + pass (medians / minima)"
        )
    if torch_too and not args.fill_only:
        base = res["DataLoader(2 workers): files"]
        for name in (
            "DataLoader(2 workers): mlcache, empty cache",
            "DataLoader(2 workers): mlcache, full cache",
        ):
            r = res[name]
            print(
                f"{name}: {r.median / base.median:.2f}x / {r.min / base.min:.2f}x the "
                "DataLoader epoch over the files (medians / minima)"
            )
    status = finish(args, "bench_fill", {"fill": res}, outcomes)
    if bench.wrong:
        print(f"\nWRONG SAMPLES returned: {bench.wrong}")
        return 1
    print("\nevery sample checked (the first, the last, each edited one) was right")
    return status


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--trial":
        figures = trial(json.loads(sys.argv[2]))
        with open(sys.argv[3], "w") as f:
            json.dump(figures, f)
        sys.exit(0)
    sys.exit(main())
