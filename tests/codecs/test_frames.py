"""codecs/pandas, arrow, polars: frames as leaves of the npy tree, never pickled.

Every common pandas column kind round-trips exactly (``assert_frame_equal`` with
``check_exact``, dtypes equal), through the codec (in memory, entry files read
and mapped) and through a real ``Memory(allow_pickle=False)`` hit; what cannot be
stored exactly is refused (pickle, or unstored)."""

from __future__ import annotations

import datetime
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlcache import EntryCorrupted, Memory, UnknownFormat  # noqa: E402
from mlcache.codecs import codecs  # noqa: E402
from mlcache.entry import EntryReader, decode  # noqa: E402
from mlcache.testing.codecs import MemorySegments, is_mapped, read, write  # noqa: E402

npy = codecs["npy"]
N = 7


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _column_kinds() -> dict[str, Any]:
    """One column of each kind, N rows."""
    return {
        "int64": np.arange(N, dtype=np.int64) - 3,
        "uint8": np.arange(N, dtype=np.uint8),
        "int16": np.arange(N, dtype=np.int16),
        "float64": np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-310, 0.1]),
        "float32": np.arange(N, dtype=np.float32) / 3,
        "complex": np.arange(N) * (1 + 1j),
        "bool": np.arange(N) % 2 == 0,
        "Int64": pd.array([1, None, 3, -4, 5, None, 2**62], dtype="Int64"),
        "UInt16": pd.array([1, None, 3, 4, 5, None, 7], dtype="UInt16"),
        "Float64": pd.array([1.5, None, 3, 4, 5, None, -0.0], dtype="Float64"),
        "boolean": pd.array([True, None, False, True, True, False, None], dtype="boolean"),
        "string": pd.array(["a", None, "c", "", "é✓", "f", "g"], dtype="string"),
        "string-python": pd.array(
            ["a", None, "c", "", "é", "f", "g"], dtype=pd.StringDtype("python")
        ),
        "str": pd.array(
            ["a", "b", None, "d", "e", "f", "\x00"], dtype=pd.StringDtype(na_value=np.nan)
        ),
        "object-str": np.array(["a", None, "c", "d", "é", "", "x" * 100], dtype=object),
        "object-none": np.array([None] * N, dtype=object),
        "object-str-nan-na": _objects(["a", np.nan, None, "d", pd.NA, "", float("nan")]),
        "object-nan": _objects([np.nan] * N),
        "object-bytes": np.array([b"a", None, b"", b"\x00\xff", b"e", b"f", b"g"], dtype=object),
        "category": pd.Categorical(list("abcabca")),
        "category-ordered": pd.Categorical(
            ["lo", "hi", None, "lo", "mid", "hi", "lo"],
            categories=["lo", "mid", "hi", "unused"],
            ordered=True,
        ),
        "category-int": pd.Categorical([3, 1, 2, 3, 1, 2, 3]),
        "datetime-ns": pd.date_range("2020-01-01", periods=N, freq="h", unit="ns"),
        "datetime-s": pd.date_range("1900-01-01", periods=N, freq="D", unit="s"),
        "datetime-nat": pd.array(
            [pd.Timestamp("2020-01-01"), pd.NaT] * 3 + [pd.NaT], dtype="datetime64[us]"
        ),
        "datetime-tz": pd.date_range("2020-03-29", periods=N, freq="h", tz="Europe/Paris"),
        "datetime-utc": pd.date_range("2020-01-01", periods=N, tz="UTC", unit="ms"),
        "datetime-fixed-offset": pd.date_range(
            "2020", periods=N, tz=datetime.timezone(datetime.timedelta(hours=-3, minutes=-30))
        ),
        "timedelta": pd.to_timedelta(np.arange(N) - 2, unit="s"),
        "period-month": pd.period_range("2020-01", periods=N, freq="M"),
        "period-quarter": pd.period_range("2020Q1", periods=N, freq="Q-DEC"),
        "interval-int": pd.arrays.IntervalArray.from_breaks(np.arange(N + 1), closed="left"),
        "interval-float-nan": pd.arrays.IntervalArray.from_arrays(
            [0.0, np.nan, 1.5, -1.0, 2.0, 3.0, 4.0],
            [1.0, np.nan, 2.5, 0.0, 2.0, 3.5, 5.0],
            closed="both",
        ),
        "interval-datetime-tz": pd.arrays.IntervalArray.from_breaks(
            pd.date_range("2020", periods=N + 1, tz="Europe/Paris"), closed="neither"
        ),
        "arrow-int64": pd.array([1, None, 3, 4, 5, 6, 7], dtype="int64[pyarrow]"),
        "arrow-string": pd.array(["a", None, "c", "", "e", "f", "g"], dtype=_arrow(pa.string())),
        "arrow-timestamp-tz": pd.array(
            pd.date_range("2020", periods=N, tz="Asia/Tokyo"),
            dtype=_arrow(pa.timestamp("us", "Asia/Tokyo")),
        ),
        "arrow-list": pd.array(
            [[1], [], None, [2, 3], [4], [5], [6]], dtype=_arrow(pa.list_(pa.int32()))
        ),
        "arrow-dictionary": pd.array(
            pa.array(list("abcabca")).dictionary_encode(),
            dtype=_arrow(pa.dictionary(pa.int32(), pa.string())),
        ),
    }


