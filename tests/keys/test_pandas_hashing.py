"""pandas values are hashed from their buffers, for every column kind: equal values
hash equal (whatever their chunks, slicing or blocks), different ones differently."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import numpy as np
import pytest

from mlcache.keys.hashing import hash_value

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

LONG = 300  # at least the length from which object columns go through arrow


def distinct(*values: object) -> None:
    keys = [hash_value(v) for v in values]
    dupes = [(i, j) for i in range(len(keys)) for j in range(i) if keys[i] == keys[j]]
    assert not dupes, f"equal keys for the values at {dupes}"


def same(*values: object) -> None:
    keys = {hash_value(v) for v in values}
    assert len(keys) == 1, f"{len(keys)} different keys"


def words(n: int, k: int = 0) -> list[str]:
    return [f"w{(i + k) % 37}" for i in range(n)]


def test_categoricals_by_codes_and_categories():
    base = pd.Series(pd.Categorical(words(LONG)))
    same(base, pd.Series(pd.Categorical(words(LONG))))
    cats = sorted(set(words(LONG)))
    distinct(
        base,
        pd.Series(pd.Categorical(words(LONG, 1))),
        pd.Series(pd.Categorical(words(LONG), categories=cats[::-1])),  # categories' order
        pd.Series(pd.Categorical(words(LONG), categories=[*cats, "extra"])),
        pd.Series(pd.Categorical(words(LONG), ordered=True)),
        pd.Series(words(LONG), dtype=object),
    )


def test_tz_aware_datetimes_by_values_and_zone():
    t = pd.date_range("2024-03-30", periods=LONG, freq="h", tz="Europe/Berlin")
    same(pd.Series(t), pd.Series(t.copy()))
    same(pd.Series(t.tz_convert("UTC")), pd.Series(t.tz_convert(dt.timezone.utc)))  # one zone
    distinct(
        pd.Series(t),
        pd.Series(t.tz_convert("UTC")),  # the same instants in another zone
        pd.Series(t.tz_convert("Europe/Paris")),
        pd.Series(t.tz_convert(zoneinfo.ZoneInfo("UTC"))),
        pd.Series(t + pd.Timedelta(1, "us")),
        pd.Series(t.as_unit("ns")),
        pd.Series(t.tz_localize(None)),
    )
    with_nat = pd.Series(t).copy()
    with_nat.iloc[3] = pd.NaT
    distinct(pd.Series(t), with_nat)


def test_masked_arrays_by_data_and_mask():
    values = np.arange(LONG)
    a = pd.array(values, dtype="Int64")
    b = a.copy()
    b[5] = pd.NA
    c = a.copy()
    c[5] = 0
    d = b.copy()
    d[5] = 0
    d[5] = pd.NA  # the same NA, whatever was under the mask
    same(pd.Series(b), pd.Series(d))
    distinct(pd.Series(a), pd.Series(b), pd.Series(c), pd.Series(a.astype("Int32")))
    distinct(pd.Series(a), pd.Series(values))  # nullable vs numpy dtype
    big = 2**62 + 1  # not a float64: a lossy conversion would make these equal
    distinct(
        pd.Series(pd.array([big, None] * LONG, dtype="Int64")),
        pd.Series(pd.array([big - 1, None] * LONG, dtype="Int64")),
    )
    f = pd.array(np.linspace(0, 1, LONG), dtype="Float64")
    g = f.copy()
    g[0] = pd.NA
    distinct(pd.Series(f), pd.Series(g))
    t = pd.array([True, False] * LONG, dtype="boolean")
    u = t.copy()
    u[1] = pd.NA
    distinct(pd.Series(t), pd.Series(u))


def test_periods_and_intervals():
    p = pd.period_range("2020-01", periods=LONG, freq="D")
    same(pd.Series(p), pd.Series(p.copy()))
    distinct(
        pd.Series(p),
        pd.Series(pd.period_range("2020-01", periods=LONG, freq="2D")),
        pd.Series(pd.period_range("2020-01-02", periods=LONG, freq="D")),
    )
    iv = pd.IntervalIndex.from_breaks(np.arange(LONG + 1))
    same(pd.Series(iv), pd.Series(pd.IntervalIndex.from_breaks(np.arange(LONG + 1))))
    distinct(
        pd.Series(iv),
        pd.Series(pd.IntervalIndex.from_breaks(np.arange(LONG + 1), closed="left")),
        pd.Series(pd.IntervalIndex.from_breaks(np.arange(LONG + 1) * 2)),
        pd.Series(pd.IntervalIndex.from_breaks(np.arange(LONG + 1.0))),
    )


@pytest.mark.parametrize("n", [3, LONG])
def test_object_strings_equal_and_different(n):
    s = words(n)
    same(pd.Series(s, dtype=object), pd.Series(list(s), dtype=object))
    changed = list(s)
    changed[-1] = changed[-1] + "x"
    moved = ["".join(s[:2]), "", *s[2:]]  # the same bytes, other boundaries
    with_none = [None, *s[1:]]
    with_nan = [np.nan, *s[1:]]
    with_empty = ["", *s[1:]]
    distinct(
        *(pd.Series(v, dtype=object) for v in (s, changed, moved, with_none, with_nan, with_empty)),
        pd.Series([str(i) for i in range(n)], dtype=object),
        pd.Series(list(range(n)), dtype=object),  # ints, not their digits
    )


def test_object_columns_of_other_types_element_by_element():
    class Text(str):
        pass

    s = words(LONG)
    subclassed = [Text(s[0]), *s[1:]]
    distinct(pd.Series(s, dtype=object), pd.Series(subclassed, dtype=object))
    mixed = [1, *s[1:]]
    same(pd.Series(mixed, dtype=object), pd.Series(list(mixed), dtype=object))
    distinct(pd.Series(mixed, dtype=object), pd.Series(["1", *s[1:]], dtype=object))
    surrogate = ["\ud800", *s[1:]]  # no UTF-8: element by element, still hashed
    distinct(pd.Series(surrogate, dtype=object), pd.Series(s, dtype=object))


@pytest.mark.parametrize("dtype", ["str", "string[python]", "string[pyarrow]"])
def test_string_dtypes_whatever_their_chunks(dtype):
    s = words(LONG)
    a = pd.Series(s, dtype=dtype)
    chunked = pd.concat([pd.Series(s[:100], dtype=dtype), pd.Series(s[100:], dtype=dtype)])
    sliced = pd.Series(["pad", *s], dtype=dtype).iloc[1:]
    same(a, chunked.reset_index(drop=True), sliced.reset_index(drop=True))
    b = a.copy()
    b.iloc[0] = None
    c = a.copy()
    c.iloc[0] = ""
    distinct(
        a, b, c, pd.Series(s, dtype=object), pd.Series(["".join(s[:2]), "", *s[2:]], dtype=dtype)
    )


def test_arrow_strings_and_binary():
    s = words(LONG)
    a = pd.Series(pd.array(s, dtype=pd.ArrowDtype(pa.string())))
    same(a, pd.Series(pd.array(list(s), dtype=pd.ArrowDtype(pa.string()))))
    distinct(
        a,
        pd.Series(pd.array(s, dtype=pd.ArrowDtype(pa.large_string()))),  # dtype repr differs
        pd.Series(pd.array([x.encode() for x in s], dtype=pd.ArrowDtype(pa.binary()))),
        pd.Series(pd.array(words(LONG, 1), dtype=pd.ArrowDtype(pa.string()))),
    )
    ints = pd.Series(pd.array([2**62 + 1, None] * 3, dtype=pd.ArrowDtype(pa.int64())))
    distinct(ints, pd.Series(pd.array([2**62, None] * 3, dtype=pd.ArrowDtype(pa.int64()))))


def test_index_names_freq_and_kind():
    daily = pd.date_range("2024-01-01", periods=LONG, freq="D", tz="UTC")
    col = np.arange(LONG)
    same(pd.DataFrame({"a": col}, index=daily), pd.DataFrame({"a": col}, index=daily.copy()))
    distinct(
        pd.DataFrame({"a": col}, index=daily),
        pd.DataFrame({"a": col}, index=daily.rename("t")),
        pd.DataFrame({"a": col}, index=pd.DatetimeIndex(list(daily))),  # no freq
        pd.DataFrame({"a": col}, index=daily.tz_convert("Europe/Berlin")),
        pd.DataFrame({"b": col}, index=daily),
    )
    idx = pd.Index(words(LONG), name="w")
    distinct(idx, idx.rename("v"), pd.Index(words(LONG), dtype=object, name="w"))


def test_frames_with_every_kind_hash_equal_when_equal():
    def frame(shift: int = 0) -> object:
        n = LONG
        return pd.DataFrame(
            {
                "num": np.arange(n) + shift,
                "cat": pd.Categorical(words(n)),
                "tz": pd.date_range("2024-01-01", periods=n, freq="s", tz="UTC"),
                "obj": pd.Series(words(n), dtype=object),
                "str": pd.Series(words(n), dtype="str"),
                "int": pd.array(np.arange(n), dtype="Int64"),
                "per": pd.period_range("2020", periods=n, freq="D"),
                "iv": pd.IntervalIndex.from_breaks(np.arange(n + 1)),
            }
        )

    same(frame(), frame())
    distinct(frame(), frame(1))


def test_hypothesis_string_columns():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    text = st.one_of(st.none(), st.text(max_size=4))

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(
        st.lists(text, min_size=LONG, max_size=LONG + 5),
        st.lists(text, min_size=LONG, max_size=LONG + 5),
    )
    def check(a: list[str | None], b: list[str | None]) -> None:
        equal = a == b
        for dtype in (object, "str"):
            x, y = pd.Series(a, dtype=dtype), pd.Series(b, dtype=dtype)
            if dtype == "str":
                equal = x.equals(y)
            assert (hash_value(x) == hash_value(y)) == equal

    check()


def test_arrow_fixed_width_whatever_their_chunks_and_what_is_under_a_null():
    values = [2**62 + 1, None, 3] * LONG
    a = pd.Series(pd.array(values, dtype=pd.ArrowDtype(pa.int64())))
    chunks = pa.chunked_array([pa.array(values[:5]), pa.array(values[5:])])
    garbage = pa.Array.from_buffers(  # 7 under the null: the same value to pandas
        pa.int64(),
        3,
        [pa.array([True, False, True]).buffers()[1], pa.py_buffer(np.array([1, 7, 3]))],
    )
    plain = pa.array([1, None, 3], pa.int64())
    same(a, pd.Series(pd.arrays.ArrowExtensionArray(chunks)))
    same(
        pd.Series(pd.arrays.ArrowExtensionArray(plain)),
        pd.Series(pd.arrays.ArrowExtensionArray(garbage)),
    )
    distinct(
        a,
        pd.Series(pd.array([2**62, None, 3] * LONG, dtype=pd.ArrowDtype(pa.int64()))),
        pd.Series(pd.array([2**62 + 1, 0, 3] * LONG, dtype=pd.ArrowDtype(pa.int64()))),
        pd.Series(pd.array([1.0, None, 3.0] * LONG, dtype=pd.ArrowDtype(pa.float64()))),
        pd.Series(pd.array([1, None, 3] * LONG, dtype=pd.ArrowDtype(pa.int64()))),
        pd.Series(pd.array(values, dtype="Int64")),
    )
    bools = pd.Series(pd.array([True, None, False] * LONG, dtype=pd.ArrowDtype(pa.bool_())))
    distinct(
        bools,
        pd.Series(pd.array([True, False, False] * LONG, dtype=pd.ArrowDtype(pa.bool_()))),
        pd.Series(pd.array([True, None, True] * LONG, dtype=pd.ArrowDtype(pa.bool_()))),
    )
    sliced = pd.Series(
        pd.array([False, *([True, None, False] * LONG)], dtype=pd.ArrowDtype(pa.bool_()))
    )
    same(bools, sliced.iloc[1:].reset_index(drop=True))
    ts = pa.array(np.arange(LONG), pa.timestamp("us", tz="UTC"))
    distinct(
        pd.Series(pd.arrays.ArrowExtensionArray(ts)),
        pd.Series(pd.arrays.ArrowExtensionArray(ts.cast(pa.timestamp("us", tz="Europe/Berlin")))),
    )


def test_nested_arrow_element_by_element():
    a = pd.Series(pd.array([[1, 2], None, [3]], dtype=pd.ArrowDtype(pa.list_(pa.int64()))))
    same(a, pd.Series(pd.array([[1, 2], None, [3]], dtype=pd.ArrowDtype(pa.list_(pa.int64())))))
    distinct(a, pd.Series(pd.array([[1, 2], [], [3]], dtype=pd.ArrowDtype(pa.list_(pa.int64())))))


def test_sparse_by_positions_and_values():
    dense = np.zeros(LONG)
    dense[[3, 100]] = [1.5, 2.5]
    a = pd.Series(pd.arrays.SparseArray(dense))
    same(a, pd.Series(pd.arrays.SparseArray(dense.copy())))
    moved = np.roll(dense, 1)
    distinct(
        a,
        pd.Series(pd.arrays.SparseArray(moved)),
        pd.Series(pd.arrays.SparseArray(dense, fill_value=1.5)),
        pd.Series(pd.arrays.SparseArray(np.r_[dense, 0.0])),  # one more fill value
        pd.Series(dense),
    )


def test_python_strings_without_an_arrow_form_element_by_element():
    s = words(LONG)
    lone = pd.Series(["\ud800", *s[1:]], dtype="string[python]")  # no UTF-8
    same(lone, pd.Series(["\ud800", *s[1:]], dtype="string[python]"))
    distinct(lone, pd.Series(["\ud801", *s[1:]], dtype="string[python]"))
    distinct(lone, pd.Series(s, dtype="string[python]"))
