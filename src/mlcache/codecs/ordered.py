"""The ``collections.OrderedDict`` leaf: an ordered dict (a torch ``state_dict()``) of
any tree values, kept an ``OrderedDict`` in its order, never pickled.

The ``npy`` tree stores ``dict`` exactly and leaves a subclass to pickle; a
``state_dict()`` is an ``OrderedDict``, so a cached function returning one would
need pickle. This leaf stores its items through the ``npy`` codec's own
``encode`` (so every value inside keeps its type: arrays, tensors, frames, plain
data), its segments appended in order after those already added::

    {"x": "collections.OrderedDict", "items": <npy tree of ([(key, value), ...], attrs)>,
     "base": 3}

``attrs`` are the Python attributes set on the dict, kept too (a ``state_dict()``
carries ``_metadata``, the versions of its modules, that ``load_state_dict``
reads); a dict whose attributes are not tree values is refused. ``base`` is the
index of the first of its segments (absent when it has none); the items tree
numbers its segments from 0, and decoding reads them shifted by ``base``.
Nesting is bounded (:data:`MAX_NESTING`): a deeper or self-containing value is
refused.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from . import Codec, Segments

__all__ = ["MAX_NESTING", "OrderedDictLeaf"]

#: ordered dicts inside ordered dicts, at most
MAX_NESTING = 8

_depth = threading.local()


def _npy() -> Codec:
    from . import codecs  # the registry, at call time (this module is imported by it)

    return codecs["npy"]


class _Shifted:
    """The segments of an entry seen from ``base`` on (the items tree's numbering)."""

    __slots__ = ("_base", "_segments")

    def __init__(self, segments: Segments, base: int) -> None:
        self._segments, self._base = segments, base

    def __len__(self) -> int:
        return len(self._segments) - self._base

    def _at(self, index: int) -> int:
        if type(index) is not int or not 0 <= index < len(self):
            raise ValueError(f"the ordered dict names a missing segment {index!r}")
        return self._base + index

    def buffer(self, index: int) -> memoryview:
        return self._segments.buffer(self._at(index))

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        return self._segments.array(self._at(index), dtype, shape, order)


class OrderedDictLeaf:
    """``collections.OrderedDict`` (exact type) of tree values (see the module)."""

    name = "collections.OrderedDict"
    types: tuple[str, ...] = ("collections.OrderedDict",)

    def can_encode(self, value: Any) -> bool:
        if type(value) is not collections.OrderedDict:
            return False
        depth = getattr(_depth, "n", 0)
        if depth >= MAX_NESTING:
            return False
        _depth.n = depth + 1
        try:
            attrs = vars(value)  # a state_dict()'s _metadata (versions of its modules)
            if not all(type(k) is str for k in attrs):
                return False
            return _npy().can_encode((list(value.items()), dict(attrs)))
        except RecursionError:  # deep trees inside nested ordered dicts
            return False
        finally:
            _depth.n = depth

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        encoded = _npy().encode((list(value.items()), dict(vars(value))))
        base = -1
        for i, segment in enumerate(encoded.segments):
            at = add(segment)
            if i == 0:
                base = at
            elif at != base + i:
                raise ValueError("segments were not appended in order")
        node: dict[str, Any] = {"items": encoded.layout["tree"]}
        if base >= 0:
            node["base"] = base
        return node

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        base = node.get("base", 0)
        if type(base) is not int or not 0 <= base <= len(segments):
            raise ValueError(f"bad ordered dict segment base {base!r}")
        tree = _npy().decode({"tree": node["items"]}, _Shifted(segments, base))
        if type(tree) is not tuple or len(tree) != 2:
            raise ValueError("an ordered dict's node is not (items, attributes)")
        items, attrs = tree
        if type(items) is not list or not all(type(p) is tuple and len(p) == 2 for p in items):
            raise ValueError("an ordered dict's items are not (key, value) pairs")
        if type(attrs) is not dict or not all(type(k) is str for k in attrs):
            raise ValueError("an ordered dict's attributes are not a dict of names")
        out = collections.OrderedDict(items)
        vars(out).update(attrs)
        return out