def _arrow(t: Any) -> Any:
    return pd.ArrowDtype(t)


KINDS = _column_kinds()


def frame(columns: dict[Any, Any], index: Any = None) -> Any:
    """A DataFrame of exactly these columns: each keeps its dtype (pandas 3 would
    make an ``object`` array of strings a ``str`` column)."""
    index = pd.RangeIndex(N) if index is None else index
    return pd.DataFrame(
        {k: pd.Series(v, index=index, dtype=v.dtype) for k, v in columns.items()}, index=index
    )


def series(values: Any, **kwargs: Any) -> Any:
    """A Series of exactly ``values``' dtype."""
    return pd.Series(values, dtype=values.dtype, **kwargs)


def assert_frame_same(got: Any, want: Any) -> None:
    """Same type, same values (bit for bit), same dtypes, index, names."""
    assert type(got) is type(want)
    if isinstance(want, pd.DataFrame):
        pd.testing.assert_frame_equal(got, want, check_exact=True, check_freq=True)
        assert list(got.dtypes) == list(want.dtypes)
        _same_index(got.columns, want.columns)
        _same_index(got.index, want.index)
        for i in range(want.shape[1]):
            _same_objects(got.iloc[:, i], want.iloc[:, i])
    elif isinstance(want, pd.Series):
        pd.testing.assert_series_equal(got, want, check_exact=True, check_freq=True)
        assert got.dtype == want.dtype
        _same_objects(got, want)
        _same_index(got.index, want.index)
    else:
        _same_index(got, want)


def _same_objects(got: Any, want: Any) -> None:
    """An ``object`` array's elements of the same types: None, NaN and pd.NA are
    all "missing" to pandas' comparisons, but not to the code that reads them."""
    if want.dtype == object:
        assert [type(v) for v in got] == [type(v) for v in want]


def _same_index(got: Any, want: Any) -> None:
    pd.testing.assert_index_equal(got, want, exact=True, check_exact=True)
    _same_objects(got, want)
    assert type(got) is type(want) and got.names == want.names and got.dtype == want.dtype
    if isinstance(want, (pd.DatetimeIndex, pd.TimedeltaIndex)):
        assert got.freq == want.freq


def round_trips(value: Any, tmp_path: Path) -> list[Any]:
    """``value`` decoded from memory, and from an entry file read and mapped."""
    assert npy.can_encode(value) is True
    encoded = npy.encode(value)
    layout = json.loads(json.dumps(encoded.layout))  # the layout is JSON
    out = [npy.decode(layout, MemorySegments(encoded))]
    path = tmp_path / "entry"
    write(npy, value, path)
    for mode in (None, "r", "c"):
        out.append(read(npy, path, mode))
    return out


# -- pandas: every column kind -----------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_column_kind_round_trips_exactly(kind: str, tmp_path: Path) -> None:
    df = frame({kind: KINDS[kind], "n": np.arange(N)})
    assert df[kind].dtype == KINDS[kind].dtype
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)
    one = series(KINDS[kind], name=kind, index=pd.Index(list("abcdefg"), name="key"))
    assert one.dtype == KINDS[kind].dtype
    for got in round_trips(one, tmp_path):
        assert_frame_same(got, one)


def test_a_frame_of_every_kind_round_trips(tmp_path: Path) -> None:
    df = frame(KINDS, index=pd.Index(list("abcdefg"), name="key"))
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)


