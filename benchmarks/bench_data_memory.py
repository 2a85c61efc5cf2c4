"""Datasets (issue 3), memory: packing more data than a memory budget, and a DataLoader
over a pack.

On the synthetic MIMIC-like patients of ``bench_data.py`` (one CSV file per patient,
20,000 in the full run); the sections go on from that script's two (1. opening a pack,
2. a random-order full pass):

3. the peak RSS of a child process packing a stream of ~1 MiB samples whose total is
   4x a memory budget (2 GiB of data for the default 512 MiB budget), and 1x;
4. the memory of a ``torch.utils.data.DataLoader`` (batch 64, shuffle, 4 workers,
   fork) over one epoch of the patients' pack at 20,000 and at 200,000 samples (the
   patients ten times), summed over the main process and its workers: peak RSS, and
   peak PSS split into file-backed pages (the memory map: page cache that every
   process shares and the kernel can drop) and anonymous + shared-memory pages (what
   the processes really hold). For contrast, the pickled list in the same DataLoader.

Targets: packing 4x the budget: peak RSS <= the budget; DataLoader: peak anonymous +
shmem PSS at 200k / at 20k <= 1.1.

Each measurement runs in a child process of its own (this script with ``--child``), so
that each peak belongs to that measurement alone.

    python benchmarks/bench_data_memory.py [--quick] [--dir PARENT] [--pack-budget-mb MB]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from _bench import (
    MIB,
    Outcome,
    check_free_disk,
    disk_size,
    finish,
    machine_note,
    mb,
    outcome,
    parse_args,
    print_outcomes,
    scratch_dir,
)
from bench_data import FULL, QUICK, Sizes, write_data
from mlcache.data import PackedDataset, pack

LOADER_BATCH = 64
MEM_FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


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


# -- the sections ---------------------------------------------------------------------------


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
        f"\n### 3. Peak RSS while packing (budget {mb(budget)}; samples ~{mb(sample)} each, "
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
            mb(r["data"]),
            f"{r['samples']:,}",
            f"{r['seconds']:.2f} s",
            f"{r['data'] / r['seconds'] / 1e6:,.0f} MB/s",
            mb(r["baseline"]),
            mb(r["hwm"]),
            mb(r["hwm"] - r["baseline"]),
            f"{r['hwm'] / r['data']:.3f}",
            mb(r["peak"]),
        ]
        print("| " + " | ".join(cells) + " |")
    big = runs[-1][1]
    ratio = big["hwm"] / budget
    o = outcome("packing 4x the budget: peak RSS / budget", ratio, ratio, "<=", 1)
    print_outcomes([o])
    return [o]


def bench_loader(
    root: str, sz: Sizes, samples: list[dict[str, Any]], pat_pack: str
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
        pkl = os.path.join(root, "patients.pkl")
        with open(pkl, "wb") as f:
            pickle.dump(samples, f, protocol=pickle.HIGHEST_PROTOCOL)
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
            mb(statistics.median(r["peak"][f] for r in rs))
            for f in ("Rss", "Pss", "Pss_File", "Pss_Anon", "Pss_Shmem", "Pss_NonFile")
        ]
        cells = [
            label,
            f"{n:,}",
            mb(disk_size(datasets_[kind, n])),
            f"{med(rs, lambda r: r['seconds']):.2f} s",
            mb(med(rs, lambda r: r["hwm"])),
            *peaks,
        ]
        print("| " + " | ".join(cells) + " |")
    lo_runs, hi_runs = runs[("pack", lo)], runs[("pack", hi)]

    def nonfile(r: dict[str, Any]) -> float:
        return r["peak"]["Pss_NonFile"]

    o = outcome(
        f"DataLoader: peak Σ PSS anon + shmem, {hi:,} / {lo:,} samples",
        med(hi_runs, nonfile) / med(lo_runs, nonfile),
        min(map(nonfile, hi_runs)) / min(map(nonfile, lo_runs)),
        "<=",
        1.1,
    )
    print_outcomes([o])
    growth_rss = med(hi_runs, lambda r: r["peak"]["Rss"]) - med(lo_runs, lambda r: r["peak"]["Rss"])
    growth_file = med(hi_runs, lambda r: r["peak"]["Pss_File"]) - med(
        lo_runs, lambda r: r["peak"]["Pss_File"]
    )
    print(
        f"\nFrom {lo:,} to {hi:,} samples the pack grows by "
        f"{mb(disk_size(hi_pack) - disk_size(pat_pack))}; peak Σ RSS grows by {mb(growth_rss)} "
        f"(each page of the map counted once per process that touched it) and peak Σ PSS "
        f"of file-backed pages by {mb(growth_file)} (each page counted once): that growth "
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
    print(f"# bench_data_memory: {sz.patients:,} synthetic patients\n\n{machine_note()}")
    with scratch_dir(args.dir, "data-memory") as root:
        # packing: spill files + pack; patients: files, pickles, packs (~8 KiB each a copy)
        check_free_disk(root, 8 * budget + sz.patients * (sz.loader_times + 2) * (8 << 10))
        _files_dir, _paths, samples, pat_pack = write_data(root, sz.patients)
        outcomes = bench_pack_memory(root, budget)
        outcomes += bench_loader(root, sz, samples, pat_pack)
    return finish(args, "bench_data_memory", {}, outcomes)


if __name__ == "__main__":
    sys.exit(main())
