"""The checked byte regions of a pack and the sample reader generated over them.

Reading sample ``j`` is the hot path of a training loop, so it is one function
per pack, generated from the pack's fields when the pack is first read (the way
``dataclasses`` generates ``__init__``): no loop over fields, no call per field,
and only the checks the pack still needs. Every name in the generated code is
ours (``o0``, ``v1``, ...); field names and values only ever appear as objects in
its namespace, never in its text.

Arrays a read returns are private to that read and writable (``s["x"] /= 255``
works and never reaches another read, nor the pack): an array of at least
:data:`PRIVATE_MAP_MIN` bytes is a copy-on-write map of its own pages of the file
(zero-copy until a page is written), a smaller one is copied, which costs less
than a map. The pack itself is mapped read-only, once.

:class:`Region` is a byte range checked block by block the first time it is
read; :class:`Field` is one field's index entry and regions, and writes its part
of the generated reader; :func:`compile_reader` assembles it. Only
:class:`mlcache.data.reader.PackedDataset` uses them.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from ..errors import PackChanged, PackCorrupted, UnsupportedValue
from .format import REGION_KEYS
from .values import TORCH_BITS

__all__ = [
    "CHECK_EVERY",
    "PRIVATE_MAP_MIN",
    "TEXT_WHOLE_MAX",
    "Field",
    "Region",
    "compile_reader",
    "field_regions",
    "refuse",
    "unpickle",
]

#: arrays of at least this many bytes are returned as a private copy-on-write map
#: of their pages, smaller ones as a copy: read whole, a copy costs less below about
#: 300 KiB (a map is ~5 us, and each page read faults), a map less above
#: (benchmarks/bench_reader.py); a map never doubles the memory of a large sample
PRIVATE_MAP_MIN = 256 << 10
#: a reader looks at its file (one fstat) every this many reads, besides at each
#: epoch (``len``, ``iter``), batch and worker start
CHECK_EVERY = 256
#: a text field of at most this many bytes, all ASCII (ids, labels, short
#: captions), is verified and decoded whole at the first read, once per process,
#: and a read slices that ``str``: ~0.1 us less a field and a sample than
#: decoding the sample's bytes (benchmarks/bench_data.py); a larger or non-ASCII
#: one is decoded sample by sample, so that no process holds a copy of it
TEXT_WHOLE_MAX = 4 << 20


def _private_map(fd: int, base: int, path: str, a: int, z: int, view: np.ndarray) -> np.ndarray:
    """Bytes [a, z) of the region at ``base`` of the file ``fd`` (whose read-only
    view is ``view``) as a writable array of their own: a private copy-on-write map
    of their pages, so that nothing is copied until a page is written."""
    start = base + a
    page = start - start % mmap.ALLOCATIONGRANULARITY
    try:
        m = mmap.mmap(fd, base + z - page, access=mmap.ACCESS_COPY, offset=page)
    except ValueError:  # the file is shorter than the region now
        raise PackChanged(
            f"{path}: the pack file is shorter than when it was opened (truncated or "
            "rewritten in place); open it again"
        ) from None
    except OSError:  # out of maps (vm.max_map_count) or file descriptors: a copy will do
        return view.copy()
    return np.ndarray(view.shape, view.dtype, buffer=m, offset=start - page)


def refuse(kind: type[PackCorrupted], message: str, *_: Any) -> Any:
    raise kind(message)


# memoryview formats that give the Python scalars of int/float/bool columns directly
_PY_FORMATS = {("int", "<i8"): "q", ("float", "<f8"): "d", ("bool", "|b1"): "?"}
_LITTLE = sys.byteorder == "little"


class Region:
    """A byte range of the pack, checked block by block the first time it is read.

    ``checked[b]`` is 1 once block ``b`` matched its checksum; one extra entry,
    always 1, lets a reader test ``checked[start >> shift]`` for an empty range at
    the very end without a bounds check. ``pending`` counts the blocks not yet
    checked; ``on_complete`` (a weak reference to a method, so that the dataset
    and its map are freed as soon as it is dropped) is called when it reaches zero.
    """

    __slots__ = (
        "block",
        "checked",
        "fd",
        "fetch",
        "file_size",
        "len",
        "mv",
        "nblocks",
        "off",
        "on_complete",
        "path",
        "pending",
        "shift",
        "sums",
    )

    def __init__(self, spec: dict[str, Any], mm: mmap.mmap, block: int, path: str) -> None:
        self.off, self.len, self.sums = int(spec["off"]), int(spec["len"]), spec["sums"]
        self.block, self.shift = block, block.bit_length() - 1
        self.nblocks = self.pending = len(self.sums)
        if self.nblocks != -(-self.len // block):
            raise PackCorrupted(f"{path}: region checksum table has the wrong length")
        self.mv = memoryview(mm)[self.off : self.off + self.len]
        if self.off < 0 or len(self.mv) != self.len:
            raise PackCorrupted(f"{path}: a region lies outside the file")
        self.checked = bytearray(self.nblocks) + b"\x01"
        self.path = path
        #: fills bytes [start, stop) of the file when they are missing (a sparse
        #: local copy of a remote pack), or None
        self.fetch: Callable[[int, int], None] | None = None
        self.on_complete: Callable[[], Callable[[], None] | None] | None = None
        #: the pack's open file and size: before hashing a block of the map, the file
        #: must still hold it (a block past the end of a truncated file is a SIGBUS)
        self.fd: int | None = None
        self.file_size = 0

    def check(self, start: int, stop: int) -> None:
        """Verify the blocks covering bytes [start, stop) of the region."""
        first, last = start >> self.shift, max(start, stop - 1) >> self.shift
        for b in range(first, min(last, self.nblocks - 1) + 1):
            if not self.checked[b]:
                if self.fd is not None and os.fstat(self.fd).st_size != self.file_size:
                    raise PackChanged(
                        f"{self.path}: the pack file was truncated or rewritten in place "
                        f"since it was opened ({self.file_size} bytes, now "
                        f"{os.fstat(self.fd).st_size}); open it again"
                    )
                piece = self.mv[b * self.block : (b + 1) * self.block]
                if xxhash.xxh3_64_intdigest(piece) != self.sums[b]:
                    if self.fetch is not None:  # not fetched yet: fetch, check again
                        start = self.off + b * self.block
                        self.fetch(start, start + len(piece))
                    if self.fetch is None or xxhash.xxh3_64_intdigest(piece) != self.sums[b]:
                        raise PackCorrupted(
                            f"{self.path}: checksum mismatch in block {b} of a region"
                        )
                self.checked[b] = 1
                self.pending -= 1
                # recounted: two threads verifying one block both decrement
                if self.pending <= 0 and self.on_complete is not None:
                    self.pending = self.checked.count(0)
                    complete = self.on_complete()  # a weak reference to the reader's method
                    if not self.pending and complete is not None:
                        complete()

    def table(self, rows: int, cols: int = 1) -> np.ndarray:
        """The whole region, verified now, as an int64 table of ``rows`` x ``cols``."""
        self.check(0, self.len)
        if self.len != 8 * rows * cols:
            raise PackCorrupted(f"{self.path}: a table region has the wrong size")
        return np.frombuffer(self.mv, dtype="<i8").reshape(rows, cols)


def field_regions(spec: dict[str, Any], mm: mmap.mmap, block: int, path: str) -> dict[str, Region]:
    """The regions of the field entry ``spec``, by key; a ``dict`` field's hold those
    of its sub-fields too, as ``"<i>/<key>"`` (so that whoever checks, fetches or
    verifies a field's regions covers its sub-fields)."""
    regions = {key: Region(spec[key], mm, block, path) for key in REGION_KEYS if key in spec}
    if spec["kind"] in ("dict", "tensor"):  # nesting bounded by format.parse_index
        for i, child in enumerate(spec["fields"]):
            for key, region in field_regions(child, mm, block, path).items():
                regions[f"{i}/{key}"] = region
    return regions


#: the field kinds this reader knows (an older one refuses the newer kinds)
KINDS = ("none", "column", "ragged", "str", "bytes", "strs", "dict", "tensor", "pickle")


class Field:
    """One field of the pack: its index entry, its regions, and, once the pack is
    first read, its verified tables as the generated reader indexes them."""

    __slots__ = (
        "children",
        "dtype",
        "ends",
        "inner",
        "kind",
        "largest",
        "name",
        "ndim",
        "offsets",
        "regions",
        "row",
        "shapes",
        "spec",
        "text",
        "width",
    )

    def __init__(self, spec: dict[str, Any], regions: dict[str, Region], path: str) -> None:
        self.spec, self.regions = spec, regions
        self.name: str = spec["name"]
        self.kind: str = spec["kind"]
        if self.kind not in KINDS:
            raise PackCorrupted(
                f"{path}: field {self.name!r} has unknown kind {self.kind!r} (unsupported "
                "by this version of mlcache: written by a newer one?)"
            )
        self.dtype = np.dtype(spec.get("dtype", "|u1"))
        if (
            self.dtype.hasobject
            or self.dtype.fields is not None
            or self.dtype.kind not in "biufcmM"
        ):
            # only plain numbers are ever written; anything else in an index is hostile
            raise PackCorrupted(f"{path}: field {self.name!r} has dtype {self.dtype}")
        self.ndim = int(spec.get("ndim", 0))
        self.row = 0  # bytes of a column's row, or of one step along a ragged first axis
        self.inner: tuple[int, ...] | None = None  # a ragged field's fixed trailing shape
        self.offsets: Any = None
        self.shapes: Any = None
        #: a small all-ASCII text field, decoded whole (a sample is a slice), or None
        self.text: str | None = None
        #: the length of every sample's text when they share one (ids, codes): a read
        #: slices without the offsets; the bytes of a ragged field's largest sample
        self.width: int | None = None
        self.largest = 0
        self.ends: Any = None  # a strs field's string ends (bytes into data)
        #: a dict field's sub-fields, each with its regions (keys "<i>/..." of ours)
        self.children = [
            Field(child, _under(regions, f"{i}/"), path)
            for i, child in enumerate(spec["fields"] if self.kind in ("dict", "tensor") else ())
        ]

    def prepare(self, n: int, path: str) -> None:
        """Verify this field's tables (offsets, shapes, columns of Python scalars: 8
        bytes a sample) whole, and check that they agree with each other and with the
        data, so that a read needs no bounds checks of its own."""
        kind, data = self.kind, self.regions.get("data")
        for child in self.children:
            child.prepare(n, path)
        if kind == "none" or (data is None and kind not in ("dict", "tensor")):
            return
        bad = f"{path}: field {self.name!r}"
        valid = self.regions.get("valid")
        if valid is not None:
            valid.check(0, valid.len)
            if valid.len != n:
                raise PackCorrupted(f"{bad} has a validity table of the wrong size")
        if kind == "tensor":
            self._check_tensor(bad)
        if data is None:  # a dict or a tensor: its sub-fields hold the data
            return
        if kind == "column":
            shape = tuple(self.spec["shape"])  # checked ints (format.parse_index)
            self.row = self.dtype.itemsize * math.prod(shape)
            if data.len != n * self.row:
                raise PackCorrupted(f"{bad} has the wrong size")
            if self.spec.get("py") in ("int", "float", "bool"):
                data.check(0, data.len)
            return
        table = self.regions["offsets"].table(n + 1)[:, 0]
        if kind == "strs":  # offsets count strings; their ends count bytes
            if table[0] != 0 or (table[1:] < table[:-1]).any():
                raise PackCorrupted(f"{bad} has bad offsets")
            ends = self.regions["ends"].table(int(table[-1]) + 1)[:, 0]
            if ends[0] != 0 or ends[-1] != data.len or (ends[1:] < ends[:-1]).any():
                raise PackCorrupted(f"{bad} has bad string ends")
            self.offsets = self.regions["offsets"].mv.cast("q") if _LITTLE else table.tolist()
            self.ends = self.regions["ends"].mv.cast("q") if _LITTLE else ends.tolist()
            return
        if table[0] != 0 or table[-1] != data.len or (table[1:] < table[:-1]).any():
            raise PackCorrupted(f"{bad} has bad offsets")
        self.offsets = self.regions["offsets"].mv.cast("q") if _LITTLE else table.tolist()
        if kind == "str" and data.len <= TEXT_WHOLE_MAX:
            data.check(0, data.len)
            raw = bytes(data.mv)
            if raw.isascii():  # one byte a character: the offsets index the str too
                self.text = raw.decode("ascii")
                width = data.len // n if n else 0
                same = n and width * n == data.len and _steps_of(table, width)
                self.width = width if same else None
        if kind == "ragged":
            shapes = self.regions["shapes"].table(n, self.ndim)
            if self.ndim < 1 or (shapes < 0).any():
                raise PackCorrupted(f"{bad} has bad shapes")
            # products that would wrap around in int64 cannot match a real size
            if (np.prod(shapes, axis=1, dtype=np.float64) >= 2.0**52).any():
                raise PackCorrupted(f"{bad} has impossible shapes")
            sizes = np.prod(shapes, axis=1, dtype=np.int64) * self.dtype.itemsize
            if (sizes != np.diff(table)).any():
                raise PackCorrupted(f"{bad} has bad shapes")
            self.largest = int(sizes.max()) if n else 0
            self.shapes = (
                self.regions["shapes"].mv.cast("q") if _LITTLE else shapes.ravel().tolist()
            )
            # the common case, a variable first axis only ([T, C] series, [T] tokens):
            # a sample is a slice of one [-1, *inner] view, no shape table needed
            inner = shapes[0, 1:]
            row = self.dtype.itemsize * int(np.prod(inner, dtype=np.int64))
            if row and (shapes[:, 1:] == inner).all():
                self.inner, self.row = tuple(inner.tolist()), row

    def _check_tensor(self, bad: str) -> None:
        """A tensor field's one sub-field is an array field of a dtype torch takes
        (the same size as ``view``'s, when it is the bits of one)."""
        (values,) = self.children
        view = self.spec.get("view")
        dtype = values.dtype
        if (
            values.kind not in ("column", "ragged")
            or values.spec.get("py") is not None
            or dtype.kind not in "biufc"
            or not dtype.isnative
            or (
                view is not None
                and (
                    view not in TORCH_BITS or dtype.itemsize != np.dtype(TORCH_BITS[view]).itemsize
                )
            )
        ):
            raise PackCorrupted(f"{bad} holds tensors of {view or dtype} as {values.kind}")

    def code(
        self,
        k: int | str,
        n: int,
        ns: dict[str, Any],
        unpickle: Any,
        fd: int,
        path: str,
        private: bool,
    ) -> list[str]:
        """Lines that leave this field's value for sample ``j`` in ``v{k}``; the
        objects they use go into ``ns`` under names suffixed with ``k``. With
        ``private``, arrays are made private to the read (``fd`` is the pack's
        file, for their maps); else they are read-only views of the shared map."""
        if self.kind == "tensor":  # its values, then the tensor over them
            lines = self.children[0].code(f"{k}_0", n, ns, unpickle, fd, path, private)
            ns[f"q{k}"] = _tensor_maker(self.spec.get("view"), path, self.name)
            lines.append(f"v{k} = q{k}(v{k}_0)")
        elif self.kind == "dict":
            lines = self._dict_code(k, n, ns, unpickle, fd, path, private)
        else:
            lines = self._value_code(k, n, ns, unpickle)
        if private and (self.kind == "ragged" or (self.kind == "column" and self.spec["shape"])):
            ns[f"p{k}"] = functools.partial(_private_map, fd, self.regions["data"].off, path)
            if self.kind == "column":  # one size for every row: decided here
                if self.row < PRIVATE_MAP_MIN:
                    lines.append(f"v{k} = v{k}.copy()")
                else:
                    lines.append(f"v{k} = p{k}(a, a + w{k}, v{k})")
            elif self.largest < PRIVATE_MAP_MIN:  # the common case: no test
                lines.append(f"v{k} = v{k}.copy()")
            else:
                lines += [
                    f"if z - a < {PRIVATE_MAP_MIN}:",
                    f"    v{k} = v{k}.copy()",
                    "else:",
                    f"    v{k} = p{k}(a, z, v{k})",
                ]
        if "valid" in self.regions:  # None where the sample has no value
            ns[f"m{k}"] = self.regions["valid"].mv
            lines = [
                f"if m{k}[j]:",
                *(f"    {line}" for line in lines),
                "else:",
                f"    v{k} = None",
            ]
        return lines

    def _dict_code(
        self,
        k: int | str,
        n: int,
        ns: dict[str, Any],
        unpickle: Any,
        fd: int,
        path: str,
        private: bool,
    ) -> list[str]:
        """Each sub-field's lines (names suffixed ``k_i``), then the dict of them."""
        lines, items = [], []
        for i, child in enumerate(self.children):
            c = f"{k}_{i}"
            lines += child.code(c, n, ns, unpickle, fd, path, private)
            ns[f"n{c}"] = child.name
            items.append(f"n{c}: v{c}")
        return [*lines, f"v{k} = {{{', '.join(items)}}}"]

    def _value_code(self, k: int | str, n: int, ns: dict[str, Any], unpickle: Any) -> list[str]:
        kind, spec = self.kind, self.spec
        if kind == "none":
            return [f"v{k} = None"]
        data = self.regions["data"]
        ns.update({f"r{k}": data.mv, f"c{k}": data.checked, f"k{k}": data.check})
        ns[f"s{k}"] = data.shift
        if kind == "strs":  # strings a to z, bytes y to x
            ns[f"o{k}"], ns[f"e{k}"], ns[f"u{k}"] = self.offsets, self.ends, _strings
            lines = [f"a = o{k}[j]", f"z = o{k}[j + 1]"]
            if data.pending:
                lines += [
                    f"y = e{k}[a]",
                    f"x = e{k}[z]",
                    f"b = y >> s{k}",
                    f"if not c{k}[b] or (x - 1) >> s{k} != b:",
                    f"    k{k}(y, x)",
                ]
            return [*lines, f"v{k} = u{k}(r{k}, e{k}, a, z)"]
        if kind == "column":
            py = spec.get("py")
            fmt: Any = _PY_FORMATS.get((str(py), self.dtype.str)) if _LITTLE else None
            if fmt is not None:  # Python scalars, no numpy; a subscript, not a call
                ns[f"g{k}"] = data.mv.cast(fmt)
                return [f"v{k} = g{k}[j]"]
            column = np.frombuffer(data.mv, dtype=self.dtype).reshape((n, *spec["shape"]))
            if py in ("int", "float", "bool"):  # a format memoryview cannot give directly
                ns[f"g{k}"] = column.item
                return [f"v{k} = g{k}(j)"]
            ns[f"g{k}"], ns[f"w{k}"] = column, self.row
            start, stop, value = f"j * w{k}", f"a + w{k}", f"g{k}[j]"
        elif self.width is not None:  # text of one width, verified whole (prepare)
            ns[f"x{k}"], ns[f"w{k}"] = self.text, self.width
            # a str of one character is CPython's own: indexing it allocates nothing
            one = [f"v{k} = x{k}[j]"]
            return one if self.width == 1 else [f"a = j * w{k}", f"v{k} = x{k}[a : a + w{k}]"]
        else:
            ns[f"o{k}"] = self.offsets
            start, stop = f"o{k}[j]", f"o{k}[j + 1]"
            if kind == "ragged" and self.inner is not None:
                ns[f"f{k}"] = np.frombuffer(data.mv, self.dtype).reshape(-1, *self.inner)
                ns[f"w{k}"] = self.row
                value = f"f{k}[a // w{k} : z // w{k}]"
            elif kind == "ragged":
                ns[f"h{k}"], ns[f"t{k}"] = self.shapes, self.dtype
                d = self.ndim
                shape = {
                    1: f"(h{k}[j],)",
                    2: f"(h{k}[2 * j], h{k}[2 * j + 1])",
                }.get(d, f"tuple(h{k}[{d} * j : {d} * j + {d}])")
                value = f"nd({shape}, t{k}, r{k}, a)"
            elif self.text is not None:
                ns[f"x{k}"] = self.text
                value = f"x{k}[a:z]"
            elif kind in ("str", "bytes"):  # bytes sliced from the map: the fastest copy
                ns["mm"], ns[f"b{k}"] = data.mv.obj, data.off
                value = f"mm[b{k} + a : b{k} + z]"
            else:
                ns["unpickle"] = unpickle
                value = f"unpickle(r{k}[a:z], n{k})"
        # a column's row is found by numpy: its start is needed to verify or to map it
        needed = kind != "column" or data.pending or self.row >= PRIVATE_MAP_MIN
        lines = [f"a = {start}"] if needed else []
        if data.pending or "z" in value or kind == "ragged":
            lines.append(f"z = {stop}")
        if data.pending:  # blocks not yet verified: test the one byte, verify if needed
            lines += [
                f"b = a >> s{k}",
                f"if not c{k}[b] or (z - 1) >> s{k} != b:",
                f"    k{k}(a, z)",
            ]
        if kind == "str" and self.text is None:  # strict UTF-8 is the fast decoder;
            # surrogates need the other
            lines += [
                "try:",
                f"    v{k} = {value}.decode()",
                "except UnicodeDecodeError:",
                f'    v{k} = {value}.decode("utf-8", "surrogatepass")',
            ]
        else:
            lines.append(f"v{k} = {value}")
        return lines


def _tensor_maker(view: str | None, path: str, name: str) -> Callable[[Any], Any]:
    """The function making a sample's tensor of its array (its own memory when the
    array is writable, a read's default; a copy of a read-only view)."""
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"{path}: field {name!r} holds torch tensors: pip install torch to read it"
        ) from None
    as_view = getattr(torch, view) if view is not None else None

    def make(values: Any) -> Any:
        arr = np.asarray(values)  # a 0-d column's value is a numpy scalar
        tensor = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        return tensor if as_view is None else tensor.view(as_view)

    return make


