"""Datasets (issue 3): opening a pack, a random-order full pass, memory when packing and
in a DataLoader.

On synthetic MIMIC-like patients (``mlcache.data.synthetic``: one CSV file per patient,
20,000 in the full run):

1. opening an existing pack, ``PackedDataset(path)``, of small samples
   (``{"x": float32[8], "y": int}``) at 20,000 and 1,000,000 samples (and, for
   information, the patients' pack and a ``CachedDataset`` over the files);
2. a full pass in random order over every patient, touching every field (the sum of
   the vitals, age, label, sex, id): (a) parsing the source file with
   ``read_patient`` each time; (b) the hand-written cache, ``pickle.load`` of one
   file holding the list of samples, then the pass; (c) mlcache,
   ``PackedDataset(path)`` then the pass; (d) HuggingFace ``datasets``,
   ``load_from_disk`` (Arrow) then the pass, in its numpy format and in its default
   Python format, if ``datasets`` is installed;
3. the peak RSS of a child process packing a stream of ~1 MiB samples whose total is
   4x a memory budget (2 GiB of data for the default 512 MiB budget), and 1x;
4. the memory of a ``torch.utils.data.DataLoader`` (batch 64, shuffle, 4 workers,
   fork) over one epoch of the patients' pack at 20,000 and at 200,000 samples (the
   patients ten times), summed over the main process and its workers: peak RSS, and
   peak PSS split into file-backed pages (the memory map: page cache that every
   process shares and the kernel can drop) and anonymous + shared-memory pages (what
   the processes really hold). For contrast, the pickled list in the same DataLoader.

Targets: open at 1M samples <= 20 ms and open 1M / open 20k <= 2 (O(1));
read_patient / mlcache >= 50, pickle list / mlcache >= 1, HF datasets / mlcache >= 1
(each format); packing 4x the budget: peak RSS <= the budget; DataLoader: peak
anonymous + shmem PSS at 200k / at 20k <= 1.1.

Sections 3 and 4 run one child process per measurement, so that each peak belongs to
that measurement alone. LitData and MosaicML Streaming are not measured: installing
either into this environment replaces its CPU build of torch with a CUDA build of
several GB (and mosaicml-streaming downgrades numpy).

    python benchmarks/bench_data.py [--quick] [--dir PARENT] [--pack-budget-mb MB]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pickle
import resource
import statistics
import subprocess
import sys
import threading
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
    finish,
    machine_note,
    measure,
    parse_args,
    report,
    scratch_dir,
)
from mlcache.data import CachedDataset, PackedDataset, pack
from mlcache.data.synthetic import read_patient, write_patients

LOADER_BATCH = 64
MEM_FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")
MIB = 1 << 20


@dataclass(frozen=True)
class Sizes:
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


def replicated(samples: list[dict[str, Any]], times: int) -> Iterator[dict[str, Any]]:
    """The samples ``times`` over, each copy its own arrays and id."""
    for r in range(times):
        for s in samples:
            yield {**s, "vitals": s["vitals"].copy(), "id": f"{s['id']}-{r}"}


# -- memory of processes (Linux /proc) ---------------------------------------------------


def _smaps(pid: int) -> dict[str, int]:
    out = dict.fromkeys(MEM_FIELDS, 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.read().splitlines()[1:]
    except OSError:  # the process has just exited
        return out
    for line in lines:
        key, _, rest = line.partition(":")
        if key in out:
            out[key] = int(rest.split()[0]) * 1024
    return out


def _status(pid: int | str, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> list[int]:
    try:
        import psutil
    except ImportError:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rpartition(")")[2].split()[1])
                except OSError:
                    continue
                if ppid == pid:
                    found.append(int(entry))
        return found
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


class _PeakMemory(threading.Thread):
    """Samples the summed memory of this process and its children every ``interval``
    seconds; keeps the peak of each sum (taken at one instant across processes)."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = dict.fromkeys((*MEM_FIELDS, "Pss_NonFile"), 0)
        self.samples = 0
        self.most_processes = 0
        self.done = threading.Event()

    def sample(self) -> None:
        pids = [os.getpid(), *_children(os.getpid())]
        total = dict.fromkeys(MEM_FIELDS, 0)
        for pid in pids:
            for key, value in _smaps(pid).items():
                total[key] += value
        total["Pss_NonFile"] = total["Pss_Anon"] + total["Pss_Shmem"]
        for key, value in total.items():
            self.peak[key] = max(self.peak[key], value)
        self.samples += 1
        self.most_processes = max(self.most_processes, len(pids))

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.sample()


