"""Optional compression of entry segments (``Memory(compress=...)``), joblib-style.

``compress`` accepts what joblib accepts: ``False``/``0`` (off), ``True`` (zlib
level 3), an int 1-9 (zlib at that level), or ``(name, level)`` with name in
``zlib``, ``gzip``, ``bz2``, ``lzma``/``xz`` and, when installed, ``lz4``
(:func:`parse_compress`, what ``Memory`` calls, refuses a method whose package is
missing: :class:`~mlcache.errors.ConfigError` naming the ``pip install``).
Compressed entries cannot be memory-mapped: they are decompressed into memory.

Methods live in :data:`compressors`, the one :class:`mlcache._registry.Registry`
kind used for stores and codecs too; :func:`register_compressor` adds one. The
name is what entries store (``"z": [name, level]``, ``docs/format.md``), so a
method's bytes must never change under its name.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._registry import Registry
from ..errors import ConfigError, InvalidRegistration

__all__ = [
    "Compression",
    "Compressor",
    "NeedsPackage",
    "compressors",
    "parse_compress",
    "register_compressor",
]


@runtime_checkable
class Compressor(Protocol):
    """One compression method: bytes-like in, ``bytes`` out."""

    def compress(self, data: Any, level: int) -> bytes:
        """``data`` compressed at ``level`` (0-9), deterministically."""
        ...

    def decompress(self, data: Any) -> bytes:
        """The bytes that :meth:`compress` was given."""
        ...


@runtime_checkable
class NeedsPackage(Protocol):
    """The power of a compressor whose package is an optional extra: say whether it
    can run here, before a setting naming it is accepted."""

    def require(self) -> None:
        """Raise :class:`~mlcache.errors.ConfigError` naming the ``pip install`` to
        run if the package is missing."""
        ...


class _Zlib:
    def compress(self, data: Any, level: int) -> bytes:
        return zlib.compress(data, level)

    def decompress(self, data: Any) -> bytes:
        return zlib.decompress(data)


class _Gzip:
    def compress(self, data: Any, level: int) -> bytes:
        return gzip.compress(data, level, mtime=0)  # no timestamp: the same bytes every time

    def decompress(self, data: Any) -> bytes:
        return gzip.decompress(data)


class _Bz2:
    def compress(self, data: Any, level: int) -> bytes:
        return bz2.compress(data, level)

    def decompress(self, data: Any) -> bytes:
        return bz2.decompress(data)


class _Lzma:
    def compress(self, data: Any, level: int) -> bytes:
        return lzma.compress(data, preset=level)

    def decompress(self, data: Any) -> bytes:
        return lzma.decompress(data)


class _Lz4:
    """lz4 frames; the package is an optional extra, imported on first use
    (:func:`parse_compress` refuses ``compress=("lz4", ...)`` without it; an entry
    written with lz4 and read without it says what to install)."""

    def require(self) -> None:
        self._module()

    def _module(self) -> Any:
        try:
            import lz4.frame as lz4f
        except ImportError:
            raise ConfigError(
                "compress=('lz4', ...) needs the lz4 package: pip install lz4"
            ) from None
        return lz4f

    def compress(self, data: Any, level: int) -> bytes:
        return self._module().compress(data, compression_level=level)

    def decompress(self, data: Any) -> bytes:
        return self._module().decompress(data)


def _check_compressor(obj: object) -> None:
    if isinstance(obj, type) or not isinstance(obj, Compressor):
        raise TypeError(
            f"{obj!r} is not a compressor: it needs compress(data, level) and decompress(data)"
        )


compressors: Registry[Compressor] = Registry("compression", _check_compressor)


def register_compressor(name: str, compressor: Compressor, *, replace: bool = False) -> None:
    """Make ``compress=(name, level)`` use ``compressor``.

    Raises :class:`~mlcache.errors.InvalidRegistration` for a bad name, an
    object without ``compress``/``decompress``, or a taken name (unless
    ``replace``).

    Examples
    --------
    >>> import zlib
    >>> class Raw:
    ...     def compress(self, data, level):
    ...         return zlib.compress(data, level, wbits=-15)
    ...     def decompress(self, data):
    ...         return zlib.decompress(data, wbits=-15)
    >>> register_compressor("rawdeflate", Raw())
    >>> Compression("rawdeflate", 6).decompress(Compression("rawdeflate", 6).compress(b"x" * 9))
    b'xxxxxxxxx'
    """
    if isinstance(compressor, str):  # the registry would take it for a lazy "module:attr"
        raise InvalidRegistration(
            f"cannot register compression {name!r}: {compressor!r} is not a compressor"
        )
    compressors.register(name, compressor, replace=replace)


for _name, _impl in (
    ("zlib", _Zlib()),
    ("gzip", _Gzip()),
    ("bz2", _Bz2()),
    ("lzma", _Lzma()),
    ("xz", _Lzma()),
    ("lz4", _Lz4()),
):
    compressors.register(_name, _impl)


@dataclass(frozen=True)
class Compression:
    """A compression method and level, e.g. ``Compression("zlib", 3)``."""

    name: str
    level: int
    # resolved once: entries are decompressed per hit, the registry is not asked
    _method: Compressor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in compressors:
            raise ConfigError(
                f"unknown compression {self.name!r}; expected one of {', '.join(compressors)}"
            )
        if not 0 <= self.level <= 9:
            raise ConfigError(f"compression level must be in 0..9, got {self.level}")
        object.__setattr__(self, "_method", compressors[self.name])

    def compress(self, data: Any) -> bytes:
        return self._method.compress(data, self.level)

    def decompress(self, data: Any) -> bytes:
        return self._method.decompress(data)


def parse_compress(compress: object) -> Compression | None:
    """Turn a joblib-style ``compress`` argument into a :class:`Compression` or None.

    Raises :class:`~mlcache.errors.ConfigError` for a setting that is not one, an
    unknown method, a level out of 0..9, or a method whose package is missing
    (``("lz4", 3)`` without lz4: the message names ``pip install lz4``), so a
    ``Memory`` is never made that would warn at every call and store nothing.
    """
    found = _parse(compress)
    method = compressors[found.name] if found is not None else None
    if isinstance(method, NeedsPackage):
        method.require()
    return found


def _parse(compress: object) -> Compression | None:
    if compress is None or compress is False or compress == 0:
        return None
    if compress is True:
        return Compression("zlib", 3)
    if isinstance(compress, int):
        return Compression("zlib", compress)
    if isinstance(compress, str):
        return Compression(compress, 3)
    if isinstance(compress, tuple) and len(compress) == 2:
        name, level = compress
        if isinstance(name, str) and isinstance(level, int) and not isinstance(level, bool):
            return None if level == 0 else Compression(name, level)
    raise ConfigError(
        f"compress must be a bool, an int 0-9, a method name or a (name, level) tuple; "
        f"got {compress!r}"
    )
