"""What a value of a pack field is: missing (NaN, ``pandas.NA``), exact in a float
dtype, or a list a JSON or SQL source gives, as a field holds it without pickle.

With ``allow_pickle=False``, :class:`~mlcache.data.fields.FieldWriter` turns a
sample's ``list`` into one of these before it applies the rules of
:mod:`mlcache.data.writer`:

* a list of numbers (Python ``bool``, ``int``, ``float``, numpy scalars), or a
  rectangular list of such lists, becomes a numpy array, with the promotion of
  a number field (``np.result_type``, a Python int/float/bool counting as
  int64/float64/bool; never rounding an int beyond 2**53): the field is then an
  array field (``ragged`` when lengths vary) and reads back arrays;
* a list of ``str`` becomes a :class:`Strs` (a field of kind ``strs``, read back
  as a list of str);
* an empty list is :data:`EMPTY`: an empty value of whichever of the two the
  field holds (its dtype that of the field's other values).

Anything else in a list (``None``, a dict, bytes, mixed numbers and text, rows
of different lengths) raises :class:`~mlcache.UnsupportedValue` naming the
sample and the field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UnsupportedValue

__all__ = [
    "EMPTY",
    "TORCH_BITS",
    "Strs",
    "as_sealed",
    "exact_limit",
    "is_na",
    "is_nan",
    "kind_name",
    "list_value",
    "magnitude",
    "may_exceed",
    "merged_py",
    "names_differ",
    "other_fields",
    "tensor_array",
]

_PY_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype("<i8"), float: np.dtype("<f8")}
#: the types :func:`read_back` gives back as they are (and arrays but 0-d ones)
_AS_IS = frozenset((bool, int, float, str, bytes, type(None)))
_NUMERIC = "biufcmM"
_PY_NAMES = {"b": "bool", "i": "int", "f": "float"}
_PYTHON = frozenset(_PY_NAMES.values())
_INT64 = (-(1 << 63), 1 << 63)
_EXACT = 1 << 53  # the largest int magnitude float64 holds exactly


def is_nan(value: Any) -> bool:
    """A float NaN: a Python float or a numpy floating scalar."""
    t = type(value)
    return (t is float or isinstance(value, np.floating)) and value != value


def is_na(value: Any) -> bool:
    """``pandas.NA``, found without importing pandas."""
    t = type(value)
    return t.__name__ == "NAType" and t.__module__.startswith("pandas")


def exact_limit(dtype: np.dtype) -> int | None:
    """The largest integer magnitude a float or complex dtype holds exactly (None
    for other kinds)."""
    if dtype.kind in "fc":
        return 1 << (np.finfo(dtype).nmant + 1)
    return None


def may_exceed(dtype: np.dtype, limit: int) -> bool:
    """Integers of ``dtype`` may be beyond ``limit`` in magnitude."""
    if dtype.kind not in "iu":
        return False
    info = np.iinfo(dtype)
    return max(-int(info.min), int(info.max)) > limit


def magnitude(values: np.ndarray) -> int:
    """The largest magnitude in an integer array (0 when empty)."""
    if not values.size:
        return 0
    return max(-int(values.min()), int(values.max()))


class Strs(list[str]):
    """One sample's list of ``str`` (a field of kind ``strs``)."""


#: an empty list: an empty array or an empty list of str, as the field decides
EMPTY = Strs()


def list_value(value: list[Any], label: str, index: int) -> np.ndarray | Strs:
    """``value`` (sample ``index``'s list in field ``label``) as an array of numbers,
    a :class:`Strs`, or :data:`EMPTY`; raise if it is none of these."""
    if not value:
        return EMPTY
    first = type(value[0])
    if first is int or first is bool:  # the common case (token ids, flags): numpy's
        # own conversion, kept when it gives what the rules give (int64 or bool)
        try:
            arr = np.array(value)
        except (ValueError, OverflowError):
            arr = None
        if arr is not None and (arr.dtype == _PY_DTYPES[int] or arr.dtype == _PY_DTYPES[bool]):
            return arr
    types = set(map(type, value))
    if types == {str}:
        return Strs(value)
    if types <= _PY_DTYPES.keys():
        return _numbers(value, types, label, index)
    if types == {list}:  # rows: a rectangular list of lists of numbers
        try:
            rows = np.array(value, dtype=object)
        except ValueError:
            rows = None
        if rows is not None and rows.size and rows.ndim > 1:
            flat = list(rows.flat)
            inner = set(map(type, flat))
            if inner <= _PY_DTYPES.keys():
                return _numbers(flat, inner, label, index).reshape(rows.shape)
    else:  # numpy scalars or arrays: numpy's own promotion
        try:
            arr = np.array(value)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is not None and arr.dtype.kind in _NUMERIC and arr.dtype.fields is None:
            return arr
    shown = ", ".join(sorted(t.__name__ for t in types))
    raise UnsupportedValue(
        f"sample {index}, field {label!r}: a list of {shown} cannot be stored without "
        "pickle; packs store lists of numbers (as arrays, rows of one length), lists of "
        "str and dicts of these (pass allow_pickle=True to pickle it)"
    )


