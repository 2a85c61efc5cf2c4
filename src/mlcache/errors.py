"""The whole error tree of mlcache.

::

    CacheError                              root: catch this to catch everything below
     ├── ConfigError(CacheError, ValueError)      bad settings (mmap_mode, compress, backend, ...)
     │    └── ConfigTypeError(ConfigError, TypeError)   a setting of the wrong type, where
     │                                            joblib raises ValueError (or takes it)
     ├── RegistryError(CacheError, LookupError)   unknown or invalid registry name / implementation
     │    ├── InvalidRegistration(RegistryError, ValueError, TypeError)
     │    │                                       register_*() with a bad name or an object
     │    │                                       that is not an implementation
     │    └── UnknownBackend(RegistryError, TypeError)  Memory(backend=name): no such backend
     ├── CallArgumentsError(CacheError, TypeError, ValueError)
     │                                            a memoized function called with arguments
     │                                            its signature does not accept
     ├── EntryNotFound(CacheError, KeyError)      no entry under a key (a miss)
     ├── EntryCorrupted(CacheError, ValueError)   an entry failed its checksum or its format check
     │    ├── EntrySignatureError                 an entry is unsigned or its signature does
     │    │                                       not verify (possible tampering)
     │    └── PackCorrupted                       a dataset pack is truncated or damaged
     │         │                                  (mlcache.data.PackCorrupted)
     │         └── PackChanged                    a pack file changed under an open reader
     │                                            (mlcache.data.PackChanged)
     ├── UnknownFormat(CacheError, LookupError)  an entry written with a codec or compression
     │    │                                       this process has not registered (a miss here,
     │    │                                       the entry is left in place)
     │    └── NewerFormat                         an entry or a pack written by a newer mlcache
     │                                            (a higher format version): left in place too
     ├── UnhashableArgument(CacheError, TypeError)  an argument of a call cannot be hashed
     │                                            (the call runs uncached, with a warning)
     ├── UnsupportedValue(CacheError, TypeError)  a value no allowed codec can store
     └── StoreError(CacheError, OSError)          the store could not be created, read or written

    CacheWarning(UserWarning)                     a cache problem that degraded to a miss
                                                  or to an unstored result

Builtin bases are kept so that code written against joblib keeps working: each
class is also the builtin joblib raises for the same mistake (``ValueError`` for
a bad registration, a non-callable ``cache_validation_callback`` or a wrong call
of a memoized function; ``TypeError`` for an unknown backend; ``KeyError`` for a
cleared result; ``OSError`` for the store), and stays the builtin mlcache raised
before (a wrong call is still the ``TypeError`` Python's own call raises), so an
``except`` clause written for either keeps catching it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = [
    "CacheError",
    "CacheWarning",
    "CallArgumentsError",
    "ConfigError",
    "ConfigTypeError",
    "EntryCorrupted",
    "EntryNotFound",
    "EntrySignatureError",
    "InvalidRegistration",
    "NewerFormat",
    "PackChanged",
    "PackCorrupted",
    "RegistryError",
    "StoreError",
    "UnhashableArgument",
    "UnknownBackend",
    "UnknownFormat",
    "UnsupportedValue",
]


class CacheError(Exception):
    """Root of every error mlcache raises on purpose."""


class ConfigError(CacheError, ValueError):
    """A setting has a wrong value, e.g. ``mmap_mode="x"`` or ``compress=("foo", 3)``."""


class ConfigTypeError(ConfigError, TypeError):
    """A setting has the wrong type (``verbose="a"``, a ``cache_validation_callback``
    that is not callable). A ``TypeError`` as Python's convention asks, and a
    ``ValueError`` as joblib raises for the same mistakes."""


class RegistryError(CacheError, LookupError):
    """A registry lookup or registration failed: unknown name, bad name, wrong class."""


class InvalidRegistration(RegistryError, ValueError, TypeError):
    """``register_store_backend`` (or ``register_codec``) was given a name that is not
    a valid name, an object that is not an implementation, or a name already taken
    by another implementation. joblib raises ``ValueError`` for these (``TypeError``
    for an object that is not a class)."""


class UnknownBackend(RegistryError, TypeError):
    """``Memory(location, backend=name)`` names no registered store backend
    (joblib: ``TypeError("Unknown location ... or backend ...")``)."""


class CallArgumentsError(CacheError, TypeError, ValueError):
    """A memoized function was called with arguments its signature does not accept
    (too many, a keyword-only one by position, a missing or unexpected one). The
    ``TypeError`` the call itself would raise, with Python's message, and the
    ``ValueError`` joblib raises, whose wording starts the message (``"Too many
    arguments for f(a, *, b=1): f() takes 1 positional argument but 2 were
    given"``). Nothing is computed."""


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


class PackCorrupted(EntryCorrupted):
    """A pack file is truncated, damaged or not a pack (a ``ValueError``)."""


class PackChanged(PackCorrupted):
    """The file an open pack reader reads was changed under it since it was opened
    (rewritten in place, truncated, or, for a dataset reopened by path, replaced
    by another pack). A ``PackCorrupted``, so a ``CachedDataset`` rebuilds."""


class UnknownFormat(CacheError, LookupError):
    """An entry was written with a codec or a compression method that this process
    has not registered (:func:`mlcache.register_codec`,
    :func:`mlcache.register_compressor`). The entry is not damaged, only unreadable
    here: a memoized call treats it as a miss and leaves it in place."""


class NewerFormat(UnknownFormat):
    """An entry or a pack was written by a newer mlcache (its format version is higher
    than this one reads): a cache shared by two versions, a cluster mid-upgrade. Not
    damage: a memoized call computes and leaves the entry as it is, unreplaced, and
    ``verify --fix`` never removes it."""


class UnhashableArgument(CacheError, TypeError):
    """An argument of a call cannot be hashed (a lock, an open file, a generator)."""


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


#: the package's folder: frames of files under it are mlcache's own
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_user(message: str) -> None:
    """:func:`warn`, shown at the first frame outside mlcache: the user's line
    (``ds = Tiles(...)``, ``ds[i]``, a DataLoader's loop), whichever path of the
    library led to the warning (a fixed ``stacklevel`` points into mlcache when
    the same warning is reached by another path)."""
    frame = sys._getframe(0)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    logging.getLogger("mlcache").warning(message)
    warnings.warn(message, CacheWarning, stacklevel=level)