@pytest.mark.parametrize(
    "index",
    [
        pd.RangeIndex(N),
        pd.RangeIndex(10, 10 + 3 * N, 3, name="step3"),
        pd.Index(np.arange(N) * 10, name=("a", 1)),
        pd.Index(list("abcdefg"), dtype=object, name=5),
        pd.Index([1, "b", 2.5, None, ("t", 1), True, 10**30], dtype=object, tupleize_cols=False),
        pd.date_range("2021-01-01", periods=N, freq="D", name="day"),
        pd.date_range("2021-01-01", periods=N, freq="15min", tz="America/New_York"),
        pd.DatetimeIndex(["2021-01-03", "2021-01-01", "2021-01-02"] * 2 + ["2020-01-01"]),
        pd.timedelta_range("1 day", periods=N, freq="h"),
        pd.period_range("2020", periods=N, freq="Y"),
        pd.interval_range(0, N, name="bins", closed="right"),
        pd.CategoricalIndex(list("abcabca"), categories=list("cba"), ordered=True, name="c"),
        pd.Index(pd.array([1, None, 3, 4, 5, 6, 7], dtype="Int64"), name="nullable"),
        pd.MultiIndex.from_arrays(
            [list("aabbccd"), np.arange(N), pd.date_range("2020", periods=N)],
            names=["letter", None, "when"],
        ),
    ],
    ids=lambda i: f"{type(i).__name__}-{i.dtype}-{i.names}",
)
def test_indexes_keep_their_type_names_and_freq(index: Any, tmp_path: Path) -> None:
    df = pd.DataFrame({"x": np.arange(N, dtype=np.float64)}, index=index)
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)
    for got in round_trips(index, tmp_path):
        assert_frame_same(got, index)


@pytest.mark.parametrize(
    "columns",
    [
        pd.Index([0, 1, 2]),
        pd.Index([2.5, -1.0, 0.0]),
        pd.Index(["a", "a", "b"]),  # duplicate names
        pd.Index([("a", 1), ("b", 2), ("c", 3)], tupleize_cols=False),
        pd.Index(["a", 1, None], dtype=object),
        pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)], names=["top", "sub"]),
        pd.RangeIndex(3, name="cols"),
        pd.date_range("2020", periods=3, freq="D"),
    ],
    ids=str,
)
def test_column_names_of_any_kind(columns: Any, tmp_path: Path) -> None:
    df = pd.DataFrame(
        {i: c for i, c in enumerate([np.arange(N), KINDS["string"], KINDS["category"]])}
    )
    df.columns = columns
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)


@pytest.mark.parametrize(
    "df",
    [
        pd.DataFrame(),
        pd.DataFrame(index=pd.RangeIndex(5)),
        pd.DataFrame(columns=["a", "b"]),
        frame(KINDS).iloc[:0],
        pd.DataFrame({"a": []}, index=pd.Index([], dtype=object, name="empty")),
    ],
    ids=["nothing", "rows-only", "columns-only", "no-rows", "empty-object-index"],
)
def test_empty_frames(df: Any, tmp_path: Path) -> None:
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)


def test_numeric_columns_are_views_of_the_mapped_entry(tmp_path: Path) -> None:
    df = frame({k: KINDS[k] for k in ("int64", "float64", "bool", "datetime-ns", "Int64")})
    write(npy, df, tmp_path / "e")
    mapped = read(npy, tmp_path / "e", "r")
    for name in ("int64", "float64", "bool", "datetime-ns"):
        values = mapped[name].to_numpy()
        assert is_mapped(values) and not values.flags.writeable, name
        assert type(values) is np.ndarray  # not a memmap: pandas' own checks compare classes
    assert is_mapped(mapped["Int64"].to_numpy(dtype="int64", na_value=0)) is False  # a copy
    in_memory = read(npy, tmp_path / "e", None)
    assert not is_mapped(in_memory["int64"].to_numpy())
    copy_on_write = read(npy, tmp_path / "e", "c")
    assert is_mapped(copy_on_write["float64"].to_numpy())
    assert_frame_same(copy_on_write, df)


def test_a_tree_of_frames_and_arrays_keeps_each_part(tmp_path: Path) -> None:
    value = {
        "train": frame({"x": KINDS["float64"], "y": KINDS["object-str"]}),
        "labels": series(KINDS["Int64"], name="y"),
        "raw": np.arange(6).reshape(2, 3),
        "meta": ("v1", 3, None),
        "index": pd.RangeIndex(4),
        "table": pa.table({"a": [1, 2]}),
    }
    for got in round_trips(value, tmp_path):
        assert list(got) == list(value)
        assert_frame_same(got["train"], value["train"])
        assert_frame_same(got["labels"], value["labels"])
        assert_frame_same(got["index"], value["index"])
        assert np.array_equal(got["raw"], value["raw"]) and got["meta"] == value["meta"]
        assert got["table"].equals(value["table"])


# -- pandas: hypothesis -------------------------------------------------------------------
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)


