"""The seal of a pack being filled (see :mod:`mlcache.data.filling`): its samples in
item order, from the old pack, the records, or new loads of records found damaged.

A record holds a sample in the plain form of :mod:`mlcache.data.records`: each
field's value is a run of bytes that, for a number, a text, bytes or a numeric
array, are the very bytes the pack's field holds for it. So when every sample is
in a record and every record is intact and plain, with the same fields of the same
kinds and dtypes in every sample, the seal *copies* the bytes of the records into
the pack's regions (:meth:`SealSource.copied_fields`): no sample is decoded, no
value is checked again against the pack writer's rules (a field of one kind and
dtype has no promotion, no missing value). A pack written this way is the pack the
writer makes of the decoded samples, byte for byte (tests/data/test_sealing.py).

Anything else - a sample from the old pack, a record that fails its checksum (it
is loaded again), a field that holds None, lists of str or dicts, or values of
several kinds or dtypes (promoted by the writer), a record of the function cache's
format - seals by decoding every sample and writing them as an up-front build does
(iterating a :class:`SealSource`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from ..errors import PackCorrupted
from .frozen import probe, probe_picks
from .records import RECORD, PlainLayout, decode_sample
from .values import read_back
from .writer import CopiedField

if TYPE_CHECKING:
    from .filling import Filler

__all__ = ["BASE", "MISSING", "SealSource"]

#: the pieces of a copied field's data are joined up to about this many bytes
_PIECE = 1 << 20
#: a field whose values are all of at most this many bytes is gathered by numpy,
#: this many records at a time
_SMALL, _SMALL_ROWS = 64, 1 << 16
#: where a filler's item is (``Filler.src``): not recorded, or in the old pack (a
#: number from 0 is a segment's)
MISSING, BASE = -2, -1
#: the kinds of :class:`~mlcache.data.records.PlainLayout` read back as scalars
_SCALARS = frozenset(("int", "float", "bool", "scalar"))
#: where a field's values lie in the records: starts, stops (n each) and, for an
#: array field, the shapes (n x ndim)
_Spans = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]
#: no length read from a record is trusted beyond this (a larger one is damage)
_MAX_SHAPE = 1 << 62


def _numbers(src: np.ndarray) -> list[int]:
    """The segments' numbers ``src`` holds (each >= 0), in order: by a count, not
    ``np.unique``, whose first call in a process imports ``numpy.ma`` (~11 ms)."""
    return np.flatnonzero(np.bincount(src)).tolist()


def _gather(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at each of the offsets ``at`` (m x width, a copy)."""
    return buf[at[:, None] + np.arange(width)]


def _segment_spans(
    mapped: mmap.mmap, offsets: np.ndarray, layout: PlainLayout
) -> tuple[np.ndarray, list[_Spans]] | None:
    """The payload lengths of the records at ``offsets`` of one segment and where
    their fields' values lie, as :meth:`SealSource._spans` says; None when one is
    damaged or has another layout. Each read stays within its record (checked
    before it is made)."""
    buf = np.frombuffer(mapped, np.uint8)
    try:
        size = len(buf)
        if (offsets < 0).any() or (offsets + RECORD.size > size).any():
            return None
        # the two fields of the header read here (its magic and checksum were checked
        # when the record was found), not all 64 bytes of each
        lengths = _gather(buf, offsets + 8, 8).view("<u8")[:, 0]
        sums = _gather(buf, offsets + 48, 8).view("<u8")[:, 0]
        if (lengths > size).any():
            return None
        start = offsets + RECORD.size
        end = start + lengths.astype(np.int64)
        if (end > size).any() or (lengths < len(layout.head)).any():
            return None
        digest, view = xxhash.xxh3_64_intdigest, memoryview(mapped)
        try:  # the one step per record: each payload is checked as the decoding seal does
            for a, z, checksum in zip(start.tolist(), end.tolist(), sums.tolist()):
                if digest(view[a:z]) != checksum:
                    return None  # damaged: loaded again by the decoding seal
        finally:
            view.release()
        if not (_gather(buf, start, 8) == np.frombuffer(layout.head, np.uint8)).all():
            return None
        at, spans = start + 8, []
        for framing, n, fixed, shape in layout.steps:
            if (at + n > end).any():
                return None
            if not (_gather(buf, at, n) == np.frombuffer(framing, np.uint8)).all():
                return None  # another layout: the decoding seal
            at = at + n
            dims: np.ndarray | None = None
            value: Any  # the values' size: one for all, or each record's
            if fixed >= 0:  # a number: its bytes
                first, value = at, fixed
            else:  # a length (-1), or a shape and a length (-2), then the bytes
                width = 8 if fixed == -1 else shape[0].size
                if (at + width > end).any():
                    return None
                found = _gather(buf, at, width).view("<u8")
                value_size = found[:, -1]
                if (value_size > size).any() or (found > _MAX_SHAPE).any():
                    return None
                if fixed == -2:
                    dims = found[:, :-1].astype(np.int64)
                    product = np.prod(dims.astype(np.float64), axis=1) * shape[1]
                    if (product != value_size.astype(np.float64)).any():
                        return None  # an array's size does not match its shape
                first, value = at + width, value_size.astype(np.int64)
            at = first + value
            spans.append((first, at, dims))
        if (at != end).any():
            return None
        return lengths.astype(np.int64), spans
    finally:
        del buf  # no view of the map is left: it is closed after the seal


