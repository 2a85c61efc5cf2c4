"""A sample shaped like the one before it is encoded by its layout: the very bytes
of the general encoding, and None (the general path) for anything else; a dataset
whose samples change shape midway is served and sealed as one encoded sample by
sample."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlcache.data import CachedDataset
from mlcache.data.layouts import SampleLayout
from mlcache.data.records import encode_sample

_DTYPES = st.sampled_from(["<f4", "<f8", ">i4", "<i8", "<u2", "|b1", "<c16", "<M8[ns]"])
_FIELD = st.one_of(
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(),
    _DTYPES.flatmap(lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=1, max_side=4))),
)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), _FIELD, min_size=1, max_size=5))
def test_a_layout_gives_the_bytes_of_the_general_encoding(sample: dict[str, Any]) -> None:
    layout = SampleLayout.of(sample)
    surrogate = any("\ud800" <= c <= "\udfff" for c in repr(sample))
    if surrogate:  # not UTF-8: the general path (an entry)
        assert layout is None
        return
    assert layout is not None
    assert layout.encode(sample) == encode_sample(sample, allow_pickle=False)


def _sample() -> dict[str, Any]:
    return {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "n": 7, "s": "é", "f": 0.5}


@pytest.mark.parametrize(
    ("change", "value"),
    [
        ("n", True),  # a bool is not an int
        ("n", 1 << 63),  # beyond 64 bits
        ("n", 7.0),
        ("s", "\ud800"),  # not UTF-8
        ("s", np.str_("a")),
        ("x", np.zeros((3, 4), np.float64)),  # another dtype
        ("x", np.zeros(12, np.float32)),  # another ndim
        ("x", np.array(1.5, np.float32)),  # 0-d: read back as a scalar
        ("x", [1.0, 2.0]),  # a list: read back as an array
        ("f", None),
    ],
)
def test_a_sample_of_another_kind_is_not_of_the_layout(change: str, value: Any) -> None:
    layout = SampleLayout.of(_sample())
    assert layout is not None
    other = _sample()
    other[change] = value
    assert layout.encode(other) is None


def test_other_fields_or_another_order_are_not_of_the_layout() -> None:
    layout = SampleLayout.of(_sample())
    assert layout is not None
    base = _sample()
    assert layout.encode(dict(reversed(base.items()))) is None
    assert layout.encode({**base, "extra": 1}) is None
    assert layout.encode({k: v for k, v in base.items() if k != "f"}) is None


def test_one_layout_gives_each_sample_its_own_bytes() -> None:
    """The framing of each shape is kept: samples of shapes met before and new
    ones, and of other values, each get the bytes of the general encoding."""
    layout = SampleLayout.of(_sample())
    assert layout is not None
    for rows in [3, 5, 3, 0, 5, 7, 3]:
        sample = {"x": np.full((rows, 4), rows, np.float32), "n": -rows, "s": "s" * rows, "f": 1.0}
        assert layout.encode(sample) == encode_sample(sample, allow_pickle=False)


def test_a_strided_array_is_encoded_as_its_contiguous_copy() -> None:
    layout = SampleLayout.of(_sample())
    assert layout is not None
    strided = {**_sample(), "x": np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]}
    assert not strided["x"].flags.c_contiguous
    assert layout.encode(strided) == encode_sample(strided, allow_pickle=False)


@pytest.mark.parametrize(
    "sample",
    [{}, {"a": None}, {"a": [1, 2]}, {"a": {"b": 1}}, {"a": np.float32(1)}, {1: 2}, {"a": False}],
)
def test_a_sample_a_layout_does_not_encode_has_none(sample: dict[Any, Any]) -> None:
    assert SampleLayout.of(sample) is None


class Numbered(CachedDataset):
    """Items 0 to n - 1, each its own fingerprint."""

    def __init__(self, n: int, **kw: Any) -> None:
        self.n = n
        super().__init__(**kw)

    def source_items(self) -> list[int]:
        return list(range(self.n))

    def item_fingerprint(self, item: int) -> int:
        return item


class Shifting(Numbered):
    """Samples whose shapes change midway: an int label, then a float one; an array,
    then a list of numbers (read back as an array); the fields in another order."""

    def load_item(self, i: int) -> dict[str, Any]:
        sample = {
            "x": np.full((i % 3 + 1, 2), i, np.int32),
            "label": i if i < 10 else float(i),
            "v": np.array([i, i]) if i < 20 else [i, i],
            "name": f"n{i}",
        }
        return dict(reversed(sample.items())) if i >= 30 else sample


def test_samples_that_change_shape_midway_are_served_and_sealed_as_loaded(
    tmp_path: Path,
) -> None:
    ds = Shifting(40, cache_dir=tmp_path / "c")
    first = [ds[i] for i in range(40)]  # the last read seals the pack
    again = Shifting(40, cache_dir=tmp_path / "c")
    assert again._filler is None  # sealed: read from the pack
    for i in range(40):
        served, sealed = first[i], again[i]
        assert sorted(served) == sorted(sealed) == ["label", "name", "v", "x"]
        assert np.array_equal(served["x"], sealed["x"]) and served["x"].dtype == np.int32
        assert served["name"] == sealed["name"] == f"n{i}"
        assert served["label"] == sealed["label"] == i
        assert isinstance(served["v"], np.ndarray) and served["v"].dtype == np.int64
        assert served["v"].tolist() == sealed["v"].tolist() == [i, i]


def test_no_layout_while_the_sealed_form_of_an_array_field_is_another_dtype() -> None:
    """A sample of a layout skips as_sealed, which records an array field's form
    whenever the field's recorded dtype differs: so no layout is made until the
    recorded dtype is the sample's."""
    sample = {"x": np.zeros((2, 5), np.int32), "n": 1}
    assert SampleLayout.of(sample, {"x": (np.dtype(np.int64), (5,))}) is None
    assert SampleLayout.of(sample, {"x": "strs"}) is None
    assert SampleLayout.of(sample, {}) is None
    assert SampleLayout.of(sample, {"x": (np.dtype(np.int32), (5,))}) is not None
    assert SampleLayout.of(sample) is not None  # allow_pickle: no sealed forms


