"""Datasets: pack many samples into one memory-mapped file (``pack``) and read them
back with random access (``PackedDataset``). The byte layout is in
:mod:`mlcache.data.format` and ``docs/format.md``."""

from __future__ import annotations

from ..errors import PackChanged, PackCorrupted
from .cached import CachedDataset
from .reader import PackedDataset
from .shards import ShardedDataset, pack_with_dask
from .sql import SqlSource, from_sql
from .writer import pack

__all__ = [
    "CachedDataset",
    "PackChanged",
    "PackCorrupted",
    "PackedDataset",
    "ShardedDataset",
    "SqlSource",
    "from_sql",
    "pack",
    "pack_with_dask",
]
