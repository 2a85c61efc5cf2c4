"""The records of a pack being filled (see :mod:`mlcache.data.filling`): one
sample each, appended to a process's *segment* file in ``<pack>.fill/``.

=======  ====  ===========================================================
offset   size  what
=======  ====  ===========================================================
0        4     magic ``MLCR``
4        4     flags (0)
8        8     payload length (u64)
16       16    the item's key (xxh3-128 of its path or value)
32       16    the item's fingerprint (what it held when loaded)
48       8     xxh3-64 of the payload
56       8     xxh3-64 of the 56 bytes before it
64       n     the payload: the sample as an entry of :mod:`mlcache.entry`
=======  ====  ===========================================================

A record is written by one ``write`` of an ``O_APPEND`` descriptor; a record
torn by a kill fails its length or its checksums.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from ..codecs import select_codec
from ..entry import EntryReader, decode, write_entry
from ..errors import EntryCorrupted, UnsupportedValue

__all__ = ["MAGIC", "RECORD", "Segment", "decode_sample", "encode_sample", "record_bytes"]

#: a record's header: magic, flags (0), payload length, item key, item
#: fingerprint, xxh3-64 of the payload, xxh3-64 of the 56 bytes before it
RECORD = struct.Struct("<4sIQ16s16sQQ")
assert RECORD.size == 64
MAGIC = b"MLCR"


def encode_sample(sample: Mapping[str, Any], allow_pickle: bool, index: int = -1) -> bytes:
    """A sample as the payload of a record: an entry of the function cache's format.

    A sample that needs pickle when ``allow_pickle`` is false is refused as an
    up-front build refuses it: :class:`~mlcache.errors.UnsupportedValue` naming
    sample ``index``, the field, and the type of the value that needs pickle."""
    try:
        codec = select_codec(dict(sample), allow_pickle=allow_pickle)
    except UnsupportedValue:
        for name, value in sample.items():
            found = _needs_pickle(value, str(name))
            if found is not None:
                label, t = found
                raise UnsupportedValue(
                    f"sample {index}, field {label!r}: a value of type "
                    f"{t.__module__}.{t.__qualname__} needs pickle; packs store numpy arrays, "
                    "int, float, bool, str, bytes, None, lists of numbers or of str, and dicts "
                    "of these (pass allow_pickle=True to store other values)"
                ) from None
        raise
    out = io.BytesIO()
    write_entry(out, codec.name, codec.encode(dict(sample)), {})
    return out.getvalue()


def _needs_pickle(value: Any, label: str, depth: int = 0) -> tuple[str, type] | None:
    """The innermost part of ``value`` that needs pickle (its field label, as
    ``"meta.tags"``, and its type), or None."""
    if depth < 16 and type(value) is dict:
        for k, v in value.items():
            found = _needs_pickle(v, f"{label}.{k}", depth + 1)
            if found is not None:
                return found
    elif depth < 16 and type(value) in (list, tuple):
        for v in value:
            found = _needs_pickle(v, label, depth + 1)
            if found is not None:
                return found
    try:
        select_codec(value, allow_pickle=False)
    except UnsupportedValue:
        return label, type(value)
    return None


def decode_sample(payload: bytes, allow_pickle: bool) -> dict[str, Any]:
    """The sample a record's payload holds (arrays writable, private to the caller)."""
    value = decode(EntryReader(io.BytesIO(payload)), allow_pickle=allow_pickle)
    if not isinstance(value, dict):
        raise EntryCorrupted("a record holds no sample")
    return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}


def record_bytes(key: bytes, fp: bytes, payload: bytes) -> bytes:
    """One record: its header (:data:`RECORD`) then ``payload``."""
    first = struct.pack(
        "<4sIQ16s16sQ", MAGIC, 0, len(payload), key, fp, xxhash.xxh3_64_intdigest(payload)
    )
    return first + struct.pack("<Q", xxhash.xxh3_64_intdigest(first)) + payload


class Segment:
    """One process's append-only file of records, as another process reads it."""

    __slots__ = ("broken", "fd", "path", "scanned")

    def __init__(self, path: str) -> None:
        self.path, self.fd, self.scanned, self.broken = path, -1, 0, False

    def open(self) -> int:
        """A descriptor of the segment to read (opened once)."""
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        return self.fd

    def close(self) -> None:
        """Close the descriptor, if open."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
