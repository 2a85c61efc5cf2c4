"""mlcache: make the slow parts of a machine-learning workflow run once.

``Memory(...).cache`` memoizes functions to disk with joblib's API; see the
README for the full tour.
"""

from __future__ import annotations

import importlib.abc as _abc
import logging as _logging
import sys as _sys
import typing as _t

from ._audit import AuditPolicy
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
    NewerFormat,
    RegistryError,
    StoreError,
    UnhashableArgument,
    UnknownBackend,
    UnknownFormat,
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

__version__ = "0.4.0"


class _MovedModules(_abc.MetaPathFinder, _abc.Loader):
    """Objects pickled by mlcache 0.1 (a shelved ``MemorizedResult`` inside a cached
    value, a ``Memory`` or a memoized function sent to a worker) name the modules of
    its flat layout. Those names are served, for unpickling only, as views of the
    modules that hold the classes now; nothing else should import them."""

    MOVED: _t.ClassVar[dict[str, str]] = {
        "mlcache.memory": "mlcache.memo.memory",
        "mlcache.memorized": "mlcache.memo.func",
        "mlcache.results": "mlcache.memo.results",
    }

    def find_spec(self, name: str, path: _t.Any = None, target: _t.Any = None) -> _t.Any:
        if name not in self.MOVED:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self)

    def exec_module(self, module: _t.Any) -> None:
        import importlib

        now = importlib.import_module(self.MOVED[module.__name__])
        module.__getattr__ = lambda attr: getattr(now, attr)


_sys.meta_path.append(_MovedModules())

# a library's logger stays quiet until the application configures logging; the
# problems mlcache works around also arrive as CacheWarnings (see errors.warn)
_logging.getLogger("mlcache").addHandler(_logging.NullHandler())

__all__ = [
    "AuditPolicy",
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
    "NewerFormat",
    "NotMemorizedFunc",
    "NotMemorizedResult",
    "RegistryError",
    "StoreError",
    "UnhashableArgument",
    "UnknownBackend",
    "UnknownFormat",
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
