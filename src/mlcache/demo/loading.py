"""The demo's first part: loading the patient files for training, timed.

Three tables (:class:`~mlcache.demo.report.Row` groups), each step timed
:data:`REPEATS` times and saying what its time measures:

- **a first run**, in this process, every sample read once: reading the files
  (the baseline: what every run costs without a cache), the hand-written
  pickled list (parse every file, dump the list), the README's dataset
  (``load_item``: the open lists the files, epoch 1 reads them and fills the
  pack as it goes) and the alternative (``load_source()``: the whole pack built
  at the open, then the epoch). Each mlcache repeat starts from an empty cache.
- **a new run, to its first sample**, each trial a fresh process (timed after
  its imports, the files in the page cache, a warm-up trial first): the pickled
  list (``pickle.load``, ``list[0]``), the README's dataset (open, its source
  files checked, ``ds[0]``) and its pack alone (``PackedDataset(pack)[0]``, no
  source to check: what part 4 measures at every size).
- **one DataLoader epoch** (batch 64, shuffled, 2 workers), after a first one
  (the workers started), over the files, the pickled list and the pack.
"""

from __future__ import annotations

import glob
import os
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._util import progress, slug
from .children import DATASET, PACK, PICKLE, Server
from .datasets import Patients, PatientsByItem
from .report import BASELINE, MLCACHE, PICKLED, Row
from .synthetic import read_patient, write_patients

__all__ = ["REPEATS", "Loaded", "forget", "measure", "repeat"]

#: how many times each step is timed (min and median)
REPEATS = 3


def repeat(
    fn: Callable[[], Any], n: int = REPEATS, setup: Callable[[], Any] | None = None
) -> list[float]:
    """The seconds of ``n`` calls of ``fn``, each after ``setup`` (not timed)."""
    times = []
    for _ in range(n):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
    return times


def forget(cache: str, cls: type) -> None:
    """Remove every pack of the class ``cls`` from ``cache``: the next open starts empty."""
    for old in glob.glob(os.path.join(cache, f"{slug(f'{cls.__module__}.{cls.__qualname__}')}*")):
        shutil.rmtree(old, ignore_errors=True)


class Loaded:
    """What the later parts use: the files' folder, the README's dataset (its pack
    filled), its ``load_item`` counter, the pickle, the baseline's and the
    alternative's first-run seconds (min)."""

    def __init__(self, files: str, ds: PatientsByItem, counter: str, pickled: str) -> None:
        self.files, self.ds, self.counter, self.pickled = files, ds, counter, pickled
        self.read = 0.0
        self.upfront = 0.0


def measure(
    root: str, cache: str, n: int, out: Callable[[str], None], *, loader: bool = True
) -> tuple[list[Row], Loaded]:
    """Write ``n`` patient files into ``root`` (and the pickle, the counter); the
    packs go into ``cache``; ``loader=False`` leaves the DataLoader epochs out.
    The fresh processes' timings are skipped, said, when they cannot run (no
    ``os.fork``, a child failed)."""
    files = os.path.join(root, "patients")
    t0 = time.perf_counter()
    write_patients(files, n, seed=0, progress=True)
    out(f"wrote {n:,} patient files in {time.perf_counter() - t0:.1f} s ({files})")
    paths = sorted(str(p) for p in Path(files).glob("*.csv"))
    pkl, counter = os.path.join(root, "patients.pkl"), os.path.join(root, "loads")

    def read_all() -> list[dict[str, Any]]:
        return [read_patient(p) for p in progress(paths, "reading the files", leave=False)]

    def pickle_first() -> None:
        samples = read_all()
        with open(pkl, "wb") as f:
            pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)

    def epoch_one(ds: Any) -> Any:
        for i in range(len(ds)):
            ds[i]
        return ds

    def by_item() -> PatientsByItem:
        return epoch_one(PatientsByItem(files, counter, cache_dir=cache, progress=False))

    def by_source() -> Patients:
        return epoch_one(Patients(files, cache_dir=cache, progress=False))

    out(f"timing a first run over {n:,} files ({REPEATS}x each)")
    group = f"a first run: {n:,} patient files, every sample read once"
    every = "this process: parse every file"
    read_all()  # warm-up: every contender then reads the files from the page cache
    read = repeat(read_all)
    rows = [Row(group, "read the files (every run)", every, BASELINE, read, min(read))]
    dumped = repeat(pickle_first)
    rows.append(Row(group, "pickled list", every + ", dump the list", PICKLED, dumped))
    filled = repeat(by_item, setup=lambda: forget(cache, PatientsByItem))
    empty = "this process, an empty cache: "
    rows.append(
        Row(
            group,
            "mlcache, load_item",
            empty + "open, read every sample (fills the pack)",
            MLCACHE,
            filled,
        )
    )
    built = repeat(by_source, setup=lambda: forget(cache, Patients))
    rows.append(
        Row(
            group,
            "mlcache, load_source() (the alternative)",
            empty + "open (builds the pack), read every sample",
            MLCACHE,
            built,
        )
    )
    for r in rows:
        r.baseline = min(read)
    forget(cache, Patients)  # its figures are taken; the later parts use load_item's pack
    ds = PatientsByItem(files, counter, cache_dir=cache, progress=False)
    loaded = Loaded(files, ds, counter, pkl)
    loaded.read, loaded.upfront = min(read), min(built)
    try:
        rows += _new_run(files, cache, ds.pack_path, pkl, n, min(read), out)
    except (OSError, RuntimeError) as exc:  # no fork here, or a child failed: said
        out(f"a new run in fresh processes could not be timed: {exc}")
    if loader:
        rows += _loader(paths, pkl, ds, out)
    return rows, loaded


