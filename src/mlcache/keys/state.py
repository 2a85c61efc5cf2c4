"""What a call changes is state, not input: the helpers that tell which of the
mutable values a code walk met (:attr:`~mlcache.keys.code_version.CodeVersion.watched`)
a call changed, and how those values count.

A module-level value that is mutable (a dict, a list, an object) counts in a
code version by value, because the code reads it; its digests
(:func:`watched_digests`) are compared before and after each computed call
(:class:`~mlcache.memo.func.MemorizedFunc`, :class:`~mlcache.data.CachedDataset`).
One that a call changed (a memo such as ``_VOCAB_CACHE = {}``, a counter) is
state: it then counts by type only. A dict is split into its keys and a plain
object into its attributes (:func:`state_parts`), so a call that records into
one key of a dict it also reads makes only that key state;
:func:`learnable` says which values may become state at all.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterable
from typing import Any

import numpy as np
import xxhash

from .hashing import code_walk, hash_value

__all__ = [
    "MAX_ITEMS",
    "STATE_PARTS_MAX",
    "learnable",
    "plain_object",
    "state_parts",
    "value_digest",
    "watchable",
    "watched_digests",
]

#: a container with more items than this is identified by its type and length
#: only, not by every value (a constant table that big is data, not code)
MAX_ITEMS = 100_000
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, np.generic, type)
#: a module-level array larger than this (bytes) is not watched for in-place
#: changes: hashing it before and after every computed call would cost more than
#: the rare accumulator array is worth
_WATCH_ARRAY_MAX = 1 << 20


def value_digest(obj: Any) -> str:
    """A value's short digest, as code versions count it (16 hex digits; its type
    and size only when it cannot be hashed or is a huge container). Functions in
    it count by their own code (:func:`~mlcache.keys.hashing.code_walk`)."""
    try:
        if isinstance(obj, (list, tuple, dict, set, frozenset)) and len(obj) > MAX_ITEMS:
            return f"{type(obj).__qualname__}[{len(obj)}]"
        with code_walk():  # functions in it by their own code: no walk inside the walk
            return hash_value(obj)[:16]
    except Exception:  # an open file, a lock, a logger: what it is, not what it holds
        return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def watchable(obj: Any) -> bool:
    """Whether a call may change ``obj`` in place and it is small enough to be
    compared before and after calls (an array over 1 MiB is not)."""
    if _immutable(obj):
        return False
    return not (isinstance(obj, np.ndarray) and obj.nbytes > _WATCH_ARRAY_MAX)


def state_parts(name: str, obj: Any) -> list[tuple[str, Any]] | None:
    """``obj``, met under ``name``, as the parts that a call may change one by one:
    a dict by key (``name[<key digest>]``), an object whose state is its
    ``__dict__`` by attribute (``name.attr``); anything else whole. So a call that
    records into one key of a dict it also reads (``REG["seen"]``) makes only that
    key state, never the keys it reads (``REG["scale"]``). None: ``obj`` counts
    whole (a list, a set, a big dict, an object with its own pickling)."""
    try:  # by type: a proxy's __class__ or __getattr__ may raise anything
        if issubclass(type(obj), dict) and len(obj) <= STATE_PARTS_MAX:
            items = list(dict.items(obj))
            return sorted(((f"{name}[{_key_digest(k)}]", v) for k, v in items), key=_first)
        if plain_object(obj) and len(vars(obj)) <= STATE_PARTS_MAX:
            return sorted(((f"{name}.{k}", v) for k, v in vars(obj).items()), key=_first)
    except Exception:
        return None
    return None


#: mutable values that a call can only add to or take from: an accumulator
_ACCUMULATORS = (list, set, bytearray, collections.deque)


def learnable(entries: Iterable[tuple[str, Any]], *, expanded: bool) -> set[str]:
    """The names among ``entries`` (name, value) that may become state: the parts
    of dicts and plain objects, and accumulators. ``expanded``: the entries are
    already split into parts (as :meth:`mlcache.memo.versions.FunctionCode._captured`
    gives them), so a part is any entry named below another (``self.calls``,
    ``conf[<key>]``)."""
    names = set()
    for name, value in entries:
        if issubclass(type(value), _ACCUMULATORS):  # by type: a proxy may raise
            names.add(name)
        elif expanded:
            if "." in name or "[" in name:
                names.add(name)
        else:
            parts = state_parts(name, value)
            names.update(sub for sub, _ in parts or ())
    return names


def watched_digests(watched: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """Digests of mutable values met by the walk (:attr:`CodeVersion.watched`), part
    by part (:func:`state_parts`): compared before and after a call to find what
    it changes."""
    digests: dict[str, str] = {}
    for name, value in watched:
        parts = state_parts(name, value)
        for sub, v in [(name, value)] if parts is None else parts:
            digests[sub] = value_digest(v)
    return digests


#: a dict with more keys (an object with more attributes) than this counts whole:
#: comparing it key by key before and after every computed call would cost more
#: than telling a memo's keys from the ones a function reads is worth
STATE_PARTS_MAX = 1000


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def _key_digest(key: Any) -> str:
    try:
        return hash_value(key)[:16]
    except Exception:  # a key the hash cannot take: its text
        return xxhash.xxh3_64_hexdigest(repr(key).encode("utf-8", "surrogatepass"))


def plain_object(obj: Any) -> bool:
    """An object whose state is its ``__dict__`` (no custom pickling, no slots),
    so that its attributes can count one by one."""
    cls = type(obj)
    try:
        return (
            isinstance(vars(obj), dict)
            and not issubclass(cls, (type, types.ModuleType, types.FunctionType))
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", None) is getattr(object, "__getstate__", None)
            and not any("__slots__" in vars(k) for k in cls.__mro__)
            and not hasattr(cls, "__mlcache_token__")
        )
    except Exception:  # no __dict__ (TypeError), or a proxy that raises
        return False


def _immutable(obj: Any, depth: int = 0) -> bool:
    """Whether a call cannot change ``obj`` in place (tuples and frozensets of
    such values included)."""
    if isinstance(obj, _IMMUTABLE):
        return True
    if isinstance(obj, (tuple, frozenset)) and depth < 4:
        return len(obj) <= 1000 and all(_immutable(v, depth + 1) for v in obj)
    return False
