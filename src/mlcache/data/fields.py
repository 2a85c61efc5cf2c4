"""What a field of a pack being built holds so far: its kind, dtype, and bytes.

:class:`FieldWriter` applies the rules of :mod:`mlcache.data.writer` (numbers
promote as numpy does, None is missing, a NaN is a number or missing, a value
that does not fit fails at once) to one field, value by value or a column at a
time, and writes the bytes to a spill (see ``writer._Spill``), from which
:meth:`FieldWriter.data` gives them back in the field's final dtype.
"""

from __future__ import annotations

import pickle
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import UnsupportedValue
from .values import (
    EMPTY,
    Strs,
    exact_limit,
    is_na,
    is_nan,
    is_tensor,
    kind_name,
    list_value,
    magnitude,
    may_exceed,
    merged_py,
    names_differ,
    tensor_array,
)

__all__ = ["FieldWriter", "Spill"]

_COPY = 1 << 20  # bytes converted at a time
_FLUSH = 4096  # scalars buffered per field before they go to the spill
_PY_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype("<i8"), float: np.dtype("<f8")}
_PY_NAMES = {"b": "bool", "i": "int", "f": "float"}
_NUMERIC = "biufcmM"  # the dtype kinds a pack stores (and its reader accepts)
_NONE = type(None)
_INT64 = (-(1 << 63), 1 << 63)
_PLAIN = frozenset((bool, int, float, str, bytes, np.ndarray, list, dict))


class _Drain(Protocol):
    def read(self, n: int) -> bytes: ...
    def close(self) -> None: ...


class Spill(Protocol):
    """Where a field's bytes go while the samples arrive (appended), read back
    (ranges, while building) and drained once (in order) into the pack."""

    size: int  # bytes written so far

    def write(self, data: Any) -> None: ...
    def read(self, start: int, stop: int) -> Iterator[bytes]: ...
    def drain(self) -> _Drain: ...
    def close(self) -> None: ...
    def sibling(self, suffix: str) -> Spill: ...  # another spill, for a sub-field


