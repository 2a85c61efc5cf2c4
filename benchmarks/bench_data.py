"""Datasets (issue 3): opening a pack, and a random-order full pass.

On synthetic MIMIC-like patients (``mlcache.demo.synthetic``: one CSV file per patient,
20,000 in the full run):

1. opening an existing pack, ``PackedDataset(path)``, of small samples
   (``{"x": float32[8], "y": int}``) at 20,000 and 1,000,000 samples (and, for
   information, the first read at 1,000,000, which verifies the per-sample tables,
   the patients' pack and a ``CachedDataset`` over the files);
2. a full pass in random order over every patient, touching every field (the sum of
   the vitals, age, label, sex, id): (a) parsing the source file with
   ``read_patient`` each time; (b) the hand-written cache, ``pickle.load`` of one
   file holding the list of samples, then the pass; (c) mlcache,
   ``PackedDataset(path)`` then the pass; (d) HuggingFace ``datasets``,
   ``load_from_disk`` (Arrow) then the pass, in its numpy format and in its default
   Python format, if ``datasets`` is installed.

Targets: open at 1M samples <= 20 ms and open 1M / open 20k <= 2 (O(1));
read_patient / mlcache >= 50, pickle list / mlcache >= 1, HF datasets / mlcache >= 1
(each format); (e) the pass over the open pack at most 2x the pass over the list
already in memory (issue 15). For information, no target: the same two passes reading
one value of each sample (``s["label"]``), which leaves the whole cost of ``ds[i]``
(building each sample: a private copy of its vitals, the dict) against a list lookup.

Sections 3 and 4 (peak RSS while packing 4x a memory budget; the memory of a
DataLoader over the pack) are in ``bench_data_memory.py``, which takes its sizes and
its patient data from here. LitData and MosaicML Streaming are not measured:
installing either into this environment replaces its CPU build of torch with a CUDA
build of several GB (and mosaicml-streaming downgrades numpy).

    python benchmarks/bench_data.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from _bench import (
    Contender,
    Outcome,
    Result,
    Target,
    check_free_disk,
    disk_size,
    finish,
    machine_note,
    mb,
    measure,
    outcome,
    parse_args,
    print_outcomes,
    report,
    scratch_dir,
)
from mlcache.data import CachedDataset, PackedDataset, pack
from mlcache.demo.synthetic import read_patient, write_patients


@dataclass(frozen=True)
class Sizes:
    """The sizes of both data benchmarks (``budget_mb`` and ``loader_*``: bench_data_memory)."""

    patients: int
    open_lo: int
    open_hi: int
    open_trials: int
    open_reps: int
    fast_trials: int
    slow_trials: int
    budget_mb: int
    loader_times: int  # the DataLoader's larger pack holds the patients this many times
    loader_workers: int
    loader_trials: int
    loader_pickle: bool  # also the pickled list in a DataLoader, for contrast
    loader_concurrent: bool  # the DataLoader children of a round at once (quick runs)


FULL = Sizes(20_000, 20_000, 1_000_000, 21, 20, 11, 3, 512, 10, 4, 3, True, False)
QUICK = Sizes(200, 2_000, 20_000, 3, 5, 3, 2, 48, 10, 4, 1, False, True)


#: the one-value passes (issue 26): what ``ds[i]`` costs over a list lookup
ONE_LIST = "one-value pass over the list in memory"
ONE_PACK = "mlcache: one-value pass (pack already open)"


# -- the work measured ------------------------------------------------------------------


def touch(s: dict[str, Any]) -> float:
    """Use every field of a sample."""
    return float(s["vitals"].sum()) + s["age"] + s["label"] + len(s["sex"]) + len(s["id"])


def touch_py(s: dict[str, Any]) -> float:
    """The same for HF's Python format, whose vitals are lists of lists."""
    vitals = np.asarray(s["vitals"], dtype=np.float32)
    return float(vitals.sum()) + s["age"] + s["label"] + len(s["sex"]) + len(s["id"])


