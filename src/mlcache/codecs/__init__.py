"""Codecs turn a value into a JSON layout plus raw segments, and back.

A codec never touches files: the entry format (:mod:`mlcache.entry`) lays the
segments out 64-byte aligned and gives them back to :meth:`Codec.decode`
either read into memory or memory-mapped, through :class:`Segments`.

Selection is explicit: safe codecs are asked in registration order whether
they *fully* represent the value (``can_encode`` is a strict structural check,
not a try-and-see); pickle is used only when none does and pickle is allowed,
and refusing it raises :class:`~mlcache.errors.UnsupportedValue` naming the type
and, where a safe codec can say (:class:`Refuses`), the part that needs pickle.

Typed values that are not arrays (a DataFrame, a pyarrow Table, a tensor) are
*leaves* of the ``npy`` tree (:mod:`mlcache.codecs.leaves`): one
:class:`~mlcache.codecs.leaves.Leaf` per type family, registered with
:func:`register_leaf` and found by the exact type's ``"module.QualName"``, so a
dict of frames and arrays is stored without pickle, each part typed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .._registry import Registry
from ..errors import RegistryError, UnsupportedValue
from .leaves import Leaf, leaves, register_leaf

__all__ = [
    "Codec",
    "Encoded",
    "Leaf",
    "Refuses",
    "Segments",
    "codecs",
    "leaves",
    "register_codec",
    "register_leaf",
    "select_codec",
]


class Encoded(NamedTuple):
    """What a codec produces: a JSON-serialisable layout and the raw segments."""

    layout: dict[str, Any]
    segments: Sequence[Any]  # bytes-like objects / contiguous numpy arrays


class Segments(Protocol):
    """The stored segments of one entry, as the entry reader hands them out."""

    def __len__(self) -> int: ...

    def buffer(self, index: int) -> memoryview:
        """Segment ``index`` as bytes."""
        ...

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        """Segment ``index`` viewed as an array (memory-mapped when the reader maps)."""
        ...


@runtime_checkable
class Codec(Protocol):
    """One family of values. ``safe`` codecs never run code when decoding; a codec
    that does must keep everything that runs code in segment 0, which is what
    signed entries cover in full (``docs/format.md``)."""

    name: str
    safe: bool

    def can_encode(self, value: Any) -> bool: ...

    def encode(self, value: Any) -> Encoded: ...

    def decode(self, layout: dict[str, Any], segments: Segments) -> Any: ...


@runtime_checkable
class Refuses(Protocol):
    """An optional power of a codec: saying what part of a value it cannot store,
    so that a value refused pickle is named by that part, not by its container."""

    def refused(self, value: Any) -> str | None: ...


def _check_codec(obj: object) -> None:
    if not isinstance(obj, Codec):
        raise TypeError(
            f"{obj!r} is not a codec: it needs name, safe, can_encode, encode and decode"
        )


codecs: Registry[Codec] = Registry("codec", _check_codec)


def register_codec(codec: Codec, *, replace: bool = False) -> None:
    """Register a codec instance under ``codec.name``."""
    if isinstance(codec, type) or not isinstance(codec, Codec):
        raise RegistryError(f"{codec!r} is not a codec instance")
    codecs.register(codec.name, codec, replace=replace)


def select_codec(value: Any, *, allow_pickle: bool) -> Codec:
    """The codec that stores ``value``: the first safe codec that fully represents it,
    else pickle when allowed."""
    for name in codecs:
        codec = codecs[name]
        if codec.safe and codec.can_encode(value):
            return codec
    if allow_pickle:
        return codecs["pickle"]
    why = ""
    for name in codecs:  # the error path only: a runtime Protocol check is slow
        codec = codecs[name]
        if codec.safe and isinstance(codec, Refuses) and (part := codec.refused(value)):
            why = f" ({part})"
            break
    raise UnsupportedValue(
        f"a value of type {type(value).__module__}.{type(value).__qualname__}{why} needs "
        "pickle to be stored, and pickle is disabled (allow_pickle=False); return numpy arrays, "
        "plain Python data (int, float, str, bytes, None, list, tuple, dict), or allow pickle"
    )


def _register_builtin() -> None:
    from .arrow import ArrowLeaf
    from .npy import NumpyCodec
    from .ordered import OrderedDictLeaf
    from .pandas import NA_LAYOUT, DataFrameLeaf, IndexLeaf, SeriesLeaf
    from .pickle import PickleCodec
    from .polars import PolarsLeaf
    from .sparse import SparseLeaf
    from .tensors import STRIDED, TensorLeaf

    register_codec(NumpyCodec())
    register_codec(PickleCodec())
    # torch and scipy are imported only when such a value is met
    register_leaf(TensorLeaf(), also=(STRIDED,))  # (a view of a shared storage)
    register_leaf(SparseLeaf())
    register_leaf(OrderedDictLeaf())  # a state_dict()
    # pandas, pyarrow and polars likewise
    for frame in (DataFrameLeaf(), SeriesLeaf(), IndexLeaf()):  # (NaN among object strings)
        register_leaf(frame, also=(frame.name + NA_LAYOUT,))
    for leaf in (ArrowLeaf(), PolarsLeaf()):
        register_leaf(leaf)


_register_builtin()
