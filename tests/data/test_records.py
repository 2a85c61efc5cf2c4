"""The payload of a record of a pack being filled: plain samples in a compact
form, any other as an entry; every kind comes back as it went in, and a damaged
payload is refused, never misread."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlcache.data.records import PLAIN, decode_sample, encode_sample
from mlcache.errors import EntryCorrupted

_DTYPES = st.sampled_from(["<f4", "<f8", ">i4", "<i8", "<u2", "|b1", "<c16", "<M8[ns]", "<m8[s]"])
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(),
    _DTYPES.flatmap(lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_side=4))),
    _DTYPES.flatmap(lambda d: hnp.from_dtype(np.dtype(d))),
    st.lists(st.text(max_size=5), max_size=4),
)
_NESTED = st.recursive(
    _VALUES, lambda inner: st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8
)


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        assert isinstance(b, (np.ndarray, np.generic))
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), _NESTED, min_size=1, max_size=5))
def test_plain_samples_round_trip_exactly(sample: dict) -> None:
    payload = encode_sample(sample, allow_pickle=False)
    if any("\ud800" <= c <= "\udfff" for c in repr(sample)):
        return  # surrogates go through the entry form (covered below)
    assert payload[:4] == PLAIN
    back = decode_sample(payload, allow_pickle=False)
    assert list(back) == list(sample)
    assert all(_same(sample[k], back[k]) for k in sample)
    arrays = [v for v in back.values() if isinstance(v, np.ndarray)]
    assert all(a.flags.writeable for a in arrays)


@pytest.mark.parametrize(
    "sample",
    [
        {"tokens": [1, 2, 3], "x": np.zeros(2)},  # a list of numbers: the entry form
        {"meta": {1: 3}},  # a dict with a key that is not a str
        {"big": 1 << 70},
        {"s": "\ud800"},
        {"t": ("a", 1)},
    ],
)
def test_other_samples_are_entries_and_come_back(sample: dict) -> None:
    payload = encode_sample(sample, allow_pickle=False)
    assert payload[:4] != PLAIN
    back = decode_sample(payload, allow_pickle=False)
    assert list(back) == list(sample) and repr(back) == repr(sample)


def test_a_damaged_plain_payload_is_refused() -> None:
    sample = {"x": np.arange(6, dtype=np.int32).reshape(2, 3), "name": "abc", "k": 7}
    payload = encode_sample(sample, allow_pickle=False)
    refused = 0
    for cut in range(5, len(payload)):  # every truncation
        with pytest.raises(EntryCorrupted):
            decode_sample(payload[:cut], allow_pickle=False)
        refused += 1
    assert refused == len(payload) - 5
    with pytest.raises(EntryCorrupted):
        decode_sample(payload + b"\0", allow_pickle=False)
    forged = payload.replace(b"<i4", b"|O8")  # an object dtype is never read
    with pytest.raises(EntryCorrupted):
        decode_sample(forged, allow_pickle=False)


def test_only_segments_of_sealed_items_are_removed_as_redundant(tmp_path) -> None:
    """A segment whose records all hold items of the sealed table goes; one with a
    record of another fingerprint (another process filling an edit) stays."""
    from mlcache.data.records import record_bytes, remove_redundant_records

    table = np.arange(16, dtype="<i8").reshape(4, 4)  # 4 items: key + fingerprint rows
    rows = [table[i].tobytes() for i in range(4)]
    folder = tmp_path / "p.pack.fill"
    folder.mkdir()
    payload = encode_sample({"x": 1}, allow_pickle=False)
    (folder / "1-a.seg").write_bytes(b"".join(record_bytes(r[:16], r[16:], payload) for r in rows))
    other = rows[2][:16] + b"\x01" * 16  # item 2 with another fingerprint
    (folder / "2-b.seg").write_bytes(
        record_bytes(rows[0][:16], rows[0][16:], payload)
        + record_bytes(other[:16], other[16:], payload)
    )
    remove_redundant_records(str(folder), table)
    assert sorted(p.name for p in folder.iterdir()) == ["2-b.seg"]
    (folder / "2-b.seg").unlink()
    (folder / "3-c.seg").write_bytes(record_bytes(rows[1][:16], rows[1][16:], payload)[:-3])  # torn
    remove_redundant_records(str(folder), table)
    assert not folder.exists()
