"""The whole error tree of mlcache.

::

    CacheError                              root: catch this to catch everything below
     ├── ConfigError(CacheError, ValueError)      bad settings (mmap_mode, compress, backend, ...)
     ├── RegistryError(CacheError, LookupError)   unknown or invalid registry name / implementation
     ├── EntryNotFound(CacheError, KeyError)      no entry under a key (a miss)
     ├── EntryCorrupted(CacheError, ValueError)   an entry failed its checksum or its format check
     │    ├── EntrySignatureError                 an entry is unsigned or its signature does
     │    │                                       not verify (possible tampering)
     │    └── PackCorrupted                       a dataset pack is truncated or damaged
     │                                            (mlcache.data.PackCorrupted)
     ├── UnsupportedValue(CacheError, TypeError)  a value no allowed codec can store
     └── StoreError(CacheError, OSError)          the store could not be created, read or written

    CacheWarning(UserWarning)                     a cache problem that degraded to a miss
                                                  or to an unstored result

Builtin bases are kept so that code written against joblib (which raises
``KeyError``, ``ValueError`` and ``OSError``) keeps working.
"""

from __future__ import annotations

import logging
import warnings

__all__ = [
    "CacheError",
    "CacheWarning",
    "ConfigError",
    "EntryCorrupted",
    "EntryNotFound",
    "EntrySignatureError",
    "RegistryError",
    "StoreError",
    "UnsupportedValue",
]


class CacheError(Exception):
    """Root of every error mlcache raises on purpose."""


class ConfigError(CacheError, ValueError):
    """A setting has a wrong value, e.g. ``mmap_mode="x"`` or ``compress=("foo", 3)``."""


class RegistryError(CacheError, LookupError):
    """A registry lookup or registration failed: unknown name, bad name, wrong class."""


class EntryNotFound(CacheError, KeyError):
    """No entry is stored under the requested key (it was never written or was cleared)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "entry not found"


class EntryCorrupted(CacheError, ValueError):
    """An entry exists but failed verification: bad magic, checksum, size or layout."""


class EntrySignatureError(EntryCorrupted):
    """With signing on, an entry has no signature or one that does not verify: it
    was written without the key, with another key, or altered. Never decoded.

    ``reason`` is ``"unsigned"``, ``"other key"`` or ``"mismatch"`` (altered,
    or moved from another name)."""

    def __init__(self, message: str, reason: str = "mismatch") -> None:
        super().__init__(message)
        self.reason = reason


class UnsupportedValue(CacheError, TypeError):
    """A value cannot be stored by any allowed codec (e.g. it needs pickle but pickle is off)."""


class StoreError(CacheError, OSError):
    """A store cannot be created, read or written (permissions, disk full, bad location)."""


class CacheWarning(UserWarning):
    """A cache problem that did not break the call: a damaged entry recomputed, a result
    that could not be stored. The message names the cause."""


def warn(message: str, stacklevel: int = 2) -> None:
    """Say that a cache problem was worked around: a WARNING record on the
    ``mlcache`` logger (for logs) and a :class:`CacheWarning` (shown once per
    place when logging is not configured; filterable; an error in strict tests)."""
    logging.getLogger("mlcache").warning(message)
    warnings.warn(message, CacheWarning, stacklevel=stacklevel + 1)
