"""``mlcache demo``: what mlcache saves, timed on this machine, on generated data.

1. **Dataset loading.** Writes a synthetic MIMIC-like dataset (one CSV file per
   patient), then times loading it for training (:mod:`mlcache.demo.loading`):
   reading the files at every run, the hand-written "pickle the whole list into
   one file" cache, the README's ``CachedDataset`` with ``load_item`` (epoch 1
   fills the pack as it reads) and, as the alternative, ``load_source()`` (the
   whole pack built at the open); a first run, a new run to its first sample (a
   fresh process) and one epoch through a PyTorch DataLoader when torch is
   installed, each timed a few times (min and median), each saying what it
   times. Then the first epochs of one training run (:mod:`mlcache.demo.epochs`):
   the time of epochs 1, 2 and 3 reading the files, with the pickled list and
   with the ``load_item`` dataset on an empty cache, one line per epoch.
2. **Function results.** A preprocessing function over a large float64 array:
   no cache, the first call (compute and store), a repeated call, a repeated
   call with ``mmap_mode="r"``, and ``joblib.Memory`` beside it if installed.
3. **A change.** A changed argument is a miss that says which argument; an
   edited source file is loaded again, alone, at the next open of the
   ``load_item`` dataset (``load_source()`` would rebuild the pack); the pickled
   list still serves the old sample; ``clear`` empties the cache.
4. **At every size.** Generated samples (``{"x": float32[64], "y": int, "id":
   str}``) at as many as there are patients, 10x and 100x as many (5k, 50k,
   500k by default; 300, 3k, 30k with ``--quick``), each written once as a
   pickled list and as a pack; then the reopen time in a fresh process (the
   file alone, no source to check: min and median) and each of 2 workers' memory
   growth after reading every sample, private (its own heap) and shared (the
   pack's pages in the page cache): the pickled list's O(N) load and copy per
   worker against the pack's O(1) open and shared pages, the small sizes where
   the list wins included. What is measured, and how: :mod:`mlcache.demo.scaling`.

Prints a table per part, and writes a bar chart (``mlcache-demo.png``, with
matplotlib: linear axes, a panel per table), the chart of per-epoch time
(``mlcache-demo-epochs.png``), the chart of part 4
(``mlcache-demo-scaling.png``: reopen time and per-worker memory against size,
log axes) and a Markdown report (``mlcache-demo.md``) into ``out``. Everything
it caches lives in a temporary folder unless ``location`` is given.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..memo.memory import Memory
from . import epochs as epochs
from . import loading as loading
from . import report as report
from . import scaling as scaling
from .datasets import Patients, PatientsByItem
from .loading import repeat
from .report import BASELINE, JOBLIB, MLCACHE, Row
from .synthetic import read_patient

__all__ = ["DemoResult", "Patients", "PatientsByItem", "Row", "preprocess", "run_demo"]


def preprocess(x: np.ndarray, scale: float = 2.0) -> np.ndarray:
    """A stand-in for feature extraction: a few full passes over the array."""
    centered = x - x.mean(axis=0)
    return np.tanh(centered * scale) + np.sqrt(np.abs(centered))


@dataclass
class DemoResult:
    rows: list[Row] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    chart: str | None = None
    report: str | None = None
    scaling: scaling.Scaling | None = None
    epochs: epochs.Epochs | None = None


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
    """Two tables: the first call (computes and stores) and a repeated call (loads),
    each beside no cache. joblib's cache lives in ``root``, mlcache's in ``cache``."""
    x = np.random.default_rng(0).standard_normal((size, size))
    what = f"preprocess() of a {size}x{size} float64 array ({x.nbytes / 1e6:,.0f} MB)"
    first, again = f"{what}: a first call", f"{what}: a repeated call"
    out(f"timing {what} ({loading.REPEATS}x each)")
    mem = Memory(cache, verbose=1)  # the changes (part 3) say why a call computes
    mapped = Memory(cache, mmap_mode="r", verbose=0)
    # the timed calls are quiet: a first call timed three times would say so three times
    cached, cached_mm = mem.cache(preprocess, verbose=0), mapped.cache(preprocess)
    preprocess(x)  # warm-up: fresh memory is slow to touch the first time on some VMs
    base = repeat(lambda: preprocess(x))
    call, cleared, hit = (
        "this process: a call",
        "this process: cleared, a call",
        "this process: a call",
    )
    mm = hit + ", memory-mapped"
    rows = [Row(first, "no cache", call, BASELINE, base)]
    stored = repeat(lambda: cached(x), setup=lambda: cached.clear(warn=False))
    rows.append(Row(first, "mlcache (computes, stores)", cleared, MLCACHE, stored))
    later = [Row(again, "no cache", call, BASELINE, base)]
    later.append(Row(again, "mlcache", hit, MLCACHE, repeat(lambda: cached(x))))
    later.append(Row(again, 'mlcache, mmap_mode="r"', mm, MLCACHE, repeat(lambda: cached_mm(x))))
    try:
        import joblib
    except ImportError:
        out("joblib is not installed: joblib.Memory is not timed beside mlcache")
    else:
        jm = joblib.Memory(os.path.join(root, "joblib"), verbose=0)
        jm_mm = joblib.Memory(os.path.join(root, "joblib"), mmap_mode="r", verbose=0)
        jf, jf_mm = jm.cache(preprocess), jm_mm.cache(preprocess)
        stored = repeat(lambda: jf(x), setup=lambda: jf.clear(warn=False))
        rows.append(Row(first, "joblib (computes, stores)", cleared, JOBLIB, stored))
        later.append(Row(again, "joblib", hit, JOBLIB, repeat(lambda: jf(x))))
        later.append(Row(again, 'joblib, mmap_mode="r"', mm, JOBLIB, repeat(lambda: jf_mm(x))))
    rows += later
    for r in rows:
        r.baseline = min(base)
    return rows, (mem.cache(preprocess), x)


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


def _load() -> str:
    """The 1-minute load average, or "n/a" where there is none."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "n/a"


