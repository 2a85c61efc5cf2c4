"""Large buffers hashed block by block, on all cores.

A buffer of many megabytes is hashed as the xxh3-128 digests of its fixed-size
blocks (the block tree of :mod:`mlcache.keys.hashing`), so that the blocks can
be hashed on several threads at once: xxhash releases the GIL. The digests do
not depend on how many threads computed them. :func:`parallel_map` lends the
same threads to the entry reader, which checks large payloads' block tables.

This module needs nothing of mlcache: only threads and xxhash.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

__all__ = ["block_digests", "chunk_block_digests", "parallel_map"]

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """Threads for hashing blocks (xxhash releases the GIL); None on one core."""
    global _pool
    workers = min(os.cpu_count() or 1, 8)
    if workers < 2:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="mlcache-hash"
            )
        return _pool


def _forget_pool() -> None:  # a forked child inherits neither the threads nor a free lock
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def block_digests(mv: memoryview, block: int) -> bytes:
    """The xxh3-128 digests of the ``block``-byte blocks of the byte view ``mv``
    (the last one shorter), concatenated; computed in parallel."""
    blocks = [mv[i : i + block] for i in range(0, mv.nbytes, block)]
    pool = _hash_pool()
    digests = (
        pool.map(xxhash.xxh3_128_digest, blocks) if pool else map(xxhash.xxh3_128_digest, blocks)
    )
    return b"".join(digests)


def chunk_block_digests(chunks: Iterable[memoryview], block: int) -> bytes:
    """:func:`block_digests` of the concatenation of the byte views ``chunks``,
    fed in order without making the concatenation (one thread)."""
    out = []
    h = xxhash.xxh3_128()
    filled = 0
    for chunk in chunks:
        while chunk.nbytes:
            take = chunk[: block - filled]
            h.update(take)
            filled += take.nbytes
            chunk = chunk[take.nbytes :]
            if filled == block:
                out.append(h.digest())
                h, filled = xxhash.xxh3_128(), 0
    if filled:
        out.append(h.digest())
    return b"".join(out)


def parallel_map(func: Callable[[memoryview], Any], blocks: list[memoryview]) -> list[Any]:
    """``[func(b) for b in blocks]``, run on the hashing threads (all cores) when
    there are several blocks; ``func`` should release the GIL, as xxhash's do.
    The entry reader checks large payloads' block tables with it."""
    pool = _hash_pool() if len(blocks) > 1 else None
    return list(pool.map(func, blocks)) if pool else [func(b) for b in blocks]