def _new_run(
    files: str, cache: str, pack: str, pkl: str, n: int, read: float, out: Callable[[str], None]
) -> list[Row]:
    """A fresh process per trial, a warm-up trial first, the contenders side by side."""
    out(f"timing a new run, to its first sample ({REPEATS} fresh processes each)")
    group = f"a new run: {n:,} patient files, to the first sample (vs reading the files)"
    fresh = "a fresh process: "
    contenders = [
        ("pickled list", fresh + "pickle.load, list[0]", PICKLED, PICKLE, pkl),
        (
            "mlcache, load_item",
            fresh + f"open ({n:,} files checked), ds[0]",
            MLCACHE,
            DATASET,
            files,
        ),
        (
            "mlcache: the pack alone",
            fresh + "PackedDataset(pack)[0], nothing checked (as in part 4)",
            MLCACHE,
            PACK,
            pack,
        ),
    ]
    server = Server()
    try:
        rows = [Row(group, name, what, who, [], read) for name, what, who, _, _ in contenders]
        for trial in range(REPEATS + 1):  # trial 0: the warm-up, not counted
            for row, (_, _, _, kind, path) in zip(rows, contenders):
                took = server.ask("reopen", kind, path, cache=cache)
                if trial:
                    row.times.append(took)
    finally:
        server.close()
    return rows


# -- one DataLoader epoch -----------------------------------------------------------------
def _collate(batch: list[dict[str, Any]]) -> Any:
    """Pad the vitals of a batch to its longest series; stack the labels."""
    import torch

    longest = max(s["vitals"].shape[0] for s in batch)
    vitals = np.zeros((len(batch), longest, batch[0]["vitals"].shape[1]), np.float32)
    for i, s in enumerate(batch):
        vitals[i, : s["vitals"].shape[0]] = s["vitals"]
    return torch.from_numpy(vitals), torch.tensor([s["label"] for s in batch])


class _Files:
    """The no-cache baseline as a map-style dataset: parse the file at each read."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return read_patient(self.paths[i])


def _epochs(dataset: Any, workers: int, desc: str) -> list[float]:
    """:data:`REPEATS` shuffled epochs, timed after a first one: the workers have
    started and what the dataset does once per process is done."""
    import torch

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        collate_fn=_collate,
        persistent_workers=workers > 0,
    )
    times = []
    for k in range(REPEATS + 1):
        t0 = time.perf_counter()
        for _ in progress(loader, f"{desc} ({k or 'warm-up'})", total=len(loader), leave=False):
            pass
        if k:
            times.append(time.perf_counter() - t0)
    return times


def _loader(paths: list[str], pkl: str, ds: Any, out: Callable[[str], None]) -> list[Row]:
    try:
        import torch  # noqa: F401 (only whether it is installed)
    except ImportError:
        out("torch is not installed: the DataLoader epochs are skipped")
        return []
    out(f"timing DataLoader epochs ({REPEATS}x each, after a first one)")
    group = "one DataLoader epoch (batch 64, shuffled, 2 workers)"
    what = "this process: an epoch after a first one"
    base = _epochs(_Files(paths), 2, "epoch over the files")
    with open(pkl, "rb") as f:
        listed = pickle.load(f)
    rows = [
        Row(group, "reading the files", what, BASELINE, base, min(base)),
        Row(group, "pickled list", what, PICKLED, _epochs(listed, 2, "epoch, pickled list")),
        Row(
            group,
            "mlcache, load_item",
            what,
            MLCACHE,
            _epochs(ds, 2, "epoch, mlcache"),
        ),
    ]
    for r in rows:
        r.baseline = min(base)
    return rows
