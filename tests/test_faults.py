"""Crash safety: processes killed with SIGKILL at random moments, while writing
entries, overwriting them, evicting, writing usage times and statistics, and
building dataset packs, never leave a wrong or partial read behind; what they
leave (temporaries, spill folders, key locks) is removed by a later run.

The default run kills a few writers; ``pytest -m slow tests/test_faults.py``
runs the published number of trials (``MLCACHE_FAULT_TRIALS`` overrides it) and
prints the figures quoted in the README's "Reliability" section.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
import warnings
from collections import Counter

import numpy as np
import pytest

from mlcache import Memory
from mlcache.data import PackCorrupted, PackedDataset, pack
from mlcache.entry import decode, open_entry
from mlcache.errors import EntryCorrupted, EntryNotFound
from mlcache.memo.layout import is_entry
from mlcache.memo.usage import collect
from mlcache.store.keylocks import KEYS_FILE

SIZES = (10, 100_000, 1_500_000)  # int64 elements: up to 12 MB, a wide write window
PACK_SAMPLES = (50, 1500)
OPS = (
    "entry write",
    "entry overwrite",
    "pickled entry write",
    "eviction",
    "metadata",
    "pack build",
)


def produce(i: int, n: int) -> np.ndarray:
    return np.full(n, i, dtype=np.int64)


def produce_obj(i: int) -> set[int]:
    return {i, i + 1, -i}  # a set: stored with pickle, signed in full


def _pack_samples(j: int, n: int):
    for s in range(n):
        yield {"x": np.full(50 + s % 7, j * 100_000 + s, dtype=np.int32), "s": s, "j": j}


def _workload(location: str, seed: int, doing) -> None:
    """Run cache operations for ever (until killed), saying which one is running."""
    warnings.simplefilter("ignore")
    rng = random.Random(seed)
    mem = Memory(location, verbose=0, bytes_limit="40MB")
    f, g = mem.cache(produce), mem.cache(produce_obj)
    packs = os.path.join(location, "packs")
    while True:
        op = rng.choices(range(len(OPS)), weights=(30, 10, 15, 10, 15, 4))[0]
        doing.value = op
        if op == 0:
            f(rng.randrange(12), rng.choice(SIZES))
        elif op == 1:
            f.call(rng.randrange(12), rng.choice(SIZES))
        elif op == 2:
            g(rng.randrange(50))
        elif op == 3:
            mem.reduce_size(bytes_limit="15MB")
        elif op == 4:
            mem.flush_usage()
        else:
            j = rng.randrange(4)
            pack(_pack_samples(j, PACK_SAMPLES[j % 2]), os.path.join(packs, f"p{j}.pack"))


def _check(location: str, tally: Counter) -> None:
    """Read back everything there is: each read is right, or a miss."""
    mem = Memory(location, verbose=0)
    store = mem.store
    assert store is not None
    for e in list(store.list()):
        if not is_entry(e.name):
            continue
        try:
            reader = open_entry(
                store, e.name, "r" if tally["reads"] % 2 else None, signer=mem.context.signer
            )
            value = decode(reader, allow_pickle=True)
        except EntryNotFound:
            continue
        except EntryCorrupted:
            tally["damaged entries"] += 1
            continue
        args = {k: int(v) for k, v in reader.info["input_args"].items()}
        want = produce(**args) if reader.codec == "npy" else produce_obj(**args)
        tally["reads"] += 1
        if isinstance(want, np.ndarray):
            right = value.dtype == want.dtype and np.array_equal(value, want)
        else:
            right = value == want
        tally["right"] += right
        tally["wrong"] += not right
    collect(store)  # statistics read back (a damaged one would raise)
    packs = os.path.join(location, "packs")
    for name in sorted(os.listdir(packs)) if os.path.isdir(packs) else []:
        if not name.endswith(".pack"):
            continue
        j = int(name[1:-5])
        try:
            ds = PackedDataset(os.path.join(packs, name))
            samples = [ds[i] for i in range(len(ds))]
        except PackCorrupted:
            tally["damaged packs"] += 1
            continue
        want = list(_pack_samples(j, PACK_SAMPLES[j % 2]))
        tally["pack reads"] += 1
        right = len(samples) == len(want) and all(
            a["s"] == b["s"] and a["j"] == b["j"] and np.array_equal(a["x"], b["x"])
            for a, b in zip(samples, want)
        )
        tally["right"] += right
        tally["wrong"] += not right


def _leftovers(location: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(location):
        for n in dirs + files:
            # a folder's file of key record locks is kept by design, never debris
            if ".tmp-" in n or (n.startswith(".") and n.endswith(".lock") and n != KEYS_FILE):
                found.append(os.path.join(folder, n))
    return found


def _age(paths: list[str], seconds: float) -> None:
    past = time.time() - seconds
    for p in paths:
        try:
            os.utime(p, (past, past), follow_symlinks=False)
        except OSError:
            pass


def run_kills(location: str, trials: int, seed: int = 0) -> Counter:
    """Kill ``trials`` workers at random moments; check after each kill."""
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(seed)
    tally: Counter = Counter()
    for t in range(trials):
        doing = ctx.Value("i", -1, lock=False)
        proc = ctx.Process(target=_workload, args=(location, seed * 100_000 + t, doing))
        proc.start()
        time.sleep(rng.uniform(0.05, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL, "the worker died before it was killed"
        tally["kills"] += 1
        if doing.value >= 0:
            tally[f"killed during {OPS[doing.value]}"] += 1
        tally["leftovers seen"] += len(_leftovers(location))
        _check(location, tally)
    return tally


def _finish(location: str, tally: Counter) -> None:
    """A later run cleans what the killed writers left: listing the store (as
    `mlcache verify --fix` or an eviction scan does) removes dead writers'
    temporaries and locks, and building a pack removes its dead spill folders."""
    left = _leftovers(location)
    _age(left, 60)  # the kills were just now: make them older than DEAD_MIN_AGE
    Memory(location, verbose=0).verify(fix=True)
    packs = os.path.join(location, "packs")
    for j in range(4):
        if any(n.startswith(f".p{j}.pack.tmp-") for n in os.listdir(packs)):
            pack(_pack_samples(j, 3), os.path.join(packs, f"p{j}.pack"), progress=False)
    tally["leftovers at the end"] = len(left)
    assert _leftovers(location) == [], "a later run left crash debris behind"
    # and the cache works on: every function reads right after all of it
    mem = Memory(location, verbose=0)
    f = mem.cache(produce)
    for i in range(12):
        assert np.array_equal(f(i, 10), produce(i, 10))


def _report(tally: Counter) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(tally.items()))


def test_killed_writers_never_leave_a_wrong_read(tmp_path):
    location = str(tmp_path / "cache")
    tally = run_kills(location, trials=10)
    _finish(location, tally)
    print(_report(tally))
    assert tally["wrong"] == 0 and tally["damaged entries"] == 0 and tally["damaged packs"] == 0
    assert tally["reads"] > 0


@pytest.mark.slow
def test_killed_writers_never_leave_a_wrong_read_many_trials(tmp_path):
    trials = int(os.environ.get("MLCACHE_FAULT_TRIALS", "150"))
    location = str(tmp_path / "cache")
    tally = run_kills(location, trials, seed=1)
    _finish(location, tally)
    print(f"\nSIGKILL trials: {_report(tally)}")
    assert tally["wrong"] == 0 and tally["damaged entries"] == 0 and tally["damaged packs"] == 0
    for op in OPS:
        assert tally[f"killed during {op}"] > 0, f"no kill landed during {op}"
