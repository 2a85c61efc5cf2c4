"""``mlcache demo``: what mlcache saves, timed on this machine, on generated data.

1. **Dataset loading.** Writes a synthetic MIMIC-like dataset (one CSV file per
   patient), then times loading it for training three ways: reading the files
   at every run, the hand-written "pickle the whole list into one file" cache,
   and ``mlcache.data.CachedDataset``; the first run, a repeated run, and one
   epoch through a PyTorch DataLoader when torch is installed. Then the first
   epochs of one training run (:mod:`mlcache.demo.epochs`): the time of epochs
   1, 2 and 3 reading the files, with the pickled list and with a dataset that
   loads one file an item (``load_item``) on an empty cache, one line per epoch.
2. **Function results.** A preprocessing function over a large float64 array:
   no cache, the first call (compute and store), a repeated call, a repeated
   call with ``mmap_mode="r"``, and ``joblib.Memory`` beside it if installed.
3. **A change.** A changed argument is a miss that says which argument; an
   edited source file rebuilds the dataset once; ``clear`` empties the cache.
4. **At every size.** Generated samples (``{"x": float32[64], "y": int, "id":
   str}``) at as many as there are patients, 10x and 100x as many (5k, 50k,
   500k by default; 300, 3k, 30k with ``--quick``), each written once as a
   pickled list and as a pack; then the reopen time in a fresh process (min and
   median) and each of 2 workers' memory growth after reading every sample,
   private (its own heap) and shared (the pack's pages in the page cache): the
   pickled list's O(N) load and copy per worker against the pack's O(1) open
   and shared pages, the small sizes where the list wins included. What is
   measured, and how: :mod:`mlcache.demo.scaling`.

Prints a table per part, and writes a bar chart (``mlcache-demo.png``, with
matplotlib), the chart of per-epoch time (``mlcache-demo-epochs.png``), the
chart of part 4 (``mlcache-demo-scaling.png``: reopen time and per-worker
memory against size, log axes) and a Markdown report
(``mlcache-demo.md``) into ``out``. Everything it caches lives in a temporary
folder unless ``location`` is given.
"""

from __future__ import annotations

import glob
import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._util import progress, slug
from ..data import CachedDataset
from ..memo.memory import Memory
from . import epochs as epochs
from . import report as report
from . import scaling as scaling
from .synthetic import read_patient, write_patients

__all__ = ["DemoResult", "preprocess", "run_demo"]


def preprocess(x: np.ndarray, scale: float = 2.0) -> np.ndarray:
    """A stand-in for feature extraction: a few full passes over the array."""
    centered = x - x.mean(axis=0)
    return np.tanh(centered * scale) + np.sqrt(np.abs(centered))


class Patients(CachedDataset):
    """The demo's dataset: one CSV file per patient, parsed by ``read_patient``."""

    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_files(self) -> list[str]:
        names = sorted(n for n in os.listdir(self.root) if n.endswith(".csv"))
        return [os.path.join(self.root, n) for n in names]

    #: source files parsed by builds in this process (the demo checks its rebuilds)
    parsed = 0

    def load_source(self) -> Iterator[dict[str, Any]]:
        for path in self.source_files():
            Patients.parsed += 1
            yield read_patient(path)


class PatientsByItem(CachedDataset):
    """The same files as a dataset of items: the declared source (``*.csv`` of
    ``root``) and ``load_item`` one file, which write-through filling (issue 17)
    loads as an epoch reads it. Each load is counted in the file ``counter``."""

    source_glob = "*.csv"
    cache_ignore = ("counter",)

    def __init__(self, root: str, counter: str | None = None, **kw: Any) -> None:
        self.source_dir, self.counter = root, counter
        super().__init__(**kw)

    def load_item(self, item: str) -> dict[str, Any]:
        epochs.count(self.counter)
        return read_patient(item)


@dataclass
class Row:
    """One timed step: ``group`` (a section), ``name``, seconds, and the baseline
    (seconds) its speed-up is measured against."""

    group: str
    name: str
    seconds: float
    baseline: float | None = None

    @property
    def speedup(self) -> float | None:
        return None if self.baseline is None or self.seconds <= 0 else self.baseline / self.seconds


