"""The entry file format of the function cache: the byte table, its constants,
and the parsing of an entry's header (one file per cached call).

:mod:`mlcache.entry.writer` writes these bytes and :mod:`mlcache.entry.reader`
reads them; nothing else does. ``docs/format.md`` holds the same table. All
integers are little-endian.

========  ======  ===========================================================
offset    size    field
========  ======  ===========================================================
0         8       magic ``b"\\x93MLCACHE"``
8         2       format version (u16), currently 1; a reader meeting a
                  higher one stops there (UnknownFormat: a newer writer's
                  entry, kept), so a change an older reader cannot follow
                  bumps it
10        2       flags (u16): 1 signed, 2 the signature covers segment 0 too,
                  4 a block table follows the info
12        4       layout length L (u32): JSON, how to decode the payload
16        4       info length I (u32): JSON, metadata (time, duration, args)
20        4       segment count (u32)
24        8       payload offset P (u64), a multiple of 64
32        8       payload length N (u64)
40        8       xxh3-64 of the payload bytes [P, P+N); with flag 4, xxh3-64
                  of the block table
48        8       xxh3-64 of layout + info (+ block table), seeded with the
                  xxh3-64 of bytes [0, 48)
56        8       reserved, zero
64        L       layout JSON: ``{"codec", "c": codec layout, "seg": [[off, len], ...],
                  "z": compression or null, "raw": [uncompressed len, ...]}``
64+L      I       info JSON
64+L+I    T       flag 4 only, the block table: block size B (u64, a power of
                  two from 64 to 2**40), then ceil(N / B) xxh3-64 (u64), one per
                  B-byte block of the payload (the last one shorter);
                  T = 8 + 8 * ceil(N / B), else T = 0
64+L+I+T  40      signed entries only: key id (8) and HMAC-SHA256 (32) of bytes
                  [0, 48) + layout + info + block table + the entry's name
                  (+ SHA-256 of segment 0 when flag 2 is set)
...               zero padding up to P
P         N       segments, each at a 64-byte aligned offset (relative to P),
                  zero padding between them
========  ======  ===========================================================

Writers add the block table (B = :data:`mlcache.entry.writer.BLOCK_SIZE`,
4 MiB) to payloads of at least :data:`mlcache.entry.writer.BLOCK_TABLE_MIN`
(16 MiB); smaller entries are byte for byte as before. Readers read entries
with and without it.

Signed entries (:mod:`mlcache.entry.signing`)
    The signature covers the header (with the payload's checksum), the layout,
    the info, the block table and the entry's name (:func:`signed_message`),
    and the whole of segment 0 of entries whose codec runs code when decoding
    (the pickle stream; flag 2). Other segments (raw arrays, a pickle's
    out-of-band buffers) are bound to the signature only through their signed
    xxh3 checksums (of the payload, or of each block).
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any, BinaryIO, NamedTuple

import xxhash

from ..codecs.compression import Compression, compressors
from ..errors import ConfigError, EntryCorrupted, NewerFormat, UnknownFormat
from .signing import KEY_ID_SIZE, MAC_SIZE

__all__ = [
    "ALIGN",
    "BLOCK_SUMS",
    "CHUNK",
    "CODE_SIGNED",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "SIGNATURE_SIZE",
    "SIGNED",
    "BlockSums",
    "Header",
    "Layout",
    "complete_head",
    "header_sum",
    "n_blocks",
    "pack_sums",
    "pad",
    "signed_message",
]

MAGIC = b"\x93MLCACHE"
FORMAT_VERSION = 1
ALIGN = 64
HEADER = struct.Struct("<8sHHIII QQQQQ")  # 64 bytes
assert HEADER.size == 64
#: header flags: the entry is signed; its segment 0 (code) is covered too; a table
#: of block checksums follows the info
SIGNED, CODE_SIGNED, BLOCK_SUMS = 1, 2, 4
_KNOWN_FLAGS = SIGNED | CODE_SIGNED | BLOCK_SUMS
#: the signature that follows the info: the signing key's id, then the MAC
SIGNATURE_SIZE = KEY_ID_SIZE + MAC_SIZE
#: the largest block size a block table may give
_BLOCK_MAX = 1 << 40
#: writer and reader checksum and copy in chunks of this size, which stay in the
#: CPU cache between the two passes
CHUNK = 1 << 20


def pad(n: int) -> int:
    """How many zero bytes follow ``n`` bytes to reach the next 64-byte boundary."""
    return -n % ALIGN


class BlockSums:
    """xxh3-64 of each ``block``-byte block of a stream fed in pieces of any size
    (of the whole stream, as one digest, when ``block`` is 0)."""

    __slots__ = ("_block", "_filled", "_h", "_sums")

    def __init__(self, block: int) -> None:
        self._block, self._filled = block, 0
        self._h = xxhash.xxh3_64()
        self._sums: list[int] = []

    def update(self, data: Any) -> None:
        block = self._block
        if not block:
            self._h.update(data)
            return
        mv = memoryview(data)
        while mv.nbytes:
            take = mv[: block - self._filled]
            self._h.update(take)
            self._filled += take.nbytes
            mv = mv[take.nbytes :]
            if self._filled == block:
                self._sums.append(self._h.intdigest())
                self._h.reset()
                self._filled = 0

    def digests(self) -> list[int]:
        """The digests so far, the last (partial) block included."""
        if not self._block:
            return [self._h.intdigest()]
        if self._filled:
            self._sums.append(self._h.intdigest())
            self._h.reset()
            self._filled = 0
        return self._sums


def pack_sums(sums: list[int]) -> bytes:
    """Block digests as they are stored in a block table (u64 each)."""
    return struct.pack(f"<{len(sums)}Q", *sums)


def n_blocks(payload_len: int, block: int) -> int:
    """How many ``block``-byte blocks cover ``payload_len`` bytes (the last shorter)."""
    return -(-payload_len // block)


def valid_block(block: int) -> bool:
    """``block`` is a block size a block table may give (a power of two, 64 to 2**40)."""
    return ALIGN <= block <= _BLOCK_MAX and not block & (block - 1)


def signed_message(head48: bytes, meta: Any, name: str, code: bytes) -> bytes:
    """What the MAC covers (``docs/format.md``), as one buffer."""
    name_b = name.encode()
    return b"".join((head48, meta, len(name_b).to_bytes(4, "little"), name_b, code))


def header_sum(fixed: Any, body: Any) -> int:
    """xxh3-64 of the layout, info (and block table), seeded with xxh3-64 of the
    first 48 bytes."""
    return xxhash.xxh3_64_intdigest(body, seed=xxhash.xxh3_64_intdigest(fixed))


class Layout(NamedTuple):
    """An entry's layout JSON, checked: how to decode its payload."""

    codec: str
    codec_layout: dict[str, Any]
    seg: list[list[int]]
    raw: list[int]
    comp: Compression | None
    end: int  # where the last segment ends, relative to the payload


