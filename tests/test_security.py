"""Nothing a function, a module or a dataset class is called can place a file
outside the cache folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mlcache import Memory
from mlcache.data import CachedDataset

HOSTILE = [
    "../../escape",
    "/abs/olute",
    "..",
    "a/../../b",
    "\x00nul",
    "C:\\windows\\evil",
    "~/.ssh/x",
    ".hidden",
    "é" * 300,
    "a" * 5000,
]


def _files_under(root):
    return {os.path.realpath(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_function_and_module_names_stay_inside(tmp_path, hostile):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = tmp_path / "inside" / "cache"

    def f(x):
        return x * 2

    f.__module__ = hostile
    f.__qualname__ = hostile
    f.__name__ = hostile
    mem = Memory(cache, verbose=0)
    g = mem.cache(f)
    assert np.array_equal(g(np.arange(3)), np.arange(3) * 2)
    assert np.array_equal(g(np.arange(3)), np.arange(3) * 2)
    mem.stats()
    root = os.path.realpath(cache)
    written = _files_under(tmp_path)
    assert written and all(p.startswith(root + os.sep) for p in written)
    assert not any(outside.iterdir())


@pytest.mark.parametrize("hostile", HOSTILE[:6])
def test_hostile_dataset_class_names_stay_inside(tmp_path, hostile):
    class Hostile(CachedDataset):
        def load_source(self):
            yield from ({"x": np.arange(i + 1)} for i in range(3))

    Hostile.__module__ = hostile
    Hostile.__qualname__ = hostile
    cache = tmp_path / "inside"
    ds = Hostile(cache_dir=cache, progress=False)
    assert len(ds) == 3
    root = os.path.realpath(cache)
    assert os.path.realpath(ds.pack_path).startswith(root + os.sep)
    assert all(p.startswith(root + os.sep) for p in _files_under(tmp_path))
