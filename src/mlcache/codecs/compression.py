"""Optional compression of entry segments (``Memory(compress=...)``), joblib-style.

``compress`` accepts what joblib accepts: ``False``/``0`` (off), ``True`` (zlib
level 3), an int 1-9 (zlib at that level), or ``(name, level)`` with name in
``zlib``, ``gzip``, ``bz2``, ``lzma``/``xz`` and, when installed, ``lz4``.
Compressed entries cannot be memory-mapped: they are decompressed into memory.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["Compression", "parse_compress"]


def _lz4() -> tuple[Callable[[bytes, int], bytes], Callable[[bytes], bytes]]:
    try:
        import lz4.frame as lz4f
    except ImportError:
        raise ConfigError("compress=('lz4', ...) needs the lz4 package: pip install lz4") from None
    return (lambda d, lvl: lz4f.compress(d, compression_level=lvl)), lz4f.decompress


_METHODS: dict[str, Callable[[], tuple[Callable[[Any, int], bytes], Callable[[Any], bytes]]]] = {
    "zlib": lambda: (lambda d, lvl: zlib.compress(d, lvl), zlib.decompress),
    "gzip": lambda: (lambda d, lvl: gzip.compress(d, lvl, mtime=0), gzip.decompress),
    "bz2": lambda: (lambda d, lvl: bz2.compress(d, lvl), bz2.decompress),
    "lzma": lambda: (lambda d, lvl: lzma.compress(d, preset=lvl), lzma.decompress),
    "xz": lambda: (lambda d, lvl: lzma.compress(d, preset=lvl), lzma.decompress),
    "lz4": _lz4,
}


@dataclass(frozen=True)
class Compression:
    """A compression method and level, e.g. ``Compression("zlib", 3)``."""

    name: str
    level: int

    def __post_init__(self) -> None:
        if self.name not in _METHODS:
            raise ConfigError(
                f"unknown compression {self.name!r}; expected one of {', '.join(_METHODS)}"
            )
        if not 0 <= self.level <= 9:
            raise ConfigError(f"compression level must be in 0..9, got {self.level}")

    def compress(self, data: Any) -> bytes:
        return _METHODS[self.name]()[0](data, self.level)

    def decompress(self, data: Any) -> bytes:
        return _METHODS[self.name]()[1](data)


def parse_compress(compress: object) -> Compression | None:
    """Turn a joblib-style ``compress`` argument into a :class:`Compression` or None."""
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