class Optional(Numbered):
    """Every third sample's note is None (no layout holds None), every fifth
    label a float: the layouts of the others are kept."""

    def load_item(self, i: int) -> dict[str, Any]:
        return {
            "x": np.full(3, i, np.int32),
            "label": float(i) if i % 5 == 0 else i,
            "note": None if i % 3 == 0 else f"n{i}",
        }


def test_a_field_sometimes_none_keeps_the_layouts_of_the_others(tmp_path: Path) -> None:
    ds = Optional(100, cache_dir=tmp_path / "c")
    served = [ds[i] for i in range(99)]
    filler = ds._filler
    assert filler is not None and filler.sealed is None
    assert len(filler._layouts) >= 2  # int and float labels: both kept
    assert filler._made <= 8
    served.append(ds[99])  # the seal
    sealed = Optional(100, cache_dir=tmp_path / "c")
    for i, sample in enumerate(served):
        assert sample["x"].tolist() == sealed[i]["x"].tolist() == [i] * 3
        assert sample["label"] == sealed[i]["label"] == i
        assert sample["note"] == sealed[i]["note"] == (None if i % 3 == 0 else f"n{i}")


def test_a_dataset_that_served_samples_goes_whole_to_a_spawned_worker(tmp_path: Path) -> None:
    """A spawned DataLoader worker gets the dataset pickled; one that served samples
    here first (a peek at ``ds[0]`` before the DataLoader) holds layouts, functions
    written for them: the copy makes its own ("Can't pickle <function encode>" at
    the DataLoader's start before)."""
    ds = Optional(30, cache_dir=tmp_path / "c")
    first = [ds[i] for i in range(10)]
    assert ds._filler is not None and ds._filler._layouts
    copy = pickle.loads(pickle.dumps(ds))
    served = first + [copy[i] for i in range(10, 30)]  # the copy fills and seals
    assert copy._filler is not None and copy._filler._layouts  # its own
    sealed = Optional(30, cache_dir=tmp_path / "c")
    assert sealed._filler is None
    for i, sample in enumerate(served):
        assert sample["x"].tolist() == sealed[i]["x"].tolist() == [i] * 3
        assert sample["note"] == sealed[i]["note"] == (None if i % 3 == 0 else f"n{i}")


class Promoted(Numbered):
    """An int32 field, then one float64 sample (the sealed form becomes float64),
    then int32 again: no layout skips what the sealing records."""

    def load_item(self, i: int) -> dict[str, Any]:
        dtype = np.float64 if i == 5 else np.int32
        return {"x": np.full((2, 3 if i < 8 else 5), i, dtype), "n": i}


def test_a_sealed_form_changed_drops_the_layouts(tmp_path: Path) -> None:
    ds = Promoted(20, cache_dir=tmp_path / "c")
    for i in range(5):
        ds[i]
    filler = ds._filler
    assert filler is not None and len(filler._layouts) == 1
    int32 = filler._layouts[0]
    ds[5]  # float64: the field's sealed form is float64 from now on
    assert int32 not in filler._layouts  # dropped (a float64 layout made since)
    for i in range(6, 19):
        ds[i]
    assert filler._layouts == []  # int32 arrays of a new shape: as_sealed records it
    assert filler._forms["x"] == (np.dtype(np.float64), (5,))


class _Lying:
    """Says it is an int, as a proxy of one does (``wrapt.ObjectProxy``)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return int


class _Name(str):
    pass


def test_names_and_values_of_other_types_that_compare_equal_are_not_of_the_layout() -> None:
    """The general encoding takes only a str as a name and looks at a value's type:
    a numpy str or a str subclass as a name, or a proxy of an int, is its business."""
    layout = SampleLayout.of(_sample())
    assert layout is not None
    for name in (np.str_("n"), _Name("n")):
        other = {name if k == "n" else k: v for k, v in _sample().items()}
        assert list(other) == list(_sample())  # equal names, in the same order
        assert layout.encode(other) is None
    lying = {**_sample(), "n": _Lying()}
    assert lying["n"].__class__ is int
    assert layout.encode(lying) is None
