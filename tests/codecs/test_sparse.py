"""codecs/sparse: scipy.sparse csr/csc/coo matrices and arrays as leaves of the npy tree."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sp = pytest.importorskip("scipy.sparse")

from mlcache import Memory  # noqa: E402
from mlcache.codecs import Encoded, codecs, leaves  # noqa: E402
from mlcache.codecs.sparse import SparseLeaf  # noqa: E402
from mlcache.entry import EntryReader, decode  # noqa: E402
from mlcache.errors import EntryCorrupted  # noqa: E402
from mlcache.testing.codecs import MemorySegments, base_chain, read, write  # noqa: E402

npy = codecs["npy"]
leaf = leaves["scipy.sparse"]

CLASSES = [
    sp.csr_matrix,
    sp.csr_array,
    sp.csc_matrix,
    sp.csc_array,
    sp.coo_matrix,
    sp.coo_array,
]
DTYPES = [np.float64, np.float32, np.int8, np.int64, np.uint16, np.complex128, np.bool_]


def assert_same_sparse(got: Any, want: Any) -> None:
    """Equal means equal: class, shape, dtype, index dtype, the stored entries as
    they are (explicit zeros, duplicates, order), bits of the data (NaNs too)."""
    assert type(got) is type(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.data.tobytes() == want.data.tobytes()
    if want.format == "coo":
        assert len(got.coords) == len(want.coords)
        for g, w in zip(got.coords, want.coords):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        assert got.has_canonical_format == want.has_canonical_format
    else:
        for name in ("indices", "indptr"):
            g, w = getattr(got, name), getattr(want, name)
            assert g.dtype == w.dtype and np.array_equal(g, w), name
        assert got.has_sorted_indices == want.has_sorted_indices
        assert got.has_canonical_format == want.has_canonical_format


def random_sparse(cls: Any, shape: tuple[int, int], dtype: Any, seed: int, density: float) -> Any:
    rng = np.random.default_rng(seed)
    dense = rng.random(shape) < density
    values = rng.integers(-3, 4, shape).astype(dtype) if dtype != np.bool_ else dense
    if np.dtype(dtype).kind == "f":
        values = values.astype(dtype)
        values[dense & (rng.random(shape) < 0.1)] = np.nan
    return cls(np.where(dense, values, np.zeros((), dtype)).astype(dtype))


def through_leaf(value: Any) -> tuple[Any, dict[str, Any]]:
    segments: list[Any] = []

    def add(segment: Any) -> int:
        segments.append(segment)
        return len(segments) - 1

    assert leaf.can_encode(value) is True
    node = json.loads(json.dumps(leaf.encode(value, add)))
    return leaf.decode(node, MemorySegments(Encoded({}, segments))), node


def test_is_registered_and_does_not_import_scipy_until_needed() -> None:
    assert isinstance(leaf, SparseLeaf)
    code = "import sys, mlcache; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_and_dtype_round_trips(cls: Any, dtype: Any) -> None:
    m = random_sparse(cls, (30, 20), dtype, seed=1, density=0.2)
    got, node = through_leaf(m)
    assert_same_sparse(got, m)
    assert node["cls"] == cls.__name__


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_explicit_zeros_duplicates_unsorted_and_index_dtypes_are_kept(cls: Any) -> None:
    fmt = cls.__name__[:3]
    data = np.array([0.0, 1.5, 0.0, -2.0, 3.0])  # explicit zeros
    row = np.array([2, 0, 1, 0, 2], dtype=np.int64)  # duplicates (0, 1) and unsorted
    col = np.array([1, 1, 0, 1, 3], dtype=np.int64)
    coo = sp.coo_matrix((data, (row, col)), shape=(3, 4))
    if fmt == "coo":
        m = cls(coo)
        m.coords = (row, col)  # int64 indices, as the caller made them
    else:
        # a compressed matrix built by hand: unsorted indices, a duplicate, a zero
        m = cls((3, 4), dtype=np.float64)
        m.data = data
        if fmt == "csr":
            m.indices = np.array([1, 1, 0, 3, 1], dtype=np.int64)
            m.indptr = np.array([0, 2, 3, 5], dtype=np.int64)
        else:
            m.indices = np.array([1, 2, 0, 0, 2], dtype=np.int64)
            m.indptr = np.array([0, 1, 4, 4, 5], dtype=np.int64)
    got, _ = through_leaf(m)
    assert_same_sparse(got, m)
    assert got.nnz == 5  # nothing summed or pruned
    if fmt != "coo":
        assert not got.has_sorted_indices
        assert got.indices.dtype == np.int64


def test_sorted_flags_are_carried_so_nothing_is_checked_again() -> None:
    m = random_sparse(sp.csr_array, (50, 40), np.float64, seed=3, density=0.1)
    assert m.has_sorted_indices and m.has_canonical_format
    got, node = through_leaf(m)
    assert node["sorted"] is True and node["canonical"] is True
    assert "_has_sorted_indices" in vars(got)  # set from the node, not recomputed


def test_one_dimensional_and_nd_sparse_arrays() -> None:
    for m in (
        sp.csr_array(np.array([1.0, 0.0, 2.0])),
        sp.coo_array(np.array([0, 5, 0, 7])),
        sp.coo_array(np.arange(24.0).reshape(2, 3, 4) % 5 == 0),
        sp.csr_array((0, 0)),
        sp.coo_array((5, 0), dtype=np.int8),
    ):
        got, _ = through_leaf(m)
        assert_same_sparse(got, m)


def test_other_formats_and_object_data_are_refused() -> None:
    m = sp.random(5, 5, density=0.5, random_state=0)
    for other in ("bsr", "dia", "lil", "dok"):
        assert npy.can_encode(m.asformat(other)) is False
    obj = sp.csr_matrix(np.eye(2))
    obj.data = np.array(["a", "b"], dtype=object)
    assert npy.can_encode(obj) is False

    class Mine(sp.csr_matrix):
        pass

    assert npy.can_encode(Mine(np.eye(2))) is False
    noted = sp.csr_matrix(np.eye(2))
    noted.note = "mine"  # would be lost
    assert npy.can_encode(noted) is False


@pytest.mark.parametrize("mmap_mode", [None, "r", "c", "r+"])
def test_round_trip_through_an_entry(mmap_mode: str | None, tmp_path: Path) -> None:
    value = {
        "X": random_sparse(sp.csr_matrix, (200, 50), np.float32, seed=4, density=0.05),
        "A": random_sparse(sp.csc_array, (40, 60), np.int64, seed=5, density=0.1),
        "C": random_sparse(sp.coo_array, (10, 10), np.complex128, seed=6, density=0.3),
        "y": np.arange(200),
    }
    write(npy, value, tmp_path / "e")
    got = read(npy, tmp_path / "e", mmap_mode)
    for k in ("X", "A", "C"):
        assert_same_sparse(got[k], value[k])
    if mmap_mode == "r":
        x = got["X"]
        for a in (x.data, x.indices, x.indptr):
            assert any(isinstance(b, np.memmap) for b in base_chain(a))
            assert not a.flags.writeable
        # a sorted matrix is usable as it is, read-only: no in-place sort is needed
        ones = np.ones(50, np.float32)
        assert np.array_equal(x @ ones, value["X"] @ ones, equal_nan=True)


def test_a_damaged_node_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "e"
    write(npy, [sp.csr_array(np.eye(3))], path)
    reader = EntryReader(str(path))
    good = reader.codec_layout["tree"][0]
    for key, bad in [
        ("cls", "bsr_matrix"),
        ("cls", 1),
        ("shape", [3, -3]),
        ("shape", [4, 3]),  # indptr no longer fits
        ("data", {"seg": 0, "dtype": "|O", "n": 3}),
        ("data", {"seg": 0, "dtype": "<f8", "n": 4}),
        ("indices", {"seg": 1, "dtype": "<f4", "n": 3}),
        ("sorted", "yes"),
        ("maxprint", "x"),
    ]:
        node = dict(good, **{key: bad})
        with pytest.raises(EntryCorrupted):
            decode(Forged(reader, {"tree": [node]}), allow_pickle=False)  # type: ignore[arg-type]


class Forged:
    """An entry reader whose layout was replaced (a damaged entry whose checksums
    were forged to match)."""

    def __init__(self, reader: EntryReader, layout: dict[str, Any]) -> None:
        self.codec, self.codec_layout, self.path = reader.codec, layout, reader.path
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def buffer(self, index: int) -> memoryview:
        return self.reader.buffer(index)

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> Any:
        return self.reader.array(index, dtype, shape, order)


@settings(max_examples=60, deadline=None)
@given(
    cls=st.sampled_from(CLASSES),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(0, 12),
    cols=st.integers(0, 12),
    density=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_sparse_matrix_round_trips(
    cls: Any, dtype: Any, rows: int, cols: int, density: float, seed: int
) -> None:
    m = random_sparse(cls, (rows, cols), dtype, seed, density)
    got, _ = through_leaf(m)
    assert_same_sparse(got, m)


def test_a_sparse_result_through_memory_without_pickle(tmp_path: Path) -> None:
    mem = Memory(tmp_path, verbose=0, allow_pickle=False)
    runs = []

    @mem.cache
    def features(n: int) -> Any:
        runs.append(n)
        return random_sparse(sp.csr_matrix, (n, 30), np.float64, seed=n, density=0.1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: no "not stored" warning
        first = features(100)
        again = features(100)
    assert runs == [100]  # the hit did not run the body
    assert_same_sparse(again, first)
    entries = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and len(p.name) == 32 and all(c in "0123456789abcdef" for c in p.name)
    ]
    assert len(entries) == 1
    assert EntryReader(str(entries[0])).codec == "npy"  # no pickle in the entry


@pytest.mark.parametrize("cls", [sp.csr_array, sp.coo_matrix], ids=lambda c: c.__name__)
def test_every_damaged_layout_is_a_corrupted_entry(cls: Any, tmp_path: Path) -> None:
    """Each place of the layout replaced by values of other types and ranges (the
    conformance kit's sweep): only EntryCorrupted comes out (or UnknownFormat for a
    leaf name replaced by another: both are misses), or a value."""
    from mlcache.errors import UnknownFormat
    from mlcache.testing.codecs import _garbled

    path = tmp_path / "e"
    write(npy, random_sparse(cls, (6, 5), np.float32, seed=1, density=0.3), path)
    reader = EntryReader(str(path))
    tried = 0
    for layout in _garbled(reader.codec_layout):
        tried += 1
        try:
            decode(Forged(reader, layout), allow_pickle=False)  # type: ignore[arg-type]
        except (EntryCorrupted, UnknownFormat):
            pass
    assert 20 <= tried < 200  # every place of the layout was damaged
