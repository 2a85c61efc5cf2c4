"""The pack file format (``.pack``): many samples in one memory-mappable file.

This module alone defines these bytes; ``docs/format.md`` holds the same
table. All integers are little-endian.

========  ======  ===========================================================
offset    size    field
========  ======  ===========================================================
0         8       magic ``b"\\x93MLCPACK"``
8         2       format version (u16), currently 1
10        2       flags (u16), 0
12        4       reserved, zero
16        8       sample count N (u64)
24        8       index offset (u64), a multiple of 64
32        8       index length in bytes (u64)
40        8       xxh3-64 of the index bytes
48        8       xxh3-64 of bytes [0, 48)
56        8       reserved, zero
64        ...     regions, each at a 64-byte aligned offset
...               the index (JSON), last
========  ======  ===========================================================

The index describes one entry per field, in the order of the first sample::

    {"version": 1, "n": N, "block": B, "fields": [
       {"name": "vitals", "kind": "ragged", "dtype": "<f4", "ndim": 2,
        "data": R, "offsets": R, "shapes": R},
       {"name": "label", "kind": "column", "dtype": "<i8", "shape": [], "data": R},
       ...]}

where every ``R`` is a region ``{"off": absolute offset, "len": bytes,
"sums": [xxh3-64 of each block of B bytes]}``. Kinds:

* ``column``: every sample has the same dtype and shape; ``data`` holds an
  array of shape ``[N, *shape]`` (so a batch is one fancy-indexing read).
  Python ints, floats and bools are columns of int64, float64 and bool.
* ``ragged``: same dtype and ndim, varying shape; ``data`` holds the arrays
  back to back, ``offsets`` is int64 ``[N + 1]`` (bytes into ``data``),
  ``shapes`` int64 ``[N, ndim]``. ``str`` (UTF-8) and ``bytes`` values are
  ragged uint8 with kind ``str`` / ``bytes``.
* ``none``: the field is ``None`` in every sample (no region).
* ``strs``: a list of ``str`` per sample: ``data`` holds every string (UTF-8)
  back to back, ``offsets`` is int64 ``[N + 1]`` counting *strings* (sample
  ``j`` holds strings ``offsets[j]`` to ``offsets[j + 1]``), ``ends`` int64
  ``[M + 1]`` the byte end of each of the M strings in ``data`` (``ends[0]``
  is 0).
* ``dict``: a dict per sample, the same keys in each: no ``data``; ``fields``
  lists one entry per key (``name`` the key), of any kind, ``dict`` too (at
  most 32 deep), read back as ``{name: value, ...}``.
* ``tensor``: a ``torch.Tensor`` per sample: ``fields`` holds one entry, an
  array field (``column`` or ``ragged``) of the elements; ``view``, when
  present, names the torch dtype (``bfloat16``, ``float8_*``) of which those
  (same-size integers) are the bits.
* ``pickle``: ragged bytes holding pickles (only with ``allow_pickle=True``).

A list of numbers is stored as the array it makes (``column`` or ``ragged``).
``strs``, ``dict`` and ``tensor`` came after the first release of version 1: a reader
that predates them refuses such a pack (``PackCorrupted``, unknown kind),
and every pack without them reads as before.

A field that is ``None`` in some samples only adds a region ``valid`` (uint8
``[N]``, 1 where the sample has a value); those samples hold a placeholder.

A pack whose format version is higher than this reader's was written by a
newer mlcache (:class:`~mlcache.errors.NewerFormat`, not damage): it is never
removed nor replaced by this one, which builds its own beside it.

The header is written last: a file whose build was interrupted has no valid
header and cannot be opened, and a build writes to a temporary name anyway.
Regions are checked block by block (``B`` bytes, a power of two, default
4 MiB) the first time a block is read, so opening is O(1) and a damaged block
is never returned.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import xxhash

from ..errors import NewerFormat, PackCorrupted

__all__ = [
    "ALIGN",
    "BLOCK",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "is_newer_pack",
    "newer_version",
    "pack_header",
]

MAGIC = b"\x93MLCPACK"
FORMAT_VERSION = 1
ALIGN = 64
BLOCK = 4 << 20
HEADER = struct.Struct("<8sHHIQQQQQQ")
assert HEADER.size == 64


def pad(n: int) -> int:
    """Bytes of padding after ``n`` bytes to reach the next 64-byte boundary."""
    return -n % ALIGN


def block_sums(data: Any, block: int = BLOCK) -> list[int]:
    """xxh3-64 of each ``block``-sized piece of the buffer ``data``."""
    mv = memoryview(data).cast("B")
    return [xxhash.xxh3_64_intdigest(mv[i : i + block]) for i in range(0, len(mv), block)]


def pack_header(n: int, index_off: int, index: bytes) -> bytes:
    """The 64-byte header for a pack of ``n`` samples whose index starts at ``index_off``."""
    first = struct.pack(
        "<8sHHIQQQQ",
        MAGIC,
        FORMAT_VERSION,
        0,
        0,
        n,
        index_off,
        len(index),
        xxhash.xxh3_64_intdigest(index),
    )
    return first + struct.pack("<QQ", xxhash.xxh3_64_intdigest(first), 0)


def read_header(head: bytes, size: int, where: str) -> tuple[int, int, int, int]:
    """Validate a header; return (sample count, index offset, index length, index sum)."""
    if len(head) < HEADER.size:
        raise PackCorrupted(f"{where}: truncated ({len(head)} bytes): not a complete pack")
    magic, version, _flags, r1, n, i_off, i_len, i_sum, h_sum, r2 = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise PackCorrupted(f"{where}: not an mlcache pack (bad magic)")
    if newer_version(head):
        # a newer mlcache's pack (a cache shared mid-upgrade): not damage, and
        # nothing after the version may mean here what it means there
        raise NewerFormat(
            f"{where}: written by a newer mlcache (pack format version {version}; this one "
            f"reads version {FORMAT_VERSION}): upgrade mlcache to read it"
        )
    if version != FORMAT_VERSION:
        raise PackCorrupted(f"{where}: unsupported pack format version {version}")
    if xxhash.xxh3_64_intdigest(head[:48]) != h_sum or r1 or r2:
        raise PackCorrupted(f"{where}: header checksum mismatch")
    if i_off % ALIGN or i_off < HEADER.size or i_off + i_len != size:
        raise PackCorrupted(f"{where}: size {size} bytes does not match the header (truncated?)")
    if n >= MAX_COUNT:
        raise PackCorrupted(f"{where}: impossible sample count {n}")
    return n, i_off, i_len, i_sum


def newer_version(head: bytes) -> int:
    """The format version of the pack header ``head`` when a newer mlcache wrote
    it (higher than :data:`FORMAT_VERSION`), else 0. A header of this format
    whose version field alone was damaged (its checksum holds with this
    version: a newer writer's passes it with 2**-64 odds) is not newer: damage."""
    if len(head) < HEADER.size or head[:8] != MAGIC:
        return 0
    (version,) = struct.unpack_from("<H", head, 8)
    if version <= FORMAT_VERSION:
        return 0
    ours = head[:8] + struct.pack("<H", FORMAT_VERSION) + head[10:48]
    if xxhash.xxh3_64_intdigest(ours) == struct.unpack_from("<Q", head, 48)[0]:
        return 0
    return int(version)


def is_newer_pack(path: str) -> bool:
    """Whether the file at ``path`` is a pack a newer mlcache wrote: never removed
    nor replaced by this one (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return newer_version(f.read(HEADER.size)) > 0
    except OSError:
        return False


def parse_index(data: bytes, expected_sum: int, n: int, size: int, where: str) -> dict[str, Any]:
    """Check and parse the index; every region must lie inside the file."""
    if xxhash.xxh3_64_intdigest(data) != expected_sum:
        raise PackCorrupted(f"{where}: index checksum mismatch")
    try:
        index = json.loads(data)
        if index["n"] != n or not isinstance(index["fields"], list):
            raise ValueError("sample count or fields")
        block = index.get("block")
        if not _count(block) or block < 64 or block & (block - 1):
            raise ValueError(f"block size {block!r} is not a power of two")
        for field in index["fields"]:
            _check_field(field, size, 0)
    except (ValueError, KeyError, TypeError) as exc:
        raise PackCorrupted(f"{where}: bad index ({exc})") from None
    return index


#: the region keys of a field entry (``ends``: a ``strs`` field's string ends)
REGION_KEYS = ("data", "offsets", "shapes", "valid", "ends")
#: how deep ``dict`` fields may nest
MAX_DEPTH = 32


def _check_field(field: dict[str, Any], size: int, depth: int) -> None:
    """Every region of ``field`` (and of its sub-fields) lies inside the file."""
    if not isinstance(field["name"], str):
        raise ValueError(f"a field is named {field['name']!r}, not a str")
    for key in REGION_KEYS:
        region = field.get(key)
        if region is None:
            continue
        if not (_count(region["off"]) and _count(region["len"])):
            raise ValueError(f"region {field['name']}.{key} has a bad offset or length")
        if region["off"] + region["len"] > size:
            raise ValueError(f"region {field['name']}.{key} outside the file")
    ndim, shape = field.get("ndim", 0), field.get("shape", [])
    if not (_count(ndim) and ndim <= 64 and isinstance(shape, list)):
        raise ValueError(f"field {field['name']} has a bad ndim or shape")
    if not all(_count(d) for d in shape) or math.prod(shape) >= MAX_COUNT:
        raise ValueError(f"field {field['name']} has a bad shape {shape}")
    if field.get("kind") in ("dict", "tensor"):
        children = field["fields"]
        if not isinstance(children, list) or depth >= MAX_DEPTH:
            raise ValueError(f"field {field['name']} has bad sub-fields")
        if field["kind"] == "tensor" and len(children) != 1:
            raise ValueError(f"tensor field {field['name']} has {len(children)} sub-fields")
        for child in children:
            _check_field(child, size, depth + 1)


#: sample counts, lengths, offsets and shape products are below this: their
#: products with an item size then stay exact in int64
MAX_COUNT = 1 << 48


def _count(x: Any) -> bool:
    """``x`` is a JSON integer in [0, MAX_COUNT) (not a bool, float, inf or NaN)."""
    return type(x) is int and 0 <= x < MAX_COUNT
