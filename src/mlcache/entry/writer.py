"""Writing entries: :class:`EntryPlan` lays an entry out (its exact size is known
before a byte is written, so a size limit can make room first) and writes it.

The bytes are those of :mod:`mlcache.entry.format`. A write goes to the file
the store hands out (a temporary name published by one rename): a reader sees
a whole entry or none.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from typing import Any, BinaryIO

import numpy as np
import xxhash

from ..codecs import Encoded, codecs
from ..codecs.compression import Compression
from .format import (
    ALIGN,
    BLOCK_SUMS,
    CHUNK,
    CODE_SIGNED,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    SIGNATURE_SIZE,
    SIGNED,
    BlockSums,
    header_sum,
    n_blocks,
    pack_sums,
    pad,
    signed_message,
)
from .signing import Signer

__all__ = ["BLOCK_SIZE", "BLOCK_TABLE_MIN", "EntryPlan", "write_entry"]

#: payloads of at least this many bytes are written with a table of block checksums
BLOCK_TABLE_MIN = 16 << 20
#: the block size of the tables this writer makes (readers take any power of two
#: from ALIGN to 2**40)
BLOCK_SIZE = 4 << 20
#: payloads of at least this many bytes have their file's blocks reserved first
_PREALLOCATE_MIN = 16 << 20


def _as_bytes(seg: Any) -> memoryview:
    if isinstance(seg, np.ndarray):
        a = seg if seg.flags.c_contiguous else seg.T  # F-ordered: its transpose is C
        return memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    mv = memoryview(seg)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


_fallocate: Any = None


def _preallocate(f: BinaryIO, size: int) -> None:
    """Reserve the file's blocks before a large write (as numpy.save does): the
    file system then allocates once instead of growing the file chunk by chunk.
    Uses Linux's fallocate(2) directly: posix_fallocate would emulate it on file
    systems without support by writing every block. Best effort."""
    global _fallocate
    if not sys.platform.startswith("linux"):
        return
    try:
        if _fallocate is None:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _fallocate = libc.fallocate
            _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _fallocate(f.fileno(), 0, 0, size)  # errors (EOPNOTSUPP, ENOSPC) are ignored
    except (OSError, AttributeError, ValueError):
        _fallocate = False if _fallocate is None else _fallocate


def _write_all(f: BinaryIO, data: memoryview) -> None:
    while data:
        n = f.write(data)
        if n is None or n <= 0:
            raise OSError("short write")
        data = data[n:]


class EntryPlan:
    """One entry laid out and ready to write: :attr:`size` is its exact size in
    bytes (a size limit can make room for it first), :meth:`write` writes it.

    With ``signer`` the entry is signed for the store name ``name`` (an entry
    moved to another name no longer verifies); when ``codec`` may run code when
    decoding (not a safe codec), its segment 0, where such a codec keeps
    everything that runs code, is covered by the signature too."""

    def __init__(
        self,
        codec: str,
        encoded: Encoded,
        info: dict[str, Any],
        compression: Compression | None = None,
        signer: Signer | None = None,
        name: str = "",
    ) -> None:
        raws = [_as_bytes(s) for s in encoded.segments]
        datas = (
            [memoryview(compression.compress(r)) for r in raws] if compression is not None else raws
        )
        seg_table = []
        pos = 0
        for d in datas:
            seg_table.append([pos, d.nbytes])
            pos += d.nbytes + pad(d.nbytes)
        layout = {
            "codec": codec,
            "c": encoded.layout,
            "seg": seg_table,
            "z": None if compression is None else [compression.name, compression.level],
            "raw": [r.nbytes for r in raws],
        }
        self._layout_b = json.dumps(layout, separators=(",", ":")).encode()
        self._info_b = json.dumps(info, separators=(",", ":"), default=str).encode()
        self._datas = datas
        self._signer, self._name = signer, name
        self._flags = 0
        if signer is not None:
            safe = codec in codecs and codecs[codec].safe
            self._flags = SIGNED if safe or not datas else SIGNED | CODE_SIGNED
        # a large payload gets a table of block checksums, so that a mapped read
        # can check it on all cores; read as globals, so that fixtures can be small
        self._block = BLOCK_SIZE if pos >= BLOCK_TABLE_MIN else 0
        self._meta_end = HEADER.size + len(self._layout_b) + len(self._info_b)
        self._table_end = self._meta_end
        if self._block:
            self._flags |= BLOCK_SUMS
            self._table_end += 8 + 8 * n_blocks(pos, self._block)
        sig_end = self._table_end + (SIGNATURE_SIZE if self._flags & SIGNED else 0)
        self._payload_off = sig_end + pad(sig_end)
        self._payload_len = pos
        #: the entry's size in bytes
        self.size = self._payload_off + self._payload_len

    def write(self, f: BinaryIO) -> int:
        """Write the entry to the seekable binary file ``f``; return its size."""
        datas, layout_b, info_b = self._datas, self._layout_b, self._info_b
        if self._payload_len >= _PREALLOCATE_MIN:
            _preallocate(f, self.size)
        f.write(bytes(HEADER.size))
        # zeros where the block table and the signature go, then up to the payload
        f.write(layout_b + info_b + bytes(self._payload_off - self._meta_end))
        sums = BlockSums(self._block)
        zeros = bytes(ALIGN)
        for d in datas:
            for start in range(0, d.nbytes, CHUNK):
                chunk = d[start : start + CHUNK]
                sums.update(chunk)  # hash then write while the chunk is in the CPU cache
                _write_all(f, chunk)
            gap = zeros[: pad(d.nbytes)]
            sums.update(gap)
            f.write(gap)
        table = b""
        if self._block:
            # the payload checksum is then the xxh3-64 of the table: each byte of
            # the payload is hashed once, as without a table
            table = struct.pack("<Q", self._block) + pack_sums(sums.digests())
            payload_sum = xxhash.xxh3_64_intdigest(table)
        else:
            payload_sum = sums.digests()[0]
        fields = [MAGIC, FORMAT_VERSION, self._flags, len(layout_b), len(info_b), len(datas)]
        fields += [self._payload_off, self._payload_len, payload_sum]
        head = HEADER.pack(*fields, 0, 0)
        meta = layout_b + info_b + table
        f.seek(0)
        f.write(HEADER.pack(*fields, header_sum(head[:48], meta), 0))
        if table:
            f.seek(self._meta_end)
            f.write(table)
        if self._signer is not None:
            code = hashlib.sha256(datas[0]).digest() if self._flags & CODE_SIGNED else b""
            mac = self._signer.sign(signed_message(head[:48], meta, self._name, code))
            f.seek(self._table_end)
            f.write(self._signer.key_id + mac)
        return self.size


def write_entry(
    f: BinaryIO,
    codec: str,
    encoded: Encoded,
    info: dict[str, Any],
    compression: Compression | None = None,
    signer: Signer | None = None,
    name: str = "",
) -> int:
    """Write one entry to the seekable binary file ``f``; return its size in bytes
    (see :class:`EntryPlan`)."""
    return EntryPlan(codec, encoded, info, compression, signer, name).write(f)
