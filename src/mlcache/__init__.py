"""mlcache: make the slow parts of a machine-learning workflow run once.

``Memory(...).cache`` memoizes functions to disk with joblib's API; see the
README for the full tour.
"""

from __future__ import annotations

import logging as _logging

from .codecs import register_codec
from .codecs.compression import register_compressor
from .errors import (
    CacheError,
    CacheWarning,
    CallArgumentsError,
    ConfigError,
    ConfigTypeError,
    EntryCorrupted,
    EntryNotFound,
    EntrySignatureError,
    InvalidRegistration,
    RegistryError,
    StoreError,
    UnhashableArgument,
    UnknownBackend,
    UnsupportedValue,
)
from .keys.hashing import hash_value, register_hasher
from .memo.memory import (
    MemorizedFunc,
    MemorizedResult,
    Memory,
    NotMemorizedFunc,
    NotMemorizedResult,
    cache,
    expires_after,
)
from .memo.parallel import cached_map
from .store import register_store_backend, register_url_scheme
from .store.local import default_location

__version__ = "0.1.0"

# a library's logger stays quiet until the application configures logging; the
# problems mlcache works around also arrive as CacheWarnings (see errors.warn)
_logging.getLogger("mlcache").addHandler(_logging.NullHandler())

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
    "MemorizedFunc",
    "MemorizedResult",
    "Memory",
    "NotMemorizedFunc",
    "NotMemorizedResult",
    "RegistryError",
    "StoreError",
    "UnhashableArgument",
    "UnknownBackend",
    "UnsupportedValue",
    "__version__",
    "cache",
    "cached_map",
    "default_location",
    "expires_after",
    "hash_value",
    "register_codec",
    "register_compressor",
    "register_hasher",
    "register_store_backend",
    "register_url_scheme",
]
