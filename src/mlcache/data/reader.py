"""``PackedDataset``: random access to a pack file through one memory map."""

from __future__ import annotations

import mmap
import os
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import UnsupportedValue
from .format import HEADER, PackCorrupted, parse_index, read_header

__all__ = ["PackedDataset"]


class _Region:
    """A byte range of the pack, checked block by block the first time it is read."""

    __slots__ = ("block", "checked", "len", "mv", "off", "path", "sums")

    def __init__(self, spec: dict[str, Any], mm: mmap.mmap, block: int, path: str) -> None:
        self.off, self.len, self.sums = int(spec["off"]), int(spec["len"]), spec["sums"]
        self.block = block
        if len(self.sums) != -(-self.len // block):
            raise PackCorrupted(f"{path}: region checksum table has the wrong length")
        self.mv = memoryview(mm)[self.off : self.off + self.len]
        self.checked = bytearray(len(self.sums))
        self.path = path

    def ok(self, start: int, stop: int) -> None:
        """:meth:`check`, with a fast path for a range inside one checked block."""
        b = start // self.block
        if b != (stop - 1) // self.block or not self.checked[b]:
            self.check(start, stop)

    def check(self, start: int, stop: int) -> None:
        """Verify the blocks covering bytes [start, stop) of the region."""
        first, last = start // self.block, max(start, stop - 1) // self.block
        for b in range(first, min(last, len(self.sums) - 1) + 1):
            if not self.checked[b]:
                piece = self.mv[b * self.block : (b + 1) * self.block]
                if xxhash.xxh3_64_intdigest(piece) != self.sums[b]:
                    raise PackCorrupted(f"{self.path}: checksum mismatch in block {b} of a region")
                self.checked[b] = 1


class PackedDataset(Sequence[dict[str, Any]]):
    """A pack file opened for random access: ``len(ds)``, ``ds[i]`` (a dict of
    fields), ``ds.get_batch(indices)``.

    Arrays come back as read-only, zero-copy views of the memory map. Opening is
    O(1) in the number of samples; each 4 MiB block is checksummed the first
    time it is read, so a damaged pack raises :class:`PackCorrupted` (a
    ``ValueError``) naming the file, never returns a wrong sample. Pickling a
    PackedDataset (to a DataLoader worker) sends its path, not its data.

    Parameters
    ----------
    path:
        The pack file, as written by :func:`mlcache.data.pack`.
    allow_pickle:
        Unpickle fields stored with pickle (refused by default).
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_pickle: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.allow_pickle = allow_pickle
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(f"no pack file at {self.path}") from None
        try:
            size = os.fstat(fd).st_size
            n, i_off, i_len, i_sum = read_header(os.pread(fd, HEADER.size, 0), size, self.path)
            index = parse_index(os.pread(fd, i_len, i_off), i_sum, n, size, self.path)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._n = n
        self._index_len = i_len
        self.layout = index  # the parsed index (see mlcache.data.format)
        block = int(index.get("block", 0)) or 1
        self._fields: list[tuple[str, str, Any]] = []
        try:
            for spec in index["fields"]:
                regions = {
                    key: _Region(spec[key], self._mm, block, self.path)
                    for key in ("data", "offsets", "shapes")
                    if key in spec
                }
                self._fields.append((spec["name"], spec["kind"], (spec, regions)))
            self._getters = [
                (name, self._getter(kind, spec, regions))
                for name, kind, (spec, regions) in self._fields
            ]
            self._getter_by_name = dict(self._getters)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PackCorrupted):
                raise
            raise PackCorrupted(f"{self.path}: bad field in the index ({exc})") from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (PackedDataset, (self.path,), {"allow_pickle": self.allow_pickle})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.allow_pickle = state["allow_pickle"]

    def __repr__(self) -> str:
        return f"PackedDataset({self.path!r}, samples={self._n}, fields={self.field_names})"

    def __len__(self) -> int:
        return self._n

    @property
    def field_names(self) -> list[str]:
        return [name for name, _, _ in self._fields]

    def _index(self, i: int) -> int:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"sample indices must be integers, got {type(i).__name__}")
        j = int(i) + self._n if i < 0 else int(i)
        if not 0 <= j < self._n:
            raise IndexError(f"sample {i} out of range for a pack of {self._n} samples")
        return j

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        j = self._index(i)
        return {name: get(j) for name, get in self._getters}

    def _getter(self, kind: str, spec: dict[str, Any], regions: dict[str, _Region]) -> Any:
        """A function j -> the field's value in sample j, with everything that does not
        depend on j (views, dtypes, row sizes) worked out once, at open."""
        if kind == "none":
            return lambda j: None
        data = regions["data"]
        dtype = np.dtype(spec["dtype"])
        if kind == "column":
            shape = tuple(spec["shape"])
            row = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            column = np.frombuffer(data.mv, dtype=dtype).reshape((self._n, *shape))
            py = spec.get("py")
            ok = data.ok
            if py in ("int", "float", "bool"):
                item = column.item

                def scalar(j: int) -> Any:
                    ok(j * row, (j + 1) * row)
                    return item(j)

                return scalar

            def cell(j: int) -> Any:
                ok(j * row, (j + 1) * row)
                return column[j] if py != "scalar" else column[j][()]

            return cell
        if kind not in ("ragged", "str", "bytes", "pickle"):
            raise PackCorrupted(f"{self.path}: unknown field kind {kind!r}")
        offsets = regions["offsets"]
        offs_item = np.frombuffer(offsets.mv, dtype="<i8").item
        raw = data.mv
        ok_offs, ok_data = offsets.ok, data.ok

        def span(j: int) -> tuple[int, int]:
            ok_offs(8 * j, 8 * j + 16)
            start, stop = offs_item(j), offs_item(j + 1)
            if not 0 <= start <= stop <= data.len:
                raise PackCorrupted(f"{self.path}: bad offsets for sample {j}")
            if stop > start:
                ok_data(start, stop)
            return start, stop

        if kind == "ragged":
            ndim = int(spec["ndim"])
            shapes = regions["shapes"]
            shape_rows = np.frombuffer(shapes.mv, dtype="<i8").reshape(self._n, ndim)
            as_bytes = np.frombuffer(raw, dtype=np.uint8)

            def ragged(j: int) -> Any:
                start, stop = span(j)
                shapes.ok(8 * ndim * j, 8 * ndim * (j + 1))
                return as_bytes[start:stop].view(dtype).reshape(tuple(shape_rows[j].tolist()))

            return ragged
        if kind == "str":

            def text(j: int) -> str:
                start, stop = span(j)
                return str(raw[start:stop], "utf-8", "surrogatepass")

            return text
        if kind == "bytes":

            def blob(j: int) -> bytes:
                start, stop = span(j)
                return raw[start:stop].tobytes()

            return blob

        def unpickle(j: int) -> Any:
            start, stop = span(j)
            if not self.allow_pickle:
                raise UnsupportedValue(
                    f"{self.path}: field {spec['name']!r} holds pickles; open the pack with "
                    "allow_pickle=True to load them"
                )
            return pickle.loads(raw[start:stop])

        return unpickle

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``indices`` as one dict: column fields stacked into arrays of shape
        ``[len(indices), ...]`` (one read, no Python loop), other fields as lists."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise TypeError("indices must be a 1-d sequence of integers")
        idx = np.where(idx < 0, idx + self._n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError(f"indices out of range for a pack of {self._n} samples")
        batch: dict[str, Any] = {}
        for name, kind, (spec, regions) in self._fields:
            if kind == "column":
                shape = tuple(spec["shape"])
                dtype = np.dtype(spec["dtype"])
                data = regions["data"]
                data.check(0, data.len)  # a batch reads across the whole column
                column = np.frombuffer(data.mv, dtype=dtype).reshape((self._n, *shape))
                batch[name] = column[idx]
            else:
                get = self._getter_by_name[name]
                batch[name] = [get(int(j)) for j in idx]
        return batch

    def verify(self) -> None:
        """Check every byte of the pack now: each block against its checksum, and the
        padding between regions (which no read uses) for zeros. Raises
        :class:`PackCorrupted` if anything is damaged."""
        spans = [(0, HEADER.size)]
        for _, _, (_, regions) in self._fields:
            for region in regions.values():
                region.check(0, region.len)
                spans.append((region.off, region.off + region.len))
        index_off = len(self._mm) - self._index_len
        spans.append((index_off, len(self._mm)))
        pos = 0
        for start, stop in sorted(spans):
            if start > pos and any(self._mm[pos:start]):
                raise PackCorrupted(f"{self.path}: damaged bytes between regions at {pos}")
            pos = max(pos, stop)
