"""Settings as frozen, keyword-only dataclasses, validated when made."""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._audit import AuditPolicy, audit_policy
from .._util import parse_bytes
from ..codecs.compression import Compression, parse_compress
from ..errors import ConfigError, ConfigTypeError, UnknownBackend, warn
from ..keys.code_version import CODE_MODES
from ..store import Store, backend_for, stores

__all__ = [
    "MMAP_MODES",
    "MemoryConfig",
    "check_callback",
    "check_mmap_mode",
    "open_store",
    "split_options",
]

#: accepted ``mmap_mode`` values (``"w+"`` would truncate the cached file)
MMAP_MODES = (None, "r", "r+", "c")


def _verbosity(verbose: Any) -> int:
    """``verbose`` as an int: None and False are 0; a float is truncated (joblib
    compares it with numbers, so any number works there); anything else is refused
    (:class:`~mlcache.errors.ConfigTypeError`, a ``TypeError`` and a ``ValueError``)."""
    if verbose is None:
        return 0
    if isinstance(verbose, int) or (isinstance(verbose, float) and math.isfinite(verbose)):
        return int(verbose)
    raise ConfigTypeError(f"verbose must be an int (0 silent, 1, 10), got {verbose!r}")


def _options(options: Any) -> Any:
    """``backend_options`` as a new dict (None: empty); anything that is not a mapping
    is passed on for ``MemoryConfig`` to refuse."""
    if options is None:
        return {}
    return dict(options) if isinstance(options, Mapping) else options


def split_options(factory: Any, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the ``backend_options`` the store class ``factory`` takes, the names of those
    it does not take). joblib passes every option on and its backends ignore what
    they do not know, so code written for it may pass more than a backend takes;
    a factory taking ``**kwargs`` (or whose signature is unknown) takes them all."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return options, []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return options, []
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in options.items() if k in named}, sorted(set(options) - named)


def check_callback(callback: Any) -> Any:
    """``callback`` (a ``cache_validation_callback``) if it is None or callable."""
    if callback is not None and not callable(callback):
        # joblib's wording and ValueError; a TypeError too, as mlcache raised before
        raise ConfigTypeError(
            "cache_validation_callback needs to be callable. "
            f"Got {callback!r} ({type(callback).__name__})."
        )
    return callback


def check_mmap_mode(mode: Any) -> str | None:
    if mode not in MMAP_MODES:
        raise ConfigError(
            f"mmap_mode must be one of None, 'r', 'r+', 'c'; got {mode!r}"
            + (" ('w+' would truncate the cached file)" if mode == "w+" else "")
        )
    return mode


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Everything a :class:`~mlcache.Memory` was configured with, validated."""

    location: str | None
    backend: str = "local"
    mmap_mode: str | None = None
    compress: Compression | None = None
    verbose: int = 1
    bytes_limit: int | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    allow_pickle: bool = True
    code: str = "transitive"
    #: how the cache checks itself (None: it does not; see :mod:`mlcache.memo.audit`)
    audit: AuditPolicy | None = None

    def __post_init__(self) -> None:
        if self.location is not None and not isinstance(self.location, str):
            raise TypeError(f"location must be a str or os.PathLike, got {self.location!r}")
        if not isinstance(self.backend, str):
            raise TypeError(f"backend must be a str, got {type(self.backend).__name__}")
        check_mmap_mode(self.mmap_mode)
        if not isinstance(self.verbose, int):
            raise ConfigTypeError(f"verbose must be an int, got {self.verbose!r}")
        if not isinstance(self.backend_options, dict):
            raise ConfigTypeError(
                f"backend_options must be a dict, got {type(self.backend_options).__name__}: "
                f"{self.backend_options!r}"
            )
        if self.code not in CODE_MODES:
            raise ConfigError(f"code must be one of {', '.join(CODE_MODES)}; got {self.code!r}")

    @classmethod
    def make(
        cls,
        location: Any,
        backend: str,
        mmap_mode: Any,
        compress: Any,
        verbose: Any,
        bytes_limit: Any,
        backend_options: Any,
        allow_pickle: bool,
        code: str = "transitive",
        audit: Any = True,
    ) -> MemoryConfig:
        if location is not None:
            if not isinstance(location, (str, os.PathLike)):
                raise TypeError(
                    f"location must be None, a str or a pathlib.Path, got {type(location).__name__}"
                )
            location = os.fspath(location)
            backend = backend_for(location, backend)
        return cls(
            location=location,
            backend=backend,
            mmap_mode=mmap_mode,
            compress=parse_compress(compress),
            verbose=_verbosity(verbose),
            bytes_limit=parse_bytes(bytes_limit),
            backend_options=_options(backend_options),
            allow_pickle=bool(allow_pickle),
            code=code,
            audit=audit_policy(audit),
        )


def open_store(c: MemoryConfig) -> Store:
    """The store of ``c``'s location; options its backend does not take are
    ignored with one warning, as joblib ignores them."""
    try:
        factory = stores[c.backend]
    except UnknownBackend as exc:  # joblib's words first: code may match on them
        raise UnknownBackend(
            f"Unknown location {c.location} or backend {c.backend}: {exc}"
        ) from None
    options, unknown = split_options(factory, c.backend_options)
    if unknown:
        warn(
            f"mlcache: the store backend {c.backend!r} takes no backend_options "
            f"{', '.join(map(repr, unknown))}; ignored",
            stacklevel=4,
        )
    try:
        store: Store = factory(c.location, **options)
    except TypeError as exc:
        if not options:  # e.g. joblib's own error for an incomplete joblib backend
            raise
        raise TypeError(f"backend {c.backend!r} rejected backend_options: {exc}") from None
    return store
