"""Randomness frozen in a pack: a ``load_item`` that gives two different samples
for one item (a random crop, flip or noise moved from ``__getitem__`` into it).

A pack keeps the first sample of each item, so every later epoch, and every
later run, gets epoch 1's draw, and nothing else would say so. A pack being
filled loads a few of the items it recorded again when it seals (see
:mod:`mlcache.data.filling`) and compares the two by value
(:func:`same_sample`); the audit of a pack's samples later in training makes the
same comparison. A difference is said once per process
(:func:`warn_frozen_randomness`); the pack is still served: where the randomness
belongs is the user's call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import warn_at_user
from .values import is_tensor, read_back

logger = logging.getLogger("mlcache")

__all__ = [
    "MAX_PROBES",
    "PROBE_EVERY",
    "probe",
    "probe_picks",
    "same_sample",
    "warn_frozen_randomness",
]

_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()
#: a pack's seal loads again one item in this many that its process loaded, at
#: most MAX_PROBES: at most 1% of the loads
PROBE_EVERY = 100
MAX_PROBES = 3
#: how deep nested dicts and lists are compared (deeper: taken as the same)
_MAX_DEPTH = 32


def probe_picks(loaded: list[int]) -> set[int]:
    """The items to load again and compare, of those a process ``loaded`` (in the
    order it loaded them): one in :data:`PROBE_EVERY`, at most :data:`MAX_PROBES`,
    spread over them.

    >>> sorted(probe_picks(list(range(250))))
    [62, 187]
    """
    count = min(MAX_PROBES, len(loaded) // PROBE_EVERY)
    if not count:
        return set()
    step = len(loaded) // count
    return {loaded[k * step + step // 2] for k in range(count)}


def probe(
    load: Callable[[Any], Any], item: Any, recorded: Any, allow_pickle: bool, index: int
) -> None:
    """Load ``item`` again (``load``: a dataset's ``load_item``) and compare with
    ``recorded``, its first sample as read back: a difference is said once
    (:func:`warn_frozen_randomness`). The probe's own error is only logged."""
    try:
        again = read_back(load(item), allow_pickle, index)
    except Exception as exc:  # the probe's load: never the seal's failure
        logger.debug("mlcache: loading item %d again to compare failed: %s", index, exc)
        return
    if not same_sample(recorded, again):
        warn_frozen_randomness(getattr(load, "__qualname__", "load_item"), item)


def same_sample(a: Any, b: Any) -> bool:
    """Whether two loads of one item gave the same value: dicts by their keys and
    values, arrays by shape and elements (exactly: a deterministic load gives
    bit-equal floats; NaN equals NaN), tensors as arrays, lists and tuples item by
    item, anything else by ``==``. A comparison that cannot be made counts as the
    same (a false alarm would be worse than a missed one).

    >>> import numpy as np
    >>> same_sample({"x": np.zeros(3), "y": [1.0]}, {"x": np.zeros(3), "y": [1.0]})
    True
    >>> same_sample({"x": np.random.rand(3)}, {"x": np.random.rand(3)})
    False
    """
    return _same(a, b, 0)


def _same(a: Any, b: Any, depth: int) -> bool:
    if a is b or depth > _MAX_DEPTH:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if is_tensor(a) or is_tensor(b):
        try:
            a, b = (x.detach().cpu().numpy() if is_tensor(x) else x for x in (a, b))
        except (RuntimeError, TypeError, ValueError):  # a dtype numpy has not: unsure
            return True
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        return _same_arrays(a, b)
    if type(a) in (list, tuple) and type(b) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if type(a) is float and type(b) is float and a != a and b != b:
        return True  # NaN, both times
    try:
        equal = a == b
        return bool(equal) if isinstance(equal, (bool, np.bool_)) else True
    except Exception:  # an object whose == raises: cannot tell
        return True


def _same_arrays(a: Any, b: Any) -> bool:
    try:
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape:
            return False
        if x.dtype.kind in "fc" and y.dtype.kind in "fc":
            return bool(np.array_equal(x, y, equal_nan=True))
        if x.dtype.kind == "O" or y.dtype.kind == "O":
            return all(_same(p, q, 1) for p, q in zip(x.flat, y.flat))
        return bool(np.array_equal(x, y))
    except (TypeError, ValueError):
        return True


def warn_frozen_randomness(owner: str, item: Any) -> None:
    """Say, once per process for ``owner`` (``"Tiles.load_item"``), that two loads of
    ``item`` differed: the pack froze its first draw."""
    with _WARNED_LOCK:
        if owner in _WARNED:
            return
        _WARNED.add(owner)
    shown = repr(item)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    warn_at_user(
        f"mlcache: {owner} gave two different samples for the item {shown}: random "
        "augmentation in load_item is frozen in the pack (every later epoch and run gets "
        "this first draw). Apply it at each read instead: CachedDataset(..., "
        "transform=augment) runs augment(sample) on every ds[i], uncached. The pack is "
        "still served."
    )
