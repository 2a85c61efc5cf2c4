"""Building a ``CachedDataset`` up front with ``num_workers`` (issue 17): serial
against 2 worker processes, side by side in one run.

A dataset with ``source_items()`` + ``load_item()`` built up front, from an
empty cache folder (file pages warm; the constructor is timed: listing and
fingerprinting the items, loading them, writing and opening the pack):

* ``csv``: 8,000 small CSV files (40 rows x 6 numeric columns and a label
  column) parsed by ``pandas.read_csv``, one sample per file,
  ``{"vitals": float32[40, 6], "label": int}``;
* ``json``: 2,000 tiny JSON files (an id, a label, three floats), parsed by
  ``json.load``: tens of microseconds each, where workers cost more than they
  save.

``csv: num_workers=2, machine not measured`` (information) is the same build
under the rule before issue 26: the workers started whenever the items are slow
enough, whatever the CPUs left to them (the probe's figures replaced by a quiet
machine's). The load average is printed before and after, and what the
2-worker builds decided (workers, or loaded here, with the figures measured).

``loads only`` rows (information) are the CSV loads without a pack: in this
process; by ``load_many`` (the workers' function) in 2 workers; and in two
plain forked processes, half each, nothing sent back: what the machine gives
at the time (a shared VM: another session's work takes its share of the two
cores, and then no build can be 2x faster).

Targets: serial / 2 workers >= 1.7 on the CSV files; serial / 2 workers >= 0.97
on the JSON files: never slower than serial (the probe keeps them in the
building process, so both run the same code after it; 0.97 allows for the
noise between two runs of the same build here, a fifth of a second each, which
get four times the trials). Trials are interleaved, each preceded by an untimed
warm-up of the same contender; min and median are reported (see
``_bench.py``). ::

    python benchmarks/bench_build.py [--quick] [--files N] [--trials T] [--dir PARENT] [--json OUT]
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from _bench import Contender, Target, finish, machine_note, measure, parse_args, report, scratch_dir
from mlcache.data import CachedDataset
from mlcache.data import workers as _workers
from mlcache.data.planning import Machine, cpus
from mlcache.data.workers import load_many

COLUMNS = ("hr", "sbp", "dbp", "spo2", "temp", "rr")


class CsvFiles(CachedDataset):
    """One sample per small CSV file, parsed by pandas."""

    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[str]:
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path: str) -> dict[str, Any]:
        import pandas as pd

        df = pd.read_csv(path)
        label = int(df.pop("label").iloc[0])
        return {"vitals": df.to_numpy(np.float32), "label": label}


class JsonFiles(CachedDataset):
    """One sample per tiny JSON file."""

    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[str]:
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path: str) -> dict[str, Any]:
        with open(path) as f:
            d = json.load(f)
        return {"id": d["id"], "label": d["label"], "v": np.asarray(d["v"], np.float32)}


def write_csv_files(folder: Path, n: int, seed: int = 0) -> None:
    """``n`` CSV files of 40 rows: six numeric columns and a label."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    header = ",".join((*COLUMNS, "label")) + "\n"
    for i in range(n):
        rows = rng.normal(size=(40, len(COLUMNS))).round(3)
        label = i % 2
        text = "\n".join(",".join(map(str, r)) + f",{label}" for r in rows)
        (folder / f"{i:05d}.csv").write_text(header + text + "\n")


