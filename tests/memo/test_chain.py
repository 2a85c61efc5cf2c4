"""Pipeline chaining: a value that came out of the cache is keyed by the entry it
came from, not hashed again; anything that can change is hashed by content."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from mlcache import Memory
from mlcache.data import pack
from mlcache.entry import REF_ATTR
from mlcache.keys.hashing import bytes_hashed, hash_value

STEPS: list[str] = []


def load(n):
    STEPS.append("load")
    return np.arange(n, dtype=np.float64)


def scale(x):
    STEPS.append("scale")
    return x * 2.0


def shift(x):
    STEPS.append("shift")
    return x + 1.0


def summarize(x, y):
    STEPS.append("summarize")
    return {"mean": float(x.mean()), "both": np.stack([x[:3], y[:3]])}


def pipeline(mem, n):
    steps = [mem.cache(f) for f in (load, scale, shift, summarize)]
    raw = steps[0](n)
    a = steps[1](raw)
    b = steps[2](a)
    return steps[3](a, b)


@pytest.mark.parametrize("mb", [10, 100])
def test_an_all_hit_pipeline_hashes_nothing_whatever_the_size(tmp_path, mb):
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    n = mb * 1_000_000 // 8
    first = pipeline(mem, n)
    STEPS.clear()
    before = bytes_hashed()
    again = pipeline(mem, n)
    hashed = bytes_hashed() - before
    assert STEPS == []  # every step hit
    assert hashed < 1024, hashed  # the arguments' names, not their megabytes
    assert again["mean"] == first["mean"]
    np.testing.assert_array_equal(again["both"], first["both"])


@pytest.mark.slow
def test_an_all_hit_pipeline_over_800_mb_hashes_nothing(tmp_path):
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    pipeline(mem, 100_000_000)
    before = bytes_hashed()
    STEPS.clear()
    pipeline(mem, 100_000_000)
    assert STEPS == [] and bytes_hashed() - before < 1024


def test_a_chained_key_is_the_entry_not_the_contents(tmp_path):
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    a = mem.cache(load)(1000)
    assert isinstance(a, np.memmap) and not a.flags.writeable
    assert "#0@" in getattr(a, REF_ATTR)  # entry, segment, payload checksum
    assert hash_value(a) != hash_value(np.asarray(a).copy())
    assert hash_value(a[:10]) == hash_value(np.arange(10.0))  # a slice: by contents
    assert hash_value(a.copy()) == hash_value(np.arange(1000.0))


def test_writable_results_carry_nothing_and_a_mutation_changes_the_key(tmp_path):
    """Read into memory (no mmap), a result is a private writable array: it is
    hashed by its contents, so changing it changes the next call's key."""
    STEPS.clear()
    mem = Memory(tmp_path, verbose=0)
    raw = mem.cache(load)(1000)
    assert raw.flags.writeable and REF_ATTR not in getattr(raw, "__dict__", {})
    f = mem.cache(scale)
    out = f(raw)
    raw[0] = 99.0  # the user changes the result they got
    changed = f(raw)
    assert changed[0] == 198.0 and out[0] == 0.0
    assert STEPS == ["load", "scale", "scale"]
    assert f.check_call_in_cache(np.arange(1000.0)) and f.check_call_in_cache(raw)


@pytest.mark.parametrize("mode", ["r+", "c"])
def test_writable_maps_carry_nothing(tmp_path, mode):
    mem = Memory(tmp_path, verbose=0, mmap_mode=mode)
    f = mem.cache(load)
    f(100)
    a = f(100)
    assert a.flags.writeable and REF_ATTR not in a.__dict__
    a[0] = 5.0
    assert hash_value(a) == hash_value(np.where(np.arange(100) == 0, 5.0, np.arange(100.0)))


def test_a_read_only_map_cannot_be_made_writable(tmp_path):
    a = Memory(tmp_path, verbose=0, mmap_mode="r").cache(load)(100)
    a = Memory(tmp_path, verbose=0, mmap_mode="r").cache(load)(100)  # a hit
    with pytest.raises(ValueError):
        a.flags.writeable = True
    with pytest.raises(ValueError):
        a[0] = 1.0


def count_rows(ds):
    STEPS.append("count")
    return len(ds)


