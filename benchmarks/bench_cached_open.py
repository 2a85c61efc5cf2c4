"""``CachedDataset``: the cost of opening one built from 20,000 files, and of
building one in worker processes.

Opening (the pack exists; what is timed is the constructor: the key, the source
check, the map), over 20,000 per-patient CSV files (``mlcache.demo.synthetic``,
issue 15's case):

* ``items``: ``source_items()`` + ``load_item()`` (each file is fingerprinted:
  one ``stat``), and ``files``: ``source_files()`` + ``load_source()``, both
  listing with ``sorted(Path(root).glob("*.csv"))`` as users write it;
* ``declared``: the same source declared (``source_dir`` + ``source_glob``),
  with ``check_source="open"`` (listed by ``os.scandir``, one stat per file),
  ``"background"`` (the check runs in a thread after the open: the thread is
  joined outside the timing) and ``"never"``;
* ``floor``: ``os.listdir`` and one ``os.stat`` per file, nothing else, and
  ``glob + stat``: the same with ``sorted(Path(root).glob(...))``;
* ``pickled list``: ``pickle.load`` of the same samples, a list of dicts, from
  one file (the hand-written cache); ``+ pass`` rows: the open or load, then
  ``ds[i]`` of every sample once.

Reopening in a fresh process (issue 26), over 20,000 and 100,000 tiny files of a
declared folder, a dataset filled item by item (``load_item``), its pack sealed:
each trial is a new interpreter timing its own constructor and ``ds[0]`` (after
its imports), with the default ``check_source="open"`` (the open checks the list
of items, each item is checked as it is first read: :mod:`mlcache.data.checking`)
and with ``"never"`` (no check: mlcache's own open). Target (issue 26): the first
<= 4x the second at both sizes. ``--before PATH`` adds the same reopen with the
``src`` folder of another checkout (the code before) on ``PYTHONPATH``.

Targets (issue 15): ``declared, open`` <= 1.3x the floor; ``declared,
background + pass`` faster than ``pickled list + pass``. The same two rows over
20,000 tiny text files (one short string a sample) are printed too, without a
target: there the pickled list wins, and the figures say by how much.

Building (``force_recache=True``, file pages warm), ``num_workers=0`` against
``num_workers=2``:

* ``csv``: 3,000 small CSV files (50 rows x 6 columns) parsed with pandas;
* ``json``: 2,000 tiny JSON files (an id, a label, three floats);
* ``json+df``: the same, from a dataset holding a 48 MB DataFrame attribute
  (left out of the key with ``cache_on``): it must reach each worker once, not
  once per chunk of items.

``loads only`` rows are the same CSV loads without mlcache, in this process
and in a plain pool of 2 forked processes: what the machine gives. A parallel
build first times a few items and stays in the building process when the rest
would take under a second (the JSON builds here).

Trials are interleaved (one of each contender per round); min and median are
reported. ::

    python benchmarks/bench_cached_open.py [--quick] [--open-only] [--reopen-only]
        [--before SRC] [--sizes 20000,100000] [--dir PARENT]

To compare with another version of the code, run it with that version first on
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from _bench import (
    Contender,
    Result,
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
from mlcache.demo.synthetic import read_patient, write_patients


class ItemsDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.csv"))

    def load_item(self, path: Path) -> dict[str, Any]:
        return read_patient(path)


class FilesDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_files(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.csv"))

    def load_source(self) -> Any:
        for path in self.source_files():
            yield read_patient(path)


class DeclaredDS(CachedDataset):
    """The patients, their source declared: mlcache lists and checks it."""

    source_glob = "*.csv"

    def __init__(self, root: str, **kw: Any) -> None:
        self.source_dir = root
        super().__init__(**kw)

    def load_source(self) -> Any:
        for path in self.source_files():
            yield read_patient(path)


class TinyDS(CachedDataset):
    """One short string a sample, from one tiny text file each."""

    source_glob = "*.txt"

    def __init__(self, root: str, **kw: Any) -> None:
        self.source_dir = root
        super().__init__(**kw)

    def load_source(self) -> Any:
        for path in self.source_files():
            with open(path) as f:
                yield {"text": f.read()}


#: the dataset of the fresh reopens, in a module of its own (as a user's is: the
#: class's code version walks its module, and this script's is large)
FILLED_DS = """
import os, time
from mlcache.data import CachedDataset


class FilledDS(CachedDataset):
    source_glob = "*.txt"

    def __init__(self, root, **kw):
        self.source_dir = root
        super().__init__(**kw)

    def load_item(self, path):
        with open(path) as f:
            return {"text": f.read()}


class FolderDS(CachedDataset):
    # a folder attribute whose files the items name (relative names in it)
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        return sorted(os.listdir(self.root))

    def load_item(self, name):
        with open(os.path.join(self.root, name)) as f:
            return {"text": f.read()}


