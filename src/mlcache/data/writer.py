"""``pack()``: stream samples into one pack file (see :mod:`mlcache.data.format`).

Samples are written as they arrive into one spill file per field next to the
target (memory stays bounded by the per-sample offsets, 8 bytes a sample), then
the spill files are copied into the pack, each field's data contiguous, and the
pack is published by one rename. An interrupted build leaves no file under the
target name.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from array import array
from collections.abc import Iterable, Mapping, Sized
from typing import Any, BinaryIO

import numpy as np
import xxhash

from .._atomic import atomic_file, open_regular, sweep_dead, temporary_folder
from ..errors import UnsupportedValue
from .format import BLOCK, HEADER, block_sums, pack_header, pad

__all__ = ["pack"]

_COPY = 1 << 20
_PY_COLUMNS = {bool: np.dtype(np.bool_), int: np.dtype("<i8"), float: np.dtype("<f8")}


class _Field:
    """What one field's samples look like so far, and where their bytes went.

    A field may be ``None`` in some samples: it keeps a validity byte per sample
    (``valid``, from the first ``None`` on) and a placeholder in their place
    (a row of zeros in a column, an empty value otherwise). Its kind comes from
    the first sample that has a value.
    """

    def __init__(self, name: str, spill: BinaryIO, allow_pickle: bool) -> None:
        self.name = name
        self.spill = spill
        self.allow_pickle = allow_pickle
        self.kind, self.dtype = "none", np.dtype(np.uint8)
        self.py: str | None = None
        self.shape: tuple[int, ...] = ()
        self.fixed = False  # a column whose samples all have the same shape so far
        self.count = 0
        self.valid: bytearray | None = None
        self.offsets = array("q", [0])
        self.shapes = array("q")

    def _describe(
        self, value: Any, index: int
    ) -> tuple[str, str | None, np.dtype, tuple[int, ...]]:
        t = type(value)
        if t in _PY_COLUMNS:
            return "column", t.__name__, _PY_COLUMNS[t], ()
        if t is str:
            return "str", None, np.dtype(np.uint8), (0,)
        if t is bytes:
            return "bytes", None, np.dtype(np.uint8), (0,)
        plain = isinstance(value, (np.ndarray, np.generic)) and value.dtype.fields is None
        if plain and not value.dtype.hasobject:
            if isinstance(value, np.generic):
                return "column", "scalar", value.dtype, ()
            if t is np.ndarray:
                return "column", None, value.dtype, value.shape
        if self.allow_pickle:
            return "pickle", None, np.dtype(np.uint8), (0,)
        raise UnsupportedValue(
            f"sample {index}, field {self.name!r}: a value of type {t.__module__}.{t.__qualname__} "
            "needs pickle; packs store numpy arrays, int, float, bool, str, bytes and None "
            "(pass allow_pickle=True to store other values)"
        )

    def add(self, value: Any, index: int) -> None:
        if value is None:
            if self.valid is None:
                self.valid = bytearray(b"\x01") * self.count
            self.valid.append(0)
            if self.kind != "none":
                self._placeholders(1)
            self.count += 1
            return
        kind, py, dtype, shape = self._describe(value, index)
        if self.kind == "none":  # the first value: it sets the kind
            self.kind, self.py, self.dtype, self.shape = kind, py, dtype, shape
            self.fixed = kind == "column"
            self._placeholders(self.count)
        elif kind != self.kind or py != self.py or (kind == "column" and dtype != self.dtype):
            first = self.valid.index(1) if self.valid is not None else 0
            raise TypeError(
                f"sample {index}, field {self.name!r}: {_what(kind, py, dtype)} where sample "
                f"{first} has {_what(self.kind, self.py, self.dtype)}"
            )
        if kind == "column":
            if py == "int" and not -(1 << 63) <= value < (1 << 63):
                raise ValueError(
                    f"sample {index}, field {self.name!r}: {value} does not fit in int64"
                )
            if len(shape) != len(self.shape):
                raise ValueError(
                    f"sample {index}, field {self.name!r}: {len(shape)} dimensions where "
                    f"earlier samples have {len(self.shape)}"
                )
            if self.fixed and shape != self.shape:
                self.fixed = False
                self.shapes.extend(self.shape * (len(self.offsets) - 1))
            flat = np.ascontiguousarray(value, dtype=dtype).reshape(-1).view(np.uint8)
            data = memoryview(flat)  # type: ignore[arg-type]
            if not self.fixed:
                self.shapes.extend(shape)
        elif kind == "str":
            data = memoryview(value.encode("utf-8", "surrogatepass"))
        elif kind == "bytes":
            data = memoryview(value)
        else:
            data = memoryview(pickle.dumps(value, protocol=5))
        self.spill.write(data)
        self.offsets.append(self.offsets[-1] + data.nbytes)
        if self.valid is not None:
            self.valid.append(1)
        self.count += 1

    def _placeholders(self, k: int) -> None:
        """Stand-ins for ``k`` samples without a value: rows of zeros in a column of
        fixed shape, empty values otherwise."""
        if not k:
            return
        size = 0
        if self.fixed:
            size = self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))
            per = max(1, (1 << 20) // max(size, 1))  # rows per write: ~1 MiB at a time
            zeros = bytes(size * min(k, per))
            for left in range(k, 0, -per):
                self.spill.write(zeros[: size * min(left, per)])
        elif self.kind == "column":  # empty along the first axis, like the others after
            self.shapes.extend((0, *self.shape[1:]) * k)
        end = self.offsets[-1]
        self.offsets.extend(range(end + size, end + size * k + 1, size) if size else [end] * k)

    def index_entry(self, out: BinaryIO, block: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "none":
            return entry
        entry["dtype"] = self.dtype.str
        if self.py is not None:
            entry["py"] = self.py
        self.spill.flush()
        self.spill.seek(0)
        entry["data"] = _copy_region(self.spill, out, self.offsets[-1], block)
        if self.valid is not None:
            entry["valid"] = _write_region(out, np.frombuffer(self.valid, dtype=np.uint8), block)
        if self.kind == "column" and self.fixed:
            entry["shape"] = list(self.shape)
            return entry
        if self.kind == "column":
            self.kind = entry["kind"] = "ragged"
            entry["ndim"] = len(self.shape)
            entry["shapes"] = _write_region(out, np.frombuffer(self.shapes, dtype="<i8"), block)
        entry["offsets"] = _write_region(out, np.frombuffer(self.offsets, dtype="<i8"), block)
        return entry


def _what(kind: str, py: str | None, dtype: np.dtype) -> str:
    if py and py != "scalar":
        return py
    if kind == "column":
        return f"an array of {dtype}"
    return {"none": "None", "str": "str", "bytes": "bytes", "pickle": "a pickled object"}[kind]


def _align(out: BinaryIO) -> int:
    pos = out.tell()
    out.write(bytes(pad(pos)))
    return pos + pad(pos)


def _copy_region(src: BinaryIO, out: BinaryIO, n: int, block_size: int) -> dict[str, Any]:
    start = _align(out)
    sums = []
    block = xxhash.xxh3_64()
    filled = 0
    left = n
    while left:
        chunk = src.read(min(_COPY, left, block_size - filled))
        if not chunk:
            raise OSError("spill file shorter than expected")
        out.write(chunk)
        block.update(chunk)
        filled += len(chunk)
        left -= len(chunk)
        if filled == block_size:
            sums.append(block.intdigest())
            block, filled = xxhash.xxh3_64(), 0
    if filled:
        sums.append(block.intdigest())
    return {"off": start, "len": n, "sums": sums}


def _write_region(out: BinaryIO, arr: np.ndarray, block: int) -> dict[str, Any]:
    start = _align(out)
    data = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    out.write(data)
    return {"off": start, "len": data.nbytes, "sums": block_sums(data, block)}


def _progress(iterable: Iterable[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    total = len(iterable) if isinstance(iterable, Sized) else None
    return tqdm(iterable, desc=desc, total=total, unit=" samples", mininterval=0.5, disable=None)


def pack(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    progress: bool = True,
    allow_pickle: bool = False,
    block_size: int = BLOCK,
    shard_size: int | str | None = None,
) -> Any:
    """Write ``samples`` (dicts of named fields) into the pack file ``path``.

    With ``shard_size`` (``"1GB"``), ``path`` must end in ``.shards``: the samples
    are written as shards of about that size beside it, and ``path`` is their
    manifest (see :mod:`mlcache.data.shards`); a :class:`ShardedDataset` is
    returned.

    Returns the :class:`~mlcache.data.PackedDataset` opened on it. Raises
    ``ValueError`` for an empty source, ``TypeError``/``ValueError`` naming the
    sample and field whose type or dimensions differ from sample 0, and
    :class:`~mlcache.UnsupportedValue` for values that need pickle when
    ``allow_pickle`` is false.

    ``block_size`` (a power of two, default 4 MiB) is the unit of checksumming:
    a reader verifies each block the first time it touches it, so smaller blocks
    make the first random reads of a large pack cheaper and the checksum table
    longer.

    >>> import numpy as np, tempfile, os
    >>> ds = pack(({"x": np.arange(i), "y": i} for i in range(3)),
    ...           os.path.join(tempfile.mkdtemp(), "d.pack"), progress=False)
    >>> len(ds), ds[2]["x"].tolist(), ds[2]["y"]
    (3, [0, 1], 2)
    """
    from .reader import PackedDataset

    if shard_size is not None:
        from .shards import pack_sharded

        return pack_sharded(
            samples,
            path,
            shard_size=shard_size,
            progress=progress,
            allow_pickle=allow_pickle,
            block_size=block_size,
        )
    if block_size < 64 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two of at least 64, got {block_size}")
    target = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    sweep_dead(folder, os.path.basename(target))  # what a killed build of it left
    fields: dict[str, _Field] = {}
    names: list[str] = []
    n = 0
    with contextlib.ExitStack() as stack:
        spill_dir = stack.enter_context(temporary_folder(folder, os.path.basename(target)))
        for n, sample in enumerate(_progress(samples, progress, os.path.basename(target))):
            if not isinstance(sample, Mapping):
                raise TypeError(f"sample {n} is a {type(sample).__name__}, not a dict of fields")
            if n == 0:
                names = list(sample)
                if not names:
                    raise ValueError("sample 0 has no fields")
                for i, name in enumerate(names):
                    if not isinstance(name, str):
                        raise TypeError(f"sample 0: field names must be str, got {name!r}")
                    # a private folder just made: created exclusively, never a link's target
                    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
                    spill_fd = open_regular(os.path.join(spill_dir, str(i)), flags)
                    spill = stack.enter_context(open(spill_fd, "w+b"))
                    fields[name] = _Field(name, spill, allow_pickle)
            elif sample.keys() != fields.keys():
                missing = sorted(set(fields) - set(sample))
                extra = sorted(set(sample) - set(fields))
                raise ValueError(
                    f"sample {n}: fields differ from sample 0 (missing {missing}, extra {extra})"
                )
            for name in names:
                fields[name].add(sample[name], n)
        else:
            if not fields:
                raise ValueError(f"no samples to pack into {target}: the source is empty")
        count = n + 1
        with atomic_file(target) as out:
            out.write(bytes(HEADER.size))
            index = {
                "version": 1,
                "n": count,
                "block": block_size,
                "fields": [fields[name].index_entry(out, block_size) for name in names],
            }
            index_off = _align(out)
            index_b = json.dumps(index, separators=(",", ":")).encode()
            out.write(index_b)
            out.seek(0)
            out.write(pack_header(count, index_off, index_b))
    return PackedDataset(target, allow_pickle=allow_pickle)
