"""``CachedDataset``: the cost of opening one built from 20,000 files, and of
building one in worker processes.

Opening (the pack exists; what is timed is the constructor: the key, the source
fingerprint, the map):

* ``items``: ``source_items()`` + ``load_item()`` over 20,000 files (each file
  is fingerprinted: one ``stat``);
* ``files``: ``source_files()`` + ``load_source()`` over the same files;
* ``declared``: the same source declared (``source_dir`` + ``source_glob``),
  with ``check_source="open"`` (listed by ``os.listdir``, one stat per file),
  ``"background"`` (the check runs in a thread after the open: the thread is
  joined outside the timing) and ``"never"``;
* ``floor``: ``os.listdir`` and one ``os.stat`` per file, nothing else (the
  target: ``declared, open`` <= 1.3x); ``glob + stat``: the same with
  ``sorted(Path(root).glob(...))``, what ``source_files()`` typically costs;
* ``pickled list``: loading the same samples, a list of dicts, from one pickle
  file (the hand-written cache), and ``+ pass`` rows: the open or load then
  reading every sample once.

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

    python benchmarks/bench_cached_open.py [--quick] [--open-only] [--dir PARENT]

To compare with another version of the code, run it with that version first on
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from _bench import machine_note, parse_args, scratch_dir
from mlcache.data import CachedDataset


class ItemsDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_items(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.txt"))

    def load_item(self, path: Path) -> dict[str, Any]:
        return {"text": path.read_text()}


class FilesDS(CachedDataset):
    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_files(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.txt"))

    def load_source(self) -> Any:
        for path in self.source_files():
            yield {"text": path.read_text()}


class DeclaredDS(CachedDataset):
    source_glob = "*.txt"

    def __init__(self, root: str, **kw: Any) -> None:
        self.source_dir = root
        super().__init__(**kw)

    def load_source(self) -> Any:
        for path in self.source_files():
            with open(path) as f:
                yield {"text": f.read()}


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


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        lambda p: p.add_argument("--open-only", action="store_true", help="skip the builds"),
    )
    n_open, n_csv, n_json = (2_000, 300, 200) if args.quick else (20_000, 3_000, 2_000)
    rounds = 2 if args.quick else 5
    print(machine_note())
    with scratch_dir(args.dir, "cached-open") as scratch:
        root = Path(scratch)
        cache = str(root / "cache")
        # -- opening --------------------------------------------------------------
        src = root / "open"
        src.mkdir()
        for i in range(n_open):
            (src / f"{i:06d}.txt").write_text(str(i))
        ItemsDS(str(src), cache_dir=cache, progress=False)
        FilesDS(str(src), cache_dir=cache, progress=False)
        DeclaredDS(str(src), cache_dir=cache, progress=False)
        pickled = root / "samples.pkl"
        with open(pickled, "wb") as f:
            pickle.dump([{"text": p.read_text()} for p in sorted(src.glob("*.txt"))], f)

        def floor() -> None:
            for name in sorted(os.listdir(src)):
                os.stat(os.path.join(src, name))

        def glob_floor() -> None:
            for p in sorted(src.glob("*.txt")):
                os.stat(p)

        def declared(check: str) -> Callable[[], Any]:
            return lambda: DeclaredDS(str(src), cache_dir=cache, progress=False, check_source=check)

        def load_pickled() -> Any:
            with open(pickled, "rb") as f:
                return pickle.load(f)

        def passed(opened: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                ds = opened()
                for i in range(len(ds)):
                    ds[i]

            return run

        opens = {
            "floor (listdir + stat)": floor,
            "glob + stat": glob_floor,
            "items": lambda: ItemsDS(str(src), cache_dir=cache, progress=False),
            "files": lambda: FilesDS(str(src), cache_dir=cache, progress=False),
            "declared, open": declared("open"),
            "declared, background": declared("background"),
            "declared, never": declared("never"),
            "pickled list": load_pickled,
            "declared, background + pass": passed(declared("background")),
            "pickled list + pass": passed(load_pickled),
        }
        title = f"open, {n_open:,} files"
        _print(title, _trials(opens, rounds + 2), "floor (listdir + stat)")
        if args.open_only:
            return

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


if __name__ == "__main__":
    main()