def write_json_files(folder: Path, n: int, seed: int = 0) -> None:
    """``n`` tiny JSON files: an id, a label, three floats."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = {"id": i, "label": i % 3, "v": rng.normal(size=3).round(4).tolist()}
        (folder / f"{i:05d}.json").write_text(json.dumps(d))


#: an up-front build, where datasets can also fill their pack as it is read
UP_FRONT = {"fill": "up-front"} if "fill" in inspect.signature(CachedDataset).parameters else {}


def build(name: str, cls: type, folder: Path, cache: str, workers: int, trials: int) -> Contender:
    """A contender: a build of ``cls`` over ``folder`` with ``workers``, from
    nothing (its cache folder is removed before each run, untimed)."""
    where = os.path.join(cache, f"{cls.__name__}-{workers}")
    return Contender(
        name,
        lambda: cls(str(folder), cache_dir=where, progress=False, num_workers=workers, **UP_FRONT),
        trials,
        before=lambda: shutil.rmtree(where, ignore_errors=True),
    )


@contextlib.contextmanager
def _machine_not_measured() -> Any:
    """The rule before issue 26: every probe sees a quiet machine (the CPU-bound
    loads had a core, and every other CPU was idle)."""
    saved = _workers.machine_since
    quiet = Machine(cpus=cpus(), cpu_share=1.0, run_share=1.0, idle_cores=cpus() - 1.0)
    _workers.machine_since = lambda before: quiet  # type: ignore[assignment]
    try:
        yield
    finally:
        _workers.machine_since = saved


def _unmeasured(make: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with _machine_not_measured():
            return make()

    return call


class _Decisions(logging.Handler):
    """What the builds decided (the probe's debug line), counted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "items of" in text and "ms each" in text:
            what = text.split(": ", 2)[2].split(" (")[0]
            self.seen[what] = self.seen.get(what, 0) + 1


def _in_two_forks(ds: Any, files: list[str]) -> None:
    """The loads in two plain forked processes, half each, nothing sent back: the
    parallelism the machine gives now (other work on it takes its share)."""
    pids = []
    for half in (files[::2], files[1::2]):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                for f in half:
                    ds.load_item(f)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


def _as_before(c: Contender) -> Contender:
    c.call, c.info = _unmeasured(c.call), True
    return c


def contenders(
    csv: Path, js: Path, cache: str, trials: int
) -> tuple[list[Contender], list[Target]]:
    """What is timed, and the targets on it."""
    probe = CsvFiles.__new__(CsvFiles)
    probe.root = str(csv)
    files = probe.source_items()
    names = {
        "csv0": "csv: serial (num_workers=0)",
        "csv2": "csv: num_workers=2",
        "csv2?": "csv: num_workers=2, machine not measured",
        "json0": "json: serial (num_workers=0)",
        "json2": "json: num_workers=2",
    }
    cs = [
        build(names["csv0"], CsvFiles, csv, cache, 0, trials),
        build(names["csv2"], CsvFiles, csv, cache, 2, trials),
        _as_before(
            build("csv: num_workers=2, machine not measured", CsvFiles, csv, cache, 2, trials)
        ),
        Contender(
            "csv: loads only, serial",
            lambda: [probe.load_item(f) for f in files],
            trials,
            info=True,
        ),
        Contender(
            "csv: loads only, load_many(2 workers)",
            lambda: list(load_many(probe, files, 2)),
            trials,
            info=True,
        ),
        Contender(
            "csv: loads only, 2 plain forks (what the machine gives)",
            lambda: _in_two_forks(probe, files),
            trials,
            info=True,
        ),
        # a fifth of a second each: more trials, for a steadier median
        build(names["json0"], JsonFiles, js, cache, 0, 4 * trials),
        build(names["json2"], JsonFiles, js, cache, 2, 4 * trials),
    ]
    targets = [
        Target("csv: serial / 2 workers", names["csv0"], names["csv2"], ">=", 1.7),
        Target("json: serial / 2 workers", names["json0"], names["json2"], ">=", 0.97),
    ]
    return cs, targets


def _options(p: Any) -> None:
    p.add_argument("--files", type=int, default=None, help="CSV files (JSON: a quarter)")
    p.add_argument("--trials", type=int, default=None, help="trials of each contender")


def main(extra: Callable[..., list[Contender]] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0], _options)
    n_csv, n_json, trials = (400, 200, 2) if args.quick else (8_000, 2_000, 5)
    if args.files is not None:  # a mid-sized run on a shared machine
        n_csv, n_json = args.files, max(200, args.files // 4)
    trials = args.trials or trials
    print(machine_note())
    print(f"load average at the start: {os.getloadavg()}")
    decisions = _Decisions()
    log = logging.getLogger("mlcache.workers")  # its decisions only
    log.addHandler(decisions)
    log.setLevel(logging.DEBUG)
    with scratch_dir(args.dir, "build") as scratch:
        root = Path(scratch)
        csv, js, cache = root / "csv", root / "json", str(root / "cache")
        write_csv_files(csv, n_csv)
        write_json_files(js, n_json)
        cs, targets = contenders(csv, js, cache, trials)
        if extra is not None:
            cs += extra(csv, js, cache, trials)
        res = measure(cs)
        print(f"load average at the end: {os.getloadavg()}")
        print(f"decisions of the builds with workers: {decisions.seen}")
        outcomes = report(
            f"Building a CachedDataset: {n_csv:,} CSV files (pandas), {n_json:,} JSON files",
            res,
            targets,
        )
    return finish(args, "bench_build", {"build": res}, outcomes)


if __name__ == "__main__":
    raise SystemExit(main())
