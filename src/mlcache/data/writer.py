"""``pack()``: stream samples into one pack file (see :mod:`mlcache.data.format`).

Samples are written as they arrive into spill files next to the target, a
series per field, each file at most :data:`SPILL_CHUNK` bytes (memory stays
bounded by the per-sample offsets, 8 bytes a sample). Then each field's data is
copied into the pack, contiguous, and each spill file is deleted as soon as it
is copied: a build needs the pack's size free plus one spill file (the one
being copied), not twice the pack. The pack is published by one rename. A build that
fails for any reason (a bad value, the source raising, an interrupt) leaves
nothing: no file under the target name, no spill file.

What a field may hold
---------------------
A field's kind comes from its first value: numbers (Python ``bool``, ``int``,
``float``, numpy scalars), numpy arrays of numbers or dates, text (``str``,
``np.str_``), ``bytes`` (``np.bytes_`` too), and, with ``allow_pickle=False``,
lists of numbers (arrays), lists of ``str`` and dicts of any of these (what a
JSON or SQL source gives), torch tensors; or pickles (``allow_pickle=True``).

* **Numbers promote as numpy does**: a field's dtype is ``np.result_type`` of
  the dtypes of all its values, counting a Python ``bool``, ``int`` and
  ``float`` as ``bool``, ``int64`` and ``float64``. So an int then a float gives
  float64, ``np.int64`` then ``int`` int64, a bool then an int int64,
  ``float32`` then ``float64`` float64 (and ``np.float32`` then a Python float is
  float64, not numpy's "weak scalar" float32: no value loses precision).
  Arrays promote the same way. Values written before a promotion are converted
  when the pack is assembled. A field of Python numbers reads back as Python
  numbers of the promoted type (an int then a float: floats; a bool then an
  int: ints); a field that held any numpy scalar reads back numpy scalars.
* **Promotion never rounds**: an integer beyond what the promoted float holds
  exactly (2**53 for float64, 2**24 for float32) raises ``ValueError`` naming
  the sample; cast the field yourself if rounding is what you want.
* **None is missing** in any field. **A float NaN is a value in a number field**
  (it makes an int field float) **and missing in any other field** (text, bytes,
  arrays, pickles): what pandas gives for an empty CSV cell. A field holding
  only NaN and None is a float field.
* A value that fits none of this (a str then an array, an int then bytes, a
  number then an array) raises ``TypeError`` at once, naming the sample, the
  field and both kinds, before the rest of the source is loaded.
* Arrays of fixed-width text (``<U3``, ``S3``) or of other non-numeric dtypes
  raise :class:`~mlcache.UnsupportedValue` at the sample holding one (they are
  pickled with ``allow_pickle=True``): pass text as ``str`` (``arr.tolist()``).
* **Lists and dicts** (with ``allow_pickle=False``; ``allow_pickle=True``
  pickles them as before, read back exactly): a list of numbers, or a
  rectangular list of such lists, is the numpy array it makes, under the rules
  of numbers above, and reads back as that array (``ragged`` when lengths
  vary); a list of ``str`` reads back as a list of ``str`` (kind ``strs``); an
  empty list is an empty value of the field's kind and dtype (see
  :mod:`mlcache.data.values`). A dict (``str`` keys, the same keys in every
  sample) is a field of kind ``dict`` whose keys are sub-fields under these
  same rules (errors name one ``"meta.age"``), read back as a dict. Other lists
  (holding ``None``, bytes, dicts, mixed numbers and text, rows of different
  lengths) raise :class:`~mlcache.UnsupportedValue`.
* **Tensors** (with ``allow_pickle=False``): a ``torch.Tensor`` is a field of
  kind ``tensor`` over an array field of its elements (a CPU copy, contiguous;
  ``requires_grad`` dropped), promoted as arrays are, read back as a tensor; a
  dtype numpy lacks (``bfloat16``, ``float8_*``) is kept as its bits, the same
  in every sample. Sparse and quantized tensors raise ``UnsupportedValue``.

A source may also hand over whole columns at once (:class:`ColumnSource`, as
:func:`~mlcache.data.from_sql` does): the same rules, without a dict per row.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
import xxhash

from .._atomic import atomic_file, open_regular, sweep_dead, temporary_folder
from .._util import progress as _progress
from .fetch import is_url, uploading
from .fields import FieldWriter
from .format import BLOCK, HEADER, block_sums, pack_header, pad
from .reader import PackedDataset
from .values import names_differ

__all__ = [
    "SPILL_CHUNK",
    "ColumnSource",
    "CopiedField",
    "CopySource",
    "not_fields",
    "write_pack",
]


def not_fields(n: int, sample: Any) -> TypeError:
    """The error for sample ``n`` that is not a dict of fields, with the way out (a
    PyTorch-style ``(x, y)`` is the common case)."""
    return TypeError(
        f"sample {n} is a {type(sample).__name__}, not a dict of fields: return one, "
        "e.g. {'image': x, 'label': y} (transform= can give it back as (x, y) at each read)"
    )


#: the largest spill file (bytes); a field's spill is a series of them
SPILL_CHUNK = 16 << 20
_COPY = 1 << 20


@runtime_checkable
class ColumnSource(Protocol):
    """A source that gives its samples a column at a time.

    ``column_batches()`` yields dicts ``{field name: sequence of values}``, every
    dict with the same names in the same order and sequences of one length (the
    samples of that batch). ``pack()`` uses it instead of iterating one dict per
    sample; the values follow the same rules (see :mod:`mlcache.data.writer`).
    """

    def column_batches(self) -> Iterator[Mapping[str, Sequence[Any]]]: ...


@dataclass(frozen=True)
class CopiedField:
    """A field whose bytes are already those of the pack (a seal copying the records
    of a pack being filled, :mod:`mlcache.data.sealing`): every sample has a value of
    one kind and dtype, so no rule of promotion or missing value applies.

    ``kind`` is ``"column"`` (``shape``: every value's; ``py``: ``"int"``,
    ``"float"``, ``"bool"`` or ``"scalar"`` for a field of scalars), ``"ragged"``
    (``shapes``: n x ndim int64) or ``"str"`` / ``"bytes"``; ``data`` gives the
    field's bytes in sample order; ``sizes`` (all but a column's) each value's bytes.
    """

    name: str
    kind: str
    dtype: str
    data: Iterable[Any]
    py: str | None = None
    shape: tuple[int, ...] = ()
    shapes: np.ndarray | None = None
    sizes: np.ndarray | None = None


@runtime_checkable
class CopySource(Protocol):
    """A source that can give its fields' bytes as they are (:class:`CopiedField`),
    or None when it cannot (then ``pack()`` iterates its samples)."""

    def copied_fields(self) -> tuple[int, list[CopiedField]] | None: ...


class _Spill:
    """Bytes appended to a series of files of at most :data:`SPILL_CHUNK` bytes in a
    private folder; read back once, in order, each file deleted once it is read."""

    def __init__(self, folder: str, prefix: str) -> None:
        self.folder, self.prefix = folder, prefix
        self.files: list[str] = []
        self.sizes: list[int] = []
        self.out: BinaryIO | None = None
        self.size = 0  # bytes written in all

    def write(self, data: Any) -> None:
        mv = memoryview(data).cast("B")
        while mv.nbytes:
            if self.out is None or self.sizes[-1] >= SPILL_CHUNK:
                self._next_file()
            assert self.out is not None
            room = max(SPILL_CHUNK - self.sizes[-1], 1)
            piece = mv[:room]
            self.out.write(piece)
            self.sizes[-1] += piece.nbytes
            self.size += piece.nbytes
            mv = mv[piece.nbytes :]

    def _next_file(self) -> None:
        self.close()
        name = os.path.join(self.folder, f"{self.prefix}.{len(self.files)}")
        # a private folder just made: created exclusively, never a link's target
        fd = open_regular(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        self.out = open(fd, "wb")  # noqa: SIM115 (closed by close(), on every path)
        self.files.append(name)
        self.sizes.append(0)

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

    def read(self, start: int, stop: int) -> Iterator[bytes]:
        """Bytes [start, stop) in pieces, the files left in place."""
        if self.out is not None:
            self.out.flush()
        base = 0
        for name, size in zip(self.files, self.sizes):
            lo, hi = max(start, base), min(stop, base + size)
            if lo < hi:
                with open(name, "rb") as f:
                    f.seek(lo - base)
                    left = hi - lo
                    while left:
                        piece = f.read(min(_COPY, left))
                        if not piece:
                            raise OSError(f"spill file {name} shorter than expected")
                        left -= len(piece)
                        yield piece
            base += size

    def drain(self) -> _Drain:
        self.close()
        return _Drain(self)

    def sibling(self, suffix: str) -> _Spill:
        """Another spill in the same folder (a sub-field's, fields.FieldWriter)."""
        return _Spill(self.folder, f"{self.prefix}-{suffix}")


class _Drain:
    """Reads a spill once from its start; deletes each file as soon as it is read."""

    def __init__(self, spill: _Spill) -> None:
        self.names = list(spill.files)
        self.f: BinaryIO | None = None

    def read(self, n: int) -> bytes:
        parts = []
        while n:
            if self.f is None:
                if not self.names:
                    raise OSError("spill files shorter than expected")
                self.f = open(self.names[0], "rb")  # noqa: SIM115 (closed by close())
            piece = self.f.read(n)
            if piece:
                parts.append(piece)
                n -= len(piece)
            else:  # this file is copied: free its space now
                self.f.close()
                self.f = None
                os.unlink(self.names.pop(0))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        for name in self.names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


def _index_entry(field: FieldWriter, out: BinaryIO, block: int) -> dict[str, Any]:
    """Write the field's regions; return its entry in the index."""
    entry: dict[str, Any] = {"name": field.name, "kind": field.kind}
    if field.kind == "none":
        return entry
    if field.kind in ("dict", "tensor"):  # its sub-fields hold the values (format.py)
        entry["fields"] = [_index_entry(f, out, block) for f in field.children.values()]
        if field.view is not None:  # a tensor's dtype, of which its values are the bits
            entry["view"] = field.view
        if field.valid is not None and field.valid.count(0):
            entry["valid"] = _write_region(out, np.frombuffer(field.valid, np.uint8), block)
        return entry
    entry["dtype"] = field.dtype.str
    if field.py is not None:
        entry["py"] = field.py
    entry["data"] = _write_stream(out, field.data(), block)
    if field.valid is not None and field.valid.count(0):
        entry["valid"] = _write_region(out, np.frombuffer(field.valid, dtype=np.uint8), block)
    for key, table in field.tables().items():  # a list-of-str field's string ends
        entry[key] = _write_region(out, table, block)
    if field.kind == "column" and field.fixed:
        entry["shape"] = list(field.shape)
        return entry
    if field.kind == "column":
        field.kind = entry["kind"] = "ragged"
        entry["ndim"] = len(field.shape)
        entry["shapes"] = _write_region(out, np.frombuffer(field.shapes, dtype="<i8"), block)
    offsets = np.frombuffer(field.offsets, dtype="<i8") * field.dtype.itemsize
    entry["offsets"] = _write_region(out, offsets, block)
    return entry


def _copied_entry(field: CopiedField, out: BinaryIO, block: int) -> dict[str, Any]:
    """Write a copied field's regions; its entry in the index, as :func:`_index_entry`
    writes it for the same values (the same keys in the same order)."""
    kind = "column" if field.kind == "ragged" else field.kind
    entry: dict[str, Any] = {"name": field.name, "kind": kind, "dtype": field.dtype}
    if field.py is not None:
        entry["py"] = field.py
    entry["data"] = _write_stream(out, field.data, block)
    if field.kind == "column":
        entry["shape"] = list(field.shape)
        return entry
    if field.kind == "ragged":
        assert field.shapes is not None
        entry["kind"] = "ragged"
        entry["ndim"] = field.shapes.shape[1]
        entry["shapes"] = _write_region(out, field.shapes.astype("<i8"), block)
    assert field.sizes is not None
    offsets = np.zeros(len(field.sizes) + 1, "<i8")
    np.cumsum(field.sizes, out=offsets[1:])
    entry["offsets"] = _write_region(out, offsets, block)
    return entry


def _align(out: BinaryIO) -> int:
    pos = out.tell()
    out.write(bytes(pad(pos)))
    return pos + pad(pos)


def _write_stream(out: BinaryIO, pieces: Iterable[Any], block_size: int) -> dict[str, Any]:
    """Write ``pieces`` as one region, checksummed per block of ``block_size``."""
    start = _align(out)
    sums = []
    block = xxhash.xxh3_64()
    filled = n = 0
    for piece in pieces:
        mv = memoryview(piece)
        out.write(mv)
        n += len(mv)
        while len(mv):
            part = mv[: block_size - filled]
            block.update(part)
            filled += len(part)
            mv = mv[len(part) :]
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


class _Build:
    """The fields of a pack being built, filled sample by sample or column by column."""

    def __init__(self, spill_dir: str, allow_pickle: bool) -> None:
        self.spill_dir, self.allow_pickle = spill_dir, allow_pickle
        self.fields: dict[str, FieldWriter] = {}
        self.spills: list[_Spill] = []
        self.count = 0

    def _start(self, names: Iterable[Any]) -> None:
        names = list(names)
        if not names:
            raise ValueError("sample 0 has no fields")
        for i, name in enumerate(names):
            if not isinstance(name, str):
                raise TypeError(f"sample 0: field names must be str, got {name!r}")
            spill = _Spill(self.spill_dir, str(i))
            self.spills.append(spill)
            self.fields[name] = FieldWriter(name, spill, self.allow_pickle)

    def _check_names(self, names: Any, n: int) -> None:
        if names != self.fields.keys():
            differ = names_differ(self.fields, names, "field", "sample 0")
            raise ValueError(f"sample {n}: fields differ from sample 0: {differ}")

    def add(self, sample: Any) -> None:
        n = self.count
        if not isinstance(sample, Mapping):
            raise not_fields(n, sample)
        if not n:
            self._start(sample)
        elif sample.keys() != self.fields.keys():
            self._check_names(sample.keys(), n)
        for name, field in self.fields.items():
            field.add(sample[name], n)
        self.count += 1

    def add_columns(self, batch: Mapping[str, Sequence[Any]]) -> int:
        n = self.count
        if not isinstance(batch, Mapping):
            raise TypeError(f"a column batch is a {type(batch).__name__}, not a dict of columns")
        if not n:
            self._start(batch)
        elif batch.keys() != self.fields.keys():
            self._check_names(batch.keys(), n)
        sizes = {len(column) for column in batch.values()}
        if len(sizes) != 1:
            raise ValueError(f"samples {n}...: columns of one batch have lengths {sorted(sizes)}")
        k = sizes.pop()
        for name, field in self.fields.items():
            field.add_batch(batch[name], n)
        self.count += k
        return k

    def close(self) -> None:
        for spill in self.spills:
            spill.close()
        for field in self.fields.values():  # the spills of sub-fields too
            field.close()


def _fill(build: _Build, samples: Iterable[Any], progress: bool, desc: str) -> None:
    if not isinstance(samples, ColumnSource):
        # a total (and so an ETA) when the source knows its length: a list, a
        # range, anything with __len__ or __length_hint__
        total = operator.length_hint(samples) or None
        for sample in _progress(samples, desc, total=total, unit=" samples", enabled=progress):
            build.add(sample)
        return
    bar: Any = None
    if progress:
        with contextlib.suppress(ImportError):
            from tqdm.auto import tqdm

            bar = tqdm(desc=desc, unit=" samples", mininterval=0.5, disable=None)
    try:
        for batch in samples.column_batches():
            k = build.add_columns(batch)
            if bar is not None:
                bar.update(k)
    finally:
        if bar is not None:
            bar.close()


def write_pack(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    progress: bool = True,
    allow_pickle: bool = False,
    block_size: int = BLOCK,
    storage_options: dict[str, Any] | None = None,
    local_cache_dir: str | None = None,
    desc: str | None = None,
    items: bytes | None = None,
) -> PackedDataset:
    """Write ``samples`` (dicts of named fields) into the pack file ``path``; return
    the :class:`~mlcache.data.PackedDataset` opened on it.

    :func:`mlcache.data.pack` is the public entry point (it also writes sharded
    packs, on top of this); the parameters, the rules and the errors are its.
    ``path`` may be an fsspec URL (``s3://bucket/x.pack``, ``memory://x.pack``):
    the pack is written where its local copy goes (``local_cache_dir``, as for
    :class:`~mlcache.data.PackedDataset`), uploaded with ``storage_options``, and
    the dataset returned reads it by its URL (from that copy: nothing is fetched).
    ``desc`` labels the progress bar (default: the file's name). ``items``: what
    the samples were loaded from, 32 bytes a sample (an item's key and
    fingerprint, see :mod:`mlcache.data.filling`), kept as the region ``items``
    of the index (:meth:`PackedDataset.item_table` reads it).

    >>> import numpy as np, tempfile, os
    >>> ds = write_pack(({"x": np.arange(i), "y": i} for i in range(3)),
    ...                 os.path.join(tempfile.mkdtemp(), "d.pack"), progress=False)
    >>> len(ds), ds[2]["x"].tolist(), ds[2]["y"]
    (3, [0, 1], 2)
    """
    if block_size < 64 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two of at least 64, got {block_size}")
    if is_url(os.fspath(path)):  # never a local folder named "s3:"
        url = os.fspath(path)
        with uploading(url, storage_options, local_cache_dir) as local:
            write_pack(
                samples,
                local,
                progress=progress,
                allow_pickle=allow_pickle,
                block_size=block_size,
                desc=desc or url.rsplit("/", 1)[-1],
                items=items,
            )
        return PackedDataset(
            url,
            allow_pickle=allow_pickle,
            storage_options=storage_options,
            local_cache_dir=local_cache_dir,
        )
    target = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    # what killed builds left in this folder: of this pack, of another (an older
    # version's, a shard's, whose names a rebuild never uses again)
    sweep_dead(folder, None)
    copied = samples.copied_fields() if isinstance(samples, CopySource) else None
    if copied is not None:  # bytes as they are: no spill, no value rules to apply
        count, fields = copied
        with atomic_file(target) as out:
            out.write(bytes(HEADER.size))
            entries = [_copied_entry(f, out, block_size) for f in fields]
            written = _finish_pack(out, count, entries, items, block_size)
        return _opened(target, written, allow_pickle)
    with temporary_folder(folder, os.path.basename(target)) as spill_dir:
        build = _Build(spill_dir, allow_pickle)
        try:
            _fill(build, samples, progress, desc or os.path.basename(target))
        finally:
            build.close()
        if not build.count:
            raise ValueError(f"no samples to pack into {target}: the source is empty")
        for field in build.fields.values():
            field.finish()
        with atomic_file(target) as out:
            out.write(bytes(HEADER.size))
            entries = [_index_entry(f, out, block_size) for f in build.fields.values()]
            written = _finish_pack(out, build.count, entries, items, block_size)
    return _opened(target, written, allow_pickle)


def _finish_pack(
    out: BinaryIO, count: int, entries: list[dict[str, Any]], items: bytes | None, block: int
) -> os.stat_result:
    """Write the item table, the index and the header after the fields' regions."""
    index: dict[str, Any] = {"version": 1, "n": count, "block": block, "fields": entries}
    if items is not None:
        if len(items) != 32 * count:
            raise ValueError(f"{len(items)} bytes of items for {count} samples")
        table = np.frombuffer(items, dtype=np.uint8)
        index["items"] = _write_region(out, table, block)
    index_off = _align(out)
    index_b = json.dumps(index, separators=(",", ":")).encode()
    out.write(index_b)
    out.seek(0)
    out.write(pack_header(count, index_off, index_b))
    return os.fstat(out.fileno())


def _opened(target: str, written: os.stat_result, allow_pickle: bool) -> PackedDataset:
    """The pack just written at ``target``, opened."""
    try:
        return PackedDataset(target, allow_pickle=allow_pickle)
    except BaseException:
        # never leave a pack that cannot be read under the name (a build would be
        # tried again and again): remove it, unless another build replaced it since
        with contextlib.suppress(OSError):
            st = os.stat(target)
            if (st.st_dev, st.st_ino) == (written.st_dev, written.st_ino):
                os.unlink(target)
        raise
