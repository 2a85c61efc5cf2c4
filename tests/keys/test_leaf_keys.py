"""A type of one's own in one module: its leaf stores it without pickle and, with
a token(), keys it too (mlcache.codecs.leaves + mlcache.keys.hashing)."""

from __future__ import annotations

import random

import numpy as np

import mlcache
from mlcache.codecs import register_leaf


class Grid:
    """A payload and a spacing; a scratch attribute that is not part of its identity
    (and that pickle would refuse, so its default key fails)."""

    def __init__(self, values, step):
        self.values, self.step = values, step
        self.scratch = lambda: None


class GridLeaf:
    name = "test.keys.Grid"
    types = (f"{Grid.__module__}.{Grid.__qualname__}",)

    def can_encode(self, value):
        return isinstance(value.values, np.ndarray) and value.values.dtype == np.float64

    def encode(self, value, add):
        return {"a": add(value.values), "n": len(value.values), "step": value.step.hex()}

    def decode(self, node, segments):
        values = segments.array(node["a"], np.dtype(np.float64), (node["n"],), "C")
        return Grid(values, float.fromhex(node["step"]))

    def token(self, value):
        return (value.values, value.step)


def test_a_leaf_with_a_token_keys_and_stores_its_type(tmp_path):
    a, b = Grid(np.arange(4.0), 0.5), Grid(np.arange(4.0), 0.5)
    register_leaf(GridLeaf(), replace=True)  # a test type: it stays registered
    assert mlcache.hash_value(a) == mlcache.hash_value(b)  # by its token: not scratch
    assert mlcache.hash_value(a) != mlcache.hash_value(Grid(np.arange(4.0), 0.25))
    mem = mlcache.Memory(tmp_path / "c", verbose=0, allow_pickle=False)
    calls = []

    @mem.cache
    def refine(grid):
        calls.append(1)
        return {"grid": Grid(grid.values * 2, grid.step / 2)}

    first = refine(a)["grid"]
    again = refine(b)["grid"]  # an equal grid: a hit, read back without pickle
    assert calls == [1] and type(again) is Grid and again.step == first.step == 0.25
    assert again.values.tolist() == [0.0, 2.0, 4.0, 6.0]
    files = [p.read_bytes() for p in (tmp_path / "c").rglob("*") if p.is_file()]
    assert any(b"test.keys.Grid" in f for f in files)  # the leaf's node
    assert not any(b"pickle" in f for f in files)  # no entry names the pickle codec


def test_a_leaf_registered_after_its_type_was_hashed_keys_it_from_then_on():
    class Late:
        def __init__(self, x):
            self.x, self.noise = x, random.random()

    class LateLeaf:
        name = "test.keys.Late"
        types = (f"{Late.__module__}.{Late.__qualname__}",)

        def can_encode(self, value):
            return True

        def encode(self, value, add):
            return {"x": value.x}

        def decode(self, node, segments):
            return Late(node["x"])

        def token(self, value):
            return value.x

    one, two = Late(1), Late(1)
    assert mlcache.hash_value(one) != mlcache.hash_value(two)  # by pickle: the noise differs
    register_leaf(LateLeaf(), replace=True)
    assert mlcache.hash_value(one) == mlcache.hash_value(two)