@dataclass
class DemoResult:
    rows: list[Row] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    chart: str | None = None
    report: str | None = None
    scaling: scaling.Scaling | None = None
    epochs: epochs.Epochs | None = None


def _timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out
    return best


# -- 1. datasets ------------------------------------------------------------------------
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


def _epoch(dataset: Any, workers: int, desc: str) -> float:
    """One shuffled epoch, timed after a first one: the workers have started and
    what the dataset does once per process is done, as in every later epoch."""
    import torch

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        collate_fn=_collate,
        persistent_workers=workers > 0,
    )
    for _ in progress(loader, desc + " (warm-up)", total=len(loader), unit="it", leave=False):
        pass
    t0 = time.perf_counter()
    for _ in progress(loader, desc, total=len(loader), unit="it", leave=False):
        pass
    return time.perf_counter() - t0


def _datasets(
    root: str, cache: str, n: int, out: Callable[[str], None]
) -> tuple[list[Row], Patients]:
    """Generated files, the pickle and the epochs' data live in ``root``; the packs
    in ``cache``."""
    files = os.path.join(root, "patients")
    t0 = time.perf_counter()
    write_patients(files, n, seed=0, progress=True)
    out(f"wrote {n:,} patient files in {time.perf_counter() - t0:.1f} s ({files})")
    paths = sorted(str(p) for p in Path(files).glob("*.csv"))
    group = f"loading {n:,} patient files"

    def read_all() -> list[dict[str, Any]]:
        return [
            read_patient(p) for p in progress(paths, "reading the files", unit="it", leave=False)
        ]

    pkl = os.path.join(root, "patients.pkl")

    def pickle_first() -> None:
        samples = read_all()
        with open(pkl, "wb") as f:
            pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)

    def pickle_again() -> list[dict[str, Any]]:
        with open(pkl, "rb") as f:
            loaded: list[dict[str, Any]] = pickle.load(f)
        return loaded

    read_all()  # warm-up: every contender then reads from the page cache
    read = _timed(read_all)
    rows = [Row(group, "read the files (every run)", read, read)]
    rows.append(Row(group, "pickled list: first run (read + dump)", _timed(pickle_first), read))
    rows.append(Row(group, "pickled list: repeated run (load)", _timed(pickle_again, 3), read))
    first = _timed(lambda: Patients(files, cache_dir=cache, progress=True))
    rows.append(Row(group, "mlcache.data: first run (read + pack)", first, read))
    again = _timed(lambda: Patients(files, cache_dir=cache, progress=False), 3)
    rows.append(Row(group, "mlcache.data: repeated run (open)", again, read))
    ds = Patients(files, cache_dir=cache, progress=False)
    try:
        import torch  # noqa: F401 (only whether it is installed)
    except ImportError:
        out("torch is not installed: the DataLoader epochs are skipped")
        return rows, ds
    group = "one DataLoader epoch (batch 64, shuffled, 2 workers; not the first)"
    base = _epoch(_Files(paths), 2, "epoch over the files")
    rows.append(Row(group, "reading the files", base, base))
    rows.append(Row(group, "pickled list", _epoch(pickle_again(), 2, "epoch, pickled list"), base))
    rows.append(Row(group, "mlcache.data", _epoch(ds, 2, "epoch, mlcache"), base))
    return rows, ds


def _epochs(root: str, out: Callable[[str], None]) -> epochs.Epochs | None:
    """The first epochs of one run over part 1's files (``root/patients``); the
    dataset's pack in ``root`` too (a ``location`` keeps part 1's packs only). A
    failure is said, and the other parts go on."""
    files, cache = os.path.join(root, "patients"), os.path.join(root, "epochs-cache")
    paths = sorted(os.path.join(files, n) for n in os.listdir(files) if n.endswith(".csv"))
    try:
        return epochs.measure(
            paths,
            read_patient,
            lambda counter: PatientsByItem(files, counter, cache_dir=cache, progress=False),
            os.path.join(root, "epochs"),
            out=out,
        )
    except (OSError, RuntimeError) as exc:
        out(f"the first epochs failed: {exc}")
        return None