def _numbers(values: list[Any], types: set[type], label: str, index: int) -> np.ndarray:
    """Python numbers as one array of their promoted dtype, refusing what it would
    not hold exactly."""
    dtype = np.result_type(*(_PY_DTYPES[t] for t in types))
    if int in types:
        ints = [v for v in values if type(v) is int]
        low, high = min(ints), max(ints)
        if low < _INT64[0] or high >= _INT64[1]:
            big = high if high >= _INT64[1] else low
            raise ValueError(f"sample {index}, field {label!r}: {big} does not fit in int64")
        if dtype.kind == "f" and max(-low, high) > _EXACT:
            raise ValueError(
                f"sample {index}, field {label!r}: the integer {max(-low, high)} of a list "
                "with floats cannot be held exactly by float64 (beyond 2**53); cast the "
                "list yourself if rounding is what you want"
            )
    return np.array(values, dtype=dtype)


#: torch dtypes numpy has none for: stored as the bits of a same-size integer
TORCH_BITS = {
    "bfloat16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
}


def is_tensor(value: Any) -> bool:
    """A ``torch.Tensor`` (not a subclass), found without importing torch."""
    t = type(value)
    return t.__qualname__ == "Tensor" and t.__module__ == "torch"


def tensor_array(value: Any, label: str, index: int) -> tuple[np.ndarray, str | None]:
    """A tensor's own elements as a numpy array on the CPU, and the torch dtype they
    are the bits of (None when numpy has the tensor's dtype)."""
    import torch  # the value is a tensor: torch is imported already

    name = str(value.dtype).removeprefix("torch.")
    bits = TORCH_BITS.get(name)
    try:
        if value.layout != torch.strided or value.is_quantized:
            raise TypeError(f"its layout is {value.layout}")
        t = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
        arr = (t.view(getattr(torch, bits)) if bits else t).numpy()
    except (RuntimeError, TypeError, ValueError) as exc:
        raise UnsupportedValue(
            f"sample {index}, field {label!r}: a tensor of {name} cannot be stored in a "
            f"pack ({exc}); pass allow_pickle=True to pickle it"
        ) from None
    return arr, (name if bits else None)


def other_fields(i: int, item: Any, keys: Any, j: int, first_item: Any, names: Any) -> ValueError:
    """The error of sample ``i`` (of ``item``) whose field names ``keys`` are not
    those of sample ``j`` (``names``): every sample of a pack has the same fields."""
    return ValueError(
        f"sample {i} (item {item!r}): fields differ from sample {j} (item "
        f"{first_item!r}): {names_differ(names, keys, 'field', f'sample {j}')}; every sample of a "
        "pack has the same fields (give a missing value as None: sample.get(key))"
    )


def names_differ(first: Any, these: Any, what: str, of: str) -> str:
    """What a sample's names (``these``) lack and add to ``first``'s, only the
    parts that hold (``"it lacks the field 'b'"``, ``"it has the fields 'x', 'y',
    which sample 0 has not"``; ``of`` names the first sample): an empty
    ``missing []`` told a user nothing."""
    missing = sorted(map(str, set(first) - set(these)))
    extra = sorted(map(str, set(these) - set(first)))

    def named(names: list[str]) -> str:
        return f"{what}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"

    parts = [f"it lacks the {named(missing)}"] if missing else []
    if extra:
        parts.append(f"it has the {named(extra)}, which {of} has not")
    return "; ".join(parts) or f"its {what}s are in another order"


def merged_py(mine: str | None, other: str | None, dtype: np.dtype) -> str | None:
    """What a field of scalars reads back as once it holds both: Python numbers of
    ``dtype``'s kind if both are Python numbers, else numpy scalars (None: arrays)."""
    if mine is None or other is None:
        return None
    if mine in _PYTHON and other in _PYTHON:
        return _PY_NAMES.get(dtype.kind, "scalar")
    return "scalar"


def kind_name(kind: str, py: str | None, dtype: np.dtype) -> str:
    if py in ("int", "float", "bool"):
        return str(py)
    if kind == "column" and py is not None:
        return f"a numpy {dtype} scalar"
    if kind == "column":
        return f"an array of {dtype}"
    return {
        "none": "None",
        "str": "str",
        "bytes": "bytes",
        "strs": "a list of str",
        "dict": "a dict",
        "tensor": "a tensor",
        "pickle": "a pickled object",
    }[kind]