def _uints(x: Any, n: int) -> bool:
    """``x`` is a list of ``n`` non-negative ints (layouts are data: check, never trust)."""
    return type(x) is list and len(x) == n and all(type(i) is int and i >= 0 for i in x)


_CACHED_LAYOUT_MAX = 4096


def _parse_layout(data: bytes) -> Layout:
    """Parse and validate a layout; raise ``ValueError`` if it is not well formed.

    Hits of one function mostly share their layout, so small layouts are parsed
    once and shared (never mutated); large ones (a result of 100,000 floats) are
    not kept: the cache would hold them for ever."""
    if len(data) <= _CACHED_LAYOUT_MAX:
        return _parse_small_layout(data)
    return _parse_layout_uncached(data)


def _unregistered_compression(z: Any) -> bool:
    """``z`` is a well-formed ``[name, level]`` whose name could be registered but
    is not here (another process's compressor); anything else malformed is
    damage, said by :class:`Compression` itself."""
    return (
        type(z) is list
        and len(z) == 2
        and compressors.can_hold(z[0])
        and type(z[1]) is int
        and z[0] not in compressors
    )


#: the C scanner of a JSON decoder of our own: json.loads adds three Python calls
#: and two regex matches around it (~1 µs of a layout's ~2.6 µs)
_SCAN: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # (set in __init__)