def _steps_of(table: np.ndarray, width: int) -> bool:
    """Every step of ``table`` (verified offsets, rising from 0) is ``width``; looked
    at a million at a time, so that a long table costs no copy of its size."""
    if not width:  # rising from 0 to 0: all steps are 0
        return True
    step = 1 << 20
    return all(
        (np.diff(table[s : s + step + 1]) == width).all() for s in range(0, len(table), step)
    )


def _under(regions: dict[str, Region], prefix: str) -> dict[str, Region]:
    """The regions keyed ``prefix + key``, by ``key`` (a sub-field's)."""
    return {key[len(prefix) :]: r for key, r in regions.items() if key.startswith(prefix)}


def _strings(data: memoryview, ends: Any, a: int, z: int) -> list[str]:
    """Strings ``a`` to ``z`` of a strs field (verified bytes; ``ends`` checked)."""
    first = ends[a]
    raw = bytes(data[first : ends[z]])
    if raw.isascii():  # one byte a character: the ends index the str too
        text = raw.decode("ascii")
        return [text[ends[i] - first : ends[i + 1] - first] for i in range(a, z)]
    out = []
    for i in range(a, z):
        piece = raw[ends[i] - first : ends[i + 1] - first]
        try:  # strict UTF-8 is the fast decoder; surrogates need the other
            out.append(piece.decode())
        except UnicodeDecodeError:
            out.append(piece.decode("utf-8", "surrogatepass"))
    return out


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> types.CodeType:
    """Compiled once per process: every pack of one layout has the same source."""
    return compile(source, "<mlcache pack reader>", "exec")


