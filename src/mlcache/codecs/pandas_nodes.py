"""The nodes of pandas values (:mod:`mlcache.codecs.pandas`'s leaves): labels,
columns and indexes, to and from JSON plus raw segments.

Each column is stored by its kind, so that it comes back with the same dtype
and the same values, and numeric data as raw segments (memory-mapped views of
the entry when the reader maps it):

========================  ===================================================
kind (``"k"``)            stored as
========================  ===================================================
``np``                    a numpy array segment: bool, ints, floats, complex,
                          ``datetime64`` and ``timedelta64`` of any unit
``masked``                values + mask segments: ``Int8``..``UInt64``,
                          ``Float32``/``Float64``, ``boolean``
``tz``                    int64 UTC values + the dtype string
                          (``datetime64[ns, Europe/Paris]``)
``period``                int64 ordinals + the dtype string (``period[M]``)
``cat``                   codes segment + categories (an index node) + ordered
``str``                   *strings* + storage and ``na_value``: the
                          ``string``/``str`` dtypes
``obj``                   *strings*, or int32 codes + each distinct string
                          once: an ``object`` column holding only ``str`` (or
                          only ``bytes``) and missing values, ``None``, NaN
                          (what reindexing puts in) or ``pd.NA``: codes -1,
                          -2, -3 (NaN or NA: always codes, the node marked
                          ``"missing"``, and the leaf stored under its
                          ``.na`` name, which older readers do not know)
``interval``              its two ends, each a column node, + ``closed``
``arrow``                 an Arrow IPC stream segment: a ``pd.ArrowDtype``
                          column (``dtype_backend="pyarrow"``), as it is
========================  ===================================================

*Strings* are a JSON list (up to 256) or an Arrow ``large_string`` /
``large_binary`` array's buffers as segments (offsets, data, validity), read
back with ``pyarrow.Array.from_buffers`` over the segments (zero-copy from a
map) once the offsets are checked; an IPC stream segment in entries of the
first layout.

An index node is a ``RangeIndex`` (start, stop, step), a ``MultiIndex`` (its
levels as index nodes, codes segments, names), an ``object`` index of plain
labels (JSON: str, int, float, bool, None and tuples of them; column names that
are ints or tuples), or any other index as one column plus its ``freq``. Names
are plain labels. A frame is its columns index, its index and one column node
per position (duplicate names are kept). Anything else (an ``object`` column
of other Python objects, sparse, ``attrs``, a time zone that does not
come back as the same type) is refused by ``can_encode``: pickle stores it, or
nothing when pickle is disabled. pandas is imported only once a value of it is
met; pyarrow is needed for string columns only.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from . import Segments

__all__ = [
    "column_kind",
    "decode_column",
    "decode_index",
    "encode_column",
    "encode_index",
    "index_ok",
    "label",
    "label_ok",
    "later_layout",
    "pandas_module",
    "unlabel",
    "values_of",
]

Add = Callable[[Any], int]

#: the numpy dtype kinds stored as raw segments
_NP_KINDS = frozenset("biufcmM")
#: object index of plain labels stored as JSON, up to this many labels
_MAX_LABELS = 100_000
_MASKED = frozenset(
    [
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float32",
        "Float64",
        "boolean",
    ]
)


# -- labels (names, object index values): plain JSON ----------------------------------
def label_ok(v: Any, depth: int = 0) -> bool:
    t = type(v)
    if v is None or t is str or t is bool or t is int or t is float:
        return True
    return t is tuple and depth < 20 and all(label_ok(x, depth + 1) for x in v)


def label(v: Any) -> Any:
    t = type(v)
    if v is None or t is str or t is bool:
        return v
    if t is int:
        return {"i": str(v)}
    if t is float:
        return {"f": v.hex()}
    return {"t": [label(x) for x in v]}


def unlabel(n: Any) -> Any:
    if n is None or type(n) is str or type(n) is bool:
        return n
    if type(n) is dict and len(n) == 1:
        if "i" in n:
            return int(n["i"])
        if "f" in n:
            return float.fromhex(n["f"])
        if "t" in n and type(n["t"]) is list:
            return tuple(unlabel(x) for x in n["t"])
    raise ValueError(f"bad pandas label node {n!r}")


# -- columns ------------------------------------------------------------------------
def column_kind(pd: Any, values: Any) -> str | None:
    """The column kind of ``values`` (a numpy array or an ExtensionArray), or None
    when it cannot be stored exactly."""
    dtype = values.dtype
    if isinstance(dtype, np.dtype):
        if dtype.kind in _NP_KINDS and dtype.fields is None and dtype.isnative:
            return "np"
        if dtype.kind == "O":
            types = set(map(type, values))
            types.discard(type(None))
            types.discard(type(pd.NA))
            if float in types:  # NaN is missing too (what reindexing puts in), if only NaN
                if not all(_is_nan(v) for v in values if type(v) is float):
                    return None
                types.discard(float)
            if types <= {str} or types == {bytes}:
                return "obj" if _has_arrow() else None
        return None
    if type(values) in (pd.arrays.IntegerArray, pd.arrays.FloatingArray, pd.arrays.BooleanArray):
        return "masked" if str(dtype) in _MASKED else None
    if isinstance(dtype, pd.CategoricalDtype):
        return "cat" if index_ok(pd, dtype.categories) else None
    if type(values) is pd.arrays.ArrowExtensionArray and isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa

        from .arrow import schema_ok

        return "arrow" if schema_ok(pa.schema([("v", dtype.pyarrow_dtype)])) else None
    if isinstance(dtype, pd.StringDtype):
        return "str" if _has_arrow() and _na_code(dtype.na_value) is not None else None
    if type(values) is pd.arrays.IntervalArray:
        ends_ok = all(
            column_kind(pd, values_of(e)) in ("np", "tz") for e in (values.left, values.right)
        )
        return "interval" if ends_ok and isinstance(values.closed, str) else None
    if isinstance(dtype, (pd.DatetimeTZDtype, pd.PeriodDtype)):
        try:
            again = pd.api.types.pandas_dtype(str(dtype))
        except (TypeError, ValueError):
            return None
        if again != dtype or type(again) is not type(dtype):
            return None
        if isinstance(dtype, pd.DatetimeTZDtype):
            return "tz" if type(again.tz) is type(dtype.tz) else None
        return "period"
    return None


#: the bits of ``float("nan")`` (numpy's ``nan`` too): the one NaN an ``obj`` column
#: gives back (another payload or sign would not come back the same: refused)
_NAN_BITS = struct.pack("<d", float("nan"))


def _is_nan(v: float) -> bool:
    return v != v and struct.pack("<d", v) == _NAN_BITS


def _na_code(na: Any) -> str | None:
    if na is None:
        return None
    if isinstance(na, float) and na != na:
        return "nan"
    if type(na).__name__ == "NAType":
        return "NA"
    return None


def _has_arrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _arrow_segment(add: Add, array: Any) -> int:
    """One Arrow array as an IPC stream segment (read back zero-copy)."""
    import pyarrow as pa

    batch = pa.record_batch([array], names=["v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return add(sink.getvalue())


def _arrow_array(segments: Segments, index: int) -> Any:
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.py_buffer(segments.buffer(index))).read_all()
    if table.num_columns != 1:
        raise ValueError("bad pandas string segment")
    return table.column(0).combine_chunks()


def _array(
    segments: Segments, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str
) -> Any:
    """A segment as a plain ndarray (a view of the map when mapped: pandas' own
    comparisons tell a ``numpy.memmap`` from an ndarray)."""
    return np.asarray(segments.array(index, dtype, shape, order))


def encode_column(pd: Any, values: Any, add: Add) -> dict[str, Any]:
    kind = column_kind(pd, values)
    n = len(values)
    if kind == "np":
        a = _contiguous(np.asarray(values))
        return {"k": "np", "a": add(a), "dtype": a.dtype.str, "n": n}
    if kind == "masked":
        dtype = values.dtype
        mask = _contiguous(np.asarray(values.isna(), dtype=bool))
        fill = False if dtype.numpy_dtype.kind == "b" else 0
        data = _contiguous(values.to_numpy(dtype=dtype.numpy_dtype, na_value=fill))
        return {"k": "masked", "dtype": str(dtype), "a": add(data), "m": add(mask), "n": n}
    if kind == "tz":
        utc = _contiguous(np.asarray(values.asi8, dtype=np.int64))
        return {"k": "tz", "dtype": str(values.dtype), "a": add(utc), "n": n}
    if kind == "period":
        ordinals = _contiguous(np.asarray(values.asi8, dtype=np.int64))
        return {"k": "period", "dtype": str(values.dtype), "a": add(ordinals), "n": n}
    if kind == "interval":  # its two ends, each a column
        ends = [encode_column(pd, values_of(e), add) for e in (values.left, values.right)]
        return {"k": "interval", "closed": values.closed, "ends": ends, "n": n}
    if kind == "cat":
        codes = _contiguous(np.asarray(values.codes))
        return {
            "k": "cat",
            "a": add(codes),
            "dtype": codes.dtype.str,
            "n": n,
            "cats": encode_index(pd, values.dtype.categories, add),
            "ordered": bool(values.dtype.ordered),
        }
    import pyarrow as pa

    if kind == "arrow":  # an ArrowDtype column (dtype_backend="pyarrow"): as it is
        array = pa.array(values)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        return {"k": "arrow", "s": _arrow_segment(add, array), "n": n}
    if kind == "str":
        array = pa.array(values, type=pa.large_string())
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        na = _na_code(values.dtype.na_value)
        node = {"k": "str", "storage": values.dtype.storage, "na": na, "n": n}
        return {**node, **_strings(add, array)}
    if kind == "obj":
        values = np.asarray(values, dtype=object)
        binary = any(type(v) is bytes for v in values)
        # which missing value each null is (Arrow has one null): NaN, pd.NA, else None
        text = pa.large_binary() if binary else pa.large_string()
        array = pa.array(values, type=text, from_pandas=True)  # None, NaN, NA: nulls
        at = np.zeros(0, dtype=np.intp)
        if array.null_count:
            at = np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))
        nan = at[np.array([type(values[i]) is float for i in at], dtype=bool)]
        nas = at[np.array([values[i] is pd.NA for i in at], dtype=bool)]
        marked = bool(len(nan) or len(nas))
        encoded = array.dictionary_encode() if marked or n >= _DICT_MIN else None
        # repeated strings are each stored once; NaN and NA need codes (below -1, which
        # readers before them refuse as damage rather than read as None)
        if encoded is not None and (marked or len(encoded.dictionary) <= n // 4):
            codes = encoded.indices.fill_null(_NONE_CODE).to_numpy().astype(np.int32, copy=True)
            codes[nan] = _NAN_CODE
            codes[nas] = _NA_CODE
            words = _strings(add, encoded.dictionary)
            node = {"k": "obj", "n": n, "codes": add(_contiguous(codes)), "words": words}
            return {**node, "missing": True} if marked else node
        return {"k": "obj", "n": n, **_strings(add, array)}
    raise TypeError(f"pandas column of dtype {values.dtype} cannot be stored without pickle")


#: string arrays up to this long go in the layout (column names, categories):
#: opening an Arrow stream costs more than parsing a short JSON list
_SMALL_STRINGS = 256
#: object columns at least this long whose distinct strings are at most a quarter
#: of them store each string once (as pickle does) plus int32 codes
_DICT_MIN = 1024
#: the codes of an ``obj`` column's missing values (then the distinct strings, from 0)
_NONE_CODE, _NAN_CODE, _NA_CODE = -1, -2, -3


def _strings(add: Add, array: Any) -> dict[str, Any]:
    """A large_string (or large_binary) Arrow array: a JSON list when short and
    text, else its Arrow buffers as segments (offsets, data, validity)."""
    import pyarrow as pa

    text = pa.types.is_large_string(array.type)
    if len(array) <= _SMALL_STRINGS and text:
        return {"v": array.to_pylist()}
    if array.offset:  # a slice: its buffers start elsewhere
        array = pa.concat_arrays([array])
    n = len(array)
    validity, offsets, data = array.buffers()
    offsets = offsets[: 8 * (n + 1)]
    end = int(np.frombuffer(offsets, dtype=np.int64)[-1]) if n else 0
    node: dict[str, Any] = {"len": n, "bin": not text, "off": add(offsets)}
    node["data"] = add(data[:end] if data is not None else b"")
    if array.null_count:
        node["valid"] = add(validity[: (n + 7) // 8])
    return node


def _strings_back(node: dict[str, Any], segments: Segments) -> Any:
    import pyarrow as pa

    if "v" in node:
        v = node["v"]
        if type(v) is not list or not all(x is None or type(x) is str for x in v):
            raise ValueError("bad string list")
        return pa.array(v, type=pa.large_string())
    if "s" in node:  # an IPC stream (the first layout of these columns)
        return _arrow_array(segments, node["s"])
    n = node["len"]
    if type(n) is not int or n < 0:
        raise ValueError(f"bad string count {n!r}")
    offsets = _array(segments, node["off"], np.dtype(np.int64), (n + 1,), "C")
    data = segments.buffer(node["data"])
    # what Arrow trusts: offsets from 0, never decreasing, within the data
    if offsets[0] != 0 or offsets[-1] > len(data) or (n and (np.diff(offsets) < 0).any()):
        raise ValueError("bad string offsets")
    validity = None
    if "valid" in node:
        validity = pa.py_buffer(segments.buffer(node["valid"]))
        if len(validity) * 8 < n:
            raise ValueError("bad string validity")
    kind = pa.large_binary() if node["bin"] is True else pa.large_string()
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, n, buffers)


def later_layout(node: Any, depth: int = 0) -> bool:
    """Whether a leaf's ``node`` holds an ``obj`` column with NaN or NA (codes -2,
    -3): the leaf then stores it under its ``.na`` name, which readers before
    those codes do not know (a miss that keeps the entry, not damage)."""
    if type(node) is dict:
        if node.get("k") == "obj" and node.get("missing") is True:
            return True
        return depth < 50 and any(later_layout(v, depth + 1) for v in node.values())
    if type(node) is list:
        return depth < 50 and any(later_layout(v, depth + 1) for v in node)
    return False


def _codes_dtype(name: Any) -> np.dtype:
    dtype = np.dtype(name)
    if dtype.kind != "i":  # pandas' codes are signed ints (-1: missing)
        raise ValueError(f"bad codes dtype {dtype}")
    return dtype


def _one_chunk(array: Any) -> Any:
    """``array`` as a one-chunk ChunkedArray (what ArrowExtensionArray holds)."""
    import pyarrow as pa

    return pa.chunked_array([array], type=array.type)


def decode_column(pd: Any, node: dict[str, Any], segments: Segments) -> Any:
    kind, n = node["k"], node["n"]
    if type(n) is not int or n < 0:
        raise ValueError(f"bad column length {n!r}")
    if kind == "np":
        dtype = np.dtype(node["dtype"])
        if dtype.kind not in _NP_KINDS:
            raise ValueError(f"bad column dtype {dtype}")
        return _array(segments, node["a"], dtype, (n,), "C")
    if kind == "masked":
        dtype = pd.api.types.pandas_dtype(node["dtype"])
        if str(dtype) not in _MASKED:
            raise ValueError(f"bad masked dtype {dtype}")
        data = _array(segments, node["a"], dtype.numpy_dtype, (n,), "C")
        mask = _array(segments, node["m"], np.dtype(bool), (n,), "C")
        return dtype.construct_array_type()(data, mask, copy=False)
    if kind == "tz":
        dtype = pd.api.types.pandas_dtype(node["dtype"])
        if not isinstance(dtype, pd.DatetimeTZDtype):
            raise ValueError(f"bad tz dtype {dtype}")
        utc = _array(segments, node["a"], np.dtype(np.int64), (n,), "C")
        naive = pd.DatetimeIndex(utc.view(f"M8[{dtype.unit}]"), copy=False)
        return naive.tz_localize("UTC").tz_convert(dtype.tz).array
    if kind == "interval":
        left, right = (decode_column(pd, e, segments) for e in node["ends"])
        if len(left) != n or len(right) != n:
            raise ValueError("bad interval column length")
        return pd.arrays.IntervalArray.from_arrays(left, right, closed=node["closed"], copy=False)
    if kind == "period":
        dtype = pd.api.types.pandas_dtype(node["dtype"])
        if not isinstance(dtype, pd.PeriodDtype):
            raise ValueError(f"bad period dtype {dtype}")
        ordinals = _array(segments, node["a"], np.dtype(np.int64), (n,), "C")
        return pd.arrays.PeriodArray(ordinals, dtype=dtype, copy=False)
    if kind == "cat":
        codes = _array(segments, node["a"], _codes_dtype(node["dtype"]), (n,), "C")
        cats = decode_index(pd, node["cats"], segments)
        dtype = pd.CategoricalDtype(cats, ordered=node["ordered"] is True)
        return pd.Categorical.from_codes(codes, dtype=dtype)
    if kind == "str":
        array = _strings_back(node, segments)
        na = {"nan": np.nan, "NA": pd.NA}[node["na"]]
        dtype = pd.StringDtype(storage=node["storage"], na_value=na)
        out = dtype.__from_arrow__(array)
        if len(out) != n:
            raise ValueError("bad string column length")
        return out
    if kind == "arrow":
        array = _arrow_array(segments, node["s"])
        if len(array) != n:
            raise ValueError("bad arrow column length")
        return pd.arrays.ArrowExtensionArray(_one_chunk(array))
    if kind == "obj" and "codes" in node:  # repeated strings: one object per distinct one
        words = _strings_back(node["words"], segments).to_numpy(zero_copy_only=False)
        codes = _array(segments, node["codes"], np.dtype(np.int32), (n,), "C")
        if n and (codes.min() < _NA_CODE or codes.max() >= len(words)):
            raise ValueError("bad string codes")
        table = np.empty(len(words) + 3, dtype=object)
        table[:-3] = words
        table[_NA_CODE], table[_NAN_CODE], table[_NONE_CODE] = pd.NA, np.nan, None
        return table[codes]  # a negative code counts from the end: a missing value
    if kind == "obj":
        out = _strings_back(node, segments).to_numpy(zero_copy_only=False)
        if out.dtype != object or len(out) != n:
            raise ValueError("bad object column")
        return out
    raise ValueError(f"bad pandas column kind {kind!r}")


# -- indexes ------------------------------------------------------------------------
def index_ok(pd: Any, idx: Any) -> bool:
    t = type(idx)
    if t is pd.RangeIndex:
        return label_ok(idx.name)
    if t is pd.MultiIndex:
        return all(label_ok(n) for n in idx.names) and all(index_ok(pd, lv) for lv in idx.levels)
    if t not in (pd.Index, pd.DatetimeIndex, pd.TimedeltaIndex, pd.PeriodIndex) and (
        t not in (pd.CategoricalIndex, pd.IntervalIndex)
    ):
        return False
    if not label_ok(idx.name):
        return False
    if _is_object(idx.dtype):
        if column_kind(pd, idx.to_numpy()) == "obj":
            return True
        return len(idx) <= _MAX_LABELS and all(label_ok(v) for v in idx)
    return column_kind(pd, values_of(idx)) is not None


def _is_object(dtype: Any) -> bool:
    """numpy's object dtype (extension dtypes have kind "O" too)."""
    return isinstance(dtype, np.dtype) and dtype.kind == "O"


