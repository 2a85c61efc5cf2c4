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
64       n     the payload: the sample, plain (``MLS1``, then each field's name,
               kind and value) or as an entry of :mod:`mlcache.entry`
=======  ====  ===========================================================

A record is written by one ``write`` of an ``O_APPEND`` descriptor; a record
torn by a kill fails its length or its checksums.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import shutil
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from ..codecs import select_codec
from ..entry import EntryReader, decode, write_entry
from ..errors import EntryCorrupted, UnsupportedValue

__all__ = [
    "MAGIC",
    "PLAIN",
    "PLAIN_KINDS",
    "RECORD",
    "NoRoom",
    "PlainLayout",
    "Segment",
    "decode_sample",
    "encode_sample",
    "framed_name",
    "record_bytes",
    "record_head",
    "remove_redundant_records",
    "room_to_seal",
]

#: a record's header: magic, flags (0), payload length, item key, item
#: fingerprint, xxh3-64 of the payload, xxh3-64 of the 56 bytes before it
RECORD = struct.Struct("<4sIQ16s16sQQ")
assert RECORD.size == 64
#: a header's first 56 bytes (what its checksum covers), and that checksum
_HEAD56, _U64 = struct.Struct("<4sIQ16s16sQ"), struct.Struct("<Q")
MAGIC = b"MLCR"


#: the payload of a plain sample (:func:`encode_sample`)
PLAIN = b"MLS1"
_COUNT, _NAME, _KIND, _LEN = (
    struct.Struct("<I"),
    struct.Struct("<H"),
    struct.Struct("<B"),
    struct.Struct("<Q"),
)
_I64, _F64 = struct.Struct("<q"), struct.Struct("<d")
_NONE, _BOOL, _INT, _FLOAT, _STR, _BYTES, _ARRAY, _SCALAR, _STRS, _DICT = range(10)
#: how deep dicts nest in a plain sample
_MAX_DEPTH = 16
#: the dtype kinds of arrays a plain sample holds: bool, numbers, dates and durations
PLAIN_KINDS = frozenset("biufcmM")


def _plain(sample: Mapping[str, Any]) -> bytes | None:
    """A sample of str-named fields that are None, bool, int (64-bit), float,
    str, bytes, numeric numpy arrays or scalars, lists of str, and dicts of
    these, as ``PLAIN`` and each field in turn (its name, a kind byte, its
    value: a few us a sample where an entry costs ~20); None for any other."""
    parts: list[Any] = [PLAIN]
    return b"".join(parts) if _put_fields(parts, sample, 0) else None


#: what a field's name is framed as (its length and UTF-8 bytes), by name: the
#: names of a dataset's samples repeat, so each is encoded once a process
_NAMES: dict[str, bytes] = {}
#: an array's framing before its shape (kind, dtype code, ndim), by dtype and ndim;
#: a scalar's (kind, dtype code) by dtype (ndim -1); None for a dtype not plain
_ARRAY_HEADS: dict[tuple[np.dtype, int], bytes | None] = {}
_SHAPES: dict[int, struct.Struct] = {}
_INT_HEAD, _FLOAT_HEAD = struct.Struct("<Bq"), struct.Struct("<Bd")
_STR_HEAD = struct.Struct("<BQ")
_CACHED = 1024  # names and array forms remembered (a bound, never reached in practice)


def framed_name(name: Any) -> bytes | None:
    """``name``'s framing (length and bytes), or None when it is not a str of UTF-8."""
    framed = _NAMES.get(name) if type(name) is str else None
    if framed is not None:
        return framed
    if type(name) is not str:
        return None
    try:
        raw = name.encode()
    except UnicodeEncodeError:
        return None
    framed = _NAME.pack(len(raw)) + raw
    if len(_NAMES) < _CACHED:
        _NAMES[name] = framed
    return framed


def _array_head(dtype: np.dtype, ndim: int) -> bytes | None:
    """The framing of an array (``ndim`` >= 0) or a scalar (-1) of ``dtype``."""
    key = (dtype, ndim)
    try:
        return _ARRAY_HEADS[key]
    except KeyError:
        pass
    head = None
    if dtype.kind in PLAIN_KINDS and dtype.fields is None:
        code = dtype.str.encode()
        kind = b"\x07" if ndim < 0 else b"\x06"
        head = kind + _KIND.pack(len(code)) + code + (_KIND.pack(ndim) if ndim >= 0 else b"")
    if len(_ARRAY_HEADS) < _CACHED:
        _ARRAY_HEADS[key] = head
    return head