class FieldWriter:
    """What one field's values look like so far, and where their bytes went.

    ``kind`` is ``"none"`` until the first value, then ``"column"`` (numbers and
    numeric arrays, lists of numbers too; ``fixed`` while every array has one
    shape, then written as ``ragged``), ``"str"``, ``"bytes"``, ``"strs"`` (lists
    of str: ``offsets`` count strings, ``ends`` are their byte ends), ``"dict"``
    (dicts: one sub-field in ``children`` per key, ``label`` naming it
    ``"meta.age"`` in messages), ``"tensor"`` (torch tensors: their elements in
    the array sub-field ``values``; ``view`` the torch dtype they are the bits
    of, when numpy has none) or ``"pickle"``. ``py`` is a Python
    type name (``"int"``...) for a field of Python numbers, ``"scalar"`` for
    numpy scalars, None for arrays. ``segments`` lists where in the spill the
    dtype changed (promotion): (byte offset, dtype of the bytes from there).
    ``offsets`` count items of the final dtype (bytes for text), so a promotion
    leaves them right. A sample without a value (None, or a NaN outside a number
    field) clears its byte in ``valid`` and holds a placeholder.
    """

    def __init__(self, name: str, spill: Spill, allow_pickle: bool, label: str = "") -> None:
        self.name = name
        self.label = label or name
        self.spill = spill
        self.allow_pickle = allow_pickle
        self.kind, self.dtype = "none", np.dtype(np.uint8)
        self.py: str | None = None
        self.shape: tuple[int, ...] = ()
        self.fixed = False
        self.first = 0  # the sample that set the kind
        self.count = 0
        self.valid: bytearray | None = None
        self.offsets = array("q", [0])
        self.shapes = array("q")
        self.segments: list[tuple[int, np.dtype]] = []
        self.buf: list[Any] = []  # a scalar column's values not yet in the spill
        # NaNs met before the kind is known: values if it is numbers, else missing
        self.nans = array("q")
        self.nan_dtype: np.dtype | None = None
        self.nan_py: str | None = None
        self.ends = array("q", [0])  # a strs field: the byte end of every string
        self.children: dict[str, FieldWriter] = {}  # a dict field: one per key
        self.empties = array("q")  # empty lists met before the kind is known
        self.view: str | None = None  # a tensor field: the torch dtype of its bits

    # -- one value ---------------------------------------------------------------------
    def _describe(
        self, value: Any, index: int
    ) -> tuple[str, str | None, np.dtype, tuple[int, ...]]:
        t = type(value)
        if t in _PY_DTYPES:
            if t is int and not _INT64[0] <= value < _INT64[1]:
                raise ValueError(
                    f"sample {index}, field {self.label!r}: {value} does not fit in int64"
                )
            return "column", t.__name__, _PY_DTYPES[t], ()
        if t is str or t is np.str_:
            return "str", None, np.dtype(np.uint8), ()
        if t is bytes or t is np.bytes_:
            return "bytes", None, np.dtype(np.uint8), ()
        if t is Strs:
            return "strs", None, np.dtype(np.uint8), ()
        if t is np.ndarray or isinstance(value, np.generic):
            dtype = value.dtype
            if dtype.kind in _NUMERIC and dtype.fields is None:
                if isinstance(value, np.generic):
                    return "column", "scalar", dtype, ()
                return "column", None, dtype, value.shape
            if self.allow_pickle:
                return "pickle", None, np.dtype(np.uint8), ()
            what = "an array" if t is np.ndarray else "a numpy scalar"
            text = (
                " (fixed-width text: pass str values, arr.tolist())" if dtype.kind in "US" else ""
            )
            raise UnsupportedValue(
                f"sample {index}, field {self.label!r}: {what} of {dtype.str}{text} cannot be "
                "stored in a pack, which holds arrays of numbers and dates only (pass "
                "allow_pickle=True to pickle it)"
            )
        if self.allow_pickle:
            return "pickle", None, np.dtype(np.uint8), ()
        what = f"{t.__module__}.{t.__qualname__}"
        raise UnsupportedValue(
            f"sample {index}, field {self.label!r}: a value of type {what} needs pickle; "
            "packs store numpy arrays, int, float, bool, str, bytes, None, lists of numbers "
            "or of str, and dicts of these (pass allow_pickle=True to store other values)"
        )

    def add(self, value: Any, index: int) -> None:
        """Add sample ``index``'s value; raise at once if it does not fit."""
        if value is None or (type(value) not in _PLAIN and is_na(value)):
            self._missing(1)
            return
        if type(value) is dict and not self.allow_pickle:
            self._add_dict(value, index)
            return
        if not self.allow_pickle and is_tensor(value):
            self._add_tensor(value, index)
            return
        if type(value) is list and not self.allow_pickle:
            value = list_value(value, self.label, index)
            if value is EMPTY and not self._empty_fits(index):
                self.empties.append(index)  # an empty what, once the kind is known
                self._missing(1)
                return
            if value is EMPTY and self.kind == "column":
                value = np.empty((0, *self.shape[1:]), self.dtype)
        if self.kind != "column" and is_nan(value):
            if self.kind == "none":
                self._pending_nan(value, index)
            else:  # a NaN in a text, bytes or pickle field: missing (a CSV's empty cell)
                self._missing(1)
            return
        kind, py, dtype, shape = self._describe(value, index)
        if self.kind == "none":
            self._start(kind, py, dtype, shape, index)
        elif kind != self.kind or (py is None) != (self.py is None):
            if is_nan(value):  # a NaN in an array field: missing
                self._missing(1)
                return
            raise TypeError(
                f"sample {index}, field {self.label!r}: {kind_name(kind, py, dtype)} where sample "
                f"{self.first} has {kind_name(self.kind, self.py, self.dtype)}"
            )
        elif kind == "column":
            self._merge(py, dtype, index)
        if kind == "column" and self.dtype.kind in "fc" and dtype.kind in "iu":
            self._check_exact(value, dtype, index)
        if kind == "column" and py is not None:
            self.buf.append(value)
            if len(self.buf) >= _FLUSH:
                self._flush()
        elif kind == "column":
            self._add_array(value, shape, index)
        elif kind == "strs":
            self._add_strs(value)
        else:
            if kind == "str":
                data = str(value).encode("utf-8", "surrogatepass")
            elif kind == "bytes":
                data = bytes(value)
            else:
                data = pickle.dumps(value, protocol=5)
            self.spill.write(data)
            self.offsets.append(self.offsets[-1] + len(data))
        if self.valid is not None:
            self.valid.append(1)
        self.count += 1

    def _add_strs(self, value: list[str]) -> None:
        data = [s.encode("utf-8", "surrogatepass") for s in value]
        self.spill.write(b"".join(data))
        end = self.ends[-1]
        for piece in data:
            end += len(piece)
            self.ends.append(end)
        self.offsets.append(self.offsets[-1] + len(data))

    def _empty_fits(self, index: int) -> bool:
        """An empty list fits the field (an array field with a first axis, or a strs
        field); False while its kind is not known; raise if it does not fit."""
        if self.kind == "strs" or (self.kind == "column" and self.py is None and self.shape):
            return True
        if self.kind == "none":
            return False
        raise TypeError(
            f"sample {index}, field {self.label!r}: an empty list where sample "
            f"{self.first} has {kind_name(self.kind, self.py, self.dtype)}"
        )

    def _add_dict(self, value: dict[Any, Any], index: int) -> None:
        """A dict: each key's value goes to its sub-field (the keys of the first)."""
        if self.kind == "none":
            self._start_dict(value, index)
        elif self.kind != "dict":
            raise TypeError(
                f"sample {index}, field {self.label!r}: a dict where sample {self.first} "
                f"has {kind_name(self.kind, self.py, self.dtype)}"
            )
        elif value.keys() != self.children.keys():
            differ = names_differ(self.children, value, "key", f"sample {self.first}")
            raise ValueError(
                f"sample {index}, field {self.label!r}: keys differ from sample "
                f"{self.first}: {differ}"
            )
        for key, child in self.children.items():
            child.add(value[key], index)
        if self.valid is not None:
            self.valid.append(1)
        self.count += 1

    def _start_dict(self, value: dict[Any, Any], index: int) -> None:
        for key in value:
            if type(key) is not str:
                raise TypeError(
                    f"sample {index}, field {self.label!r}: the keys of a dict must be str "
                    f"to be stored without pickle, got {key!r}"
                )
        self._start_children("dict", list(value), index)

    def _start_children(self, kind: str, keys: list[str], index: int) -> None:
        """The field becomes a ``dict`` (or ``tensor``) of sub-fields ``keys``."""
        if self.empties:
            raise TypeError(
                f"sample {index}, field {self.label!r}: {kind_name(kind, None, self.dtype)} "
                f"where sample {self.empties[0]} has an empty list"
            )
        for k, key in enumerate(keys):
            label = f"{self.label}.{key}" if kind == "dict" else self.label
            child = FieldWriter(key, self.spill.sibling(str(k)), self.allow_pickle, label)
            child._missing(self.count)  # the samples before: None
            self.children[key] = child
        self.kind, self.first = kind, index

    def _add_tensor(self, value: Any, index: int) -> None:
        """A tensor: its elements go to the sub-field ``values`` (an array field)."""
        arr, view = tensor_array(value, self.label, index)
        if self.kind == "none":
            self._start_children("tensor", ["values"], index)
            self.view = view
        elif self.kind != "tensor" or view != self.view:
            had = f"tensors of {self.view}" if self.kind == "tensor" else None
            raise TypeError(
                f"sample {index}, field {self.label!r}: a tensor of {view or arr.dtype} where "
                f"sample {self.first} has {had or kind_name(self.kind, self.py, self.dtype)}"
            )
        self.children["values"].add(arr, index)
        if self.valid is not None:
            self.valid.append(1)
        self.count += 1

    def _add_array(self, value: np.ndarray, shape: tuple[int, ...], index: int) -> None:
        if len(shape) != len(self.shape):
            raise ValueError(
                f"sample {index}, field {self.label!r}: {len(shape)} dimensions where "
                f"earlier samples have {len(self.shape)}"
            )
        if self.fixed and shape != self.shape:
            self.fixed = False
            self.shapes.extend(self.shape * (len(self.offsets) - 1))
        flat = np.ascontiguousarray(value, dtype=self.dtype).reshape(-1)
        self.spill.write(flat.view(np.uint8))
        self.offsets.append(self.offsets[-1] + flat.size)
        if not self.fixed:
            self.shapes.extend(shape)

    def _start(
        self, kind: str, py: str | None, dtype: np.dtype, shape: tuple[int, ...], index: int
    ) -> None:
        """The first value sets the kind; NaNs before it become values of a number
        field and stay missing in any other."""
        nans = self.nans if kind == "column" and py is not None else array("q")
        if nans and self.nan_dtype is not None:
            try:
                dtype = np.result_type(dtype, self.nan_dtype)
                py = merged_py(self.nan_py, py, dtype)
            except TypeError:  # numbers that do not mix with floats (dates): missing
                nans = array("q")
        empties = self.empties
        if empties and not (kind == "strs" or (kind == "column" and py is None and shape)):
            raise TypeError(
                f"sample {index}, field {self.label!r}: {kind_name(kind, py, dtype)} where "
                f"sample {empties[0]} has an empty list"
            )
        self.kind, self.py, self.dtype, self.shape = kind, py, dtype, shape
        self.first = min(nans[0] if nans else index, empties[0] if empties else index)
        self.fixed = kind == "column" and not empties  # empty lists: ragged
        self.segments = [(0, dtype)]
        if kind == "column" and py is not None:
            prefix = np.zeros(self.count, dtype)
            if nans:
                assert self.valid is not None
                where = np.frombuffer(nans, dtype=np.int64)
                prefix[where] = np.nan
                marks = np.frombuffer(self.valid, dtype=np.uint8)
                marks[where] = 1
                del marks  # a live view would keep the bytearray from growing
            self.spill.write(prefix.view(np.uint8))
        else:
            self._placeholders(self.count)
        if empties:  # values, not missing
            assert self.valid is not None
            for i in empties:
                self.valid[i] = 1
        self.nans, self.empties = array("q"), array("q")

    def _pending_nan(self, value: Any, index: int) -> None:
        dtype = np.dtype("<f8") if type(value) is float else value.dtype
        py = "float" if type(value) is float else "scalar"
        if self.nan_dtype is None:
            self.nan_dtype, self.nan_py = dtype, py
        else:
            self.nan_dtype = np.result_type(self.nan_dtype, dtype)
            self.nan_py = merged_py(self.nan_py, py, self.nan_dtype)
        self.nans.append(index)
        self._missing(1)

    def _merge(self, py: str | None, dtype: np.dtype, index: int) -> None:
        """Promote the field to hold a value of ``dtype`` (Python type name ``py``)."""
        new = self.dtype
        if dtype != self.dtype:
            try:
                new = np.result_type(self.dtype, dtype)
            except TypeError:
                raise TypeError(
                    f"sample {index}, field {self.label!r}: {kind_name('column', py, dtype)} where "
                    f"sample {self.first} has {kind_name('column', self.py, self.dtype)}, "
                    "and they have no common dtype"
                ) from None
        if new != self.dtype:
            limit = exact_limit(new)
            if limit is not None:
                self._check_written(limit, new, py, dtype, index)
            self._flush()
            self.segments.append((self.spill.size, new))
            self.dtype = new
        self.py = merged_py(self.py, py, new)

    def _check_written(
        self, limit: int, new: np.dtype, py: str | None, dtype: np.dtype, index: int
    ) -> None:
        """The integers written so far stay exact in the float dtype ``new``."""
        for start, stop, seg in self._segment_spans():
            if not may_exceed(seg, limit):
                continue
            pieces = self.spill.read(start, stop)
            big = max((magnitude(np.frombuffer(p, seg)) for p in pieces), default=0)
            if self.buf and seg == self.dtype:
                big = max(big, magnitude(np.asarray(self.buf, dtype=seg)))
            if big > limit:
                raise ValueError(
                    f"sample {index}, field {self.label!r}: {kind_name('column', py, dtype)} "
                    f"makes the field {new}, which cannot hold the integer {big} of an "
                    f"earlier sample exactly (beyond 2**{limit.bit_length() - 1}); "
                    "cast the field yourself if rounding is what you want"
                )

    def _check_exact(self, value: Any, dtype: np.dtype, index: int) -> None:
        """An integer value going into a float field must be exact there."""
        limit = exact_limit(self.dtype)
        if limit is None or not may_exceed(dtype, limit):
            return
        big = abs(int(value)) if np.ndim(value) == 0 else magnitude(np.asarray(value))
        if big > limit:
            raise ValueError(
                f"sample {index}, field {self.label!r}: the integer {big} cannot be held "
                f"exactly by the field's {self.dtype} (beyond 2**{limit.bit_length() - 1}); "
                "cast the field yourself if rounding is what you want"
            )

    def _segment_spans(self) -> Iterator[tuple[int, int, np.dtype]]:
        ends = [start for start, _ in self.segments[1:]] + [self.spill.size]
        for (start, dtype), stop in zip(self.segments, ends):
            yield start, stop, dtype

    def _flush(self) -> None:
        if self.buf:
            self.spill.write(np.array(self.buf, dtype=self.dtype).view(np.uint8))
            self.buf.clear()

    def _missing(self, k: int) -> None:
        if self.valid is None:
            self.valid = bytearray(b"\x01") * self.count
        self.valid.extend(bytes(k))
        if self.kind != "none":
            self._placeholders(k)
        self.count += k

    def _placeholders(self, k: int) -> None:
        """Stand-ins for ``k`` samples without a value: zeros in a column of fixed
        shape, empty values otherwise."""
        if not k:
            return
        if self.kind in ("dict", "tensor"):
            for child in self.children.values():
                child._missing(k)
            return
        if self.kind == "column" and self.py is not None:
            self.buf.extend([0] * k)
            if len(self.buf) >= _FLUSH:
                self._flush()
            return
        size = 0
        if self.fixed:
            size = int(np.prod(self.shape, dtype=np.int64))
            row = size * self.dtype.itemsize
            per = max(1, (1 << 20) // max(row, 1))  # rows per write: ~1 MiB at a time
            zeros = bytes(row * min(k, per))
            for left in range(k, 0, -per):
                self.spill.write(zeros[: row * min(left, per)])
        elif self.kind == "column":  # empty along the first axis, like the others after
            self.shapes.extend((0, *self.shape[1:]) * k)
        end = self.offsets[-1]
        self.offsets.extend(range(end + size, end + size * k + 1, size) if size else [end] * k)

    # -- a batch of values (a column source) -------------------------------------------
    def add_batch(self, values: Sequence[Any], start: int) -> None:
        """Add samples ``start, start + 1, ...``: whole columns of Python numbers, text
        or bytes at once once the field's kind is set (by its first value); anything
        else, and a batch that does not fit, value by value, which applies the same
        rules and names the sample at fault."""
        first = 0
        while self.kind == "none" and first < len(values):
            self.add(values[first], start + first)
            first += 1
        if first:
            values, start = values[first:], start + first
        if not values:
            return
        types = set(map(type, values))
        none = _NONE in types
        types.discard(_NONE)
        if self.kind == "column" and self.py is not None and types and types <= _PY_DTYPES.keys():
            if self._add_numbers(values, types, none, start):
                return
        elif self.kind in ("str", "bytes") and types and self._add_text(values, types, none):
            return
        for i, value in enumerate(values):
            self.add(value, start + i)

    def _add_numbers(self, values: Sequence[Any], types: set[type], none: bool, start: int) -> bool:
        """A batch of Python numbers (and None), promoting the field if need be; False
        when it needs value by value (an int beyond int64 or beyond what the float
        field holds exactly, no common dtype)."""
        dtype = np.result_type(*(_PY_DTYPES[t] for t in types))
        try:
            target = np.result_type(self.dtype, dtype)
        except TypeError:
            return False
        limit = exact_limit(target)
        mask = [v is None for v in values] if none else None
        if mask is not None:
            values = [0 if v is None else v for v in values]
        if int in types and (len(types) > 1 or limit is not None):
            big = max(abs(v) for v in values if type(v) is int)
            if big >= _INT64[1] or (limit is not None and big > limit):
                return False
        try:
            arr = np.array(values, dtype=dtype)
        except OverflowError:  # an int beyond int64
            return False
        try:  # checks before it changes anything: value by value then names the sample
            self._merge(_PY_NAMES[dtype.kind], dtype, start)
        except (TypeError, ValueError):
            return False
        self._flush()
        self.spill.write(np.ascontiguousarray(arr, dtype=self.dtype).view(np.uint8))
        self._valid_batch(mask, len(values))
        return True

    def _add_text(self, values: Sequence[Any], types: set[type], none: bool) -> bool:
        """A batch of str or bytes (None and NaN missing); False when it needs value
        by value (a type that does not fit, a float that is not NaN)."""
        mine = str if self.kind == "str" else bytes
        mask = None
        if types != {mine} or none:
            if types - {mine, float}:
                return False
            if float in types and any(type(v) is float and v == v for v in values):
                return False
            mask = [type(v) is not mine for v in values]
            values = [v if type(v) is mine else mine() for v in values]
        data = [v.encode("utf-8", "surrogatepass") for v in values] if mine is str else values
        self.spill.write(b"".join(data))
        ends = np.cumsum(np.fromiter(map(len, data), np.int64, len(data))) + self.offsets[-1]
        self.offsets.frombytes(ends.astype("<i8").tobytes())
        self._valid_batch(mask, len(values))
        return True

    def _valid_batch(self, mask: list[bool] | None, k: int) -> None:
        if mask is not None and any(mask):
            if self.valid is None:
                self.valid = bytearray(b"\x01") * self.count
            self.valid.extend(np.logical_not(mask).astype(np.uint8).tobytes())
        elif self.valid is not None:
            self.valid.extend(b"\x01" * k)
        self.count += k

    # -- the pack ----------------------------------------------------------------------
    def finish(self) -> None:
        """The last sample is in: NaNs of a field that had nothing else become a float
        column; buffered scalars go to the spill."""
        if self.kind == "none" and self.empties:  # only empty lists: float64 arrays
            self._start("column", None, np.dtype("<f8"), (0,), self.empties[0])
        if self.kind == "none" and self.nans:
            assert self.nan_dtype is not None
            self._start("column", self.nan_py, self.nan_dtype, (), self.nans[0])
        self._flush()
        for child in self.children.values():
            child.finish()

    def tables(self) -> dict[str, np.ndarray]:
        """The field's tables besides ``data``, ``offsets``, ``shapes`` and ``valid``:
        a strs field's ``ends`` (int64, the byte end of each string, from 0)."""
        if self.kind == "strs":
            return {"ends": np.frombuffer(self.ends, dtype="<i8")}
        return {}

    def close(self) -> None:
        """Close the spill files left open (a sub-field's too)."""
        self.spill.close()
        for child in self.children.values():
            child.close()

    def data(self) -> Iterator[Any]:
        """The field's data in its final dtype, from the spill (deleted as it is read)."""
        spans = list(self._segment_spans()) or [(0, self.spill.size, self.dtype)]
        drain = self.spill.drain()
        try:
            for start, stop, dtype in spans:
                left = stop - start
                step = max(dtype.itemsize, _COPY // dtype.itemsize * dtype.itemsize)
                while left:
                    piece = drain.read(min(step, left))
                    left -= len(piece)
                    if dtype == self.dtype:
                        yield piece
                    else:
                        converted = np.frombuffer(piece, dtype).astype(self.dtype)
                        yield memoryview(converted.view(np.uint8))  # type: ignore[arg-type]
        finally:
            drain.close()
