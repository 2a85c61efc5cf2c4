"""The pack reader's cost per sample (issue 13): reads private to each read.

Since issue 13, an array a read returns is writable and private to that read
(``s["x"] /= 255`` works and never reaches the pack or the next epoch): copied
below ``PRIVATE_MAP_MIN`` (256 KiB), a private copy-on-write map of its pages
above; and the reader looks at its file every ``CHECK_EVERY`` reads. This script
times ``ds[i]`` over a full pass in random order, side by side, for the reader
as it was before (loaded from git, ``--before``, default the commit before issue
13's reader work) and as it is now:

* ``small``: 20,000 samples ``{"x": float32[8], "y": int}`` (the copy path);
* ``medium``: 4,000 samples ``{"x": float32[64, 64]}``, 16 KiB (the copy path);
* ``large``: 256 samples ``{"x": uint8[512, 512, 3]}``, 768 KiB (the map path),
  read only, and read whole (``x.sum()``: every page touched, the map's page
  faults included);
* ``patients``: 2,000 synthetic patients (``mlcache.demo.synthetic``, as in
  ``bench_data.py``: vitals float32[T, 6], age, label, sex, id), every field
  touched, as ``bench_data.py``'s pass does; and again reading one value of each
  (``s["label"]``: what ``ds[i]`` itself costs, issue 26);
* each also with ``writable=False`` (read-only views of the shared map, the
  reads of before with today's file checks);
* ``torch``: ``mlcache.torch.TorchDataset`` over the medium and large packs
  (before: zero-copy tensors of the read-only map, which crash on an in-place
  operation).

Each trial is one full pass, preceded by an untimed warm-up pass; rounds are
interleaved (see ``_bench.py``). ``--before`` loads that revision's ``reader`` and,
when it had one, its ``regions`` (the generated reader, since issue 14). Printed:
µs per sample, min and median, and the ratio after / before. No target: the
figures go into ``benchmarks/RESULTS.md``.

    python benchmarks/bench_reader.py [--quick] [--dir PARENT] [--before REV] [--patients N]
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from _bench import Contender, machine_note, measure, parse_args, scratch_dir
from mlcache.data import pack
from mlcache.data import reader as now

#: the last commit before issue 13's changes to the reader
BEFORE = "35eafdd"


def _git_show(rev: str, path: str) -> bytes:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, check=True
    ).stdout


def _load(name: str, source: bytes, folder: str) -> types.ModuleType:
    """``source`` imported as the module ``name`` (in the package: its relative
    imports resolve)."""
    path = os.path.join(folder, name.rpartition(".")[2] + ".py")
    with open(path, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _old_reader(rev: str) -> types.ModuleType | None:
    """``mlcache.data.reader`` as it was at ``rev``, imported beside today's, with
    that revision's ``regions`` (the generated reader) when it had one."""
    try:
        source = _git_show(rev, "src/mlcache/data/reader.py")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no reader at {rev}: {exc}; only today's is timed)", file=sys.stderr)
        return None
    folder = tempfile.mkdtemp(prefix="mlcache-old-reader-")
    try:
        regions = _git_show(rev, "src/mlcache/data/regions.py")
    except subprocess.CalledProcessError:  # before issue 14: all in reader.py
        regions = None
    if regions is not None:
        _load("mlcache.data._regions_before", regions, folder)
        source = source.replace(b"from .regions import", b"from ._regions_before import")
    # what it imports moved since (issue 14's layout): point it at the new homes
    source = source.replace(b"from .remote import", b"from .fetch import").replace(
        b"from .format import HEADER, PackCorrupted,",
        b"from ..errors import PackCorrupted\nfrom .format import HEADER,",
    )
    return _load("mlcache.data._reader_before", source, folder)


def _old_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """``mlcache.torch.as_tensors`` before issue 13: tensors of the read-only map."""
    import warnings

    import torch

    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        for key, value in sample.items():
            out[key] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return out