def _put_fields(parts: list[Any], fields: Mapping[str, Any], depth: int) -> bool:
    """Append ``fields`` (their count, then name, kind and value each) to ``parts``;
    False when one is not plain. The framing of names and dtypes repeats from
    sample to sample and is made once (:data:`_NAMES`, :data:`_ARRAY_HEADS`): the
    encoding is a few us of a first epoch's every sample."""
    add = parts.append
    add(_COUNT.pack(len(fields)))
    for name, v in fields.items():
        framed = framed_name(name)
        if framed is None:
            return False
        add(framed)
        t = type(v)
        if t is np.ndarray:  # the common field first: no chain of type tests
            head = _array_head(v.dtype, v.ndim)
            if head is None:
                return False
            add(head)
            shape = _SHAPES.get(v.ndim)
            if shape is None:
                shape = _SHAPES[v.ndim] = struct.Struct(f"<{v.ndim}Q")
            add(shape.pack(*v.shape))
            add(_LEN.pack(v.nbytes))
            # the array's own buffer, joined once (a copy only when not contiguous)
            add(v if v.flags.c_contiguous else np.ascontiguousarray(v))
        elif t is int:
            if not -(1 << 63) <= v < (1 << 63):
                return False
            add(_INT_HEAD.pack(2, v))
        elif t is str:
            try:
                data = v.encode()
            except UnicodeEncodeError:
                return False
            add(_STR_HEAD.pack(4, len(data)))
            add(data)
        elif not _put(parts, v, depth):
            return False
    return True


def _put(parts: list[Any], v: Any, depth: int) -> bool:
    """Append one value's kind byte and bytes to ``parts``; False when not plain
    (arrays, ints and strs are framed by :func:`_put_fields` itself)."""
    add = parts.append
    t = type(v)
    if v is None:
        add(b"\x00")
    elif t is bool:
        add(b"\x01\x01" if v else b"\x01\x00")
    elif t is float:
        add(_FLOAT_HEAD.pack(3, v))
    elif t is bytes:
        add(_STR_HEAD.pack(5, len(v)))
        add(v)
    elif isinstance(v, np.generic):
        head = _array_head(v.dtype, -1)
        if head is None:
            return False
        add(head)
        add(v.tobytes())
    elif t is list and all(type(x) is str for x in v):  # what a pack's strs field gives
        add(b"\x08")
        add(_COUNT.pack(len(v)))
        try:
            for x in v:
                data = x.encode()
                add(_LEN.pack(len(data)))
                add(data)
        except UnicodeEncodeError:
            return False
    elif t is dict and depth < _MAX_DEPTH:
        add(b"\x09")
        return _put_fields(parts, v, depth + 1)
    else:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _dtype(code: bytes) -> np.dtype:
    """The dtype a plain record names (parsed once per process)."""
    dtype = np.dtype(code.decode())
    if dtype.kind not in PLAIN_KINDS or dtype.fields is not None:
        raise ValueError(f"dtype {dtype}")
    return dtype