@st.composite
def frames(draw: st.DrawFn) -> Any:
    n = draw(st.integers(0, 6))
    makers = {
        "int": lambda: np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)), dtype=np.int64),  # noqa: E501
        "float": lambda: np.array(draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n)), dtype=np.float64),  # noqa: E501
        "Int64": lambda: pd.array(draw(st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)), dtype="Int64"),  # noqa: E501
        "string": lambda: pd.array(draw(st.lists(st.none() | _text, min_size=n, max_size=n)), dtype="string"),  # noqa: E501
        "object": lambda: _objects(draw(st.lists(st.sampled_from([None, np.nan, pd.NA]) | _text, min_size=n, max_size=n))),  # noqa: E501
        "category": lambda: pd.Categorical(draw(st.lists(st.none() | st.sampled_from("abc"), min_size=n, max_size=n)), categories=list("abcd"), ordered=draw(st.booleans())),  # noqa: E501
        "datetime-tz": lambda: pd.DatetimeIndex(np.array(draw(st.lists(st.integers(-(2**62), 2**62), min_size=n, max_size=n)), dtype="M8[ns]")).tz_localize("UTC").tz_convert("Asia/Kolkata"),  # noqa: E501
    }  # fmt: skip
    kinds = draw(st.lists(st.sampled_from(sorted(makers)), max_size=5))
    index = pd.RangeIndex(n)
    columns = {i: makers[k]() for i, k in enumerate(kinds)}
    df = pd.DataFrame({i: pd.Series(c, index=index, dtype=c.dtype) for i, c in columns.items()})
    k = len(kinds)
    names = draw(st.lists(st.none() | _text | st.integers(-5, 5), min_size=k, max_size=k))
    df.columns = pd.Index(names, dtype=object)
    return df


@settings(max_examples=40, deadline=None)
@given(frames())
def test_random_frames_round_trip(df: Any) -> None:
    encoded = npy.encode(df)
    got = npy.decode(json.loads(json.dumps(encoded.layout)), MemorySegments(encoded))
    assert_frame_same(got, df)


# -- pandas: refusals -----------------------------------------------------------------------
class MyFrame(pd.DataFrame):
    pass


def _refused() -> dict[str, Any]:
    with_attrs = pd.DataFrame({"a": [1]})
    with_attrs.attrs["source"] = "x"
    return {
        "object-python-objects": pd.DataFrame({"a": pd.Series([object(), "x"], dtype=object)}),
        "object-negative-nan-and-str": pd.Series(["x", -np.nan], dtype=object),
        "object-numpy-nan-and-str": pd.Series(["x", np.float64("nan")], dtype=object),
        "object-number-and-str": pd.Series(["x", 1.5], dtype=object),
        "object-str-subclass": pd.DataFrame({"a": pd.Series([np.str_("x")], dtype=object)}),
        "object-mixed-bytes-str": pd.Series([b"x", "y"], dtype=object),
        "sparse": pd.DataFrame({"a": pd.arrays.SparseArray([0, 0, 1])}),
        "dateutil-tz": pd.Series(pd.date_range("2020", periods=2, tz="dateutil/Europe/Paris")),
        "attrs": with_attrs,
        "subclass": MyFrame({"a": [1]}),
        "name-object": pd.Series([1], name=frozenset()),
        "index-of-objects": pd.Series([1, 2], index=pd.Index([object(), object()])),
    }


@pytest.mark.parametrize("name", list(_refused()))
def test_what_cannot_be_stored_exactly_is_refused(name: str) -> None:
    value = _refused()[name]
    assert npy.can_encode(value) is False
    assert npy.can_encode({"nested": [value]}) is False


# -- pandas: through a real Memory, without pickle -----------------------------------------------
@pytest.mark.parametrize("allow_pickle", [False, True])
def test_memory_hit_without_pickle(allow_pickle: bool, tmp_path: Path) -> None:
    """Frames are stored typed whatever allow_pickle says: the default store path
    uses no pickle for them."""
    mem = Memory(tmp_path, verbose=0, allow_pickle=allow_pickle)
    runs = []

    @mem.cache
    def load(n: int) -> Any:
        runs.append(n)
        return frame(KINDS, index=pd.Index(list("abcdefg"), name="key")).iloc[:n]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: no "not stored" warning
        first = load(N)
        again = load(N)
    assert runs == [N]
    assert_frame_same(again, first)
    entries = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and len(p.name) == 32 and all(c in "0123456789abcdef" for c in p.name)
    ]
    assert len(entries) == 1
    assert EntryReader(str(entries[0])).codec == "npy"  # no pickle in the entry


