"""The hashing handlers of mlcache's own types, one section per type family:
scalars, containers, numpy, pandas, torch, and the callables that have no code
of the user's (builtin functions, bound methods).

Each handler writes one value to a :class:`~mlcache.keys.hashing.Hasher`
through its fast API (``h.buf``, ``h.update``, ``h.raw``, ``h.text``, ...) and
is entered into the dispatch tables of :mod:`mlcache.keys.hashing` at import
(``mlcache.keys`` imports this module). Functions and classes of the user's are
hashed by :mod:`mlcache.keys.code_version`, which knows their code versions.

The stream each handler writes is fixed by ``HASH_SCHEME``: any change to what
it writes is a change of every key, and must bump it.
"""

from __future__ import annotations

import pathlib
import struct
import types
import weakref
from typing import Any

import numpy as np

from ..entry import REF_ATTR, map_holds  # a cached read-only map's name: entries set it
from .hashing import Handler, Hasher, handle_exact, handle_family, handle_library, typename
from .origin import is_user_code, library_version

__all__ = ["write_global"]

_CHUNK = 1 << 24  # copy size when hashing a non-contiguous array
_pack_q = struct.Struct("<q").pack
_pack_d = struct.Struct("<d").pack
_pack_Q = struct.Struct("<Q").pack
_VECTOR_MIN = 256  # an object column at least this long: from arrow buffers if it can
_STR_OR_NONE = frozenset({str, type(None)})


# -- scalars ---------------------------------------------------------------------
def _none(h: Hasher, obj: None) -> None:
    h.buf += b"N"


def _bool(h: Hasher, obj: bool) -> None:
    h.buf += b"T" if obj else b"F"


def _int(h: Hasher, obj: int) -> None:
    if -(1 << 63) <= obj < (1 << 63):
        h.buf += b"i" + _pack_q(obj)
    else:
        data = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
        h.buf += b"I" + _pack_Q(len(data)) + data


def _float(h: Hasher, obj: float) -> None:
    h.buf += b"f" + _pack_d(obj)


def _complex(h: Hasher, obj: complex) -> None:
    h.buf += b"c" + _pack_d(obj.real) + _pack_d(obj.imag)


def _str(h: Hasher, obj: str) -> None:
    h.buf += b"s"
    h.text(obj)


def _bytes(h: Hasher, obj: bytes) -> None:
    h.buf += b"b"
    h.raw(obj)


def _bytearray(h: Hasher, obj: bytearray) -> None:
    h.buf += b"y"
    h.raw(obj)


def _memoryview(h: Hasher, obj: memoryview) -> None:
    h.buf += b"m"
    h.text(obj.format)
    h.buf += _pack_Q(obj.ndim) + b"".join(_pack_Q(n) for n in (obj.shape or ()))
    h.raw(obj if obj.c_contiguous else obj.tobytes())


def _ellipsis(h: Hasher, obj: Any) -> None:
    h.buf += b"E"


def _range(h: Hasher, r: range) -> None:
    h.buf += b"r" + _pack_q(r.start) + _pack_q(r.stop) + _pack_q(r.step)


def _path(h: Hasher, obj: pathlib.PurePath) -> None:
    h.buf += b"P"
    h.text(type(obj).__name__)
    h.text(str(obj))


def _module(h: Hasher, obj: types.ModuleType) -> None:
    h.buf += b"Mod"
    h.text(obj.__name__)


# -- containers ------------------------------------------------------------------
def _tuple(h: Hasher, obj: tuple[Any, ...]) -> None:
    # immutable: identity is not observable, so no back-references
    h.buf += b"(" + _pack_Q(len(obj))
    for item in obj:
        h.update(item)


def _list(h: Hasher, obj: list[Any]) -> None:
    if h.seen(obj):
        return
    h.buf += b"[" + _pack_Q(len(obj))
    for item in obj:
        h.update(item)


