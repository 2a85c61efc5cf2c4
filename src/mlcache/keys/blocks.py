"""Large buffers hashed block by block, on all cores.

A buffer of many megabytes is hashed as the xxh3-128 digests of its fixed-size
blocks (the block tree of :mod:`mlcache.keys.hashing`), so that the blocks can
be hashed on several threads at once: xxhash releases the GIL. The digests do
not depend on how many threads computed them. The threads are
:func:`mlcache._util.hash_pool`'s, which the entry reader also uses
(:func:`mlcache._util.parallel_map`) to check large payloads' block tables.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

from .._util import hash_pool

__all__ = ["block_digests", "chunk_block_digests"]


def block_digests(mv: memoryview, block: int) -> bytes:
    """The xxh3-128 digests of the ``block``-byte blocks of the byte view ``mv``
    (the last one shorter), concatenated; computed in parallel."""
    blocks = [mv[i : i + block] for i in range(0, mv.nbytes, block)]
    pool = hash_pool()
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