def test_a_damaged_frame_layout_is_a_corrupted_entry(tmp_path: Path) -> None:
    df = frame({k: KINDS[k] for k in ("int64", "object-str", "category", "datetime-tz")})
    path = tmp_path / "e"
    write(npy, df, path)
    reader = EntryReader(str(path))
    leaf = reader.codec_layout["tree"]
    for column in range(4):
        for key in list(leaf["data"][column]):
            for bad in (None, -1, "x", 2**70, [], {"k": "np"}):
                forged = json.loads(json.dumps(leaf))
                forged["data"][column][key] = bad
                try:
                    got = decode(_Forged(reader, {"tree": forged}), allow_pickle=False)  # type: ignore[arg-type]
                except EntryCorrupted:
                    continue
                assert isinstance(got, pd.DataFrame)  # a harmless field (a name)


class _Forged:
    def __init__(self, reader: EntryReader, layout: dict[str, Any]) -> None:
        self._reader, self.codec_layout = reader, layout
        self.codec, self.path = reader.codec, reader.path

    def __len__(self) -> int:
        return len(self._reader)

    def buffer(self, index: int) -> memoryview:
        return self._reader.buffer(index)

    def array(self, *args: Any) -> np.ndarray:
        return self._reader.array(*args)


def test_decoding_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    df = frame(KINDS)
    write(npy, df, tmp_path / "e")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    assert_frame_same(decode(EntryReader(str(tmp_path / "e")), allow_pickle=False), df)


# -- pyarrow --------------------------------------------------------------------------------------
def _tables() -> dict[str, Any]:
    t = pa.table(
        {
            "i": pa.array([1, None, 3], pa.int32()),
            "s": ["x", None, "é"],
            "ls": pa.array(["a", "b", None], pa.large_string()),
            "d": pa.array(["a", "b", "a"]).dictionary_encode(),
            "l": [[1, 2], None, []],
            "st": [{"a": 1, "b": "x"}, None, {"a": 3, "b": None}],
            "ts": pa.array([0, 1, None], pa.timestamp("ns", tz="Europe/Paris")),
            "dec": pa.array([1, 2, None], pa.decimal128(10, 2)),
            "dur": pa.array([1, 2, 3], pa.duration("ms")),
            "bin": [b"\x00", b"", None],
            "map": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
            "f16": pa.array(np.arange(3, dtype=np.float16)),
        },
        metadata={b"origin": b"test"},
    )
    return {
        "table": t,
        "chunked": pa.concat_tables([t, t.slice(1)]),
        "empty": t.slice(0, 0),
        "batch": t.to_batches()[0],
        "empty-batch": t.to_batches()[0].slice(0, 0),
        "tensor-ext": pa.table(
            {"t": pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 3, 4), np.float32))}
        ),
    }


@pytest.mark.parametrize("name", list(_tables()))
def test_arrow_tables_and_batches_round_trip(name: str, tmp_path: Path) -> None:
    value = _tables()[name]
    for got in round_trips(value, tmp_path):
        assert type(got) is type(value)
        assert got.equals(value, check_metadata=True)
        assert got.schema.equals(value.schema, check_metadata=True)
        if isinstance(value, pa.Table):  # the chunks kept (an empty one is no chunk)
            assert [len(c) for c in got.column(0).chunks if len(c)] == [
                len(c) for c in value.column(0).chunks if len(c)
            ]


def test_arrow_columns_are_zero_copy_views_of_the_mapped_entry(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(100_000, dtype=np.float64), "s": ["ab"] * 100_000})
    write(npy, table, tmp_path / "e")
    reader = EntryReader(str(tmp_path / "e"), "r")
    segment = np.frombuffer(reader.buffer(0), dtype=np.uint8)
    assert is_mapped(segment)
    lo, hi = segment.ctypes.data, segment.ctypes.data + segment.nbytes
    got = decode(reader, allow_pickle=False)
    for column in got.columns:
        for buf in column.chunk(0).buffers():
            if buf is not None:
                assert lo <= buf.address and buf.address + buf.size <= hi  # inside the map
    values = got.column("x").to_numpy()
    assert is_mapped(values) or lo <= values.ctypes.data < hi


def test_arrow_extension_types_that_need_registering_are_refused() -> None:
    pandas_period = pa.Table.from_pandas(pd.DataFrame({"p": pd.period_range("2020", periods=2)}))
    assert isinstance(pandas_period.schema.field("p").type, pa.ExtensionType)
    assert npy.can_encode(pandas_period) is False


