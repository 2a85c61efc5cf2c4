"""The record of a sample shaped like the one before it, encoded without asking
again what each field is: the first epoch's every sample (see
:mod:`mlcache.data.filling`).

A dataset's samples share their fields, in the same order, each of the same
kind: an array of one dtype and ndim, an int, a str... A :class:`SampleLayout`
is made from one sample (:meth:`SampleLayout.of`), with the framing of every
field (its name, kind and dtype: the bytes :func:`~mlcache.data.records.encode_sample`
writes before a value) made once. :meth:`SampleLayout.encode` then gives a sample
of that layout the very payload ``encode_sample`` gives it, and proves on the way
what the filler would ask of it with three more passes over its fields:

- it has the first sample's fields (nothing to refuse, as
  ``RecordWriting._same_fields`` would);
- it is read back as it is (:func:`~mlcache.data.values.read_back`: no 0-d
  array, no list, no numpy str);
- the sealed form of its arrays is already known (:func:`~mlcache.data.values.as_sealed`
  records a field's dtype only when it differs from the one recorded).

Any other sample (another field, kind, dtype or ndim; an int beyond 64 bits; a
str that is not UTF-8) gets None, and the filler takes its general path.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SampleLayout"]

#: the kinds of field a layout encodes itself (their bytes as encode_sample's)
_ARRAY, _INT, _FLOAT, _STR, _BYTES = range(5)
_PLAIN_KINDS = frozenset("biufcmM")
_KINDS = {int: _INT, float: _FLOAT, str: _STR, bytes: _BYTES}
_KIND_BYTES = {int: b"\x02", float: b"\x03", str: b"\x04", bytes: b"\x05"}
_Q, _q, _d = struct.Struct("<Q"), struct.Struct("<q"), struct.Struct("<d")
#: the shapes (and lengths) of an array field whose framing a layout keeps, at most
_SHAPES = 4096


class SampleLayout:
    """The fields of a sample and their framing (see the module docstring).

    ``steps`` holds, for each field in order: its kind, the bytes before its value
    (the name's length and bytes, the kind byte, an array's dtype and ndim), and
    for an array its dtype, ndim, the struct of its shape and length, and the
    bytes of the shapes met so far (a dataset's arrays have few).
    """

    __slots__ = ("head", "names", "steps")

    def __init__(self, names: tuple[str, ...], head: bytes, steps: list[tuple[Any, ...]]) -> None:
        self.names, self.head, self.steps = names, head, steps

    @classmethod
    def of(cls, sample: Mapping[str, Any]) -> SampleLayout | None:
        """The layout of ``sample``, or None when a field is of a kind a layout does
        not encode (a list, a dict, None, a bool, a numpy scalar, a 0-d array...)."""
        if type(sample) is not dict or not sample:
            return None
        steps: list[tuple[Any, ...]] = []
        for name, v in sample.items():
            if type(name) is not str:
                return None
            try:
                raw = name.encode()
            except UnicodeEncodeError:
                return None
            framed = struct.pack("<H", len(raw)) + raw
            t = type(v)
            if t is np.ndarray:
                dtype = v.dtype
                if not v.ndim or dtype.kind not in _PLAIN_KINDS or dtype.fields is not None:
                    return None
                code = dtype.str.encode()
                head = b"\x06" + bytes([len(code)]) + code + bytes([v.ndim])
                dims = struct.Struct(f"<{v.ndim + 1}Q")
                steps.append((_ARRAY, framed + head, dtype, v.ndim, (dims, {})))
            elif t in _KINDS:
                steps.append((_KINDS[t], framed + _KIND_BYTES[t], None, 0, None))
            else:
                return None
        layout = cls(tuple(sample), b"MLS1" + struct.pack("<I", len(sample)), steps)
        return layout if layout.encode(sample) is not None else None

    def encode(self, sample: dict[str, Any]) -> bytes | None:
        """The payload of ``sample``'s record, byte for byte as
        :func:`~mlcache.data.records.encode_sample` writes it, or None when
        ``sample`` is not of this layout."""
        if len(sample) != len(self.names) or tuple(sample) != self.names:
            return None
        parts: list[Any] = [self.head]
        add = parts.append
        try:
            for (kind, framing, dtype, ndim, form), v in zip(self.steps, sample.values()):
                t = v.__class__
                if kind is _ARRAY:
                    if t is not np.ndarray or v.ndim != ndim:
                        return None
                    if v.dtype is not dtype and v.dtype != dtype:
                        return None
                    add(framing)
                    # the shape and the length: the same few shapes again and again
                    shape = v.shape
                    dims, known = form
                    framed = known.get(shape)
                    if framed is None:
                        framed = dims.pack(*shape, v.nbytes)
                        if len(known) < _SHAPES:
                            known[shape] = framed
                    add(framed)
                    # the array's own buffer, joined once (a copy only when not contiguous)
                    add(v if v.flags.c_contiguous else np.ascontiguousarray(v))
                elif kind is _INT:
                    if t is not int:
                        return None
                    add(framing)
                    add(_q.pack(v))  # beyond 64 bits: struct.error
                elif kind is _STR:
                    if t is not str:
                        return None
                    data = v.encode()  # not UTF-8 (a lone surrogate): UnicodeEncodeError
                    add(framing)
                    add(_Q.pack(len(data)))
                    add(data)
                elif kind is _FLOAT:
                    if t is not float:
                        return None
                    add(framing)
                    add(_d.pack(v))
                else:
                    if t is not bytes:
                        return None
                    add(framing)
                    add(_Q.pack(len(v)))
                    add(v)
        except (struct.error, UnicodeEncodeError):
            return None
        return b"".join(parts)