class Patients(CachedDataset):
    """The CachedDataset a user would write over the patient files."""

    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_files(self) -> list[Path]:
        return sorted(Path(self.root).glob("*.csv"))

    def load_source(self) -> Iterator[dict[str, Any]]:
        for path in self.source_files():
            yield read_patient(path)


def small_samples(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    for start in range(0, n, 1 << 16):
        x = rng.random((min(1 << 16, n - start), 8), dtype=np.float32)
        for k, row in enumerate(x):
            yield {"x": row, "y": start + k}


def write_data(root: str, n: int) -> tuple[str, list[Path], list[dict[str, Any]], str]:
    """Write ``n`` patient files under ``root``, read them and pack them (from memory),
    printing the times; the folder of the files, their paths, the samples, the pack."""
    files_dir = os.path.join(root, "patients")
    t0 = time.perf_counter()
    paths = write_patients(files_dir, n, seed=0)
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    samples = [read_patient(p) for p in paths]
    t_read = time.perf_counter() - t0
    pat_pack = os.path.join(root, "patients.pack")
    t0 = time.perf_counter()
    pack(samples, pat_pack, progress=False)
    t_pack = time.perf_counter() - t0
    print(
        f"\n{n:,} patient files written in {t_write:.1f} s, read in "
        f"{t_read:.2f} s, packed (from memory) in {t_pack:.2f} s; scratch folder {root}"
    )
    return files_dir, paths, samples, pat_pack


def _recording(call: Any, name: str, totals: dict[str, float]) -> Any:
    def recorded() -> float:
        totals[name] = call()
        return totals[name]

    return recorded


# -- the sections ---------------------------------------------------------------------------


def bench_open(
    root: str, sz: Sizes, files_dir: str, pat_pack: str
) -> tuple[dict[str, dict[str, Result]], list[Outcome]]:
    paths = {}
    lines = []
    for n in (sz.open_lo, sz.open_hi):
        paths[n] = os.path.join(root, f"small-{n}.pack")
        t0 = time.perf_counter()
        pack(small_samples(n), paths[n], progress=False)
        dt = time.perf_counter() - t0
        lines.append(
            f"pack of {n:,} small samples: {mb(disk_size(paths[n]))}, built in {dt:.2f} s "
            f"({n / dt:,.0f} samples/s)"
        )
    cache_dir = os.path.join(root, "cached-datasets")
    t0 = time.perf_counter()
    Patients(files_dir, cache_dir=cache_dir, progress=False)  # the first one builds
    t_build = time.perf_counter() - t0
    lines.append(f"CachedDataset over the {sz.patients:,} files, first build: {t_build:.2f} s")
    lo_name = f"PackedDataset(path), {sz.open_lo:,} small samples"
    hi_name = f"PackedDataset(path), {sz.open_hi:,} small samples"
    trials, reps = sz.open_trials, sz.open_reps
    res = measure(
        [
            Contender(lo_name, lambda: PackedDataset(paths[sz.open_lo]), trials, reps),
            Contender(hi_name, lambda: PackedDataset(paths[sz.open_hi]), trials, reps),
            Contender(
                f"PackedDataset(path) + first read (verifies the tables), {sz.open_hi:,} "
                "small samples",
                lambda: PackedDataset(paths[sz.open_hi])[0],
                trials,
                reps,
                info=True,
            ),
            Contender(
                f"PackedDataset(path), {sz.patients:,} patients",
                lambda: PackedDataset(pat_pack),
                trials,
                reps,
                info=True,
            ),
            Contender(
                f"CachedDataset: key (stat of {sz.patients:,} source files) + open",
                lambda: Patients(files_dir, cache_dir=cache_dir, progress=False),
                max(3, trials // 3),
                info=True,
            ),
        ]
    )
    outcomes = report(
        "1. Opening an existing pack",
        res,
        [Target(f"open {sz.open_hi:,} / open {sz.open_lo:,} samples", hi_name, lo_name, "<=", 2)],
        note="\n".join(lines),
    )
    absolute = outcome(
        f"open at {sz.open_hi:,} samples, ms",
        res[hi_name].median * 1e3,
        res[hi_name].min * 1e3,
        "<=",
        20,
    )
    print_outcomes([absolute], "time")
    return {"open": res}, [*outcomes, absolute]


def _hf_dataset(samples: list[dict[str, Any]], out: str) -> Any:
    """Convert the samples once into an Arrow dataset saved under ``out``; the module."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    features = datasets.Features(
        {
            "vitals": datasets.Array2D(shape=(None, 6), dtype="float32"),
            "age": datasets.Value("int64"),
            "sex": datasets.Value("string"),
            "label": datasets.Value("int64"),
            "id": datasets.Value("string"),
        }
    )
    columns = {name: [s[name] for s in samples] for name in features}
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(out)
    return datasets


def bench_pass(
    root: str, sz: Sizes, paths: list[Path], samples: list[dict[str, Any]], pat_pack: str
) -> tuple[dict[str, dict[str, Result]], list[Outcome]]:
    order = np.random.default_rng(1).permutation(len(samples)).tolist()
    pkl = os.path.join(root, "patients.pkl")
    with open(pkl, "wb") as f:
        pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)
    hf_dir = os.path.join(root, "patients-hf")
    hf: Any = None
    hf_note = ""
    if importlib.util.find_spec("datasets") is None:
        hf_note = "HuggingFace datasets: not installed (pip install datasets), not measured."
    else:
        t0 = time.perf_counter()
        hf = _hf_dataset(samples, hf_dir)
        hf_note = (
            f"HuggingFace datasets {hf.__version__}: converted once with Array2D(None, 6) "
            f"vitals in {time.perf_counter() - t0:.2f} s, {mb(disk_size(hf_dir))} on disk."
        )

    def files() -> float:
        return sum(touch(read_patient(paths[i])) for i in order)

    def pickled() -> float:
        with open(pkl, "rb") as fh:
            data = pickle.load(fh)
        return sum(touch(data[i]) for i in order)

    def load_only() -> Any:
        with open(pkl, "rb") as fh:
            return pickle.load(fh)

    def in_memory() -> float:
        return sum(touch(samples[i]) for i in order)

    def mlc() -> float:
        ds = PackedDataset(pat_pack)
        return sum(touch(ds[i]) for i in order)

    opened = PackedDataset(pat_pack)

    def mlc_pass() -> float:
        return sum(touch(opened[i]) for i in order)

    def in_memory_one() -> float:
        return sum(samples[i]["label"] for i in order)

    def mlc_one() -> float:
        return sum(opened[i]["label"] for i in order)

    def hf_numpy() -> float:
        ds = hf.load_from_disk(hf_dir).with_format("numpy")
        return sum(touch(ds[i]) for i in order)

    def hf_python() -> float:
        ds = hf.load_from_disk(hf_dir)
        return sum(touch_py(ds[i]) for i in order)

    names = {
        "a": "(a) read_patient() of each source file",
        "b": "(b) pickle.load of the list + pass",
        "c": "(c) mlcache: PackedDataset(path) + pass",
        "d": "(d) HF datasets: load_from_disk + pass, numpy format",
        "d2": "(d) HF datasets: load_from_disk + pass, Python format",
    }
    fast, slow = sz.fast_trials, sz.slow_trials
    contenders = [
        Contender(names["a"], files, max(slow, fast // 2)),  # the numerator of (a)
        Contender(names["b"], pickled, fast),
        Contender(names["c"], mlc, fast),
        Contender("pickle.load only", load_only, fast, info=True),
        Contender("pass over the list already in memory", in_memory, fast, info=True),
        Contender("mlcache: pass only (pack already open)", mlc_pass, fast, info=True),
        Contender(ONE_LIST, in_memory_one, fast, info=True),
        Contender(ONE_PACK, mlc_one, fast, info=True),
    ]
    targets = [
        Target("(a) read_patient / mlcache", names["a"], names["c"], ">=", 50),
        Target("(b) pickle list / mlcache", names["b"], names["c"], ">=", 1),
        Target(  # issue 15: a random pass at most twice a pass over a list in RAM
            "(e) pass, pack open / list in memory",
            "mlcache: pass only (pack already open)",
            "pass over the list already in memory",
            "<=",
            2,
        ),
    ]
    if hf is not None:
        contenders += [
            Contender(names["d"], hf_numpy, slow),
            Contender(names["d2"], hf_python, slow),
            Contender(
                "HF datasets: load_from_disk only",
                lambda: hf.load_from_disk(hf_dir),
                fast,
                info=True,
            ),
        ]
        targets += [
            Target("(d) HF datasets numpy / mlcache", names["d"], names["c"], ">=", 1),
            Target("(d) HF datasets Python / mlcache", names["d2"], names["c"], ">=", 1),
        ]
    # every pass must read the same values: keep each one's last total
    totals: dict[str, float] = {}
    for c in contenders:
        if c.name != "pickle.load only" and "load_from_disk only" not in c.name:
            c.call = _recording(c.call, c.name, totals)
    n = len(samples)
    note = "\n".join(
        [
            f"{n:,} patients; sizes on disk: source CSV files "
            f"{mb(disk_size(str(paths[0].parent)))}, pickle {mb(disk_size(pkl))}, "
            f"pack {mb(disk_size(pat_pack))}.",
            hf_note,
            "LitData and MosaicML Streaming: not measured (installing either replaces this "
            "environment's CPU torch with a CUDA build of several GB; mosaicml-streaming "
            "also downgrades numpy).",
        ]
    )
    res = measure(contenders)
    expected = in_memory()
    one = (totals.pop(ONE_LIST, None), totals.pop(ONE_PACK, None))
    for name, got in totals.items():
        if not math.isclose(got, expected, rel_tol=1e-9):
            raise AssertionError(f"{name}: total {got} where the samples give {expected}")
    if one[1] != in_memory_one() or one[0] != one[1]:
        raise AssertionError(
            f"one-value passes: totals {one} where the samples give {in_memory_one()}"
        )
    outcomes = report(
        f"2. A full pass in random order over {n:,} patients", res, targets, note=note
    )
    per = {k: res[v].median / n * 1e6 for k, v in names.items() if v in res}
    per["pass only"] = res["mlcache: pass only (pack already open)"].median / n * 1e6
    per["list in memory"] = res["pass over the list already in memory"].median / n * 1e6
    per["one value, pack"] = res[ONE_PACK].median / n * 1e6
    per["one value, list"] = res[ONE_LIST].median / n * 1e6
    print("\nPer sample (medians): " + ", ".join(f"{k} {v:.1f} µs" for k, v in per.items()) + ".")
    return {"pass": res}, outcomes


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    sz = QUICK if args.quick else FULL
    print(f"# bench_data: {sz.patients:,} synthetic patients\n\n{machine_note()}")
    with scratch_dir(args.dir, "data") as root:
        # files, pickle, packs, HF dataset (~8 KiB a patient, each a copy); small packs
        check_free_disk(root, sz.patients * 5 * (8 << 10) + sz.open_hi * 64)
        os.environ["HF_HOME"] = os.path.join(root, "hf-home")  # nothing of ours in ~/.cache
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
        files_dir, paths, samples, pat_pack = write_data(root, sz.patients)
        sections, outcomes = bench_open(root, sz, files_dir, pat_pack)
        more, more_outcomes = bench_pass(root, sz, paths, samples, pat_pack)
        sections.update(more)
        outcomes += more_outcomes
    return finish(args, "bench_data", sections, outcomes)


if __name__ == "__main__":
    sys.exit(main())