def _unplain(payload: bytes) -> dict[str, Any]:
    """The sample :func:`_plain` wrote (its arrays writable, private)."""
    try:
        view = memoryview(payload)
        out, pos = _get_fields(view, 4, 0)
        if pos != len(view):
            raise ValueError("trailing bytes")
    except (ValueError, TypeError, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EntryCorrupted(f"a plain record is damaged ({exc})") from None
    return out


def _get_fields(view: memoryview, pos: int, depth: int) -> tuple[dict[str, Any], int]:
    """The fields at ``pos`` (as :func:`_put_fields` wrote them) and the position after."""
    (count,) = _COUNT.unpack_from(view, pos)
    pos += 4
    out: dict[str, Any] = {}
    for _ in range(count):
        (n,) = _NAME.unpack_from(view, pos)
        name = bytes(view[pos + 2 : pos + 2 + n]).decode()
        pos += 2 + n
        out[name], pos = _get(view, pos, depth)
    return out, pos


def _get(view: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    """The value at ``pos`` (as :func:`_put` wrote it) and the position after."""
    kind = view[pos]
    pos += 1
    if kind == _NONE:
        return None, pos
    if kind == _BOOL:
        return view[pos] == 1, pos + 1
    if kind == _INT:
        return _I64.unpack_from(view, pos)[0], pos + 8
    if kind == _FLOAT:
        return _F64.unpack_from(view, pos)[0], pos + 8
    if kind in (_STR, _BYTES):
        (n,) = _LEN.unpack_from(view, pos)
        data = bytes(view[pos + 8 : pos + 8 + n])
        if len(data) != n:
            raise ValueError("truncated")
        return (data.decode() if kind == _STR else data), pos + 8 + n
    if kind in (_ARRAY, _SCALAR):
        n = view[pos]
        dtype = _dtype(bytes(view[pos + 1 : pos + 1 + n]))
        pos += 1 + n
        if kind == _SCALAR:
            return np.frombuffer(view, dtype, 1, pos)[0], pos + dtype.itemsize
        ndim = view[pos]
        shape = struct.unpack_from(f"<{ndim}Q", view, pos + 1)
        pos += 1 + 8 * ndim
        (n,) = _LEN.unpack_from(view, pos)
        pos += 8
        count = n // dtype.itemsize if dtype.itemsize else 0
        if count * dtype.itemsize != n or math.prod(shape) != count:
            raise ValueError("an array's size does not match its shape")
        return np.frombuffer(view, dtype, count, pos).reshape(shape).copy(), pos + n
    if kind == _STRS:
        (count,) = _COUNT.unpack_from(view, pos)
        pos += 4
        strs = []
        for _ in range(count):
            (n,) = _LEN.unpack_from(view, pos)
            data = bytes(view[pos + 8 : pos + 8 + n])
            if len(data) != n:
                raise ValueError("truncated")
            strs.append(data.decode())
            pos += 8 + n
        return strs, pos
    if kind == _DICT and depth < _MAX_DEPTH:
        return _get_fields(view, pos, depth + 1)
    raise ValueError(f"kind {kind}")


#: the kinds of a plain record's field a seal copies byte for byte
#: (:class:`PlainLayout`): their names, and the dtype a pack gives a Python kind
_COPIED = {
    _INT: ("int", b"<i8"),
    _FLOAT: ("float", b"<f8"),
    _BOOL: ("bool", b"|b1"),
    _STR: ("str", b"|u1"),
    _BYTES: ("bytes", b"|u1"),
}


class PlainLayout:
    """The layout of a plain record (:func:`encode_sample`) whose values a seal
    copies, and where the values of any record of that layout lie.

    ``fields`` holds each field's name, kind (``"int"``, ``"float"``, ``"bool"``,
    ``"str"``, ``"bytes"``, ``"scalar"``: a numpy scalar, or ``"array"``), dtype
    code and ndim; ``steps`` each field's framing, its length, and its value's size
    (-1: a length precedes the value; -2: a shape and a length), from which a seal
    finds each value's bytes in every record of the layout
    (:mod:`mlcache.data.sealing`): the bytes a pack's field holds for it
    (little-endian int64 / float64 / bool for Python numbers). A payload that is not
    plain or holds a kind that is not copied (None, a list of str, a dict) raises
    ``ValueError``: its seal decodes it instead.
    """

    __slots__ = ("fields", "head", "steps")

    def __init__(self, buf: Any, pos: int, end: int) -> None:
        if buf[pos : pos + 4] != PLAIN:
            raise ValueError("not a plain record")
        (count,) = _COUNT.unpack_from(buf, pos + 4)
        self.head = bytes(buf[pos : pos + 8])
        pos += 8
        fields: list[tuple[bytes, str, bytes, int]] = []
        #: each field's framing (name, kind, dtype code, ndim), its length, and its
        #: value's size (-1: a length follows; -2: a shape and a length follow)
        steps: list[tuple[bytes, int, int, Any]] = []
        for _ in range(count):
            start = pos
            (n,) = _NAME.unpack_from(buf, pos)
            name, kind = bytes(buf[pos + 2 : pos + 2 + n]), buf[pos + 2 + n]
            pos += 3 + n
            copied, ndim, shape = _COPIED.get(kind), 0, None
            if copied is not None:
                code, size = copied[1], {_STR: -1, _BYTES: -1, _BOOL: 1}.get(kind, 8)
                fields.append((name, copied[0], code, 0))
            elif kind in (_ARRAY, _SCALAR):
                k = buf[pos]
                code = bytes(buf[pos + 1 : pos + 1 + k])
                itemsize = _dtype(code).itemsize
                pos += 1 + k
                if kind == _SCALAR:
                    size = itemsize
                else:
                    ndim, size = buf[pos], -2
                    pos += 1
                    shape = struct.Struct(f"<{ndim + 1}Q"), itemsize
                fields.append((name, "scalar" if kind == _SCALAR else "array", code, ndim))
            else:
                raise ValueError(f"kind {kind} is decoded, not copied")
            steps.append((bytes(buf[start:pos]), pos - start, size, shape))
            pos = self._value(buf, pos, size, shape)[1]
        if pos != end:
            raise ValueError("the fields do not end where the payload does")
        self.fields, self.steps = tuple(fields), steps

    @staticmethod
    def _value(buf: Any, pos: int, size: int, shape: Any) -> tuple[tuple[int, int, Any], int]:
        if size >= 0:
            return (pos, pos + size, ()), pos + size
        if size == -1:
            (size,) = _LEN.unpack_from(buf, pos)
            return (pos + 8, pos + 8 + size, ()), pos + 8 + size
        form, itemsize = shape
        found = form.unpack_from(buf, pos)
        dims, size = found[:-1], found[-1]
        if math.prod(dims) * itemsize != size:
            raise ValueError("an array's size does not match its shape")
        pos += form.size
        return (pos, pos + size, dims), pos + size


def encode_sample(sample: Mapping[str, Any], allow_pickle: bool, index: int = -1) -> bytes:
    """A sample as the payload of a record: a plain sample (fields of numbers,
    text, bytes and numeric arrays) in a few bytes of framing (:data:`PLAIN`),
    any other as an entry of the function cache's format.

    A sample that needs pickle when ``allow_pickle`` is false is refused as an
    up-front build refuses it: :class:`~mlcache.errors.UnsupportedValue` naming
    sample ``index``, the field, and the type of the value that needs pickle."""
    plain = _plain(sample)
    if plain is not None:
        return plain
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
    if payload[:4] == PLAIN:
        return _unplain(payload)
    value = decode(EntryReader(io.BytesIO(payload)), allow_pickle=allow_pickle)
    if not isinstance(value, dict):
        raise EntryCorrupted("a record holds no sample")
    return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}


def record_head(key: bytes, fp: bytes, payload: bytes) -> bytes:
    """The header (:data:`RECORD`) of the record of ``payload``."""
    first = _HEAD56.pack(MAGIC, 0, len(payload), key, fp, xxhash.xxh3_64_intdigest(payload))
    return first + _U64.pack(xxhash.xxh3_64_intdigest(first))


def record_bytes(key: bytes, fp: bytes, payload: bytes) -> bytes:
    """One record: its header (:data:`RECORD`) then ``payload``."""
    return record_head(key, fp, payload) + payload


def remove_redundant_records(folder: str, table: np.ndarray) -> None:
    """Remove the segments of ``folder`` whose every record holds an item of
    ``table`` as it is (its key and fingerprint): the records of a pack that was
    sealed, left by a run killed between the seal and their removal. A segment
    with any other record (another process filling another version) stays; the
    folder goes once empty. Housekeeping: never raises."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".seg")]
    except OSError:
        return
    rows = table.tobytes()
    sealed = {rows[32 * i : 32 * i + 32] for i in range(len(table))}
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        off, redundant = 0, True
        while off + RECORD.size <= len(data):
            magic, _flags, length, key, fp, _psum, hsum = RECORD.unpack_from(data, off)
            if magic != MAGIC or xxhash.xxh3_64_intdigest(data[off : off + 56]) != hsum:
                break  # a torn end: nothing after it
            if key + fp not in sealed:
                redundant = False
                break
            off += RECORD.size + length
        if redundant:
            with contextlib.suppress(OSError):
                os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


class NoRoom(OSError):
    """The disk has not the room a sealed pack needs (no seal is tried)."""


def room_to_seal(pack_path: str, kept: list[str]) -> None:
    """Raise :class:`NoRoom` when the disk of ``pack_path`` has less free space
    than the sealed pack needs: about the size of the files it is written from
    (``kept``: the segments, the old pack), which stay until it is written. A
    seal that would fill the disk fails after writing it all, at every run."""
    need = 0
    for path in kept:
        with contextlib.suppress(OSError):
            need += os.stat(path).st_size
    try:
        free = shutil.disk_usage(os.path.dirname(pack_path) or ".").free
    except OSError:
        return  # cannot tell: the seal tries
    if free < need:
        raise NoRoom(
            f"mlcache: not sealing {pack_path}: the pack needs about {need / 2**20:,.1f} MiB "
            f"and its disk has {free / 2**20:,.1f} MiB free; its samples are read from its "
            "records meanwhile (free some space, e.g. `mlcache prune`, and a later run seals it)"
        )


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

    def abandon(self, fd: int, size: int) -> bool:
        """A record to this segment failed half way (a full disk): cut it back to
        its ``size`` bytes of whole records, or remove it when it had none (a new
        empty file at each failure would pile up), and close ``fd``, the writer's
        descriptor. True when removed."""
        removed = False
        with contextlib.suppress(OSError):
            if size:
                os.ftruncate(fd, size)
            else:
                os.unlink(self.path)
                self.broken = removed = True
        with contextlib.suppress(OSError):
            os.close(fd)
        return removed

    def close(self) -> None:
        """Close the descriptor, if open."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