class RowsDS(CachedDataset):
    # a folder attribute no item names: range(n), load_item opens a file of it
    def __init__(self, root, n, **kw):
        self.root, self.n = root, n
        super().__init__(**kw)

    def source_items(self):
        return range(self.n)

    def load_item(self, i):
        with open(os.path.join(self.root, f"{i:06d}.txt")) as f:
            return {"text": f.read()}


class FolderIgnoredDS(FolderDS):
    cache_ignore = ("root",)  # the same, its folder out of the key: the cost without it


class RowsIgnoredDS(RowsDS):
    cache_ignore = ("root",)


def make(kind, root, **kw):
    n = len(os.listdir(root)) if kind.startswith("Rows") else None
    return globals()[kind](root, **({"n": n} if n is not None else {}), **kw)


def trial(root, cache, check, kind="FilledDS"):
    n = len(os.listdir(root)) if kind.startswith("Rows") else None  # not timed: the user's own
    t0 = time.perf_counter()
    args = [n] if n is not None else []
    ds = globals()[kind](root, *args, cache_dir=cache, progress=False, check_source=check)
    ds[0]
    return time.perf_counter() - t0
"""


#: the datasets of the fresh reopens: a declared folder, a folder attribute whose
#: files the items name, and one whose files no item names (rows)
KINDS = ("FilledDS", "FolderDS", "FolderIgnoredDS", "RowsDS", "RowsIgnoredDS")


def _reopen_in_new_process(
    where: Path, root: str, cache: str, check: str, src: str | None, kind: str = "FilledDS"
) -> float:
    """One fresh process's constructor and ``ds[0]``, in seconds (timed inside it)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.path.abspath(src)
    code = f"import filledds; print(filledds.trial({root!r}, {cache!r}, {check!r}, {kind!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=where, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return float(out.stdout.split()[-1])


def bench_reopen(scratch: Path, sizes: tuple[int, ...], rounds: int, before: str | None):
    """Section: a fresh process's reopen to ds[0], with and without the source check."""
    outcomes, sections = [], {}
    for n in sizes:
        src, cache = scratch / f"filled-{n}", str(scratch / f"filled-cache-{n}")
        src.mkdir()
        for i in range(n):
            (src / f"{i:06d}.txt").write_text(str(i))
        (scratch / "filledds.py").write_text(FILLED_DS)
        time.sleep(0.2)  # a listing is trusted once begun this long after the last change
        for kind in KINDS:
            fill = f"import filledds; filledds.make({kind!r}, {str(src)!r}, cache_dir={cache!r}, "
            fill += "progress=False, fill='up-front')"
            for _ in range(2):  # the pack, then the listings recorded by an open
                subprocess.run([sys.executable, "-c", fill], cwd=scratch, check=True)
        runs = {"open": ("open", None, "FilledDS"), "never": ("never", None, "FilledDS")}
        # a folder attribute (issue 24): its files named by the items
        # (source_items() listing it), or by none (range(n)); each beside the same
        # dataset with the folder left out of its key (cache_ignore)
        runs["open, folder attribute"] = ("open", None, "FolderDS")
        runs["open, folder ignored"] = ("open", None, "FolderIgnoredDS")
        runs["open, rows of a folder"] = ("open", None, "RowsDS")
        runs["open, rows, folder ignored"] = ("open", None, "RowsIgnoredDS")
        if before is not None:
            runs["open, before"] = ("open", before, "FilledDS")
            runs["never, before"] = ("never", before, "FilledDS")
        times: dict[str, list[float]] = {k: [] for k in runs}
        names = list(runs)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                check, where, kind = runs[name]
                times[name].append(
                    _reopen_in_new_process(scratch, str(src), cache, check, where, kind)
                )
        res = {f"{n:,} files: {k}": Result(f"{n:,} files: {k}", times[k]) for k in names}
        _print(f"Reopen in a fresh process to ds[0], {n:,} files (declared, load_item)", times)
        o, nv = res[f"{n:,} files: open"], res[f"{n:,} files: never"]
        outcomes.append(
            outcome(
                f"{n:,} files: reopen with the default check / open without check",
                o.median / nv.median,
                o.min / nv.min,
                "<=",
                4,
            )
        )
        # a folder attribute whose files the items name costs nothing more (issue 24)
        f, fi = (
            res[f"{n:,} files: open, folder attribute"],
            res[f"{n:,} files: open, folder ignored"],
        )
        outcomes.append(
            outcome(
                f"{n:,} files: reopen, folder attribute / the same with the folder ignored",
                f.median / fi.median,
                f.min / fi.min,
                "<=",
                1.2,
            )
        )
        sections[f"reopen {n}"] = res
    print_outcomes(outcomes)
    return sections, outcomes


