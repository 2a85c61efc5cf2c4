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

import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from ..errors import PackCorrupted
from .frozen import probe, probe_picks
from .records import PLAIN, RECORD, PlainLayout, decode_sample
from .values import read_back
from .writer import CopiedField

if TYPE_CHECKING:
    from .filling import Filler

__all__ = ["BASE", "MISSING", "SealSource"]

#: the pieces of a copied field's data are joined up to about this many bytes
_PIECE = 1 << 20
#: where a filler's item is (``Filler.src``): not recorded, or in the old pack (a
#: number from 0 is a segment's)
MISSING, BASE = -2, -1
#: the kinds of :func:`~mlcache.data.records.plain_spans` read back as scalars
_SCALARS = frozenset(("int", "float", "bool", "scalar"))


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
            found = self._spans(f.src.tolist(), f.pos.tolist())
        except (OSError, ValueError, IndexError, struct.error):
            return None  # damaged, not plain, or not copied: decoded (the module docstring)
        if found is None:
            return None
        layout, where, spans = found
        for i in probe_picks(f.loaded_here):  # random augmentation in load_item?
            number, off, length = where[i]
            payload = self.maps[number][off + RECORD.size : off + RECORD.size + length]
            recorded = decode_sample(payload, f.allow_pickle)
            probe(f.load_item, f.items[i], recorded, f.allow_pickle, i)
        fields = [self._field(k, field, where, spans) for k, field in enumerate(layout.fields)]
        return n, fields

    def _spans(
        self, src: list[int], pos: list[int]
    ) -> tuple[PlainLayout, list[tuple[int, int, int]], list[list[Any]]] | None:
        """Every record's segment, offset and payload length, in item order, and the
        spans of its fields' values (checked: the payload's checksum, its layout the
        first record's); None when one differs."""
        maps: dict[int, mmap.mmap] = self.maps
        layout: PlainLayout | None = None
        where: list[tuple[int, int, int]] = []
        spans: list[list[Any]] = []
        seen: dict[tuple[int, int], int] = {}  # an item listed twice: one record
        head = RECORD.unpack_from
        digest = xxhash.xxh3_64_intdigest
        for number, off in zip(src, pos):
            twin = seen.get((number, off))
            if twin is not None:
                where.append(where[twin])
                spans.append(spans[twin])
                continue
            seen[(number, off)] = len(where)
            mapped = maps.get(number)
            if mapped is None:
                mapped = self._map(number)
                if mapped is None:
                    return None
            _m, _f, length, _k, _fp, psum, _h = head(mapped, off)
            start = off + RECORD.size
            if start + length > len(mapped) or mapped[start : start + 4] != PLAIN:
                return None
            if digest(memoryview(mapped)[start : start + length]) != psum:
                return None  # damaged: loaded again by the decoding seal
            if layout is None:
                layout = PlainLayout(mapped, start, start + length)
            where.append((number, off, length))
            spans.append(layout.spans(mapped, start, start + length))
        assert layout is not None
        return layout, where, spans

    def _field(
        self,
        k: int,
        layout: tuple[bytes, str, bytes, int],
        where: list[tuple[int, int, int]],
        spans: list[list[Any]],
    ) -> CopiedField:
        """Field ``k`` of the samples as a :class:`CopiedField` of their bytes."""
        name, kind, code, ndim = layout
        mine = [s[k] for s in spans]
        numbers = [w[0] for w in where]
        data = self._pieces(numbers, mine)
        label = name.decode()
        if kind in _SCALARS:
            return CopiedField(label, "column", code.decode(), data, py=kind)
        sizes = np.fromiter((z - a for a, z, _ in mine), np.int64, len(mine))
        if kind in ("str", "bytes"):
            return CopiedField(label, kind, "|u1", data, sizes=sizes)
        shape = mine[0][2]
        if all(s[2] == shape for s in mine):
            return CopiedField(label, "column", code.decode(), data, shape=tuple(shape))
        shapes = np.array([s[2] for s in mine], np.int64).reshape(len(mine), ndim)
        return CopiedField(label, "ragged", code.decode(), data, shapes=shapes, sizes=sizes)

    def _pieces(self, numbers: list[int], spans: list[Any]) -> Iterator[bytes]:
        """The bytes of ``spans`` (in segments ``numbers``), joined in pieces of
        about :data:`_PIECE` bytes."""
        maps = self.maps
        parts: list[bytes] = []
        size = 0
        for number, (a, z, _shape) in zip(numbers, spans):
            parts.append(maps[number][a:z])
            size += z - a
            if size >= _PIECE:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)

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