def read_back(sample: Any, allow_pickle: bool, index: int = -1) -> dict[str, Any]:
    """``sample`` in the form a pack reads it back, as far as one sample tells: what a
    pack being filled returns for a sample it just loaded, so that the first epoch
    gives the types of the later ones (a batch never mixes a list and an array).

    With ``allow_pickle=False``, a list becomes what :func:`list_value` makes of it
    (an array, or a list of str), a dict's values are read back in turn (fields
    ``"meta.age"``); with it, lists and dicts are pickled and come back as they are.
    A 0-d numeric array comes back as its numpy scalar, ``np.str_`` and ``np.bytes_``
    as ``str`` and ``bytes``; the rest as it is. What only the other samples decide
    is left as it is: an int field promoted to float by a later sample, an empty
    list (an empty array or list of str, as the field holds), a NaN that is a
    missing value in a text field. A list, or a value of a type, that a pack refuses
    raises as it would at the build (:class:`~mlcache.UnsupportedValue` naming sample
    ``index`` and the field): a tuple, a set, a ``datetime``, an object.
    """
    if type(sample) is not dict:
        sample = dict(sample)
    else:  # the common sample, every value as it is: one pass of type tests (a first
        # epoch's every sample), no call and no label a field
        for v in sample.values():
            t = type(v)
            if t is np.ndarray:
                if not v.ndim:
                    break
            elif t not in _AS_IS:
                break
        else:
            return dict(sample)
    return {k: _read_back(v, allow_pickle, str(k), index) for k, v in sample.items()}


def _read_back(value: Any, allow_pickle: bool, label: str, index: int, depth: int = 0) -> Any:
    t = type(value)
    if t in _PY_DTYPES or t is str or t is bytes or value is None:
        return value
    if t is np.ndarray:
        if value.ndim == 0 and value.dtype.kind in _NUMERIC and value.dtype.fields is None:
            return value[()]
        return value
    if t is np.str_:
        return str(value)
    if t is np.bytes_:
        return bytes(value)
    if allow_pickle:
        return value
    if t is list:
        converted = list_value(value, label, index)
        if converted is EMPTY:
            return value
        return list(converted) if type(converted) is Strs else converted
    if t is dict and depth < 32:
        return {
            k: _read_back(v, allow_pickle, f"{label}.{k}", index, depth + 1)
            for k, v in value.items()
        }
    if t is dict or isinstance(value, np.generic) or is_tensor(value) or is_na(value):
        return value
    # what a pack refuses whatever the other samples hold: refused now, at the
    # read that loads it, in the pack writer's words, not at the seal an epoch later
    raise UnsupportedValue(
        f"sample {index}, field {label!r}: a value of type {t.__module__}.{t.__qualname__} "
        "needs pickle; packs store numpy arrays, int, float, bool, str, bytes, None, lists of "
        "numbers or of str, and dicts of these (pass allow_pickle=True to store other values)"
    )


#: in :func:`as_sealed`'s ``forms``: a field whose values are lists of str
_STRS_FORM = "strs"
_EMPTY_ALONE = (np.dtype(np.float64), ())


def as_sealed(sample: dict[str, Any], forms: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``sample`` (as :func:`read_back` gave it, ``allow_pickle=False``) with each
    empty list as the sealed pack gives it: an empty array of the dtype and
    trailing shape of the field's other values, or ``[]`` in a field of lists of
    str; an epoch that served ``[]`` beside arrays would differ from the next ones.

    ``forms`` holds what the samples given so far showed of each field (updated
    here): an empty list met before any other value of its field is an empty
    float64 array, as in a pack whose field holds only empty lists. The record
    of a sample keeps its ``[]``: the pack writer decides from every sample.
    A new dict is returned when something changed; ``sample`` is left as it is.

    >>> forms = {}
    >>> as_sealed({"ids": np.arange(3)}, forms)["ids"].dtype
    dtype('int64')
    >>> as_sealed({"ids": []}, forms)["ids"]
    array([], dtype=int64)
    """
    out = sample
    for name, value in sample.items():
        cls = value.__class__
        if cls is np.ndarray:
            if value.ndim:
                label = prefix + str(name)
                form = forms.get(label)
                if form is None or form.__class__ is not tuple or form[0] != value.dtype:
                    dtype = value.dtype
                    if form.__class__ is tuple:
                        dtype = np.result_type(form[0], dtype)
                    forms[label] = (dtype, value.shape[1:])
        elif cls is list:
            label = prefix + str(name)
            if value:
                forms[label] = _STRS_FORM
                continue
            form = forms.get(label, _EMPTY_ALONE)
            if form is _STRS_FORM:
                continue
            if out is sample:
                out = dict(sample)
            out[name] = np.empty((0, *form[1]), form[0])
        elif cls is dict:
            inner = as_sealed(value, forms, f"{prefix}{name}.")
            if inner is not value:
                if out is sample:
                    out = dict(sample)
                out[name] = inner
    return out