def compile_reader(
    fields: list[Field],
    n: int,
    unpickle: Any,
    fd: int,
    path: str,
    tick: Callable[[], Callable[[], Any] | None],
    private: bool = True,
) -> Callable[[int], dict[str, Any]]:
    """The function ``j -> {name: value}`` for sample ``j`` (0 <= j < n, checked by
    the caller) over ``fields``, which must be prepared.

    Every :data:`CHECK_EVERY` calls it calls ``tick()()`` (a weak reference to the
    reader's file check): that raises if the file changed, or returns the reader to
    use instead (blocks to verify again), or None."""
    ns: dict[str, Any] = {"nd": np.ndarray, "tick": tick}
    body: list[str] = []
    for k, field in enumerate(fields):
        body += field.code(k, n, ns, unpickle, fd, path, private)
        ns[f"n{k}"] = field.name
    items = ", ".join(f"n{k}: v{k}" for k in range(len(fields)))
    head = [
        "nonlocal left",
        "left -= 1",
        "if not left:",
        f"    left = {CHECK_EVERY}",
        "    t = tick()",
        "    t = t() if t is not None else None",
        "    if t is not None:",
        "        return t(j)",
    ]
    source = f"def make():\n    left = {CHECK_EVERY}\n    def sample(j):\n"
    source += "".join(f"        {line}\n" for line in head + body)
    source += f"        return {{{items}}}\n    return sample\n"
    exec(_compiled(source), ns)  # our own text, see above
    sample: Callable[[int], dict[str, Any]] = ns["make"]()
    sample.__doc__ = source
    return sample


def unpickle(path: str, allow: bool, data: memoryview, name: str) -> Any:
    if not allow:
        raise UnsupportedValue(
            f"{path}: field {name!r} holds pickles; open the pack with allow_pickle=True "
            "to load them"
        )
    return pickle.loads(data)