# -- 2. function results ----------------------------------------------------------------
def _functions(
    root: str, cache: str, size: int, out: Callable[[str], None]
) -> tuple[list[Row], Any]:
    """joblib's cache lives in ``root``, mlcache's in ``cache``."""
    x = np.random.default_rng(0).standard_normal((size, size))
    group = f"preprocess() of a {size}x{size} float64 array ({x.nbytes / 1e6:,.0f} MB)"
    out(f"timing {group}")
    mem = Memory(cache, verbose=1)
    mapped = Memory(cache, mmap_mode="r", verbose=0)
    cached, cached_mm = mem.cache(preprocess), mapped.cache(preprocess)
    preprocess(x)  # warm-up: fresh memory is slow to touch the first time on some VMs
    base = _timed(lambda: preprocess(x), repeat=2)
    rows = [Row(group, "no cache", base, base)]
    rows.append(
        Row(
            group, "mlcache: first call (compute + store, fsynced)", _timed(lambda: cached(x)), base
        )
    )
    rows.append(Row(group, "mlcache: repeated call", _timed(lambda: cached(x), 3), base))
    rows.append(
        Row(group, 'mlcache: repeated, mmap_mode="r"', _timed(lambda: cached_mm(x), 3), base)
    )
    try:
        import joblib
    except ImportError:
        out("joblib is not installed: joblib.Memory is not timed beside mlcache")
        return rows, (cached, x)
    jm = joblib.Memory(os.path.join(root, "joblib"), verbose=0)
    jm_mm = joblib.Memory(os.path.join(root, "joblib"), mmap_mode="r", verbose=0)
    jf, jf_mm = jm.cache(preprocess), jm_mm.cache(preprocess)
    rows.append(Row(group, "joblib: first call", _timed(lambda: jf(x)), base))
    rows.append(Row(group, "joblib: repeated call", _timed(lambda: jf(x), 3), base))
    rows.append(Row(group, 'joblib: repeated, mmap_mode="r"', _timed(lambda: jf_mm(x), 3), base))
    return rows, (cached, x)


# -- 3. a change ------------------------------------------------------------------------
class _Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _why(call: Callable[[], Any]) -> str:
    """Run ``call``; return why it computed (its miss reason), or that it did not."""
    log = logging.getLogger("mlcache")
    captured = _Captured()
    log.addHandler(captured)
    try:
        call()
    finally:
        log.removeHandler(captured)
    reason = next((m for m in captured.messages if "calling" in m), None)
    return "a hit (nothing computed)" if reason is None else "a miss, " + reason.rpartition(": ")[2]


# preprocess() with one constant changed, defined in memory (nothing is edited on
# disk) under the same module and name, as an edited and reloaded file would be
_EDITED = """
def preprocess(x, scale=2.0):
    centered = x - x.mean(axis=0)
    return np.tanh(centered * scale) + np.sqrt(np.abs(centered)) * 1.5
"""