class SealSource:
    """The samples of a filler in item order: iterated (each decoded, or loaded),
    or their fields' bytes copied (:meth:`copied_fields`) when they allow it.
    :meth:`close` unmaps the records' segments."""

    def __init__(self, filler: Filler) -> None:
        self.filler = filler
        self.maps: dict[int, mmap.mmap] = {}

    def __len__(self) -> int:
        return self.filler.n

    def close(self) -> None:
        for mapped in self.maps.values():
            # (a view still held by a seal that failed: the map goes with it)
            with contextlib.suppress(BufferError):
                mapped.close()
        self.maps.clear()

    # -- copied -----------------------------------------------------------------------
    def _map(self, number: int) -> mmap.mmap | None:
        mapped = self.maps.get(number)
        if mapped is None:
            fd = self.filler.segments[number].open()
            if not os.fstat(fd).st_size:
                return None
            mapped = self.maps[number] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        return mapped

    def copied_fields(self) -> tuple[int, list[CopiedField]] | None:
        """The fields' bytes copied from the records, or None when a sample is not in
        an intact plain record of the common layout (see the module docstring)."""
        f = self.filler
        n = f.n
        if not n or (f.src < 0).any():
            return None
        try:
            found = self._spans(f.src, f.pos)
        except (OSError, ValueError, IndexError, struct.error):
            return None  # damaged, not plain, or not copied: decoded (the module docstring)
        if found is None:
            return None
        layout, lengths, spans = found
        for i in probe_picks(f.loaded_here):  # random augmentation in load_item?
            number, off = int(f.src[i]), int(f.pos[i])
            payload = self.maps[number][off + RECORD.size : off + RECORD.size + lengths[i]]
            recorded = decode_sample(payload, f.allow_pickle)
            probe(f.load_item, f.items[i], recorded, f.allow_pickle, i)
        fields = [self._field(field, f.src, spans[k]) for k, field in enumerate(layout.fields)]
        return n, fields

    def _spans(
        self, src: np.ndarray, pos: np.ndarray
    ) -> tuple[PlainLayout, np.ndarray, list[_Spans]] | None:
        """Every record's payload length, in item order, and where each field's
        value lies in it (checked: the payload's checksum, its layout the first
        record's); None when one differs. The records of one segment are read
        together, a field at a time (numpy gathers, no Python step per record but
        the checksum's), so that the seal costs little beside the epoch."""
        maps: dict[int, mmap.mmap] = {}
        for number in _numbers(src):
            mapped = self._map(number)
            if mapped is None:
                return None
            maps[number] = mapped
        first, off = int(src[0]), int(pos[0])
        length = RECORD.unpack_from(maps[first], off)[2]
        start = off + RECORD.size
        layout = PlainLayout(maps[first], start, start + length)
        n = len(src)
        lengths = np.empty(n, np.int64)
        spans = [
            (
                np.empty(n, np.int64),
                np.empty(n, np.int64),
                None if size != -2 else np.empty((n, shape[0].size // 8 - 1), np.int64),
            )
            for _framing, _n, size, shape in layout.steps
        ]
        for number, mapped in maps.items():
            rows = np.flatnonzero(src == number)
            found = _segment_spans(mapped, pos[rows], layout)
            if found is None:
                return None
            lengths[rows] = found[0]
            for (starts, stops, dims), (a, z, d) in zip(spans, found[1]):
                starts[rows], stops[rows] = a, z
                if dims is not None:
                    dims[rows] = d
        return layout, lengths, spans

    def _field(
        self, layout: tuple[bytes, str, bytes, int], src: np.ndarray, spans: _Spans
    ) -> CopiedField:
        """A field of the samples as a :class:`CopiedField` of their bytes."""
        name, kind, code, _ndim = layout
        starts, stops, dims = spans
        data = self._pieces(src, starts, stops)
        label = name.decode()
        if kind in _SCALARS:
            return CopiedField(label, "column", code.decode(), data, py=kind)
        sizes = stops - starts
        if kind in ("str", "bytes"):
            return CopiedField(label, kind, "|u1", data, sizes=sizes)
        assert dims is not None  # an array's
        if (dims == dims[0]).all():
            shape = tuple(dims[0].tolist())
            return CopiedField(label, "column", code.decode(), data, shape=shape)
        return CopiedField(label, "ragged", code.decode(), data, shapes=dims, sizes=sizes)

    def _pieces(self, src: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> Iterator[bytes]:
        """The bytes of the values at ``starts``-``stops`` (of the segments ``src``),
        joined in pieces of about :data:`_PIECE` bytes."""
        sizes = stops - starts
        if len(sizes) and int(sizes.max()) <= _SMALL:
            yield from self._small_pieces(src, starts, sizes)
            return
        # views of the maps, not a copy of each value before the join's
        views = {number: memoryview(mapped) for number, mapped in self.maps.items()}
        parts: list[memoryview] = []
        size = 0
        try:
            for number, a, z in zip(src.tolist(), starts.tolist(), stops.tolist()):
                parts.append(views[number][a:z])
                size += z - a
                if size >= _PIECE:
                    yield b"".join(parts)
                    parts, size = [], 0
            if parts:
                yield b"".join(parts)
        finally:  # no view of a map is left: they are closed after the seal
            for part in parts:
                part.release()
            for view in views.values():
                view.release()

    def _small_pieces(
        self, src: np.ndarray, starts: np.ndarray, sizes: np.ndarray
    ) -> Iterator[bytes]:
        """:meth:`_pieces` of values of at most :data:`_SMALL` bytes (numbers, ids,
        codes): gathered by numpy, :data:`_SMALL_ROWS` records at a time, each
        segment's rows at once (a slice and a join a value were most of the seal)."""
        width = int(sizes.max())
        columns = np.arange(width)
        for first in range(0, len(src), _SMALL_ROWS):
            part = slice(first, first + _SMALL_ROWS)
            at, numbers, lengths = starts[part], src[part], sizes[part]
            values = np.empty((len(at), width), np.uint8)
            for number in _numbers(numbers):
                rows = np.flatnonzero(numbers == number)
                buf = np.frombuffer(self.maps[number], np.uint8)
                # (a short value at the map's end reads no further: its last byte again)
                values[rows] = buf[np.minimum(at[rows, None] + columns, len(buf) - 1)]
                del buf  # no view of the map is left: it is closed after the seal
            yield values[columns < lengths[:, None]].tobytes()

    # -- decoded ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        """The samples in item order, records read from the mapped segments; a few
        of the items this process loaded are loaded again and compared
        (:func:`~mlcache.data.frozen.probe`)."""
        f = self.filler
        probes = probe_picks(f.loaded_here)
        for i in range(f.n):
            src = int(f.src[i])
            if src == BASE and f.base is not None:
                try:
                    yield f.base[int(f.pos[i])]
                    continue
                except PackCorrupted as exc:
                    f.drop_base(exc)
            elif src >= 0:
                recorded = f.read_record(i, self.maps)
                if recorded is not None:
                    if i in probes:
                        probe(f.load_item, f.items[i], recorded, f.allow_pickle, i)
                    yield recorded
                    continue
            f.loaded += 1
            try:
                loaded = f.load_item(f.items[i])
            except BaseException as exc:  # the user's error, not the cache's
                f.load_error = exc
                raise
            yield read_back(loaded, f.allow_pickle, i)  # as the records beside it