def encode_index(pd: Any, idx: Any, add: Add) -> dict[str, Any]:
    t = type(idx)
    if t is pd.RangeIndex:
        return {"k": "range", "r": [idx.start, idx.stop, idx.step], "name": label(idx.name)}
    if t is pd.MultiIndex:
        codes = [_contiguous(np.asarray(c)) for c in idx.codes]
        return {
            "k": "multi",
            "levels": [encode_index(pd, lv, add) for lv in idx.levels],
            "codes": [{"a": add(c), "dtype": c.dtype.str} for c in codes],
            "n": len(idx),
            "names": [label(n) for n in idx.names],
        }
    name = label(idx.name)
    if _is_object(idx.dtype) and column_kind(pd, idx.to_numpy()) != "obj":
        return {"k": "labels", "v": [label(v) for v in idx], "name": name}
    freq = getattr(idx, "freqstr", None) if t in (pd.DatetimeIndex, pd.TimedeltaIndex) else None
    return {"k": "index", "v": encode_column(pd, values_of(idx), add), "name": name, "freq": freq}


def decode_index(pd: Any, node: dict[str, Any], segments: Segments) -> Any:
    kind = node["k"]
    if kind == "range":
        start, stop, step = (int(x) for x in node["r"])
        return pd.RangeIndex(start, stop, step, name=unlabel(node["name"]))
    if kind == "multi":
        n = node["n"]
        if type(n) is not int or n < 0:
            raise ValueError(f"bad MultiIndex length {n!r}")
        levels = [decode_index(pd, lv, segments) for lv in node["levels"]]
        codes = [
            _array(segments, c["a"], _codes_dtype(c["dtype"]), (n,), "C") for c in node["codes"]
        ]
        names = [unlabel(x) for x in node["names"]]
        return pd.MultiIndex(levels=levels, codes=codes, names=names, copy=False)
    name = unlabel(node["name"])
    if kind == "labels":
        labels = _tuples([unlabel(v) for v in node["v"]])
        return pd.Index(labels, dtype=object, name=name, copy=False, tupleize_cols=False)
    if kind != "index":
        raise ValueError(f"bad pandas index kind {kind!r}")
    values = decode_column(pd, node["v"], segments)
    idx = pd.Index(values, dtype=values.dtype, name=name, copy=False)
    freq = node["freq"]
    if freq is not None:
        if type(idx) is pd.DatetimeIndex:
            idx = pd.DatetimeIndex(idx, freq=freq, name=name)
        elif type(idx) is pd.TimedeltaIndex:
            idx = pd.TimedeltaIndex(idx, freq=freq, name=name)
        else:
            raise ValueError("a freq on an index that has none")
    return idx


def _tuples(labels: list[Any]) -> Any:
    """An object array of ``labels`` whose elements may be tuples (numpy would
    otherwise make a 2-D array of them)."""
    out = np.empty(len(labels), dtype=object)
    for i, v in enumerate(labels):
        out[i] = v
    return out


def pandas_module() -> Any:
    import pandas as pd

    return pd


def values_of(s: Any) -> Any:
    """A Series' or an Index's values: a numpy array for numpy dtypes (datetimes
    too), else its ExtensionArray."""
    pd = pandas_module()
    values = s.array
    numpy_backed = (
        pd.arrays.NumpyExtensionArray,
        pd.arrays.DatetimeArray,
        pd.arrays.TimedeltaArray,
    )
    if isinstance(values, numpy_backed) and isinstance(s.dtype, np.dtype):
        return s.to_numpy()
    return values