def _changes(cached: Any, x: np.ndarray, ds: Patients, pickled: str) -> list[str]:
    lines = [f"preprocess(x) again: {_why(lambda: cached(x))}"]
    changed = _why(lambda: cached(x, scale=3.0))
    lines.append(f"changed argument, preprocess(x, scale=3.0): {changed}")
    ns: dict[str, Any] = {"__name__": __name__, "np": np}
    exec(_EDITED, ns)  # our own text, above
    edited = cached.memory.cache(ns["preprocess"])
    lines.append(f"changed code of preprocess(), same call: {_why(lambda: edited(x))}")
    victim = ds.source_files()[0]
    before = read_patient(victim)["age"]
    text = Path(victim).read_text().replace(f"# age: {before}", f"# age: {before + 1}", 1)
    Path(victim).write_text(text)
    t0, parsed = time.perf_counter(), Patients.parsed
    again = Patients(ds.root, cache_dir=os.path.dirname(os.path.dirname(ds.pack_path)))
    took, parsed = time.perf_counter() - t0, Patients.parsed - parsed
    if again.pack_path != ds.pack_path:
        what = (
            f"was rebuilt in {took:.2f} s ({parsed:,} files parsed, once each): patient 0's "
            f"age is now {again[0]['age']}"
        )
    else:
        what = "was NOT rebuilt"
    name = os.path.basename(victim)
    lines.append(
        f"edited one source file ({name}, age {before} -> {before + 1}): the dataset {what}"
    )
    t0 = time.perf_counter()
    third = Patients(ds.root, cache_dir=os.path.dirname(os.path.dirname(ds.pack_path)))
    same = "the rebuilt pack" if third.pack_path == again.pack_path else "ANOTHER pack"
    lines.append(f"opened again: {same}, in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    with open(pickled, "rb") as f:
        stale = pickle.load(f)[0]["age"]
    lines.append(f"the pickled list after the same edit: still says {stale} (it never looks)")
    edited.clear(warn=False)
    lines.append(f"after clear(), the last call is cached? {edited.check_call_in_cache(x)}")
    return lines


def run_demo(
    size: int = 4000,
    patients: int = 5000,
    location: str | None = None,
    out_dir: str = "mlcache-demo",
    out: Callable[[str], None] = print,
    scaling_sizes: Sequence[int] | None = None,
) -> DemoResult:
    """Run the four parts of the demo; print and write the report.

    ``scaling_sizes`` are part 4's sample counts (default
    :func:`mlcache.demo.scaling.sizes_for` ``(patients)``; empty: part 4 is skipped).
    """
    sizes = scaling.sizes_for(patients) if scaling_sizes is None else tuple(scaling_sizes)
    log = logging.getLogger("mlcache")
    level = log.level
    log.setLevel(logging.INFO)  # the miss reasons; nothing is printed unless handled
    # generated data, the pickle and joblib's cache: always a temporary folder;
    # mlcache's caches: there too, or in ``location`` (then `mlcache ls` shows them)
    tmp = tempfile.mkdtemp(prefix="mlcache-demo-")
    functions = location if location is not None else os.path.join(tmp, "mlcache")
    datasets = os.path.join(functions, "datasets")
    if location is not None:  # a rerun starts from scratch: the demo's own entries only
        Memory(location, verbose=0).cache(preprocess).clear(warn=False)
        for old in glob.glob(os.path.join(datasets, f"{slug(f'{__name__}.Patients')}*")):
            shutil.rmtree(old, ignore_errors=True)
    result = DemoResult()
    try:
        out(f"mlcache demo: generated data in {tmp}, mlcache's caches in {functions}")
        rows, ds = _datasets(tmp, datasets, patients, out)
        result.rows += rows
        result.epochs = _epochs(tmp, out)
        rows, (cached, x) = _functions(tmp, functions, size, out)
        result.rows += rows
        result.changes = _changes(cached, x, ds, os.path.join(tmp, "patients.pkl"))
        del ds, cached, x  # part 4 measures memory: the earlier parts' data goes first
        if sizes:
            try:
                result.scaling = scaling.measure(os.path.join(tmp, "scaling"), sizes, out=out)
            except (OSError, RuntimeError) as exc:  # the other parts still report
                out(f"part 4 (at every size) failed: {exc}")
    finally:
        log.setLevel(level)
        shutil.rmtree(tmp, ignore_errors=True)
    report.show(result.rows, result.changes, out)
    if result.epochs is not None:
        result.epochs.show(out)
    if result.scaling is not None:
        result.scaling.show(out)
    os.makedirs(out_dir, exist_ok=True)
    result.chart = report.chart(result.rows, os.path.join(out_dir, "mlcache-demo.png"), out)
    sections: list[str] = []
    if result.epochs is not None:
        where = os.path.join(out_dir, "mlcache-demo-epochs.png")
        result.epochs.chart = epochs.chart(result.epochs, where, out)
        sections += result.epochs.markdown()
    if result.scaling is not None:
        where = os.path.join(out_dir, "mlcache-demo-scaling.png")
        result.scaling.chart = scaling.chart(result.scaling, where, out)
        sections += result.scaling.markdown()
    result.report = report.markdown(
        result.rows,
        result.changes,
        result.chart,
        os.path.join(out_dir, "mlcache-demo.md"),
        sections,
    )
    out(f"\nreport: {os.path.abspath(result.report)}")
    if result.chart:
        out(f"chart:  {os.path.abspath(result.chart)}")
    if result.epochs is not None and result.epochs.chart:
        out(f"chart of the first epochs: {os.path.abspath(result.epochs.chart)}")
    if result.scaling is not None and result.scaling.chart:
        out(f"chart at every size (reopen, memory): {os.path.abspath(result.scaling.chart)}")
    return result