# -- polars -----------------------------------------------------------------------------------
def test_polars_frames_and_series_round_trip(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars")
    from polars.testing import assert_frame_equal, assert_series_equal

    df = pl.DataFrame(
        {
            "i": [1, None, 3],
            "u8": pl.Series([1, 2, 3], dtype=pl.UInt8),
            "f": [1.5, float("nan"), None],
            "s": ["x", None, "é"],
            "b": [True, None, False],
            "cat": pl.Series(["a", "b", "a"], dtype=pl.Categorical),
            "enum": pl.Series(["lo", "hi", "lo"], dtype=pl.Enum(["hi", "lo"])),
            "l": [[1], [2, 3], None],
            "st": [{"x": 1}, {"x": None}, None],
            "dec": pl.Series(["1.25", "2.50", None]).cast(pl.Decimal(10, 2)),
            "dt": pl.Series([0, 1, None]).cast(pl.Datetime("ms", "Europe/Paris")),
            "date": pl.Series([1, 2, 3]).cast(pl.Date),
            "dur": pl.Series([1, 2, 3]).cast(pl.Duration("us")),
            "arr": pl.Series([[1, 2], [3, 4], [5, 6]], dtype=pl.Array(pl.Int32, 2)),
            "bin": [b"a", b"", None],
        }
    )
    for got in round_trips(df, tmp_path):
        assert type(got) is pl.DataFrame and got.schema == df.schema
        assert_frame_equal(got, df, check_exact=True, check_dtypes=True)
    for value in (df["enum"], pl.Series("empty", [], dtype=pl.Int16), df["st"]):
        for got in round_trips(value, tmp_path):
            assert type(got) is pl.Series and got.name == value.name
            assert_series_equal(got, value, check_exact=True, check_dtypes=True)
    for got in round_trips(pl.DataFrame(), tmp_path):
        assert got.shape == (0, 0)


def test_polars_object_columns_are_refused() -> None:
    pl = pytest.importorskip("polars")
    assert npy.can_encode(pl.DataFrame({"o": pl.Series([object()], dtype=pl.Object)})) is False
    assert npy.can_encode(pl.Series([object()], dtype=pl.Object)) is False


def test_long_string_columns_go_through_arrow_segments(tmp_path: Path) -> None:
    n = 1000  # past the short lists kept in the layout
    words = np.array([f"w{i % 300}" if i % 11 else None for i in range(n)], dtype=object)
    df = pd.DataFrame(
        {
            "str": pd.array(words, dtype="str"),
            "string": pd.array(words, dtype="string"),
            "python": pd.array(words, dtype=pd.StringDtype("python")),
            "object": words,
            "bytes": np.array([None if w is None else w.encode() for w in words], dtype=object),
            "cat": pd.Categorical(words),  # 300 categories: a segment too
        },
        index=pd.Index([f"row{i}" for i in range(n)], dtype=object),
    )
    encoded = npy.encode(df)
    assert len(encoded.segments) >= 7  # each column, the categories and the index
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)
    for part in (df.iloc[7:], df.iloc[::3], df.iloc[999:], df.iloc[:0]):  # sliced buffers
        for got in round_trips(part, tmp_path):
            assert_frame_same(got, part)


def test_damaged_string_buffers_are_refused(tmp_path: Path) -> None:
    df = pd.DataFrame({"s": pd.array([f"w{i}" for i in range(1000)], dtype="str")})
    write(npy, df, tmp_path / "e")
    reader = EntryReader(str(tmp_path / "e"))
    tree = reader.codec_layout["tree"]
    column = tree["data"][0]
    # (a forged layout can also point at another segment of the right size: only
    # the checksums, which forging must also redo, stand against that)
    for key, bad in (("len", 1001), ("len", -1), ("off", column["data"]), ("data", 99)):
        forged = json.loads(json.dumps(tree))
        forged["data"][0][key] = bad
        with pytest.raises(EntryCorrupted):
            decode(_Forged(reader, {"tree": forged}), allow_pickle=False)  # type: ignore[arg-type]


def test_importing_mlcache_imports_no_frame_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, mlcache, mlcache.codecs\n"
        "print(sorted(m for m in ('pandas', 'pyarrow', 'polars') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_repeated_object_strings_are_stored_once(tmp_path: Path) -> None:
    n = 3000
    words = [f"w{i % 300}" if i % 11 else None for i in range(n)]
    df = pd.DataFrame(
        {
            "object": pd.Series(words, dtype=object),  # (an object array would become "str")
            "bytes": np.array([None if w is None else w.encode() for w in words], dtype=object),
            "unique": pd.Series([f"u{i}" for i in range(n)], dtype=object),
        }
    )
    layout = npy.encode(df).layout["tree"]
    assert ["codes" in c for c in layout["data"]] == [True, True, False]  # "unique": not repeated
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)
        column = got["object"].to_numpy()
        assert column[1] is column[301]  # one object per distinct string, as pickle gives


