"""The code walk in progress on a thread (see
:func:`mlcache.keys.code_version.code_version`): while it lasts, functions and classes
are hashed by identity and their own code, and the user code met is noted for the walk
to follow."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["code_walk", "in_code_walk", "meet"]

_walk_state = threading.local()


@contextlib.contextmanager
def code_walk(met: list[Any] | None = None) -> Iterator[None]:
    """Mark a code walk in progress on this thread: inside it, functions and
    classes are hashed by identity and their own normalised code only, never by
    :func:`mlcache.keys.code_version.code_version` (the walk hashes constants,
    which may hold functions: so it cannot recurse into itself, and a code
    version never depends on what was hashed before it). The user functions and
    classes hashed inside it are appended to ``met``, for the walk to follow.

    Examples
    --------
    >>> from mlcache.keys.hashing import hash_value
    >>> with code_walk():
    ...     key = hash_value(len)
    """
    depth, outer = getattr(_walk_state, "depth", 0), getattr(_walk_state, "met", None)
    _walk_state.depth, _walk_state.met = depth + 1, met
    try:
        yield
    finally:
        _walk_state.depth, _walk_state.met = depth, outer


def meet(obj: Any) -> None:
    """Note a user function or class hashed in a :func:`code_walk` given a list."""
    met = getattr(_walk_state, "met", None)
    if met is not None:
        met.append(obj)


def in_code_walk() -> bool:
    """Whether a :func:`code_walk` is in progress on this thread."""
    return getattr(_walk_state, "depth", 0) > 0