def _files(n: int) -> str:
    return f"{n:,} file" + ("" if n == 1 else "s")


def _changes(cached: Any, x: np.ndarray, loaded: loading.Loaded) -> list[str]:
    lines = [f"preprocess(x) again: {_why(lambda: cached(x))}"]
    changed = _why(lambda: cached(x, scale=3.0))
    lines.append(f"changed argument, preprocess(x, scale=3.0): {changed}")
    ns: dict[str, Any] = {"__name__": __name__, "np": np}
    exec(_EDITED, ns)  # our own text, above
    edited = cached.memory.cache(ns["preprocess"])
    lines.append(f"changed code of preprocess(), same call: {_why(lambda: edited(x))}")
    ds = loaded.ds
    first = min(n for n in os.listdir(loaded.files) if n.endswith(".csv"))
    victim = os.path.join(loaded.files, first)
    before = read_patient(victim)["age"]
    text = Path(victim).read_text().replace(f"# age: {before}", f"# age: {before + 1}", 1)
    Path(victim).write_text(text)
    cache = os.path.dirname(os.path.dirname(ds.pack_path))

    def reopen() -> tuple[PatientsByItem, int, float]:
        """Open the dataset as a new run would, read ds[0]: the loads, the seconds."""
        t0, done = time.perf_counter(), epochs.counted(loaded.counter)
        again = PatientsByItem(loaded.files, loaded.counter, cache_dir=cache, progress=False)
        again[0]
        return again, epochs.counted(loaded.counter) - done, time.perf_counter() - t0

    again, loads, took = reopen()
    name = os.path.basename(victim)
    lines.append(
        f"edited one source file ({name}, age {before} -> {before + 1}): at the next open "
        f"{_files(loads)} loaded again (open + ds[0] in {report.seconds(took)}); patient 0's "
        f"age is now {again[0]['age']}"
    )
    third, loads, took = reopen()
    same = "the same pack" if third.pack_path == again.pack_path else "ANOTHER pack"
    lines.append(f"opened again: {_files(loads)} loaded, {same}, in {report.seconds(took)}")
    rebuild = report.seconds(loaded.upfront)
    lines.append(
        "with load_source() instead (the alternative), the same edit rebuilds the whole pack "
        f"at the next open: every file parsed again, as in its first run ({rebuild})"
    )
    with open(loaded.pickled, "rb") as f:
        stale = pickle.load(f)[0]["age"]
    lines.append(f"the pickled list after the same edit: still says {stale} (it never looks)")
    stats = edited.memory.stats().values()  # what `mlcache ls` shows, per function
    saved, spent = sum(st.saved for st in stats), sum(st.computed for st in stats)
    lines.append(
        f"what the cache saved so far (mlcache ls): {report.seconds(saved)} of computing, "
        f"for {report.seconds(spent)} spent computing what it stored"
    )
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
        for cls in (Patients, PatientsByItem):
            loading.forget(datasets, cls)
    result = DemoResult()
    started, load = time.perf_counter(), _load()
    try:
        out(f"mlcache demo: generated data in {tmp}, mlcache's caches in {functions}")
        rows, loaded = loading.measure(tmp, datasets, patients, out)
        result.rows += rows
        result.epochs = _epochs(tmp, out)
        rows, (cached, x) = _functions(tmp, functions, size, out)
        result.rows += rows
        result.changes = _changes(cached, x, loaded)
        del loaded, cached, x  # part 4 measures memory: the earlier parts' data goes first
        if sizes:
            try:
                result.scaling = scaling.measure(os.path.join(tmp, "scaling"), sizes, out=out)
            except (OSError, RuntimeError) as exc:  # the other parts still report
                out(f"part 4 (at every size) failed: {exc}")
    finally:
        log.setLevel(level)
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.perf_counter() - started
    conditions = (
        f"The run took {took:.0f} s; load average {load} at its start, {_load()} at its end"
    )
    conditions += f" ({os.cpu_count()} CPUs: above that, other work was waiting for a CPU)."
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
        conditions,
    )
    out(f"\n{conditions}")
    out(f"\nreport: {os.path.abspath(result.report)}")
    if result.chart:
        out(f"chart:  {os.path.abspath(result.chart)}")
    if result.epochs is not None and result.epochs.chart:
        out(f"chart of the first epochs: {os.path.abspath(result.epochs.chart)}")
    if result.scaling is not None and result.scaling.chart:
        out(f"chart at every size (reopen, memory): {os.path.abspath(result.scaling.chart)}")
    return result