def test_object_strings_with_nan_among_them_are_stored_typed(tmp_path: Path) -> None:
    """A column of strings given a non-range index is reindexed: the rows it lacks
    become NaN among the strings. Such a frame is stored without pickle, each
    missing value (None, NaN, pd.NA) coming back as it was."""
    n = 2000
    words = pd.Series([f"id{i % 997}" for i in range(n)], dtype=object)
    index = pd.Index(np.arange(n) * 2, name="row")
    df = pd.DataFrame({"s": words}, index=index)  # NaN from row 2000 on
    assert df["s"].dtype == object and df["s"].isna().sum() == n // 2
    rare = _objects([("w", None, np.nan, pd.NA)[i % 4] for i in range(n)])
    df["rare"] = pd.Series(rare, index=index, dtype=object)  # (an array would become "str")
    assert df["rare"].dtype == object
    mem = Memory(tmp_path / "cache", verbose=0, allow_pickle=False)
    runs = []

    @mem.cache
    def load(k: int) -> Any:
        runs.append(k)
        return {"frame": df, "series": words.reindex(index), "index": pd.Index(df["s"])}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: no "needs pickle" warning
        load(1)
        got = load(1)
    assert runs == [1]
    assert_frame_same(got["frame"], df)
    assert_frame_same(got["series"], words.reindex(index))
    assert_frame_same(got["index"], pd.Index(df["s"]))
    assert got["frame"]["s"].iloc[-1] is np.nan and got["frame"]["rare"].iloc[-1] is pd.NA
    for got in round_trips(df, tmp_path):
        assert_frame_same(got, df)


def test_readers_before_object_nan_miss_and_keep_such_entries(tmp_path: Path) -> None:
    """A column holding NaN or NA is stored as codes (-2, -3) in a node of the
    leaf's ``.na`` name: a process that knows only the first names misses
    (UnknownFormat, the entry kept), never reading NaN back as None; frames
    without them keep the first layout."""
    from mlcache.codecs import register_leaf
    from mlcache.codecs.leaves import get_leaf

    for values in (["a", np.nan], ["a", pd.NA], ["b", "a", None, np.nan]):
        tree = npy.encode(pd.Series(values, dtype=object)).layout["tree"]
        assert tree["x"] == "pandas.Series.na" and "codes" in tree["v"]
    tree = npy.encode(pd.Series(["a", None], dtype=object)).layout["tree"]
    assert tree["x"] == "pandas.Series" and tree["v"] == {"k": "obj", "n": 2, "v": ["a", None]}
    df = pd.DataFrame({"s": pd.Series(["a", "b"], dtype=object)}, index=[4, 6])  # all NaN
    value = {"df": df, "index": pd.Index(["a", np.nan], dtype=object)}
    tree = npy.encode(value).layout["tree"]["d"]
    assert [n["x"] for _, n in tree] == ["pandas.DataFrame.na", "pandas.Index.na"]
    write(npy, value, tmp_path / "e")
    leaves = [get_leaf(name) for name in ("pandas.DataFrame", "pandas.Series", "pandas.Index")]
    for leaf in leaves:
        register_leaf(leaf, replace=True)  # as before: no other name
    try:
        with pytest.raises(UnknownFormat, match="pandas.DataFrame.na"):
            decode(EntryReader(str(tmp_path / "e")), allow_pickle=False)
    finally:
        for leaf in leaves:
            register_leaf(leaf, replace=True, also=(leaf.name + ".na",))
    got = read(npy, tmp_path / "e", None)
    assert_frame_same(got["df"], df)
    assert_frame_same(got["index"], value["index"])


def test_string_columns_of_the_first_layout_still_read() -> None:
    """Entries written before the buffers layout hold an IPC stream ("s")."""
    from mlcache.codecs import Encoded

    segments: list[Any] = []

    def add(segment: Any) -> int:
        segments.append(segment)
        return len(segments) - 1

    sink = pa.BufferOutputStream()
    batch = pa.record_batch([pa.array(["a", None, "b"], pa.large_string())], names=["v"])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    column = {"k": "str", "storage": "pyarrow", "na": "nan", "n": 3, "s": add(sink.getvalue())}
    index = {"k": "range", "r": [0, 3, 1], "name": None}
    tree = {"x": "pandas.Series", "v": column, "index": index, "name": "old"}
    got = npy.decode({"tree": tree}, MemorySegments(Encoded({}, segments)))
    assert_frame_same(got, pd.Series(["a", None, "b"], dtype="str", name="old"))


