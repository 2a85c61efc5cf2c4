"""Reading a payload into fresh memory, checked as it is read.

A read into memory (``mmap_mode=None``) copies the payload from the file into a
fresh array (``numpy.empty``: no zero-fill pass; numpy asks for huge pages for
large arrays) and checksums it one :data:`~mlcache.entry.format.CHUNK` at a time,
while each chunk is still in the CPU cache, instead of a read and then a second
pass over the bytes. The payload of an entry with a block table (large entries,
:mod:`mlcache.entry.format`) is read and checked block by block on the hashing
threads (:func:`mlcache._util.hash_pool`, all cores; ``os.preadv`` and xxhash
release the GIL), each thread taking the next block when it is done with one, so
a core busy with other work only slows its share. The caller compares the
digests with the entry's before it uses a byte.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import BinaryIO

import numpy as np
import xxhash

from .._util import hash_pool
from ..errors import EntryCorrupted
from .format import CHUNK, BlockSums

__all__ = ["read_payload"]


def read_payload(
    fd: int, f: BinaryIO | None, offset: int, length: int, block: int, where: str
) -> tuple[np.ndarray, list[int]]:
    """The ``length`` bytes at ``offset`` of the file (the descriptor ``fd``, or the
    open file ``f`` when it is not None) in a fresh writable array, with the xxh3-64
    digest of each ``block``-byte block (one of the whole payload when ``block`` is
    0). A file that ends early raises :class:`EntryCorrupted`."""
    buf = np.empty(length, dtype=np.uint8)
    mv = memoryview(buf)  # type: ignore[arg-type]
    pool = hash_pool() if f is None and block and length > block else None
    if pool is None:
        return buf, _read_in_order(fd, f, mv, offset, block, where)
    futures: list[concurrent.futures.Future[int]] = []
    try:
        try:
            for start in range(0, length, block):
                view = mv[start : start + block]
                futures.append(pool.submit(_read_block, fd, view, offset + start, where))
        except RuntimeError:  # the pool is shut down (the interpreter is exiting)
            concurrent.futures.wait(futures)
            return buf, _read_in_order(fd, None, mv, offset, block, where)
        return buf, [future.result() for future in futures]
    finally:
        # on an error, no thread may still be reading through fd once the caller
        # closes it: drop the blocks not started, wait for those running
        for future in futures:
            future.cancel()
        concurrent.futures.wait(futures)


def _read_block(fd: int, dest: memoryview, pos: int, where: str) -> int:
    """Read ``dest.nbytes`` bytes at ``pos`` of ``fd`` into ``dest``, a chunk at a
    time, and return their xxh3-64 digest (each chunk hashed while it is hot)."""
    h = xxhash.xxh3_64()
    got, size = 0, dest.nbytes
    while got < size:
        chunk = dest[got : got + CHUNK]
        n = os.preadv(fd, [chunk], pos + got)
        if not n:
            raise EntryCorrupted(f"{where}: truncated payload")
        h.update(chunk[:n])
        got += n
    return h.intdigest()


def _read_in_order(
    fd: int, f: BinaryIO | None, mv: memoryview, offset: int, block: int, where: str
) -> list[int]:
    """Read into ``mv`` on this thread, in order; the digests of its blocks."""
    sums = BlockSums(block)
    got, length = 0, mv.nbytes
    while got < length:
        chunk = mv[got : got + CHUNK]
        if f is None:
            n = os.preadv(fd, [chunk], offset + got)
        else:
            f.seek(offset + got)
            n = f.readinto(chunk)  # type: ignore[attr-defined]
        if not n:
            raise EntryCorrupted(f"{where}: truncated payload")
        sums.update(chunk[:n])
        got += n
    return sums.digests()