def _settle() -> None:
    """Wait for the background source checks (outside the timings)."""
    for t in threading.enumerate():
        if t.name == "mlcache-source-check":
            t.join()


class CsvDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.csv"))

    def load_item(self, path: Path) -> dict[str, Any]:
        import pandas as pd

        return {"x": pd.read_csv(path).to_numpy(np.float32)}


class JsonDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.json"))

    def load_item(self, path: Path) -> dict[str, Any]:
        with open(path) as f:
            d = json.load(f)
        return {"id": d["id"], "label": d["label"], "v": np.asarray(d["v"], np.float32)}


class JsonWithTable(JsonDS):
    cache_on = ("root",)

    def __init__(self, root: str, table: Any, **kw: Any) -> None:
        self.table = table  # a lookup table load_item could use: not part of the key
        super().__init__(root, **kw)


def _load_csv(path: Path) -> dict[str, Any]:
    return CsvDS.load_item(cast(Any, None), path)


def _forked(f: Callable[[Any], Any], items: list[Any], workers: int) -> list[Any]:
    """``f`` over ``items`` in a plain pool of forked processes (chunks of 64)."""
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(f, items, chunksize=64))


def _trials(contenders: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t0)
            _settle()
    return times


def _print(title: str, times: dict[str, list[float]], base: str | None = None) -> None:
    print(f"\n{title}")
    print(f"  {'':<28} {'min':>9} {'median':>9}" + ("   x base (med)" if base else ""))
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = f"   {med / statistics.median(times[base]):.2f}" if base else ""
        print(f"  {name:<28} {min(ts) * 1e3:8.1f}ms {med * 1e3:8.1f}ms{ratio}")


