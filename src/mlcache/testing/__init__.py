"""Helpers for tests of mlcache and of its backends.

- :class:`StoreTests` (:mod:`mlcache.testing.stores`): the conformance suite a
  store backend's tests subclass, for a backend made for
  :func:`mlcache.register_store_backend`;
- :class:`CodecTests` (:mod:`mlcache.testing.codecs`): the same for a codec made
  for :func:`mlcache.register_codec`;
- :class:`MemoryStore`: a store that keeps its entries in this process's memory
  (backend ``"memory"``), for tests that need a store and no disk;
- :func:`seaweedfs`, :func:`s3_options`, :class:`ServerError`
  (:mod:`mlcache.testing.seaweedfs`): a real S3 server, for tests and benchmarks
  of shared caches.

The two suites import pytest, so they are loaded on first use: importing
``mlcache.testing`` needs no test framework.

>>> from mlcache.testing import MemoryStore
>>> store = MemoryStore("memory://example")
>>> with store.write("a/b") as f:
...     _ = f.write(b"data")
>>> store.open("a/b").read()
b'data'
"""

from __future__ import annotations

from typing import Any

from ..store.memory import MemoryStore
from .seaweedfs import ServerError, s3_options, seaweedfs

__all__ = ["CodecTests", "MemoryStore", "ServerError", "StoreTests", "s3_options", "seaweedfs"]


def __getattr__(name: str) -> Any:
    if name == "StoreTests":
        from .stores import StoreTests

        return StoreTests
    if name == "CodecTests":
        from .codecs import CodecTests

        return CodecTests
    raise AttributeError(f"module 'mlcache.testing' has no attribute {name!r}")
