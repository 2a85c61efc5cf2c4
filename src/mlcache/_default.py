"""``mlcache.cache``: a ready decorator on a default :class:`~mlcache.Memory`."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .memory import Memory
from .store.local import cache_folder

_lock = threading.Lock()
_memory: Memory | None = None


def default_location() -> str:
    """The default cache folder (absolute): ``$MLCACHE_DIR``, else the platform's
    per-user cache folder plus ``mlcache``; its ``mlcache`` subfolder when that
    folder holds a user's files (see :func:`mlcache.store.local.cache_folder`).
    Function results and dataset packs (``datasets/``) both live there."""
    env = os.environ.get("MLCACHE_DIR")
    if env:
        return cache_folder(os.path.expanduser(env))
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
        return cache_folder(os.path.join(base, "mlcache", "Cache"))
    if sys.platform == "darwin":
        return cache_folder(os.path.expanduser("~/Library/Caches/mlcache"))
    return cache_folder(
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mlcache")
    )


def default_memory() -> Memory:
    """The process-wide default Memory, created on first use (quiet: ``verbose=0``)."""
    global _memory
    with _lock:
        if _memory is None or _memory.location != os.path.abspath(default_location()):
            _memory = Memory(os.path.abspath(default_location()), verbose=0)
        return _memory


def cache(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Memoize ``func`` in the default cache (``$MLCACHE_DIR`` or the user cache folder).

    Same options as :meth:`Memory.cache`.

    >>> import mlcache
    >>> @mlcache.cache  # doctest: +SKIP
    ... def features(x):
    ...     return x * 2
    """
    return default_memory().cache(func, **kwargs)