def main() -> int:
    def options(p: Any) -> None:
        p.add_argument("--open-only", action="store_true", help="skip the builds")
        p.add_argument("--reopen-only", action="store_true", help="only the fresh reopens")
        p.add_argument("--before", default=None, help="src folder of the code before")
        p.add_argument("--sizes", default=None, help="files of the reopens: 20000,100000")

    args = parse_args(__doc__.splitlines()[0], options)
    n_open, n_csv, n_json = (2_000, 300, 200) if args.quick else (20_000, 3_000, 2_000)
    rounds = 2 if args.quick else 5
    print(machine_note())
    with scratch_dir(args.dir, "cached-open") as scratch:
        root = Path(scratch)
        sizes = (2_000,) if args.quick else (20_000, 100_000)
        if args.sizes:
            sizes = tuple(int(n) for n in args.sizes.split(","))
        reopened, reopen_outcomes = bench_reopen(root, sizes, rounds + 2, args.before)
        if args.reopen_only:
            return finish(args, "bench_cached_open", reopened, reopen_outcomes)
        cache = str(root / "cache")
        # -- opening --------------------------------------------------------------
        src = root / "patients"
        paths = write_patients(str(src), n_open, seed=0)
        t0 = time.perf_counter()
        for cls in (ItemsDS, FilesDS, DeclaredDS):
            cls(str(src), cache_dir=cache, progress=False)
        print(f"\n{n_open:,} patient files; three packs built in {time.perf_counter() - t0:.1f} s")
        pickled = root / "patients.pkl"
        with open(pickled, "wb") as f:
            pickle.dump([read_patient(p) for p in paths], f, protocol=pickle.HIGHEST_PROTOCOL)
        tiny = root / "tiny"
        tiny.mkdir()
        for i in range(n_open):
            (tiny / f"{i:06d}.txt").write_text(str(i))
        TinyDS(str(tiny), cache_dir=cache, progress=False)
        tiny_pickled = root / "tiny.pkl"
        with open(tiny_pickled, "wb") as f:
            pickle.dump([{"text": str(i)} for i in range(n_open)], f)

        def floor() -> None:
            for name in sorted(os.listdir(src)):
                os.stat(os.path.join(src, name))

        def glob_floor() -> None:
            for p in sorted(src.glob("*.csv")):
                os.stat(p)

        def declared(check: str, cls: type = DeclaredDS, where: Path = src) -> Callable[[], Any]:
            return lambda: cls(str(where), cache_dir=cache, progress=False, check_source=check)

        def loaded(path: Path) -> Callable[[], Any]:
            def load() -> Any:
                with open(path, "rb") as f:
                    return pickle.load(f)

            return load

        def passed(opened: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                ds = opened()
                for i in range(len(ds)):
                    ds[i]

            return run

        trials = rounds + 2
        names = {
            "floor": "floor: os.listdir + os.stat of every file",
            "open": "declared source, check_source='open'",
            "bg": "declared source, check_source='background'",
            "bg pass": "declared, 'background' + ds[i] of every sample",
            "pickle pass": "pickled list: pickle.load + l[i] of every sample",
            "tiny bg pass": "tiny files: declared, 'background' + ds[i] of every sample",
            "tiny pickle pass": "tiny files: pickle.load + l[i] of every sample",
        }
        res = measure(
            [
                Contender(names["floor"], floor, trials),
                Contender("glob + stat", glob_floor, trials, info=True),
                Contender(
                    "source_items(), sorted(glob)",
                    lambda: ItemsDS(str(src), cache_dir=cache, progress=False),
                    trials,
                    info=True,
                ),
                Contender(
                    "source_files(), sorted(glob)",
                    lambda: FilesDS(str(src), cache_dir=cache, progress=False),
                    trials,
                    info=True,
                ),
                Contender(names["open"], declared("open"), trials),
                Contender(
                    names["bg"],
                    declared("background"),
                    trials,
                    before=_settle,
                    after=_settle,
                    info=True,
                ),
                Contender(
                    "declared source, check_source='never'", declared("never"), trials, info=True
                ),
                Contender("pickled list: pickle.load only", loaded(pickled), trials, info=True),
                Contender(
                    names["bg pass"],
                    passed(declared("background")),
                    trials,
                    before=_settle,
                    after=_settle,
                ),
                Contender(names["pickle pass"], passed(loaded(pickled)), trials),
                Contender(
                    names["tiny bg pass"],
                    passed(declared("background", TinyDS, tiny)),
                    trials,
                    before=_settle,
                    after=_settle,
                    info=True,
                ),
                Contender(
                    names["tiny pickle pass"], passed(loaded(tiny_pickled)), trials, info=True
                ),
            ]
        )
        outcomes = report(
            f"Opening a CachedDataset over {n_open:,} per-patient CSV files",
            res,
            [
                Target("declared 'open' / floor", names["open"], names["floor"], "<=", 1.3),
                Target(
                    "declared 'background' + pass / pickled list + pass",
                    names["bg pass"],
                    names["pickle pass"],
                    "<=",
                    1.0,
                ),
            ],
        )
        tiny_ratio = res[names["tiny bg pass"]].median / res[names["tiny pickle pass"]].median
        print(
            f"\nTiny samples (one short string each, no target): 'background' + pass is "
            f"{tiny_ratio:.2f}x the pickled list's load + pass (medians)."
        )
        if args.open_only:
            outcomes += reopen_outcomes
            return finish(args, "bench_cached_open", {"open": res, **reopened}, outcomes)

        # -- building -------------------------------------------------------------
        csv, js = root / "csv", root / "json"
        csv.mkdir()
        js.mkdir()
        rng = np.random.default_rng(0)
        header = "a,b,c,d,e,f\n"
        for i in range(n_csv):
            rows = rng.normal(size=(50, 6)).round(3)
            (csv / f"{i:05d}.csv").write_text(
                header + "\n".join(",".join(map(str, r)) for r in rows)
            )
        for i in range(n_json):
            d = {"id": i, "label": int(i % 3), "v": rng.normal(size=3).round(4).tolist()}
            (js / f"{i:05d}.json").write_text(json.dumps(d))
        import pandas as pd

        table = pd.DataFrame({"a": np.arange(3_000_000), "b": rng.random(3_000_000)})
        print(f"\n(the DataFrame attribute: {table.memory_usage().sum() / 1e6:.0f} MB)")

        def build(cls: type, folder: Path, workers: int, *extra: Any) -> Callable[[], Any]:
            return lambda: cls(
                str(folder),
                *extra,
                cache_dir=cache,
                progress=False,
                force_recache=True,
                num_workers=workers,
            )

        for title, cls, folder, extra in (
            (f"build, {n_csv:,} CSV files (pandas)", CsvDS, csv, ()),
            (f"build, {n_json:,} JSON files", JsonDS, js, ()),
            (
                f"build, {n_json:,} JSON files, 48 MB DataFrame attribute",
                JsonWithTable,
                js,
                (table,),
            ),
        ):
            builds = {
                "serial": build(cls, folder, 0, *extra),
                "num_workers=2": build(cls, folder, 2, *extra),
            }
            if cls is CsvDS:  # what the machine gives: the loads alone, no pack
                files = CsvDS.source_items(cast(Any, SimpleNamespace(root=str(folder))))
                builds["loads only, serial"] = lambda fs=files: [_load_csv(f) for f in fs]
                builds["loads only, 2 forked"] = lambda fs=files: _forked(_load_csv, fs, 2)
            _print(title, _trials(builds, rounds), "serial")
    outcomes += reopen_outcomes
    return finish(args, "bench_cached_open", {"open": res, **reopened}, outcomes)


if __name__ == "__main__":
    raise SystemExit(main())
