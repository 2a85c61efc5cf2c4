"""Hits of typed results stored without pickle: mlcache.Memory vs joblib.Memory.

One case per row of :data:`CASES`: a cached function of one small int returns the
value, already stored; its hit is timed by ``mlcache.Memory(allow_pickle=False)``
(the typed codecs: no pickle in the entry) and by ``joblib.Memory`` side by side,
trials interleaved, each after an untimed warm-up, min and median. Breakdown rows:
mlcache's hit of the same value through its pickle-5 path (the value returned
beside an ``object()``, which only pickle stores), and with ``mmap_mode="c"``
(copy-on-write: tensors and arrays are views of the entry file).

Targets (issue 18): joblib / mlcache >= 5 for every case, read into memory; for
the tensor and sparse cases also with ``mmap_mode="c"`` on both sides.

    python benchmarks/bench_typed.py [--quick] [--dir PARENT] [--only TEXT]

A case is a row of ``CASES``: a name, a function making the value (``quick`` for
the smoke run's small version) and its target ratio.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import joblib
import numpy as np

import mlcache
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
from bench_hit import read_floor


@dataclass(frozen=True)
class Case:
    """One typed result to hit."""

    name: str
    make: Callable[[bool], Any]  # quick -> the value
    bound: float = 5.0  # joblib / mlcache >= bound
    #: also time both with mmap_mode="c" (copy-on-write maps: writable, private):
    #: joblib / mlcache >= mmap_bound there
    mmap_bound: float | None = None


def state_dict(quick: bool) -> dict[str, Any]:
    """A 100 MB model's parameters (float32 weights and biases, a bfloat16 embedding,
    an int64 counter), as ``dict(model.state_dict())`` gives them."""
    import torch

    g = torch.Generator().manual_seed(0)
    width, layers = (64, 2) if quick else (1024, 11)
    out: dict[str, Any] = {"embed.weight": torch.randn(8 * width, width, generator=g).bfloat16()}
    for i in range(layers):
        out[f"layers.{i}.weight"] = torch.randn(2 * width, width, generator=g)
        out[f"layers.{i}.bias"] = torch.randn(2 * width, generator=g)
        out[f"layers.{i}.norm.num_batches_tracked"] = torch.tensor(1000, dtype=torch.int64)
    return out


def sparse_matrix(quick: bool) -> Any:
    """A 200,000 x 10,000 CSR matrix at 0.1% density (2M stored float64 values, 10 a
    row, sorted and unique: what ``scipy.sparse.random`` gives, made without its
    sampling of 2e9 cells, which takes minutes here)."""
    import scipy.sparse

    rows, cols = (2_000, 1_000) if quick else (200_000, 10_000)
    per_row = cols // 1000
    rng = np.random.default_rng(0)
    picks = np.sort(rng.integers(0, cols - per_row + 1, (rows, per_row)), axis=1)
    indices = (picks + np.arange(per_row)).astype(np.int32).ravel()  # strictly increasing
    indptr = np.arange(0, rows * per_row + 1, per_row, dtype=np.int32)
    return scipy.sparse.csr_matrix((rng.random(indices.size), indices, indptr), (rows, cols))


def mixed_frame(quick: bool) -> Any:
    """A 200,000-row pandas DataFrame of ten column kinds: float64, int64, float32,
    bool, nullable Int64 (every 7th missing), categorical (1,000 words), tz-aware
    datetimes, timedeltas, the default ``str`` dtype and ``object`` strings."""
    import pandas as pd

    n = 2_000 if quick else 200_000
    rng = np.random.default_rng(0)
    words = np.array([f"word{i}" for i in range(1000)], dtype=object)
    pick = words[rng.integers(0, 1000, n)]
    nullable = pd.array(rng.integers(0, 1000, n), dtype="Int64")
    nullable[::7] = pd.NA
    return pd.DataFrame(
        {
            "f64": rng.random(n),
            "i64": rng.integers(0, 10**6, n),
            "f32": rng.random(n).astype(np.float32),
            "bool": rng.random(n) < 0.5,
            "Int64": nullable,
            "cat": pd.Categorical(pick),
            "when": pd.date_range("2020", periods=n, freq="min", tz="Europe/Paris"),
            "td": pd.to_timedelta(rng.integers(0, 10**9, n), unit="ns"),
            "str": pd.array(pick, dtype="str"),
            "obj": pd.Series(pick, dtype=object),  # (an object array would become "str")
        }
    )


#: the cases, in the order they run (add a row for a new kind of value)
CASES = [
    Case("pandas DataFrame, 200,000 rows of 10 column kinds", mixed_frame),
    Case("state_dict, 100 MB of torch tensors", state_dict, mmap_bound=5.0),
    Case("scipy.sparse csr 200,000 x 10,000, 0.1% dense", sparse_matrix, mmap_bound=5.0),
]


def nbytes(value: Any) -> int:
    """The bytes of the arrays and tensors inside ``value``."""
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if hasattr(value, "untyped_storage"):
        return int(value.numel() * value.element_size())
    if hasattr(value, "memory_usage"):  # a DataFrame: its columns, strings included
        return int(value.memory_usage(deep=True).sum())
    if hasattr(value, "indptr"):
        return int(value.data.nbytes + value.indices.nbytes + value.indptr.nbytes)
    return 0


def bench_case(
    root: str, case: Case, quick: bool, fast: int, slow: int
) -> tuple[dict[str, Result], list[Outcome]]:
    value = case.make(quick)
    check_free_disk(root, 4 * nbytes(value))
    tag = "".join(c if c.isalnum() else "-" for c in case.name)[:24]

    # the functions make the value: one that returned a captured ``value`` would have
    # it hashed into mlcache's key at every call (a variable it reads is an input)
    make = case.make

    def result(seed: int) -> Any:
        return make(quick)

    def with_object(seed: int) -> Any:
        return (make(quick), object())  # only pickle stores an object(): the pickle-5 path

    ml = mlcache.Memory(os.path.join(root, f"ml-{tag}"), verbose=0, allow_pickle=False)
    ml_c = mlcache.Memory(
        os.path.join(root, f"ml-{tag}"), verbose=0, allow_pickle=False, mmap_mode="c"
    )
    ml_pickle = mlcache.Memory(os.path.join(root, f"mlp-{tag}"), verbose=0)
    jl = joblib.Memory(os.path.join(root, f"jl-{tag}"), verbose=0)
    f_ml, f_c = ml.cache(result), ml_c.cache(result)
    f_pickle, f_jl = ml_pickle.cache(with_object), jl.cache(result)
    for f in (f_ml, f_pickle, f_jl):
        f(1)  # stored
    shelf = f_ml.call_and_shelve(1)
    assert type(shelf.get()) is type(value)  # a hit, read back from the entry
    contenders = [
        Contender("mlcache.Memory hit, typed (allow_pickle=False)", lambda: f_ml(1), fast),
        Contender("joblib.Memory hit", lambda: f_jl(1), slow),
        Contender("mlcache.Memory hit, pickle-5 path", lambda: f_pickle(1), slow, info=True),
        Contender(
            "mlcache.Memory hit, typed, mmap_mode='c'",
            lambda: f_c(1),
            fast,
            info=case.mmap_bound is None,
        ),
    ]
    targets = []
    if case.mmap_bound is not None:
        # joblib's maps on the same files (mmap_mode only changes how they are read),
        # and mlcache's read-only map, where tensors are copies (torch has no read-only
        # tensors: see mlcache.codecs.tensors)
        jl_c = joblib.Memory(os.path.join(root, f"jl-{tag}"), verbose=0, mmap_mode="c")
        ml_r = mlcache.Memory(
            os.path.join(root, f"ml-{tag}"), verbose=0, allow_pickle=False, mmap_mode="r"
        )
        f_jl_c, f_r = jl_c.cache(result), ml_r.cache(result)
        assert ml.store is not None
        entry = ml.store.local_path(shelf.name)  # type: ignore[attr-defined]
        contenders += [
            Contender("joblib.Memory hit, mmap_mode='c'", lambda: f_jl_c(1), slow),
            Contender("mlcache.Memory hit, typed, mmap_mode='r'", lambda: f_r(1), fast, info=True),
            Contender(
                "floor: the entry file read into fresh memory on all cores, unchecked",
                lambda: read_floor(entry),
                fast,
                info=True,
            ),
        ]
        targets.append(
            Target(
                f"{case.name}: joblib / mlcache, mmap_mode='c'",
                "joblib.Memory hit, mmap_mode='c'",
                "mlcache.Memory hit, typed, mmap_mode='c'",
                ">=",
                case.mmap_bound,
            )
        )
    res = measure(contenders, progress=False)
    mb = nbytes(value) / 1e6
    outcomes = report(
        f"{case.name} ({mb:.0f} MB of buffers)",
        res,
        [
            Target(
                f"{case.name}: joblib / mlcache",
                "joblib.Memory hit",
                "mlcache.Memory hit, typed (allow_pickle=False)",
                ">=",
                case.bound,
            ),
            Target(
                f"{case.name}: mlcache pickle-5 / typed",
                "mlcache.Memory hit, pickle-5 path",
                "mlcache.Memory hit, typed (allow_pickle=False)",
                ">=",
                1,
            ),
            *targets,
        ],
    )
    return res, outcomes


def main() -> int:
    args = parse_args(
        __doc__.splitlines()[0],
        lambda p: p.add_argument(
            "--only", default="", help="run only the cases whose name contains this text"
        ),
    )
    fast, slow = (3, 3) if args.quick else (11, 7)
    print(f"# bench_typed: hits of typed values, no pickle\n\n{machine_note()}")
    sections: dict[str, dict[str, Result]] = {}
    outcomes: list[Outcome] = []
    with scratch_dir(args.dir, "typed") as root:
        for case in CASES:
            if args.only not in case.name:
                continue
            res, got = bench_case(root, case, args.quick, fast, slow)
            sections[case.name] = res
            outcomes += got
    return finish(args, "bench_typed", sections, outcomes)


if __name__ == "__main__":
    sys.exit(main())