def _dict(h: Hasher, d: dict[Any, Any]) -> None:
    if h.seen(d):
        return
    h.buf += b"{" + _pack_Q(len(d))
    for k, v in h.canonical_items(d):
        h.update(k)
        h.update(v)


def _set(h: Hasher, s: set[Any] | frozenset[Any]) -> None:
    h.buf += (b"S" if type(s) is set else b"Z") + _pack_Q(len(s))
    if all(type(x) is str for x in s):
        for x in sorted(s):
            h.text(x)
        return
    for digest in sorted(h.sub_digest(x) for x in s):
        h.buf += digest


# -- numpy -----------------------------------------------------------------------
def _dtype_name(dt: np.dtype[Any]) -> str:
    # a structured dtype by its fields: "|V8" would not tell ('a', i4), ('b', i4)
    # from ('x', f4), ('y', i4)
    return str(dt) if dt.fields is not None else dt.str


def _ndarray(h: Hasher, a: np.ndarray[Any, Any]) -> None:
    dt = a.dtype
    h.buf += b"A"
    h.text(_dtype_name(dt))
    if dt.metadata:  # np.dtype(..., metadata={"unit": "m"}): a function can read it
        h.buf += b"d"
        h.update(dict(dt.metadata))
    h.buf += _pack_Q(a.ndim) + b"".join(_pack_Q(n) for n in a.shape)
    if dt.hasobject:
        h.buf += b"O"
        for item in a.flat:
            h.update(item)
        return
    if a.flags.c_contiguous:
        h.buf += b"C"
        h.raw(a.reshape(-1).view(np.uint8))
    elif a.flags.f_contiguous:
        h.buf += b"F"
        h.raw(a.T.reshape(-1).view(np.uint8))
    else:
        # the same stream as its C-contiguous copy, without making that copy
        h.buf += b"C"
        rows = max(1, _CHUNK // max(1, a[:1].nbytes))
        chunks = (
            memoryview(np.ascontiguousarray(a[i : i + rows]).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
            for i in range(0, a.shape[0], rows)
        )
        h.raw_chunks(chunks, a.nbytes)


def _ndarray_subclass(h: Hasher, obj: np.ndarray[Any, Any]) -> None:
    if isinstance(obj, np.memmap):
        ref = obj.__dict__.get(REF_ATTR)
        if ref is not None and not obj.flags.writeable and map_holds(obj):
            # a cached result mapped read-only, its file as checked (entry.marks): its
            # entry names its contents; dtype, shape, strides are read now (settable)
            h.buf += b"R"
            h.text(ref)
            h.text(obj.dtype.str)
            h.buf += b"".join(_pack_q(n) for n in (*obj.shape, *obj.strides))
            return
        _ndarray(h, obj.view(np.ndarray))
        return
    # a subclass: its type, what its instances carry (astropy-like units, metadata
    # in __dict__ or slots) and its buffer, never pickled
    h.buf += b"X"
    h.text(typename(obj))
    attrs, slots = _instance_state(obj)
    if isinstance(obj, np.ma.MaskedArray):
        # the mask, the fill value and the hard-mask flag change what the array
        # does; the other bookkeeping (_sharedmask, _optinfo, ...) does not
        attrs = attrs or {}
        h.buf += b"m"
        h.update(attrs.get("_mask"))
        fill = attrs.get("_fill_value")  # None until read: then the dtype's default
        h.update(np.ma.default_fill_value(obj) if fill is None else fill)
        h.buf += b"T" if attrs.get("_hardmask") else b"F"
        h.update(attrs.get("_baseclass"))
        attrs = {k: v for k, v in attrs.items() if k not in _MASKED_INTERNALS}
    h.update(attrs or None)
    if slots:
        h.update(slots)
    _ndarray(h, obj.view(np.ndarray))


_MASKED_INTERNALS = frozenset(
    {"_mask", "_fill_value", "_hardmask", "_sharedmask", "_isfield", "_baseclass"}
    | {"_optinfo", "_basedict"}
)


def _np_scalar(h: Hasher, obj: np.generic) -> None:
    if obj.dtype.hasobject:
        h.buf += b"o"
        h.update(obj.item())
        return
    dt = obj.dtype
    h.buf += b"n"
    h.text(_dtype_name(dt))  # a record (np.void) of a structured array: its fields
    if dt.metadata:
        h.buf += b"d"
        h.update(dict(dt.metadata))
    h.raw(np.asarray(obj).tobytes())


def _dtype(h: Hasher, obj: np.dtype[Any]) -> None:
    h.buf += b"d"
    h.text(_dtype_name(obj))
    if obj.metadata:
        h.buf += b"d"
        h.update(dict(obj.metadata))


def _ufunc(h: Hasher, obj: np.ufunc) -> None:
    h.buf += b"U"
    h.text(obj.__name__)
    h.text(library_version("numpy"))


# -- what instances carry ----------------------------------------------------------
_NO_SLOTS: tuple[str, ...] = ()
_SLOTS_BY_TYPE: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _slot_names(t: type) -> tuple[str, ...]:
    """The names of the slots of ``t``'s instances (private names mangled)."""
    found = _SLOTS_BY_TYPE.get(t)
    if found is None:
        names = []
        for klass in t.__mro__:
            slots = vars(klass).get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name in ("__dict__", "__weakref__"):
                    continue
                if name.startswith("__") and not name.endswith("__"):
                    name = f"_{klass.__name__.lstrip('_')}{name}"
                names.append(name)
        found = tuple(sorted(set(names))) or _NO_SLOTS
        _SLOTS_BY_TYPE[t] = found
    return found


def _instance_state(obj: Any) -> tuple[dict[str, Any] | None, list[tuple[str, Any]]]:
    """An instance's ``__dict__`` (or None) and its slots' ``(name, value)``, read
    without running its ``__getattr__`` or ``__getattribute__``; an unset slot's
    value is a marker that hashes as such."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attrs = None
    slots = []
    for name in _slot_names(type(obj)):
        try:
            slots.append((name, object.__getattribute__(obj, name)))
        except AttributeError:  # an unset slot
            slots.append((name, _UNSET_SLOT))
    return attrs, slots


class _UnsetSlot:
    """Stands for an unset slot in the stream."""


_UNSET_SLOT = _UnsetSlot()


def _unset_slot(h: Hasher, obj: _UnsetSlot) -> None:
    # the stream of the global reference it was when it lived in mlcache.keys.hashing
    # (pickled by name): fixed by HASH_SCHEME 5
    h.buf += b"g"
    h.text("mlcache.keys.hashing")
    h.text("_UNSET_SLOT")


# -- pandas ----------------------------------------------------------------------
def _pandas(h: Hasher, obj: Any) -> None:
    """A type defined in pandas: frames, series and indexes from their buffers;
    anything else of pandas' (a Timestamp, an offset) through ``__reduce_ex__``.
    A user's subclass of a frame is not pandas': it is hashed as pickle sees it."""
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        h.buf += b"pD"
        h.update(obj.columns)
        h.update(obj.index)
        h.buf += _pack_Q(obj.shape[1])
        for _, column in obj.items():  # items(): much cheaper than iloc[:, i]
            _pandas_values(h, column)
        h.update(dict(obj.attrs))
        h.buf += b"T" if obj.flags.allows_duplicate_labels else b"F"
    elif isinstance(obj, pd.Series):
        h.buf += b"pS"
        h.update(obj.name)
        h.update(obj.index)
        _pandas_values(h, obj)
        h.update(dict(obj.attrs))
        h.buf += b"T" if obj.flags.allows_duplicate_labels else b"F"
    elif isinstance(obj, pd.Index):
        _pandas_index(h, obj, pd)
    else:
        h.reduce(obj)


def _pandas_index(h: Hasher, obj: Any, pd: Any) -> None:
    h.buf += b"pI"
    h.text(typename(obj))
    if isinstance(obj, pd.MultiIndex):
        # levels and codes: what .levels shows (unused levels too), without
        # building a tuple per row
        h.update(list(obj.names))
        h.buf += _pack_Q(obj.nlevels)
        for level, codes in zip(obj.levels, obj.codes):
            h.update(level)
            h.update(np.asarray(codes))
        return
    h.update(obj.name)
    if isinstance(obj, pd.RangeIndex):  # its start, stop and step are what it is
        h.buf += b"r" + _pack_q(obj.start) + _pack_q(obj.stop) + _pack_q(obj.step)
        return
    if isinstance(obj, (pd.DatetimeIndex, pd.TimedeltaIndex)):
        h.buf += b"q"  # .freq: a function can read it (asfreq, shift, resample)
        h.update(obj.freq)
    _pandas_values(h, obj)


def _pandas_values(h: Hasher, obj: Any) -> None:
    """The values of a series or an index, from their buffers for every kind pandas
    has: the dtype's repr (categories, zone, unit, storage), then a tag and the
    kind's buffers; an unknown extension array element by element."""
    import pandas as pd
    from pandas.core.dtypes.dtypes import BaseMaskedDtype  # Int64, Float64, boolean

    dtype = obj.dtype
    h.text(repr(dtype))
    if isinstance(dtype, np.dtype):
        values = np.asarray(obj.to_numpy())
        if dtype.kind == "O":
            _pandas_objects(h, values)
        else:
            h.update(values)
        return
    arr = obj.array
    if isinstance(dtype, pd.CategoricalDtype):
        h.update(dtype.categories)
        h.update(np.asarray(arr.codes))  # codes, not an object array of values
    elif isinstance(dtype, pd.DatetimeTZDtype):
        h.buf += b"z"  # the zone's type too: two zones of one name can differ
        h.text(typename(dtype.tz))
        h.text(str(dtype.tz))
        h.update(np.asarray(arr.asi8))  # int64 UTC instants, NaT as its own int
    elif isinstance(dtype, pd.PeriodDtype):
        h.buf += b"p"
        h.update(dtype.freq)
        h.update(np.asarray(arr.asi8))
    elif isinstance(dtype, pd.IntervalDtype):
        h.buf += b"v"
        h.text(str(arr.closed))
        _pandas_values(h, arr.left)
        _pandas_values(h, arr.right)
    elif isinstance(dtype, BaseMaskedDtype):
        # data and mask: a value under the mask does not count (it is zeroed)
        nd = dtype.numpy_dtype
        h.buf += b"k"
        h.update(np.asarray(arr.isna()))
        h.update(np.asarray(arr.fillna(np.zeros(1, nd)[0]).to_numpy(dtype=nd)))
    elif isinstance(dtype, pd.SparseDtype):  # its length, stored positions and values
        h.buf += b"s" + _pack_Q(len(arr))
        h.update(np.asarray(arr.sp_index.to_int_index().indices))
        h.update(np.asarray(arr.sp_values))
    elif isinstance(dtype, (pd.StringDtype, pd.ArrowDtype)) and _arrow(h, arr):
        pass
    else:  # element by element: NA, NaT and nan as themselves
        h.buf += b"e"
        h.update(np.asarray(arr.to_numpy(dtype=object)))


def _pandas_objects(h: Hasher, values: np.ndarray[Any, Any]) -> None:
    """An object column: a long one of only ``str`` (and None) from arrow buffers,
    anything else element by element (as an object ndarray)."""
    if len(values) >= _VECTOR_MIN and set(map(type, values)) <= _STR_OR_NONE:
        import pyarrow as pa

        try:
            strings = pa.array(values, type=pa.large_string(), from_pandas=False)
        except (pa.ArrowException, UnicodeError, TypeError, ValueError):
            pass  # lone surrogates: element by element
        else:
            h.buf += b"o"
            _arrow(h, strings)
            return
    h.update(values)


def _arrow(h: Hasher, data: Any) -> bool:
    """Write an arrow array (or pandas' array of one) of strings, binary or a
    fixed-width type from its buffers, whatever its chunks and slicing: its null
    mask, then its values with zeros ("" for strings) under the mask; any other
    type (lists, structs, ...) as its IPC stream. False, writing nothing, if it
    has no arrow form."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(data, (pa.Array, pa.ChunkedArray)):
        try:
            data = data.__arrow_array__()
        except (ValueError, TypeError):  # lone surrogates in a python-backed string
            return False
    if isinstance(data, pa.Array):
        data = pa.chunked_array([data], type=data.type)
    t, n, types = data.type, len(data), pa.types
    if types.is_string(t) or types.is_large_string(t) or types.is_string_view(t):
        wide, empty = pa.large_string(), pa.scalar("", pa.large_string())
    elif types.is_binary(t) or types.is_large_binary(t) or types.is_binary_view(t):
        wide, empty = pa.large_binary(), pa.scalar(b"", pa.large_binary())
    elif any(f(t) for f in (types.is_integer, types.is_floating, types.is_temporal)) or any(
        f(t) for f in (types.is_decimal, types.is_fixed_size_binary, types.is_boolean)
    ):
        h.buf += b"w" + _pack_Q(n) + _pack_Q(data.null_count)
        if n:
            flat = data.combine_chunks()
            bits, o = np.frombuffer(flat.buffers()[1], np.uint8), flat.offset
            values: np.ndarray[Any, Any]
            if types.is_boolean(t):  # bits: as bools
                values = np.unpackbits(bits, bitorder="little")[o : o + n].view(np.bool_)
            else:
                w = t.bit_width // 8  # as unsigned ints of its width, or bytes
                values = bits[o * w : (o + n) * w]
                values = values.view(f"<u{w}") if w in (2, 4, 8) else values.reshape(n, w)
            if data.null_count:  # the validity bitmap (a fixed width type has one)
                valid = np.frombuffer(flat.buffers()[0], np.uint8)
                valid = np.unpackbits(valid, bitorder="little")[o : o + n].view(np.bool_)
                h.update(~valid)
                if values.dtype == np.bool_:
                    values = values & valid
                else:  # zeros under the nulls
                    values = values * (valid if values.ndim == 1 else valid[:, None])
            h.update(values)
        return True
    else:  # lists, structs, ...: the IPC stream of one batch of it (its type too)
        sink = pa.BufferOutputStream()
        batch = pa.record_batch([data.combine_chunks()], names=["v"])
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        h.buf += b"i"
        h.raw(sink.getvalue())
        return True
    data = data.cast(wide)
    h.buf += b"a" + _pack_Q(n) + _pack_Q(data.null_count)
    if data.null_count:  # the mask, then the values with "" under it
        h.update(np.asarray(data.is_null().to_numpy()))
        data = pc.fill_null(data, empty)
    if n == 0:
        return True
    flat = data.combine_chunks()
    bufs = flat.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[flat.offset : flat.offset + n + 1]
    start, stop = int(offsets[0]), int(offsets[-1])
    h.update(offsets - offsets[0] if start else offsets)
    h.raw(memoryview(bufs[2])[start:stop] if bufs[2] is not None else b"")
    return True


# -- torch -----------------------------------------------------------------------
def _torch(h: Hasher, obj: Any) -> None:
    """A tensor (also a user's subclass) from its buffer, never pickled; anything
    else of torch's (a dtype, a module) through ``__reduce_ex__``."""
    import torch

    if not issubclass(type(obj), torch.Tensor):
        h.reduce(obj)
        return
    t = obj.detach()
    h.buf += b"t"
    h.text(typename(obj))
    h.text(str(t.dtype))
    h.text(t.device.type)
    h.buf += b"1" if obj.requires_grad else b"0"
    if t.is_nested:  # a nested tensor is its components (its shape is not a tuple of ints)
        parts = t.unbind()
        h.buf += b"J"
        h.text(str(t.layout))
        h.buf += _pack_Q(len(parts))
        for part in parts:
            _torch(h, part)
        return
    attrs, slots = _instance_state(obj)  # attributes set on it: a function can read them
    h.update(attrs or None)
    if slots:
        h.update(slots)
    h.buf += _pack_Q(t.dim()) + b"".join(_pack_Q(n) for n in t.shape)
    if t.is_meta:  # no data: what it is, as a function sees it
        h.buf += b"m" + b"".join(_pack_q(n) for n in (*t.stride(), t.storage_offset()))
        return
    if t.layout != torch.strided:
        h.reduce(t.cpu())
        return
    t = t.cpu().resolve_conj().resolve_neg().contiguous()
    h.raw(t.reshape(-1).view(torch.uint8).numpy())


# -- callables without code of the user's --------------------------------------------
def write_global(h: Hasher, obj: Any) -> bool:
    """Write a function or class by name: ``G``, its module and qualified name and,
    for a library's, the library's version. Returns whether it is the user's
    (whose code then counts too: see :mod:`mlcache.keys.code_version`)."""
    module = str(getattr(obj, "__module__", None) or "")
    module = "__main__" if module == "__mp_main__" else module  # as a spawned worker runs it
    qualname = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", ""))
    h.buf += b"G"
    h.text(module)
    h.text(qualname)
    if is_user_code(module):
        return True
    if module != "builtins":  # a library's class or function: by its version
        h.buf += b"v"
        h.text(library_version(module))
    return False


def _builtin(h: Hasher, obj: types.BuiltinFunctionType) -> None:
    bound = obj.__self__
    if bound is not None and not isinstance(bound, types.ModuleType):
        # a bound builtin method ([].append, "x".upper): its object counts
        h.buf += b"B"
        h.update(bound)
        h.text(obj.__name__)
        return
    write_global(h, obj)


def _method(h: Hasher, obj: types.MethodType) -> None:
    h.buf += b"M"
    h.update(obj.__self__)
    h.update(obj.__func__)


_EXACT_TYPES: dict[type, Handler] = {
    type(None): _none,
    bool: _bool,
    int: _int,
    float: _float,
    complex: _complex,
    str: _str,
    bytes: _bytes,
    bytearray: _bytearray,
    memoryview: _memoryview,
    tuple: _tuple,
    list: _list,
    dict: _dict,
    set: _set,
    frozenset: _set,
    np.ndarray: _ndarray,
    types.BuiltinFunctionType: _builtin,
    types.ModuleType: _module,
    type(Ellipsis): _ellipsis,
    range: _range,
    pathlib.PurePath: _path,
    pathlib.PurePosixPath: _path,
    pathlib.PureWindowsPath: _path,
    pathlib.Path: _path,
    pathlib.PosixPath: _path,
    pathlib.WindowsPath: _path,
}
for _cls, _handler in _EXACT_TYPES.items():  # scalars: a few bytes, nothing else read
    handle_exact(_cls, _handler, scalar=_cls in (type(None), bool, int, float, str))
handle_family(np.generic, _np_scalar)
handle_family(np.ndarray, _ndarray_subclass)  # np.memmap, np.matrix, masked, users'
handle_family(np.dtype, _dtype)
handle_family(np.ufunc, _ufunc)
handle_family(_UnsetSlot, _unset_slot)
handle_library("torch", _torch, base="Tensor")
handle_library("pandas", _pandas)
handle_family(types.MethodType, _method, callable_kind=True)
del _cls, _handler