def _json_value(text: str) -> Any:
    """The JSON value ``text`` holds (``ValueError`` if it holds anything else)."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # nothing at 0: space before it, or no JSON at all
        end = -1
    if end != len(text):  # space around it, or more after it: as json.loads says
        return json.loads(text)
    return value


def _parse_layout_uncached(data: bytes) -> Layout:
    # decoded as UTF-8 (what the writer writes): json.loads of bytes would first
    # guess among UTF-8, -16 and -32; bytes that are not UTF-8 are damage
    lay = _json_value(data.decode())
    if type(lay) is not dict:
        raise ValueError("not an object")
    try:
        codec, codec_layout, seg, raw, z = lay["codec"], lay["c"], lay["seg"], lay["raw"], lay["z"]
        if z is None:
            comp = None
        elif _unregistered_compression(z):
            raise UnknownFormat(
                f"written with the compression {z[0]!r}, which this process has not "
                "registered (mlcache.register_compressor)"
            )
        else:
            comp = Compression(z[0], z[1])
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"missing or malformed field ({exc})") from None
    if type(codec) is not str or type(codec_layout) is not dict:
        raise ValueError("bad codec fields")
    if type(seg) is not list or type(raw) is not list or len(raw) != len(seg):
        raise ValueError("bad segment table")
    end = 0  # one pass: a hit of a small entry parses its layout at its first read
    for x, r in zip(seg, raw):
        if not _uints(x, 2) or type(r) is not int or r < 0:
            raise ValueError("bad segment table")
        off, n = x
        if comp is None and n != r:
            raise ValueError("segment lengths do not match")
        if off + n > end:
            end = off + n
    return Layout(codec, codec_layout, seg, raw, comp, end)


_parse_small_layout = functools.lru_cache(maxsize=1024)(_parse_layout_uncached)


class Header:
    """The checked header of an entry: the fixed 64 bytes, the layout, the info,
    the block table and where the signature starts. ``head`` holds at least all
    of these (see :func:`complete_head`); anything that does not add up raises
    :class:`~mlcache.errors.EntryCorrupted` naming ``where``."""

    __slots__ = (
        "block",
        "flags",
        "head",
        "info_b",
        "layout",
        "meta_end",
        "n_seg",
        "payload_len",
        "payload_off",
        "payload_sum",
        "sums",
    )

    def __init__(self, head: bytes, where: str) -> None:
        if len(head) < HEADER.size:
            raise EntryCorrupted(f"{where}: truncated header ({len(head)} bytes)")
        magic, version, flags, lay_n, info_n, n_seg, p_off, p_len, p_sum, h_sum, _r = (
            HEADER.unpack_from(head)
        )
        if magic != MAGIC:
            raise EntryCorrupted(f"{where}: not an mlcache entry (bad magic)")
        if version > FORMAT_VERSION:
            # a newer mlcache's entry (a cache shared mid-upgrade): not damage, and
            # nothing after the version may mean here what it means there; unless it
            # is one of ours whose version field alone was damaged (its checksum
            # holds with our version): damage, removed and written again
            if _ours_but_version(head, where):
                raise EntryCorrupted(f"{where}: damaged format version {version}")
            raise NewerFormat(
                f"{where}: written by a newer mlcache (entry format version {version}; "
                f"this one reads version {FORMAT_VERSION}): upgrade mlcache to read it"
            )
        if version != FORMAT_VERSION:
            raise EntryCorrupted(f"{where}: unsupported entry format version {version}")
        if _r != 0:
            raise EntryCorrupted(f"{where}: reserved header bytes are not zero")
        if flags & ~_KNOWN_FLAGS or flags & (SIGNED | CODE_SIGNED) == CODE_SIGNED:
            raise EntryCorrupted(f"{where}: unknown header flags {flags:#x}")
        end = meta_end = HEADER.size + lay_n + info_n
        limit = min(len(head), p_off)
        self.block, self.sums = 0, b""
        if flags & BLOCK_SUMS:
            if end + 8 > limit:
                raise EntryCorrupted(f"{where}: header longer than the data read")
            (block,) = struct.unpack_from("<Q", head, end)
            if not valid_block(block):
                raise EntryCorrupted(f"{where}: bad block size {block}")
            meta_end += 8 + 8 * n_blocks(p_len, block)
            self.block = block
        if meta_end + (SIGNATURE_SIZE if flags & SIGNED else 0) > limit:
            raise EntryCorrupted(f"{where}: header longer than the data read")
        mv = memoryview(head)
        if header_sum(mv[:48], mv[HEADER.size : meta_end]) != h_sum:
            raise EntryCorrupted(f"{where}: header checksum mismatch")
        if self.block:
            if xxhash.xxh3_64_intdigest(mv[end:meta_end]) != p_sum:
                raise EntryCorrupted(f"{where}: the block table does not match the checksum")
            self.sums = head[end + 8 : meta_end]
        try:
            self.layout = _parse_layout(head[HEADER.size : HEADER.size + lay_n])
        except (ValueError, ConfigError) as exc:
            raise EntryCorrupted(f"{where}: bad layout ({exc})") from None
        if len(self.layout.seg) != n_seg or self.layout.end > p_len:
            raise EntryCorrupted(f"{where}: segment table does not match the header")
        self.info_b = head[HEADER.size + lay_n : end]
        #: where the layout, info and block table end (the signature starts there)
        self.head, self.meta_end, self.flags = head, meta_end, flags
        self.n_seg = n_seg
        self.payload_off = p_off
        self.payload_len = p_len
        self.payload_sum = p_sum


def _ours_but_version(head: bytes, where: str) -> bool:
    """``head`` is a whole, checked header of this format once its version field
    says :data:`FORMAT_VERSION` (the header checksum covers the version: a newer
    writer's header passes it with 2**-64 odds)."""
    try:
        Header(head[:8] + FORMAT_VERSION.to_bytes(2, "little") + head[10:], where)
    except (EntryCorrupted, UnknownFormat):
        return False
    return True


def _head_need(head: bytes) -> int:
    """How many bytes the header, layout, info, block table and signature take, as
    far as ``head`` (at least the fixed header) tells: a block table's length is
    known once its first 8 bytes (the block size) are in ``head``."""
    flags, lay_n, info_n = struct.unpack_from("<HII", head, 10)
    need = HEADER.size + lay_n + info_n
    if flags & BLOCK_SUMS:
        if len(head) < need + 8:
            return need + 8
        (block,) = struct.unpack_from("<Q", head, need)
        if valid_block(block):  # else the header check refuses it
            need += 8 + 8 * n_blocks(struct.unpack_from("<Q", head, 32)[0], block)
    return need + (SIGNATURE_SIZE if flags & SIGNED else 0)


def complete_head(head: bytes, size: int, fd: int, f: BinaryIO | None) -> bytes:
    """``head`` plus the rest of the layout, info, block table and signature when
    they are longer than the first read."""
    if len(head) < HEADER.size:
        return head
    for _ in range(2):  # twice when the block size itself was beyond the first read
        need = _head_need(head)
        if not len(head) < need <= size:
            break
        if f is None:
            head += os.pread(fd, need - len(head), len(head))
        else:
            f.seek(len(head))
            head += f.read(need - len(head))
    return head