def collate(batch: list[dict[str, Any]]) -> tuple[Any, ...]:
    """Pad the vitals of a batch into one tensor (as a training script would)."""
    import torch

    longest = max(len(s["vitals"]) for s in batch)
    vitals = np.zeros((len(batch), longest, 6), dtype=np.float32)
    for k, s in enumerate(batch):
        vitals[k, : len(s["vitals"])] = s["vitals"]
    return (
        torch.from_numpy(vitals),
        torch.tensor([s["label"] for s in batch]),
        torch.tensor([s["age"] for s in batch]),
        [s["id"] for s in batch],
    )


# -- child processes ------------------------------------------------------------------


def child_pack(spec: dict[str, Any]) -> dict[str, Any]:
    """Pack ~``spec["data"]`` bytes of generated samples; report this process's memory."""
    baseline = _status("self", "VmRSS")
    rng = np.random.default_rng(spec["seed"])
    rows = max(2, spec["sample"] // 1024)  # rows of 256 float32
    produced = [0, 0]  # bytes, samples

    def samples() -> Iterator[dict[str, Any]]:
        while produced[0] < spec["data"]:
            t = int(rng.integers(rows // 2, rows * 3 // 2 + 1))
            signal = rng.random((t, 256), dtype=np.float32)
            sid = f"s{produced[1]:08d}"
            produced[0] += signal.nbytes + len(sid) + 8
            produced[1] += 1
            yield {"signal": signal, "label": produced[1] % 2, "id": sid}

    t0 = time.perf_counter()
    ds = pack(samples(), spec["path"], progress=False)
    seconds = time.perf_counter() - t0
    n = len(ds)
    del ds
    return {
        "baseline": baseline,
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "hwm": _status("self", "VmHWM"),
        "data": produced[0],
        "samples": n,
        "pack_bytes": os.path.getsize(spec["path"]),
        "seconds": seconds,
    }


def child_loader(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch of a DataLoader over a pack or a pickled list; peak memory of all."""
    import torch
    from torch.utils.data import DataLoader

    dataset: Any
    if spec["kind"] == "pack":
        dataset = PackedDataset(spec["path"])
    else:
        with open(spec["path"], "rb") as f:
            dataset = pickle.load(f)
    peak = _PeakMemory(spec["interval"])
    peak.sample()
    loader = DataLoader(
        dataset,
        batch_size=LOADER_BATCH,
        shuffle=True,
        num_workers=spec["workers"],
        collate_fn=collate,
        persistent_workers=True,  # still alive after the epoch, to read their VmHWM
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0),
    )
    peak.start()
    t0 = time.perf_counter()
    seen, total = 0, 0.0
    for vitals, _labels, ages, ids in loader:
        total += float(vitals.sum()) + float(ages.sum())
        seen += len(ids)
    seconds = time.perf_counter() - t0
    peak.done.set()
    peak.join()
    peak.sample()
    pids = [os.getpid(), *_children(os.getpid())]
    hwm = sum(_status(pid, "VmHWM") for pid in pids)
    if seen != len(dataset):
        raise RuntimeError(f"the epoch saw {seen} samples of {len(dataset)}")
    return {
        "seconds": seconds,
        "samples": seen,
        "processes": len(pids),
        "hwm": hwm,
        "peak": peak.peak,
        "polls": peak.samples,
    }


def start_child(spec: dict[str, Any]) -> tuple[dict[str, Any], subprocess.Popen[str]]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return spec, proc


def wait_child(started: tuple[dict[str, Any], subprocess.Popen[str]]) -> dict[str, Any]:
    spec, proc = started
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['what']} failed:\n{out[-2000:]}{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return wait_child(start_child(spec))


# -- reporting helpers --------------------------------------------------------------------


def _mb(n: float) -> str:
    return f"{n / MIB:,.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.1f} MiB"


def _outcome(label: str, med: float, mn: float, op: str, bound: float) -> Outcome:
    def ok(r: float) -> bool:
        return r >= bound if op == ">=" else r <= bound

    n_ok = ok(med) + ok(mn)
    verdict = "holds" if n_ok == 2 else "marginal" if n_ok == 1 else "fails"
    return Outcome(label, med, mn, op, bound, verdict)


def _print_outcomes(outcomes: list[Outcome], first: str = "ratio") -> None:
    print(f"\n| {first} | of medians | of minima | target | verdict |")
    print("|---|---:|---:|---:|---|")
    for o in outcomes:
        shown = o.verdict if o.verdict == "holds" else f"**{o.verdict.upper()}**"
        print(
            f"| {o.label} | {o.ratio_median:.2f} | {o.ratio_min:.2f} | {o.op} {o.bound:g} "
            f"| {shown} |",
            flush=True,
        )


def _recording(call: Any, name: str, totals: dict[str, float]) -> Any:
    def recorded() -> float:
        totals[name] = call()
        return totals[name]

    return recorded


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return os.path.getsize(path)


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
            f"pack of {n:,} small samples: {_mb(_size(paths[n]))}, built in {dt:.2f} s "
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
    absolute = _outcome(
        f"open at {sz.open_hi:,} samples, ms",
        res[hi_name].median * 1e3,
        res[hi_name].min * 1e3,
        "<=",
        20,
    )
    _print_outcomes([absolute], "time")
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
            f"vitals in {time.perf_counter() - t0:.2f} s, {_mb(_size(hf_dir))} on disk."
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
        Contender(names["a"], files, slow),
        Contender(names["b"], pickled, fast),
        Contender(names["c"], mlc, fast),
        Contender("pickle.load only", load_only, fast, info=True),
        Contender("pass over the list already in memory", in_memory, fast, info=True),
        Contender("mlcache: pass only (pack already open)", mlc_pass, fast, info=True),
    ]
    targets = [
        Target("(a) read_patient / mlcache", names["a"], names["c"], ">=", 50),
        Target("(b) pickle list / mlcache", names["b"], names["c"], ">=", 1),
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
            f"{n:,} patients; sizes on disk: source CSV files {_mb(_size(str(paths[0].parent)))}, "
            f"pickle {_mb(_size(pkl))}, pack {_mb(_size(pat_pack))}.",
            hf_note,
            "LitData and MosaicML Streaming: not measured (installing either replaces this "
            "environment's CPU torch with a CUDA build of several GB; mosaicml-streaming "
            "also downgrades numpy).",
        ]
    )
    res = measure(contenders)
    expected = in_memory()
    for name, got in totals.items():
        if not math.isclose(got, expected, rel_tol=1e-9):
            raise AssertionError(f"{name}: total {got} where the samples give {expected}")
    outcomes = report(
        f"2. A full pass in random order over {n:,} patients", res, targets, note=note
    )
    per = {k: res[v].median / n * 1e6 for k, v in names.items() if v in res}
    per["pass only"] = res["mlcache: pass only (pack already open)"].median / n * 1e6
    per["list in memory"] = res["pass over the list already in memory"].median / n * 1e6
    print("\nPer sample (medians): " + ", ".join(f"{k} {v:.1f} µs" for k, v in per.items()) + ".")
    return {"pass": res}, outcomes


def bench_pack_memory(root: str, budget: int) -> list[Outcome]:
    path = os.path.join(root, "big.pack")
    sample = min(MIB, max(16 << 10, budget // 64))
    runs = []
    for mult in (1, 4):
        spec = {"what": "pack", "path": path, "data": mult * budget, "sample": sample, "seed": mult}
        r = run_child(spec)
        os.unlink(path)
        runs.append((mult, r))
    print(
        f"\n### 3. Peak RSS while packing (budget {_mb(budget)}; samples ~{_mb(sample)} each, "
        "generated on the fly)\n"
    )
    print(
        "A child process per row packs `{signal: float32[T, 256], label, id}` samples. Peak "
        "RSS is the child's VmHWM (the kernel's high-water mark of its address space), the "
        "baseline its VmRSS after imports. Its `getrusage(RUSAGE_SELF).ru_maxrss` is shown "
        "too but is not the figure: Python starts the child with vfork + exec, and Linux "
        "carries the high-water mark of the address space replaced at exec (this parent's) "
        "into ru_maxrss (and so into the parent's RUSAGE_CHILDREN). The bytes written go "
        "through the page cache, which is in no process's RSS.\n"
    )
    print(
        "| data packed | samples | time | throughput | RSS after imports | peak RSS (VmHWM) "
        "| peak - baseline | peak RSS / data | ru_maxrss |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for _mult, r in runs:
        cells = [
            _mb(r["data"]),
            f"{r['samples']:,}",
            f"{r['seconds']:.2f} s",
            f"{r['data'] / r['seconds'] / 1e6:,.0f} MB/s",
            _mb(r["baseline"]),
            _mb(r["hwm"]),
            _mb(r["hwm"] - r["baseline"]),
            f"{r['hwm'] / r['data']:.3f}",
            _mb(r["peak"]),
        ]
        print("| " + " | ".join(cells) + " |")
    big = runs[-1][1]
    ratio = big["hwm"] / budget
    o = _outcome("packing 4x the budget: peak RSS / budget", ratio, ratio, "<=", 1)
    _print_outcomes([o])
    return [o]


def bench_loader(
    root: str, sz: Sizes, samples: list[dict[str, Any]], pat_pack: str, pkl: str
) -> list[Outcome]:
    if importlib.util.find_spec("torch") is None:
        print("\n### 4. DataLoader memory\n\ntorch is not installed: not measured.")
        return []
    lo, hi = len(samples), len(samples) * sz.loader_times
    hi_pack = os.path.join(root, f"patients-x{sz.loader_times}.pack")
    t0 = time.perf_counter()
    pack(replicated(samples, sz.loader_times), hi_pack, progress=False)
    build = time.perf_counter() - t0
    datasets_ = {("pack", lo): pat_pack, ("pack", hi): hi_pack}
    if sz.loader_pickle:
        hi_pkl = os.path.join(root, f"patients-x{sz.loader_times}.pkl")
        with open(hi_pkl, "wb") as f:
            pickle.dump(list(replicated(samples, sz.loader_times)), f, pickle.HIGHEST_PROTOCOL)
        datasets_[("pickle", lo)] = pkl
        datasets_[("pickle", hi)] = hi_pkl
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {k: [] for k in datasets_}
    keys = list(datasets_)
    for trial in range(sz.loader_trials):
        k = trial % len(keys)
        started = []
        for key in keys[k:] + keys[:k]:
            if key[0] == "pickle" and trial > 0:
                continue  # the contrast: one run each
            spec = {
                "what": "loader",
                "kind": key[0],
                "path": datasets_[key],
                "workers": sz.loader_workers,
                "interval": 0.05,
            }
            if sz.loader_concurrent:  # each child sums its own process tree only
                started.append((key, start_child(spec)))
            else:
                runs[key].append(run_child(spec))
        for key, child in started:
            runs[key].append(wait_child(child))
        print(
            f"  DataLoader round {trial + 1}/{sz.loader_trials} done", file=sys.stderr, flush=True
        )

    def med(rs: list[dict[str, Any]], f: Any) -> float:
        return statistics.median(f(r) for r in rs)

    print(
        f"\n### 4. Memory of a DataLoader (batch {LOADER_BATCH}, shuffle, "
        f"{sz.loader_workers} workers, fork), one epoch\n"
    )
    print(
        f"The {hi:,}-sample pack holds the {lo:,} patients {sz.loader_times} times (built in "
        f"{build:.1f} s). Memory summed over the main process and its workers; peaks of "
        "the sums sampled every 50 ms from /proc/<pid>/smaps_rollup, and the sum of each "
        "process's kernel-tracked peak RSS (VmHWM). Medians over "
        f"{sz.loader_trials} run(s) for the packs, one run for the pickled lists.\n"
    )
    print(
        "| dataset | samples | file | epoch | Σ VmHWM | peak Σ RSS | peak Σ PSS "
        "| of which file-backed | anon | shmem | peak Σ PSS anon + shmem |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (kind, n), rs in runs.items():
        label = "mlcache pack" if kind == "pack" else "pickled list (contrast)"
        peaks = [
            _mb(statistics.median(r["peak"][f] for r in rs))
            for f in ("Rss", "Pss", "Pss_File", "Pss_Anon", "Pss_Shmem", "Pss_NonFile")
        ]
        cells = [
            label,
            f"{n:,}",
            _mb(_size(datasets_[kind, n])),
            f"{med(rs, lambda r: r['seconds']):.2f} s",
            _mb(med(rs, lambda r: r["hwm"])),
            *peaks,
        ]
        print("| " + " | ".join(cells) + " |")
    lo_runs, hi_runs = runs[("pack", lo)], runs[("pack", hi)]

    def nonfile(r: dict[str, Any]) -> float:
        return r["peak"]["Pss_NonFile"]

    o = _outcome(
        f"DataLoader: peak Σ PSS anon + shmem, {hi:,} / {lo:,} samples",
        med(hi_runs, nonfile) / med(lo_runs, nonfile),
        min(map(nonfile, hi_runs)) / min(map(nonfile, lo_runs)),
        "<=",
        1.1,
    )
    _print_outcomes([o])
    growth_rss = med(hi_runs, lambda r: r["peak"]["Rss"]) - med(lo_runs, lambda r: r["peak"]["Rss"])
    growth_file = med(hi_runs, lambda r: r["peak"]["Pss_File"]) - med(
        lo_runs, lambda r: r["peak"]["Pss_File"]
    )
    print(
        f"\nFrom {lo:,} to {hi:,} samples the pack grows by "
        f"{_mb(_size(hi_pack) - _size(pat_pack))}; peak Σ RSS grows by {_mb(growth_rss)} "
        f"(each page of the map counted once per process that touched it) and peak Σ PSS "
        f"of file-backed pages by {_mb(growth_file)} (each page counted once): that growth "
        "is the page cache of the memory-mapped pack, shared, clean and reclaimable, not "
        "memory the processes own."
    )
    return [o]


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pack-budget-mb",
        type=int,
        default=None,
        help="memory budget of the packing measurement; it packs 4x this much data "
        f"(default {FULL.budget_mb}, {QUICK.budget_mb} with --quick)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], _options)
    if args.child is not None:
        spec = json.loads(args.child)
        result = child_pack(spec) if spec["what"] == "pack" else child_loader(spec)
        print(json.dumps(result))
        return 0
    sz = QUICK if args.quick else FULL
    budget = (args.pack_budget_mb or sz.budget_mb) * MIB
    print(f"# bench_data: {sz.patients:,} synthetic patients\n\n{machine_note()}")
    with scratch_dir(args.dir, "data") as root:
        # packing: spill files + pack; patients: files, pickles, packs (~8 KiB each a copy)
        check_free_disk(root, 8 * budget + sz.patients * (sz.loader_times + 2) * (8 << 10))
        os.environ["HF_HOME"] = os.path.join(root, "hf-home")  # nothing of ours in ~/.cache
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
        files_dir = os.path.join(root, "patients")
        t0 = time.perf_counter()
        paths = write_patients(files_dir, sz.patients, seed=0)
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        samples = [read_patient(p) for p in paths]
        t_read = time.perf_counter() - t0
        pat_pack = os.path.join(root, "patients.pack")
        t0 = time.perf_counter()
        pack(samples, pat_pack, progress=False)
        t_pack = time.perf_counter() - t0
        print(
            f"\n{sz.patients:,} patient files written in {t_write:.1f} s, read in "
            f"{t_read:.2f} s, packed (from memory) in {t_pack:.2f} s; scratch folder {root}"
        )
        sections, outcomes = bench_open(root, sz, files_dir, pat_pack)
        more, more_outcomes = bench_pass(root, sz, paths, samples, pat_pack)
        sections.update(more)
        outcomes += more_outcomes
        outcomes += bench_pack_memory(root, budget)
        outcomes += bench_loader(root, sz, samples, pat_pack, os.path.join(root, "patients.pkl"))
    return finish(args, "bench_data", sections, outcomes)


if __name__ == "__main__":
    sys.exit(main())
