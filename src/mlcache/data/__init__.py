"""Datasets: pack many samples into one memory-mapped file (:func:`pack`) and read
them back with random access (:func:`open_pack`, :class:`PackedDataset`). The
byte layout is in :mod:`mlcache.data.format` and ``docs/format.md``.

The modules, bottom up: ``format`` (the bytes), ``regions`` (checked regions and
the generated sample reader), ``reader`` (:class:`PackedDataset`), ``writer``
(one pack file), ``shards`` (a sharded pack: plain packs and a manifest, built
on the reader and the writer), ``fetch`` (local copies of remote packs),
``sources`` and ``workers`` (what :class:`CachedDataset` keys and builds with),
``cached`` (:class:`CachedDataset`). The two functions below choose between a
plain and a sharded pack, above both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, overload

from ..errors import PackChanged, PackCorrupted
from .cached import CachedDataset
from .format import BLOCK
from .reader import SHARDS_SUFFIX, Pack, PackedDataset
from .shards import ShardedDataset, pack_sharded, pack_with_dask
from .sql import SqlSource, from_sql
from .writer import write_pack

__all__ = [
    "CachedDataset",
    "Pack",
    "PackChanged",
    "PackCorrupted",
    "PackedDataset",
    "ShardedDataset",
    "SqlSource",
    "from_sql",
    "open_pack",
    "pack",
    "pack_with_dask",
]


def open_pack(
    path: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    storage_options: dict[str, Any] | None = None,
    local_cache_dir: str | None = None,
    fetch: str = "whole",
    writable: bool = True,
) -> PackedDataset | ShardedDataset:
    """Open a pack, plain or sharded, by its path or URL: a sharded pack's manifest
    (``*.shards``) as a :class:`ShardedDataset`, any other file as a
    :class:`PackedDataset`. The parameters are :class:`PackedDataset`'s.

    >>> import tempfile, os
    >>> where = os.path.join(tempfile.mkdtemp(), "d.shards")
    >>> _ = pack(({"y": i} for i in range(10)), where, shard_size="64B", progress=False)
    >>> ds = open_pack(where)
    >>> type(ds).__name__, len(ds), ds[9]["y"]
    ('ShardedDataset', 10, 9)
    """
    options: dict[str, Any] = {
        "allow_pickle": allow_pickle,
        "storage_options": storage_options,
        "local_cache_dir": local_cache_dir,
        "fetch": fetch,
        "writable": writable,
    }
    if os.fspath(path).endswith(SHARDS_SUFFIX):
        return ShardedDataset(path, **options)
    return PackedDataset(path, **options)


@overload
def pack(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    progress: bool = ...,
    allow_pickle: bool = ...,
    block_size: int = ...,
    storage_options: dict[str, Any] | None = ...,
    local_cache_dir: str | None = ...,
    shard_size: None = None,
) -> PackedDataset: ...


@overload
def pack(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    progress: bool = ...,
    allow_pickle: bool = ...,
    block_size: int = ...,
    storage_options: dict[str, Any] | None = ...,
    local_cache_dir: str | None = ...,
    shard_size: int | str,
) -> ShardedDataset: ...


def pack(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    progress: bool = True,
    allow_pickle: bool = False,
    block_size: int = BLOCK,
    storage_options: dict[str, Any] | None = None,
    local_cache_dir: str | None = None,
    shard_size: int | str | None = None,
) -> PackedDataset | ShardedDataset:
    """Write ``samples`` (dicts of named fields) into the pack file ``path``.

    Returns the :class:`PackedDataset` opened on it. With ``shard_size``
    (``"1GB"``), ``path`` must end in ``.shards``: the samples are written as
    shards of about that size beside it, and ``path`` is their manifest (see
    :mod:`mlcache.data.shards`); the :class:`ShardedDataset` opened on it is
    returned.

    Numbers of different types in one field promote as numpy does, None is
    missing, a float NaN is a value in a number field and missing elsewhere (the
    rules: :mod:`mlcache.data.writer`). Raises ``ValueError`` for an empty
    source, ``TypeError`` naming the sample, the field and both kinds when a
    value does not fit the field (a str then an array), ``ValueError`` for a
    change of dimensions or an integer a float field cannot hold exactly, and
    :class:`~mlcache.UnsupportedValue` for values that need pickle when
    ``allow_pickle`` is false; each at the sample concerned, before the rest of
    the source is read, leaving no file behind.

    ``block_size`` (a power of two, default 4 MiB) is the unit of checksumming:
    a reader verifies each block the first time it touches it, so smaller blocks
    make the first random reads of a large pack cheaper and the checksum table
    longer.

    ``path`` may be an fsspec URL (``s3://bucket/x.pack``): the pack is written
    where its local copy goes (``local_cache_dir``, as for
    :class:`PackedDataset`), then uploaded with ``storage_options`` (a sharded
    pack is written to local paths only).

    >>> import numpy as np, tempfile, os
    >>> ds = pack(({"x": np.arange(i), "y": i} for i in range(3)),
    ...           os.path.join(tempfile.mkdtemp(), "d.pack"), progress=False)
    >>> len(ds), ds[2]["x"].tolist(), ds[2]["y"]
    (3, [0, 1], 2)
    """
    options: dict[str, Any] = {
        "progress": progress,
        "allow_pickle": allow_pickle,
        "block_size": block_size,
    }
    if shard_size is not None:
        if storage_options is not None or local_cache_dir is not None:
            raise ValueError("a sharded pack is written to a local path: no storage_options")
        return pack_sharded(samples, path, shard_size=shard_size, **options)
    if os.fspath(path).endswith(SHARDS_SUFFIX):  # said before the source is read
        raise ValueError(
            f"{os.fspath(path)!r} names a sharded pack's manifest ({SHARDS_SUFFIX}): give "
            "shard_size= to write shards, or another name for one pack file"
        )
    return write_pack(
        samples, path, storage_options=storage_options, local_cache_dir=local_cache_dir, **options
    )
