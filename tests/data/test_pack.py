"""mlcache.data: the pack format, pack() and PackedDataset."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlcache import UnsupportedValue
from mlcache.data import Pack, PackCorrupted, PackedDataset, open_pack, pack
from mlcache.data import format as fmt


def patients(n, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {
            "vitals": rng.random((int(rng.integers(1, 30)), 6), dtype=np.float32),
            "age": int(rng.integers(18, 95)),
            "label": i % 2,
            "id": f"p{i:05d}",
            "image": np.full((4, 3), i % 256, dtype=np.uint8),
            "weight": 0.25 * i,
            "icu": bool(i % 3),
            "note": "é" * (i % 4),
            "blob": bytes([i % 256]) * (i % 5),
            "missing": None,
        }


@pytest.fixture
def ds(tmp_path):
    return pack(patients(200), tmp_path / "p.pack", progress=False)


def test_round_trip_every_field_type(ds):
    expected = list(patients(200))
    assert len(ds) == 200
    assert ds.field_names == list(expected[0])
    for i in (0, 1, 57, 199, -1):
        got, want = ds[i], expected[i]
        np.testing.assert_array_equal(got["vitals"], want["vitals"])
        assert got["vitals"].dtype == np.float32
        np.testing.assert_array_equal(got["image"], want["image"])
        for key in ("age", "label", "id", "weight", "icu", "note", "blob", "missing"):
            assert got[key] == want[key] and type(got[key]) is type(want[key])


def test_arrays_are_writable_and_private_to_each_read(ds):
    """In-place operations work and never reach the pack or another read (issue 13;
    large arrays stay zero-copy until written: tests/compat/test_dataset_reader.py)."""
    vitals = ds[3]["vitals"]
    assert vitals.flags.writeable
    before = float(vitals[0, 0])
    vitals[0, 0] = -1.0
    assert float(ds[3]["vitals"][0, 0]) == before


def test_fixed_fields_are_columns_and_batches_stack(ds):
    kinds = {f["name"]: f["kind"] for f in ds.pack_index["fields"]}
    assert kinds["image"] == "column" and kinds["age"] == "column"
    assert kinds["vitals"] == "ragged" and kinds["id"] == "str" and kinds["missing"] == "none"
    batch = ds.get_batch([5, 0, 199, 5])
    assert batch["image"].shape == (4, 4, 3)
    np.testing.assert_array_equal(batch["image"][:, 0, 0], [5, 0, 199, 5])
    np.testing.assert_array_equal(batch["label"], [1, 0, 1, 1])
    assert batch["age"].dtype == np.int64
    assert [v.shape[1] for v in batch["vitals"]] == [6, 6, 6, 6]
    assert batch["id"] == ["p00005", "p00000", "p00199", "p00005"]
    with pytest.raises(IndexError):
        ds.get_batch([200])


def test_sample_indices(ds):
    with pytest.raises(IndexError):
        ds[200]
    with pytest.raises(IndexError):
        ds[-201]
    with pytest.raises(TypeError):
        ds["x"]


def test_pickling_sends_the_path_not_the_data(ds):
    data = pickle.dumps(ds)
    assert len(data) < 300 and ds.path.encode() in data
    again = pickle.loads(data)
    assert again[10]["id"] == "p00010"


def test_a_column_that_varies_becomes_ragged(tmp_path):
    samples = [{"x": np.zeros((2, 2))}, {"x": np.ones((2, 2))}, {"x": np.ones((3, 1))}]
    ds = pack(samples, tmp_path / "r.pack", progress=False)
    assert ds.pack_index["fields"][0]["kind"] == "ragged"
    assert [ds[i]["x"].shape for i in range(3)] == [(2, 2), (2, 2), (3, 1)]
    np.testing.assert_array_equal(ds[1]["x"], np.ones((2, 2)))


# -- bad input ----------------------------------------------------------------------
def test_type_mismatch_names_the_sample_and_field(tmp_path):
    samples = [{"a": 1, "b": np.zeros(3)}, {"a": 2, "b": np.zeros(3)}, {"a": "x", "b": np.zeros(3)}]
    with pytest.raises(TypeError, match=r"sample 2, field 'a': str where sample 0 has int"):
        pack(samples, tmp_path / "t.pack", progress=False)
    # numbers promote (float64 and int32 arrays give float64); dates and numbers do not mix
    bad_dtype = [{"b": np.zeros(3)}, {"b": np.zeros(3, dtype="datetime64[s]")}]
    with pytest.raises(TypeError, match=r"sample 1, field 'b'.*no common dtype"):
        pack(bad_dtype, tmp_path / "t.pack", progress=False)
    bad_ndim = [{"b": np.zeros(3)}, {"b": np.zeros((3, 1))}]
    with pytest.raises(ValueError, match=r"sample 1, field 'b': 2 dimensions"):
        pack(bad_ndim, tmp_path / "t.pack", progress=False)
    assert not (tmp_path / "t.pack").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # nothing left


def test_field_sets_must_match(tmp_path):
    with pytest.raises(
        ValueError, match=r"sample 1: fields differ from sample 0: it lacks the field 'b'$"
    ):
        pack([{"a": 1, "b": 2}, {"a": 1}], tmp_path / "f.pack", progress=False)
    with pytest.raises(TypeError, match="sample 0 is a list"):
        pack([[1, 2]], tmp_path / "f.pack", progress=False)


def test_empty_source_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="source is empty"):
        pack([], tmp_path / "e.pack", progress=False)
    assert not (tmp_path / "e.pack").exists()


def test_other_values_need_allow_pickle(tmp_path):
    import datetime

    samples = [{"when": datetime.date(2020, 1, i + 1)} for i in range(3)]
    with pytest.raises(UnsupportedValue, match=r"sample 0, field 'when'.*allow_pickle"):
        pack(samples, tmp_path / "d.pack", progress=False)
    ds = pack(samples, tmp_path / "d.pack", progress=False, allow_pickle=True)
    assert ds[2]["when"] == datetime.date(2020, 1, 3)
    with pytest.raises(UnsupportedValue, match="allow_pickle=True"):
        PackedDataset(tmp_path / "d.pack")[0]


def test_an_interrupted_build_leaves_nothing_openable(tmp_path):
    def source():
        yield from patients(10)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(source(), tmp_path / "i.pack", progress=False)
    assert os.listdir(tmp_path) == []


# -- damage ---------------------------------------------------------------------------
def test_truncation_and_garbage_are_detected(tmp_path, ds):
    data = Path(ds.path).read_bytes()
    for cut in (0, 10, 64, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{cut}.pack"
        p.write_bytes(data[:cut])
        with pytest.raises(PackCorrupted, match=str(p)):
            PackedDataset(p)
    p = tmp_path / "garbage.pack"
    p.write_bytes(b"not a pack at all" * 10)
    with pytest.raises(PackCorrupted, match="bad magic"):
        PackedDataset(p)
    with pytest.raises(FileNotFoundError):
        PackedDataset(tmp_path / "nope.pack")


def test_every_flipped_byte_is_detected(tmp_path, ds):
    """Flip random bytes: opening or reading every sample raises, never a wrong value."""
    data = bytearray(Path(ds.path).read_bytes())
    rng = np.random.default_rng(1)
    positions = [*list(rng.integers(0, len(data), 150)), 0, 20, 47, 60, len(data) - 1]
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= 0x5A
        p = tmp_path / "flip.pack"
        p.write_bytes(bytes(damaged))
        with pytest.raises(PackCorrupted):
            bad = PackedDataset(p)
            bad.verify()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(min_size=0, max_size=600))
def test_random_bytes_give_only_pack_errors(tmp_path, blob):
    p = tmp_path / "random.pack"
    p.write_bytes(blob)
    with pytest.raises(PackCorrupted):
        PackedDataset(p).verify()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "a": st.none()
                | hnp.arrays(
                    st.sampled_from([np.float32, np.int64, np.uint8, np.complex64]),
                    hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=4),
                ),
                "n": st.none() | st.integers(-(2**63), 2**63 - 1),
                "f": st.floats(allow_nan=False),
                "s": st.none() | st.text(max_size=8),
            }
        ),
        min_size=1,
        max_size=12,
    ).filter(lambda xs: len({x["a"].dtype for x in xs if x["a"] is not None}) <= 1)
)
def test_hypothesis_samples_round_trip(tmp_path, samples):
    ds = pack(samples, tmp_path / "h.pack", progress=False, block_size=64)
    for i, want in enumerate(samples):
        got = ds[i]
        if want["a"] is None:
            assert got["a"] is None
        else:
            np.testing.assert_array_equal(got["a"], want["a"])
            assert got["a"].dtype == want["a"].dtype
        assert (got["n"], got["f"], got["s"]) == (want["n"], want["f"], want["s"])
    ds.verify()


def test_header_layout_matches_the_spec(ds):
    head = Path(ds.path).read_bytes()[:64]
    magic, version, flags, _r, n, i_off, i_len = struct.unpack_from("<8sHHIQQQ", head)
    assert (magic, version, flags, n) == (fmt.MAGIC, 1, 0, 200)
    assert i_off % 64 == 0 and i_off + i_len == os.path.getsize(ds.path)
    for field in ds.pack_index["fields"]:
        for key in ("data", "offsets", "shapes"):
            if key in field:
                assert field[key]["off"] % 64 == 0


def test_ints_beyond_int64_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"sample 1, field 'n': .* does not fit in int64"):
        pack([{"n": 1}, {"n": 2**70}], tmp_path / "big.pack", progress=False)


def _same(got, want):
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            if not np.array_equal(got[key], value) or got[key].dtype != value.dtype:
                return False
        elif got[key] != value or type(got[key]) is not type(value):
            return False
    return True


def test_reads_of_a_damaged_pack_are_right_or_raise(tmp_path):
    """With 64-byte blocks, damage anywhere is caught by the reads that touch it:
    every ds[i] and get_batch either returns the original sample or raises."""
    expected = list(patients(60))
    good = pack(expected, tmp_path / "b.pack", progress=False, block_size=64)
    data = bytearray(Path(good.path).read_bytes())
    rng = np.random.default_rng(7)
    detected = 0
    for pos in rng.integers(64, len(data), 300).tolist():
        damaged = bytearray(data)
        damaged[pos] ^= 1 << int(rng.integers(0, 8))
        p = tmp_path / "flip.pack"
        p.write_bytes(bytes(damaged))
        raised = False
        try:
            ds = PackedDataset(p)
            for i in rng.permutation(60).tolist():
                try:
                    assert _same(ds[i], expected[i]), f"wrong sample {i} after a flip at {pos}"
                except PackCorrupted:
                    raised = True
            try:
                batch = ds.get_batch([5, 1, 59])
                np.testing.assert_array_equal(
                    batch["age"], [expected[i]["age"] for i in (5, 1, 59)]
                )
            except PackCorrupted:
                raised = True
            ds.verify()
        except PackCorrupted:
            raised = True
        assert raised, f"a flip at byte {pos} went unnoticed"
        detected += 1
    assert detected == 300


def test_reads_after_every_block_is_verified(tmp_path):
    """Once every block has been verified the reader drops its checks; the values
    stay the same, before and after, in any order."""
    expected = list(patients(80))
    ds = pack(expected, tmp_path / "v.pack", progress=False, block_size=256)
    order = np.random.default_rng(3).permutation(80).tolist()
    first = [ds[i] for i in order]
    ds.verify()
    assert "k0(" not in ds._sample.__doc__  # the generated reader no longer tests blocks
    for i, got in zip(order, first):
        assert _same(got, expected[i]) and _same(ds[i], expected[i])


def test_block_size_must_be_a_power_of_two(tmp_path):
    with pytest.raises(ValueError, match="power of two"):
        pack(patients(3), tmp_path / "x.pack", progress=False, block_size=1000)


def test_fields_may_be_none_in_some_samples(tmp_path):
    samples = [
        {"a": None, "b": 1, "x": np.ones(3), "s": None, "r": None, "all": None},
        {"a": 2.5, "b": None, "x": None, "s": "hi", "r": np.ones((2, 2)), "all": None},
        {"a": None, "b": 3, "x": np.zeros(3), "s": None, "r": np.ones((1, 2)), "all": None},
        {"a": 1.0, "b": None, "x": None, "s": "yo", "r": None, "all": None},
    ]
    ds = pack(samples, tmp_path / "n.pack", progress=False, block_size=64)
    for i, want in enumerate(samples):
        got = ds[i]
        for key, value in want.items():
            if value is None:
                assert got[key] is None, (i, key)
            elif isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[key], value)
            else:
                assert got[key] == value and type(got[key]) is type(value)
    batch = ds.get_batch([3, 0, 1])
    assert batch["b"] == [None, 1, None] and batch["a"] == [1.0, None, 2.5]
    assert batch["x"][0] is None and batch["x"][1].tolist() == [1, 1, 1]
    kinds = {f["name"]: (f["kind"], "valid" in f) for f in ds.pack_index["fields"]}
    assert kinds["all"] == ("none", False) and kinds["r"] == ("ragged", True)
    ds.verify()


def test_a_type_mismatch_after_nones_names_the_first_value(tmp_path):
    samples = [{"a": None}, {"a": 2}, {"a": None}, {"a": "two"}]
    with pytest.raises(TypeError, match=r"sample 3, field 'a': str where sample 1 has int"):
        pack(samples, tmp_path / "m.pack", progress=False)


def test_strings_with_lone_surrogates_round_trip(tmp_path):
    values = ["plain", "\ud800 lone", "é\udfff", ""]
    ds = pack(
        ({"s": v, "b": v.encode("utf-8", "surrogatepass")} for v in values),
        tmp_path / "s.pack",
        progress=False,
    )
    assert [ds[i]["s"] for i in range(4)] == values
    assert [ds[i]["b"] for i in range(4)] == [v.encode("utf-8", "surrogatepass") for v in values]


def test_short_ascii_text_is_read_from_one_decoded_copy_and_checked_first(tmp_path):
    """An all-ASCII text field (ids, labels) is verified and decoded whole at the
    first read, and each read slices it: the same values as a field decoded sample
    by sample (a non-ASCII one, and a large one), and one damaged byte anywhere in it
    is found at the first read of any sample, never served."""
    from mlcache.data import regions

    ids = [f"p{i:05d}" for i in range(3000)]
    words = ["é" * (i % 4) + str(i) for i in range(3000)]
    p = tmp_path / "t.pack"
    pack(({"id": a, "w": b} for a, b in zip(ids, words)), p, progress=False)
    ds = PackedDataset(p)
    assert [ds[i]["id"] for i in range(3000)] == ids and [ds[i]["w"] for i in range(3000)] == words
    assert ds.get_batch([2, 0])["id"] == [ids[2], ids[0]]
    old = regions.TEXT_WHOLE_MAX
    regions.TEXT_WHOLE_MAX = 0  # the per-sample path reads the same values
    try:
        assert [PackedDataset(p)[i]["id"] for i in (0, 1234, 2999)] == [
            ids[0],
            ids[1234],
            ids[2999],
        ]
    finally:
        regions.TEXT_WHOLE_MAX = old
    data = bytearray(p.read_bytes())
    at = data.find(b"p02999")  # the last id: a block the first read never touches
    data[at + 1] ^= 0x01  # '0' -> '1': still ASCII
    damaged = tmp_path / "d.pack"
    damaged.write_bytes(bytes(data))
    with pytest.raises(PackCorrupted, match="checksum"):
        PackedDataset(damaged)[0]


def test_an_index_naming_an_object_dtype_is_refused(tmp_path):
    """Object dtypes would turn the file's bytes into pointers: a hostile index that
    asks for one (with valid checksums) is refused at open."""
    import json as _json

    ds = pack(
        ({"x": np.arange(i + 1.0), "y": np.ones((i + 1, i + 2))} for i in range(4)),
        tmp_path / "o.pack",
        progress=False,
    )
    data = bytearray(Path(ds.path).read_bytes())
    n, i_off, _, _ = fmt.read_header(bytes(data[:64]), len(data), "t")
    index = _json.loads(bytes(data[i_off:]))
    for field in index["fields"]:
        field["dtype"] = "|O"
    new_index = _json.dumps(index).encode()
    forged = bytes(data[64:i_off]) + new_index
    p = tmp_path / "forged.pack"
    p.write_bytes(fmt.pack_header(n, i_off, new_index) + forged)
    with pytest.raises(PackCorrupted, match="dtype"):
        PackedDataset(p)


def test_a_dropped_dataset_is_freed_at_once(tmp_path):
    """No reference cycle keeps a read pack (and its map) alive until the next GC."""
    import gc
    import weakref

    path = pack(patients(20), tmp_path / "f.pack", progress=False, block_size=64).path
    gc.disable()
    try:
        ds = PackedDataset(path)
        ds[3], ds.get_batch([1, 2])
        ds.verify()
        ref = weakref.ref(ds)
        del ds
        assert ref() is None
    finally:
        gc.enable()


def test_the_parsed_index_is_pack_index_and_layout_a_deprecated_name(tmp_path):
    ds = pack(({"y": i} for i in range(3)), tmp_path / "d.pack", progress=False)
    assert isinstance(ds, Pack) and isinstance(ds, PackedDataset)
    assert ds.pack_index["n"] == 3 and ds.fingerprint[0] == 3
    assert ds.fingerprint[2] == ds.index_sum
    assert ds.index({"y": 1}) == 1  # Sequence.index, not the pack's index
    with pytest.warns(DeprecationWarning, match="pack_index"):
        assert ds.layout is ds.pack_index
    again = open_pack(tmp_path / "d.pack")
    assert type(again) is PackedDataset and again.fingerprint == ds.fingerprint


def test_text_of_one_width_is_sliced_without_the_offsets(tmp_path):
    """Text fields whose samples all have one length (ids, one-letter codes, empty)
    are read by arithmetic instead of two lookups of the offsets (issue 26); the
    others, and a field with missing values, keep the offsets; every value reads
    back the same, in any order, twice (the generated reader is made again once
    every block is verified)."""
    expected = [
        {
            "id": f"p{i:05d}",
            "sex": "MF"[i % 3 == 0],
            "empty": "",
            "mixed": "ab" * (i % 3),
            "accent": "é",  # one character, two bytes: decoded sample by sample
            "code": None if i % 7 == 0 else "xy",
        }
        for i in range(300)
    ]
    ds = pack(expected, tmp_path / "t.pack", progress=False, block_size=256)
    order = np.random.default_rng(5).permutation(300).tolist()
    for _ in range(2):
        for i in order:
            assert ds[i] == expected[i]
    source = ds._sample.__doc__
    offsets = {name: f"o{k}[j]" in source for k, name in enumerate(ds.field_names)}
    assert offsets == {
        "id": False,
        "sex": False,
        "empty": False,
        "mixed": True,
        "accent": True,
        "code": True,
    }
    assert ds.get_batch([3, 0])["id"] == ["p00003", "p00000"]


def test_ragged_arrays_all_small_are_copied_without_a_size_test(tmp_path):
    """A ragged field whose samples are all below PRIVATE_MAP_MIN is copied with no
    test of each sample's size (issue 26); one with a larger sample keeps the test,
    and maps that one: both private to each read and writable."""
    from mlcache.data.regions import PRIVATE_MAP_MIN

    rows = PRIVATE_MAP_MIN // 8 + 1  # float64 rows of one value: the largest is mapped
    small = [{"x": np.arange(i + 1, dtype=np.float64)} for i in range(20)]
    mixed = [*small, {"x": np.arange(rows, dtype=np.float64)}]
    for samples, tested in ((small, False), (mixed, True)):
        ds = pack(samples, tmp_path / f"r{tested}.pack", progress=False)
        for _ in range(2):
            for i in range(len(samples) - 1, -1, -1):
                x = ds[i]["x"]
                assert x.flags.writeable and x.flags.owndata == (x.nbytes < PRIVATE_MAP_MIN)
                x[...] = -1
                np.testing.assert_array_equal(ds[i]["x"], samples[i]["x"])
        assert (f"< {PRIVATE_MAP_MIN}" in ds._sample.__doc__) is tested


def test_a_verified_column_of_small_rows_is_read_without_its_offset(tmp_path):
    """A column's row is numpy's index: its byte offset is computed only while its
    blocks are being verified (issue 26); the values are the same before and after."""
    samples = [{"x": np.full(8, i, dtype=np.float32), "y": i} for i in range(200)]
    pack(samples, tmp_path / "c.pack", progress=False, block_size=256)
    ds = PackedDataset(tmp_path / "c.pack")
    assert ds[7]["y"] == 7 and "k0(a" in ds._sample.__doc__  # blocks left to verify
    for _ in range(2):
        for i in range(199, -1, -1):
            s = ds[i]
            np.testing.assert_array_equal(s["x"], samples[i]["x"])
            assert s["y"] == i and s["x"].flags.owndata
    assert "a = " not in ds._sample.__doc__


def test_one_width_is_judged_over_the_whole_table_a_piece_at_a_time():
    """The width test of a text field looks at every step, across the pieces it
    reads the offsets in (a million at a time, no copy of a long table)."""
    from mlcache.data.regions import _steps_of

    n = (1 << 20) + 3
    table = np.arange(n + 1, dtype=np.int64) * 6
    assert _steps_of(table, 6) and not _steps_of(table, 5)
    for at in (1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, n - 1):
        bent = table.copy()
        bent[at] += 1  # two steps change: 7 then 5
        assert not _steps_of(bent, 6), at
    assert _steps_of(np.zeros(9, dtype=np.int64), 0)
