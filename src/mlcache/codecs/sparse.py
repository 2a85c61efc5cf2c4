"""The ``scipy.sparse`` leaf: csr, csc and coo matrices and arrays, never pickled.

A sparse matrix or array (``csr_matrix``, ``csr_array``, ``csc_matrix``,
``csc_array``, ``coo_matrix``, ``coo_array``: exact types only) is a node of the
``npy`` tree (:mod:`mlcache.codecs.leaves`)::

    {"x": "scipy.sparse", "cls": "csr_array", "shape": [200000, 10000],
     "data": {"seg": 0, "dtype": "<f8", "n": 2000000},
     "indices": {"seg": 1, "dtype": "<i4", "n": 2000000},
     "indptr": {"seg": 2, "dtype": "<i4", "n": 200001},
     "sorted": true, "canonical": true}

(a coo node has ``"coords": [array, ...]``, one per dimension, instead of
``indices`` and ``indptr``). The class comes back exactly (a ``*_matrix`` stays
a matrix, a ``*_array`` an array, 1-d and n-d coo arrays included), with its
dtype, shape and index dtype; the stored entries are kept as they are: explicit
zeros, duplicates and unsorted indices included, and the ``has_sorted_indices``
/ ``has_canonical_format`` flags are carried so that a sorted matrix is not
checked or sorted again after loading. Other formats (bsr, dia, lil, dok) and
object dtypes are refused (pickle, or unstored).

With ``mmap_mode`` set the arrays are views of the mapped entry file (read-only
under ``"r"``). scipy is imported only when a sparse value is met or decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from . import Segments

__all__ = ["SparseLeaf"]

#: class name -> scipy module that defines it
_CLASSES = {
    "csr_matrix": "_csr",
    "csr_array": "_csr",
    "csc_matrix": "_csc",
    "csc_array": "_csc",
    "coo_matrix": "_coo",
    "coo_array": "_coo",
}
#: instance attributes scipy itself sets; any other is user data we would lose
_KNOWN_ATTRS = frozenset(
    {
        "_shape",
        "data",
        "indices",
        "indptr",
        "coords",
        "maxprint",
        "has_canonical_format",
        "_has_sorted_indices",
        "_has_canonical_format",
    }
)


def _flat_ok(a: Any, integer: bool) -> bool:
    return (
        type(a) is np.ndarray
        and a.ndim == 1
        and not a.dtype.hasobject
        and a.dtype.fields is None
        and (a.dtype.kind in "iu" if integer else a.dtype.kind in "biufc")
    )


def _put(a: np.ndarray, add: Callable[[Any], int]) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"seg": add(a), "dtype": a.dtype.str, "n": int(a.shape[0])}


def _get(node: Any, segments: Segments, integer: bool) -> np.ndarray:
    dtype = np.dtype(node["dtype"])
    if (
        dtype.hasobject
        or dtype.fields is not None
        or dtype.kind not in ("iu" if integer else "biufc")
    ):
        raise ValueError(f"bad sparse array dtype {dtype}")
    n = node["n"]
    if type(n) is not int or n < 0:
        raise ValueError(f"bad sparse array length {n!r}")
    return segments.array(node["seg"], dtype, (n,), "C")


class SparseLeaf:
    """scipy.sparse csr, csc and coo matrices and arrays (see the module)."""

    name = "scipy.sparse"
    types = tuple(f"scipy.sparse.{mod}.{cls}" for cls, mod in _CLASSES.items())

    def can_encode(self, value: Any) -> bool:
        t = type(value)
        if _CLASSES.get(t.__qualname__) != t.__module__.removeprefix("scipy.sparse."):
            return False
        try:
            if not set(vars(value)) <= _KNOWN_ATTRS or not _flat_ok(value.data, integer=False):
                return False
            if value.format == "coo":
                return all(_flat_ok(c, integer=True) for c in value.coords)
            return _flat_ok(value.indices, integer=True) and _flat_ok(value.indptr, integer=True)
        except (AttributeError, TypeError):  # a scipy older than 1.15 (no coords)
            return False

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        node: dict[str, Any] = {
            "cls": type(value).__qualname__,
            "shape": [int(d) for d in value.shape],
            "data": _put(value.data, add),
        }
        if value.format == "coo":
            node["coords"] = [_put(c, add) for c in value.coords]
            node["canonical"] = bool(value.has_canonical_format)
        else:
            node["indices"] = _put(value.indices, add)
            node["indptr"] = _put(value.indptr, add)
            node["sorted"] = bool(value.has_sorted_indices)
            node["canonical"] = bool(value.has_canonical_format)
        if type(value.maxprint) is int:
            node["maxprint"] = value.maxprint
        return node

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        import scipy.sparse

        name = node["cls"]
        if name not in _CLASSES:
            raise ValueError(f"unknown sparse class {name!r}")
        cls = getattr(scipy.sparse, name)
        shape = node["shape"]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"bad sparse shape {shape!r}")
        data = _get(node["data"], segments, integer=False)
        canonical = node.get("canonical", False)
        maxprint = node.get("maxprint")
        if type(canonical) is not bool or (maxprint is not None and type(maxprint) is not int):
            raise ValueError("bad sparse flags")
        if name.startswith("coo"):
            coords = tuple(_get(c, segments, integer=True) for c in node["coords"])
            if len(coords) != len(shape) or any(len(c) != len(data) for c in coords):
                raise ValueError("sparse coords do not match the shape and data")
            m = cls((data, coords), shape=tuple(shape), copy=False)
            m.coords = coords  # as stored: the constructor may change the index dtype
            m.has_canonical_format = canonical
        else:
            indices = _get(node["indices"], segments, integer=True)
            indptr = _get(node["indptr"], segments, integer=True)
            major = shape[0] if name.startswith("csr") else shape[-1]
            if len(shape) == 1:
                major = 1  # a 1-d csr array is one row
            if len(indices) != len(data) or len(indptr) != major + 1:
                raise ValueError("sparse indices do not match the shape and data")
            m = cls((data, indices, indptr), shape=tuple(shape), copy=False)
            m.data, m.indices, m.indptr = data, indices, indptr  # exactly as stored
            is_sorted = node.get("sorted", False)
            if type(is_sorted) is not bool:
                raise ValueError("bad sparse flags")
            if is_sorted:  # known: not checked again (scipy would scan the indices)
                m.has_sorted_indices = True
            if canonical:
                m.has_canonical_format = True
        if maxprint is not None:
            m.maxprint = maxprint
        return m
