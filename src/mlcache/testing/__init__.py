"""Helpers for tests of mlcache and of its backends.

- :mod:`mlcache.testing.seaweedfs`: a real S3 server (:func:`seaweedfs`,
  :func:`s3_options`, :class:`ServerError`), for tests and benchmarks of shared
  caches;
- :mod:`mlcache.testing.stores`: :class:`~mlcache.testing.stores.StoreTests`, the
  conformance suite a store backend's tests subclass (it imports pytest).
"""

from __future__ import annotations

from .seaweedfs import ServerError, s3_options, seaweedfs

__all__ = ["ServerError", "s3_options", "seaweedfs"]