def test_long_str_columns_are_zero_copy_views_of_the_mapped_entry(tmp_path: Path) -> None:
    df = pd.DataFrame({"s": pd.array([f"word{i}" for i in range(5000)], dtype="str")})
    write(npy, df, tmp_path / "e")
    reader = EntryReader(str(tmp_path / "e"), "r")
    node = reader.codec_layout["tree"]["data"][0]
    data = np.frombuffer(reader.buffer(node["data"]), dtype=np.uint8)
    assert is_mapped(data)
    got = decode(reader, allow_pickle=False)
    assert_frame_same(got, df)
    chunk = pa.array(got["s"].array)
    address = chunk.buffers()[2].address
    assert data.ctypes.data <= address < data.ctypes.data + data.nbytes  # inside the map


def test_a_frame_no_leaf_can_store_goes_to_pickle_or_is_returned_unstored(tmp_path: Path) -> None:
    def compute(n: int) -> Any:
        runs.append(n)
        return pd.DataFrame({"a": pd.Series([object(), "x"], dtype=object), "n": [n, n]})

    runs: list[int] = []
    pickled = Memory(tmp_path / "p", verbose=0).cache(compute)
    pickled(1)
    assert len(pickled(1)) == 2 and runs == [1]  # stored by pickle: a hit
    (entry,) = [p for p in (tmp_path / "p").rglob("*") if p.is_file() and len(p.name) == 32]
    assert EntryReader(str(entry)).codec == "pickle"
    refused = Memory(tmp_path / "r", verbose=0, allow_pickle=False).cache(compute)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(refused(2)) == 2  # returned, not stored, one warning
    assert len(caught) == 1 and "DataFrame" in str(caught[0].message), [
        str(w.message) for w in caught
    ]
    assert runs == [1, 2]


def _places(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _places(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _places(v, (*at, i))
    return out


def _put(node: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = json.loads(json.dumps(node))
    parent = copy
    for step in at[:-1]:
        parent = parent[step]
    parent[at[-1]] = new
    return copy


@pytest.fixture(scope="module")
def forged_entry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One entry of a frame of many kinds, for the forging test (made once)."""
    n = 2000
    words = [f"w{i % 50}" if i % 7 else None for i in range(n)]
    df = pd.DataFrame(
        {
            "i": np.arange(n),
            "s": pd.array(words, dtype="str"),
            "o": pd.Series(words, dtype=object),
            "p": pd.Series([np.nan if w is None else w for w in words], dtype=object),
            "c": pd.Categorical(words),
            "t": pd.date_range("2020", periods=n, freq="min", tz="UTC"),
            "m": pd.array(np.arange(n), dtype="Int64"),
            "v": pd.arrays.IntervalArray.from_breaks(np.arange(n + 1)),
        }
    )
    df.index = pd.MultiIndex.from_arrays([np.arange(n) % 3, np.arange(n)], names=["a", "b"])
    assert df["o"].dtype == object and df["o"].iloc[1] == "w1"
    path = tmp_path_factory.mktemp("forged") / "e"
    write(npy, df, path)
    return path


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    bad=st.none() | st.booleans() | st.integers(-3, 3000) | st.text(max_size=4) | st.just([]),
)
def test_forged_frame_layouts_are_damage_never_another_error(
    forged_entry: Path, data: Any, bad: Any
) -> None:
    """A layout changed anywhere (its checksums forged to match) decodes to a frame
    or is a damaged entry (a miss): never another error, never a crash."""
    reader = EntryReader(str(forged_entry))
    tree = reader.codec_layout["tree"]
    place = data.draw(st.sampled_from(_places(tree)[1:]))
    try:
        decode(_Forged(reader, {"tree": _put(tree, place, bad)}), allow_pickle=False)  # type: ignore[arg-type]
    except EntryCorrupted:
        pass  # a miss: the entry is removed and recomputed
    except UnknownFormat:
        assert place == ("x",) and isinstance(bad, str)  # another leaf's name: a miss, kept


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_a_frame_read_back_hashes_as_the_original(mmap_mode: str | None, tmp_path: Path) -> None:
    """So a cached frame passed on to another cached step keys it as the original did."""
    from mlcache import hash_value

    df = frame(KINDS, index=pd.Index(list("abcdefg"), name="key"))
    write(npy, df, tmp_path / "e")
    got = read(npy, tmp_path / "e", mmap_mode)
    assert hash_value(got) == hash_value(df)
    assert hash_value(got.index) == hash_value(df.index)
    for name in df.columns:
        assert hash_value(got[name]) == hash_value(df[name]), name