def test_datasets_are_keyed_by_their_fingerprint(tmp_path):
    STEPS.clear()
    samples = [{"x": np.full(1000, i, dtype=np.float32), "y": i} for i in range(200)]
    ds = pack(samples, tmp_path / "d.pack", progress=False)
    f = Memory(tmp_path / "c", verbose=0).cache(count_rows)
    before = bytes_hashed()
    assert f(ds) == 200 and f(ds) == 200
    assert bytes_hashed() - before < 1024  # the pack is not read
    assert STEPS == ["count"]
    samples[7]["x"][0] = -1.0  # another pack: other contents, the same path
    ds2 = pack(samples, tmp_path / "d.pack", progress=False)
    assert f(ds2) == 200 and STEPS == ["count", "count"]


def noisy(n):
    STEPS.append("noisy")
    return np.arange(n, dtype=np.float64) + len(STEPS)  # another value each time


def total(x):
    STEPS.append("total")
    return float(x.sum())


def test_a_result_recomputed_with_other_contents_is_another_key(tmp_path):
    """Same entry name, other contents (call() forced a recompute): the next step
    must not return what it computed from the old contents."""
    STEPS.clear()
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    f, g = mem.cache(noisy), mem.cache(total)
    first = g(f(3))
    f.call(3)  # recomputed: other contents under the same key
    second = g(f(3))
    assert second == float(f(3).sum()) != first


def test_a_tagged_map_reshaped_in_place_is_another_key(tmp_path):
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    a = mem.cache(load)(8)
    before = hash_value(a)
    a.shape = (2, 4)
    assert hash_value(a) != before
    a.shape = (8,)
    a.dtype = np.int64  # the same bytes read as other numbers
    assert hash_value(a) != before


def test_a_read_only_map_edited_through_a_writable_map_is_hashed_by_contents(tmp_path):
    """An ``"r+"`` map of the same entry shares the read-only map's pages: once it
    writes, the read-only map no longer holds what its entry's name says, so the
    next step computes from what it holds (before: the step's old result)."""
    mem = Memory(tmp_path, verbose=0)
    held = mem.cache(load, mmap_mode="r")(1000)
    step = mem.cache(scale)
    assert step(held)[1] == 2.0
    writable = mem.cache(load, mmap_mode="r+")(1000)  # the same entry
    writable[:] = 7.0
    assert held[1] == 7.0  # one file, shared pages
    assert step(held)[1] == 14.0
    del writable


def test_a_read_only_map_edited_by_another_process_is_hashed_by_contents(tmp_path):
    """Another process writing through a shared map of the entry file changes what
    this process's read-only map holds (and the file's times): the next step
    computes from what it holds (before: the step's old result)."""
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    first = mem.cache(load)(1000)
    hour_ago = time.time() - 3600  # a change later than this shows in the file's times
    os.utime(first.filename, (hour_ago, hour_ago))
    held = mem.cache(load)(1000)  # a hit, mapped as the file is now
    step = mem.cache(scale)
    before = bytes_hashed()
    assert step(held)[1] == 2.0
    assert bytes_hashed() - before < 1024  # still keyed by its entry's name
    edit = (
        "import sys, numpy as np; "
        "w = np.memmap(sys.argv[1], dtype='<f8', mode='r+', "
        "offset=int(sys.argv[2]), shape=(1000,)); "
        "w[:] = 7.0; w.flush()"
    )
    subprocess.run([sys.executable, "-c", edit, held.filename, str(held.offset)], check=True)
    assert held[1] == 7.0
    assert step(held)[1] == 14.0


def test_a_read_only_map_is_hashed_by_contents_once_an_edit_map_is_gone(tmp_path):
    """The edit through an ``"r+"`` map may fall in the clock tick of the entry's
    writing (no change of its times): a file this process mapped ``"r+"`` keys
    its read-only maps by their contents, even once that map is gone."""
    mem = Memory(tmp_path, verbose=0)
    held = mem.cache(load, mmap_mode="r")(1000)
    step = mem.cache(scale)
    writable = mem.cache(load, mmap_mode="r+")(1000)
    writable[:] = 7.0
    del writable
    assert step(held)[1] == 14.0
