"""The ``npy`` codec: numpy arrays and plain containers of them, never pickled.

A value is a tree of: numpy arrays (any non-object dtype, any shape, C or F
order), numpy scalars, ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``, and ``tuple`` / ``list`` / ``dict`` of those (dict keys may
be any tree value). Arrays and bytes become raw segments, so every array comes
back memory-mapped when the reader maps; the rest is JSON in the layout.
Exact types only: a subclass (``defaultdict``, ``np.matrix``) goes to pickle
(``OrderedDict`` is a leaf: :mod:`mlcache.codecs.ordered`; a ``numpy.memmap``
is stored as its array).

A value of another type is a *leaf* when a registered
:class:`~mlcache.codecs.leaves.Leaf` handles its exact type (pandas, pyarrow
and polars frames are built in): its node is ``{"x": leaf name, ...}``, the
rest of the node and its segments the leaf's own (``docs/format.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import Encoded, Segments
from .leaves import get_leaf, leaf_for, stores_as, tree

_SCALARS = (type(None), bool, int, float, str)
_MAX_DEPTH = 100


#: a numpy.memmap is an array whose bytes are a file's (a mapped result passed on
#: by the next step, ``np.load(..., mmap_mode="r")``): stored as the array it is
_ARRAYS = (np.ndarray, np.memmap)


def _array_ok(a: np.ndarray) -> bool:
    return type(a) in _ARRAYS and not a.dtype.hasobject and a.dtype.fields is None


class NumpyCodec:
    """Arrays and plain data, decoded without running any code."""

    name = "npy"
    safe = True

    def can_encode(self, value: Any) -> bool:
        return self._ok(value, 0, set())

    def _ok(self, v: Any, depth: int, seen: set[int]) -> bool:
        t = type(v)
        if t in _SCALARS or t is bytes or t is complex:
            return True
        if t is np.ndarray or t is np.memmap:
            return _array_ok(v)
        if isinstance(v, np.generic):
            return not v.dtype.hasobject and v.dtype.fields is None
        if depth > _MAX_DEPTH:
            return False
        if t is tuple:
            return all(self._ok(x, depth + 1, seen) for x in v)
        if id(v) in seen:
            # a list, dict or leaf the value holds twice ((l, l), {"a": cfg, "b":
            # cfg}): the tree would come back as two copies, and an edit of one
            # would not show in the other as it does in what the function
            # returned. Pickle keeps the sharing, as joblib does. (Arrays are
            # stored by their bytes: one array held twice comes back as two, as
            # from joblib, each mapped from its segment.)
            return False
        seen.add(id(v))
        if t is list:
            return all(self._ok(x, depth + 1, seen) for x in v)
        if t is dict:
            return all(
                self._ok(k, depth + 1, seen) and self._ok(x, depth + 1, seen) for k, x in v.items()
            )
        leaf = leaf_for(t)
        return leaf is not None and leaf.can_encode(v) is True

    def refused(self, value: Any) -> str | None:
        """The first part of ``value`` this codec cannot store, by its place and
        type (``"['model']: collections.Counter"``), or None: what the warning of
        a value that needs pickle names. Walked only then."""
        return self._refused(value, "", 0, set())

    def _refused(self, v: Any, where: str, depth: int, seen: set[int]) -> str | None:
        t = type(v)
        place = where or "the value"
        if t is not tuple and t is not list and t is not dict:
            if not where or self._ok(v, depth, seen):  # the value itself: named already
                return None
            kind = f"{t.__module__}.{t.__qualname__}"
            if isinstance(v, np.ndarray):
                kind += f" of dtype {v.dtype}"
            return f"{where}: {kind}"
        if depth > _MAX_DEPTH:
            return f"{place}: nested more than {_MAX_DEPTH} deep"
        if t is not tuple:
            if id(v) in seen:
                return f"{place}: a {t.__name__} held twice"
            seen.add(id(v))
        if t is dict:
            for k, x in v.items():
                why = self._refused(k, f"{where} key {k!r}".lstrip(), depth + 1, seen)
                why = why or self._refused(x, f"{where}[{k!r}]", depth + 1, seen)
                if why:
                    return why
            return None
        for i, x in enumerate(v):
            why = self._refused(x, f"{where}[{i}]", depth + 1, seen)
            if why:
                return why
        return None

    def encode(self, value: Any) -> Encoded:
        segments: list[Any] = []
        with tree(value):  # what its leaves share (tensors of one storage)
            node = self._enc(value, segments)
        return Encoded({"tree": node}, segments)

    def _enc(self, v: Any, segs: list[Any]) -> Any:
        t = type(v)
        if t is str or t is bool or v is None:
            return v
        if t is int:
            return v if -(1 << 53) < v < (1 << 53) else {"int": str(v)}
        if t is float:
            return {"f": v.hex()}  # exact, including nan/inf/-0.0
        if t is complex:
            return {"c": [v.real.hex(), v.imag.hex()]}
        if t is bytes:
            segs.append(v)
            return {"b": len(segs) - 1}
        if t is list:
            return [self._enc(x, segs) for x in v]
        if t is tuple:
            return {"t": [self._enc(x, segs) for x in v]}
        if t is dict:
            return {"d": [[self._enc(k, segs), self._enc(x, segs)] for k, x in v.items()]}
        if isinstance(v, np.generic):
            return {"s": self._enc(np.asarray(v), segs)}
        if t is not np.ndarray and t is not np.memmap:
            leaf = leaf_for(t)
            if leaf is None:  # can_encode said no: encode() was called anyway
                raise TypeError(f"the npy codec cannot store a {t.__module__}.{t.__qualname__}")

            def add(segment: Any) -> int:
                segs.append(segment)
                return len(segs) - 1

            node = leaf.encode(v, add)
            name = node.get("x", leaf.name)  # another name of its own: a later layout
            if not stores_as(leaf, name):
                raise ValueError(f"the leaf {leaf.name!r} returned a node with the key 'x'")
            return {"x": name, **{k: x for k, x in node.items() if k != "x"}}
        a: np.ndarray = v
        if a.flags.c_contiguous:
            order = "C"
        elif a.flags.f_contiguous:
            order = "F"
        else:
            a, order = np.ascontiguousarray(a), "C"
        segs.append(a)
        return {"a": len(segs) - 1, "dtype": a.dtype.str, "shape": list(a.shape), "order": order}

    def decode(self, layout: dict[str, Any], segments: Segments) -> Any:
        with tree():
            return self._dec(layout["tree"], segments)

    def _dec(self, n: Any, segs: Segments) -> Any:
        t = type(n)  # the common leaves first: a small result is mostly these
        if t is str or t is int or t is bool or n is None:
            return n
        if t is list:
            return [self._dec(x, segs) for x in n]
        if t is not dict:
            raise ValueError(f"bad npy layout node {n!r}")
        if "x" in n:  # a leaf (first: its own keys may be any): unregistered is UnknownFormat
            return get_leaf(n["x"]).decode(n, segs)
        if "f" in n:
            return float.fromhex(n["f"])
        if "a" in n:
            return segs.array(n["a"], np.dtype(n["dtype"]), tuple(n["shape"]), n["order"])
        if "t" in n:
            return tuple(self._dec(x, segs) for x in n["t"])
        if "d" in n:
            return {self._dec(k, segs): self._dec(x, segs) for k, x in n["d"]}
        if "b" in n:
            return bytes(segs.buffer(n["b"]))
        if "s" in n:
            return self._dec(n["s"], segs)[()]
        if "int" in n:
            return int(n["int"])
        if "c" in n:
            return complex(float.fromhex(n["c"][0]), float.fromhex(n["c"][1]))
        raise ValueError(f"bad npy layout node {n!r}")
