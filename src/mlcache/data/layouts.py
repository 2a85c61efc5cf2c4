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
- :func:`~mlcache.data.values.as_sealed` has nothing to record of it: a layout
  is made only while the dtype it recorded of each array field is the sample's
  own, and the filler drops its layouts when it records something new
  (``RecordWriting._payload``).

Any other sample (another field, kind, dtype or ndim; a name or a value of
another type that compares equal; an int beyond 64 bits; a str that is not
UTF-8) gets None, and the filler takes its general path.

The encoding of a layout is one function written for it (as
:func:`collections.namedtuple` writes its class): the fields' checks in a row,
then one ``join`` of constants, the numbers packed between them, and the
values' bytes. A loop over the fields cost ~4 us a sample; the function ~2. Its
source holds names made of field numbers only, never a name or value of the
sample (those are its constants).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .records import PLAIN, PLAIN_KINDS, framed_name

__all__ = ["SampleLayout"]

#: the kind byte of each Python type a layout encodes (records.py's kinds), and the
#: struct code of what follows it (a number, or the length of the bytes that follow)
_KINDS = {int: (b"\x02", "q"), float: (b"\x03", "d"), str: (b"\x04", "Q"), bytes: (b"\x05", "Q")}
#: the shapes (and lengths) of an array field whose framing a layout keeps, at most
_SHAPES = 4096


class SampleLayout:
    """The fields of a sample, in order, and the function that encodes a sample of
    them (see the module docstring)."""

    __slots__ = ("encode", "names")

    def __init__(self, names: tuple[str, ...], encode: Callable[[dict[str, Any]], bytes | None]):
        self.names = names
        #: ``encode(sample)``: the payload of ``sample``'s record, byte for byte as
        #: :func:`~mlcache.data.records.encode_sample` writes it, or None when
        #: ``sample`` is not of this layout
        self.encode = encode

    @classmethod
    def of(
        cls, sample: Mapping[str, Any], forms: Mapping[str, Any] | None = None
    ) -> SampleLayout | None:
        """The layout of ``sample``, or None when a field is of a kind a layout does
        not encode (a list, a dict, None, a bool, a numpy scalar, a 0-d array...),
        or when ``forms`` (what :func:`~mlcache.data.values.as_sealed` recorded of
        each field) does not hold an array field's dtype: ``as_sealed`` would
        record something of a sample of the layout, which skips it."""
        if type(sample) is not dict or not sample:
            return None
        writer = _Writer(len(sample))
        for k, (name, v) in enumerate(sample.items()):
            framed = framed_name(name)
            if framed is None:  # not a str of UTF-8
                return None
            t = type(v)
            if t is np.ndarray:
                dtype = v.dtype
                if not v.ndim or dtype.kind not in PLAIN_KINDS or dtype.fields is not None:
                    return None
                form = forms.get(name) if forms is not None else (dtype,)
                if form.__class__ is not tuple or form[0] != dtype:
                    return None
                code = dtype.str.encode()
                writer.array(k, framed + b"\x06" + bytes([len(code)]) + code + bytes([v.ndim]), v)
            elif t in _KINDS:
                writer.value(k, framed, t)
            else:
                return None
        layout = cls(tuple(sample), writer.function(tuple(sample)))
        return layout if layout.encode(sample) is not None else None


class _Writer:
    """The source of a layout's encoding, field by field: checks, then the parts of
    one ``join``; consecutive constants and numbers are one ``struct`` pack."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.checks: list[str] = []
        self.prepare: list[str] = []
        self.parts: list[str] = []
        self.consts: dict[str, Any] = {"ndarray": np.ndarray, "contiguous": np.ascontiguousarray}
        #: the run of constants and numbers being gathered: struct codes, arguments
        self.codes, self.args = "<4sI", [self._const("plain", PLAIN), str(count)]

    def _const(self, name: str, value: Any) -> str:
        self.consts[name] = value
        return name

    def _flush(self) -> None:
        """The run of constants and numbers gathered so far, as one part."""
        if self.args:
            pack = self._const(f"run{len(self.parts)}", struct.Struct(self.codes).pack)
            self.parts.append(f"{pack}({', '.join(self.args)})")
        self.codes, self.args = "<", []

    def _bytes(self, data: bytes) -> None:
        self.codes += f"{len(data)}s"
        self.args.append(self._const(f"c{len(self.consts)}", data))

    def array(self, k: int, framing: bytes, v: np.ndarray) -> None:
        """Field ``k``, an array like ``v``: its framing, its shape and length (the
        bytes of each shape made once), its buffer."""
        dtype, dims = self._const(f"dtype{k}", v.dtype), struct.Struct(f"<{v.ndim + 1}Q")
        known: dict[tuple[int, ...], bytes] = {}

        def framed(a: np.ndarray) -> bytes:
            out = dims.pack(*a.shape, a.nbytes)
            if len(known) < _SHAPES:
                known[a.shape] = out
            return out

        self._const(f"known{k}", known)
        self._const(f"frame{k}", framed)
        self.checks.append(
            f"if type(v{k}) is not ndarray or v{k}.ndim != {v.ndim} or "
            f"(v{k}.dtype is not {dtype} and v{k}.dtype != {dtype}): return None"
        )
        self.prepare.append(f"h{k} = known{k}.get(v{k}.shape) or frame{k}(v{k})")
        # the array's own buffer, joined once (a copy only when not contiguous)
        self.prepare.append(f"if not v{k}.flags.c_contiguous: v{k} = contiguous(v{k})")
        self._bytes(framing)
        self._flush()
        self.parts += [f"h{k}", f"v{k}"]

    def value(self, k: int, framed_name: bytes, t: type) -> None:
        """Field ``k``, a value of type ``t``: its kind, then the number, or the
        length and the bytes."""
        kind, code = _KINDS[t]
        self.checks.append(f"if type(v{k}) is not {self._const(f't{k}', t)}: return None")
        self._bytes(framed_name + kind)
        if t is str:  # not UTF-8 (a lone surrogate): UnicodeEncodeError
            self.prepare.append(f"v{k} = v{k}.encode()")
        self.codes += code
        if code == "Q":
            self.args.append(f"len(v{k})")
            self._flush()
            self.parts.append(f"v{k}")
        else:  # an int beyond 64 bits: struct.error
            self.args.append(f"v{k}")

    def function(self, names: tuple[str, ...]) -> Callable[[dict[str, Any]], bytes | None]:
        self._flush()
        values = ", ".join(f"v{k}" for k in range(self.count))
        keys = ", ".join(f"k{k}" for k in range(self.count))
        exact = " or ".join(f"type(k{k}) is not str" for k in range(self.count))
        lines = [
            "def encode(sample):",
            f"    if len(sample) != {self.count}: return None",
            f"    ({keys},) = sample",
            # the names, each a str (as encode_sample's: a subclass is no plain name)
            f"    if ({keys},) != names or {exact}: return None",
            f"    ({values},) = sample.values()",
            *(f"    {line}" for line in self.checks),
            "    try:",
            *(f"        {line}" for line in self.prepare),
            f"        return b''.join(({', '.join(self.parts)},))",
            "    except (OverflowError, UnicodeEncodeError, struct_error): return None",
        ]
        namespace = {**self.consts, "names": names, "struct_error": struct.error}
        exec("\n".join(lines), namespace)  # its names: field numbers only
        encode: Callable[[dict[str, Any]], bytes | None] = namespace["encode"]
        return encode