def _options(p: Any) -> None:
    p.add_argument("--before", default=BEFORE, help="git revision of 'before'")
    p.add_argument(
        "--patients", type=int, default=2_000, help="patients in their pack (bench_data: 20,000)"
    )


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        _options,
    )
    quick = args.quick
    scale = 20 if quick else 1
    trials = 3 if quick else 9
    old = _old_reader(args.before)
    with scratch_dir(args.dir, "reader") as where:
        packs = {
            "small": pack(
                ({"x": np.full(8, i, dtype=np.float32), "y": i} for i in range(20_000 // scale)),
                os.path.join(where, "small.pack"),
                progress=False,
            ).path,
            "medium": pack(
                ({"x": np.full((64, 64), i, dtype=np.float32)} for i in range(4_000 // scale)),
                os.path.join(where, "medium.pack"),
                progress=False,
            ).path,
            "large": pack(
                (
                    {"x": np.full((512, 512, 3), i % 256, dtype=np.uint8)}
                    for i in range(256 // scale)
                ),
                os.path.join(where, "large.pack"),
                progress=False,
            ).path,
        }
        from mlcache.demo.synthetic import read_patient, write_patients

        files = write_patients(os.path.join(where, "src"), args.patients // scale, seed=0)
        packs["patients"] = pack(
            (read_patient(f) for f in files), os.path.join(where, "p.pack"), progress=False
        ).path
        readers: dict[str, Any] = {"after": now, "after, writable=False": now}
        if old is not None:
            readers["before"] = old
        opened = {
            (which, name): (
                module.PackedDataset(path, writable=False)
                if which.endswith("writable=False")
                else module.PackedDataset(path)
            )
            for which, module in readers.items()
            for name, path in packs.items()
        }
        orders = {
            name: np.random.default_rng(0).permutation(len(opened["after", name])).tolist()
            for name in packs
        }

        def full_pass(ds: Any, order: list[int], touch: bool | str) -> Callable[[], None]:
            def run() -> None:
                if touch == "one":  # one value of each sample: the cost of ds[i] itself
                    for i in order:
                        ds[i]["label"]
                elif "vitals" in ds.field_names:
                    for i in order:
                        s = ds[i]
                        float(s["vitals"].sum()) + s["age"] + s["label"] + len(s["sex"])
                        len(s["id"])
                elif touch:
                    for i in order:
                        ds[i]["x"].sum()
                else:
                    for i in order:
                        ds[i]

            return run

        def tensor_pass(ds: Any, order: list[int], convert: Any) -> Callable[[], None]:
            def run() -> None:
                for i in order:
                    convert(ds[i])

            return run

        contenders = []
        counts: dict[str, int] = {}
        cases = [
            ("small", False),
            ("medium", False),
            ("large", False),
            ("large", True),
            ("patients", True),
            ("patients", "one"),
        ]
        for name, touch in cases:
            for which in readers:
                whole = " read whole" if touch is True and name != "patients" else ""
                whole = " one value" if touch == "one" else whole
                label = f"{name}{whole}: {which}"
                contenders.append(
                    Contender(label, full_pass(opened[which, name], orders[name], touch), trials)
                )
                counts[label] = len(orders[name])
        try:
            from mlcache.torch import as_tensors
        except ImportError:
            as_tensors = None
        if as_tensors is not None:
            for name in ("medium", "large"):
                for which in ("after", "before"):
                    if which not in readers:
                        continue
                    convert = as_tensors if which == "after" else _old_tensors
                    label = f"torch {name}: {which}"
                    contenders.append(
                        Contender(
                            label, tensor_pass(opened[which, name], orders[name], convert), trials
                        )
                    )
                    counts[label] = len(orders[name])
        results = measure(contenders)
    print(f"\n### Pack reader, µs per sample ({machine_note()})\n")
    print("| contender | trials | min | median | after / before (min) | (median) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in results.items():
        per = 1e6 / counts[label]
        ratio = ""
        case, _, which = label.partition(": ")
        if which.startswith("after") and f"{case}: before" in results:
            b = results[f"{case}: before"]
            ratio = f"{r.min / b.min:.2f} | {r.median / b.median:.2f}"
        else:
            ratio = " | "
        print(f"| {label} | {len(r.times)} | {r.min * per:.2f} | {r.median * per:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
