"""``PackedDataset``: random access to a pack file through one memory map.

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

What a reader notices, and what it cannot
-----------------------------------------
mlcache never changes a pack in place: a build writes a temporary file and
renames it over the name, so a reader keeps the file it opened, whole, for as
long as it holds it. Somebody else's tools can change a pack in place (``cp``
onto it, an editor, ``truncate``). A reader compares the file's size and
modification time with those it opened (one ``fstat``) at the first read, at
every ``len()`` (a sampler calls it at the start of each epoch), ``iter()``,
``get_batch()``, at each worker start (unpickling) and every
:data:`CHECK_EVERY` reads. A change found is handled so that no wrong sample
comes back: another pack (or other sizes) under the same file raises
:class:`PackChanged` naming the file from then on; the same pack's header and
index again (a copy of the same file, a ``touch``, damage to the data) makes
every block be checked again against its checksum as it is read, so a
flipped byte raises :class:`PackCorrupted`. A read of a large array maps its
pages and so sees a truncation at once. What cannot be detected by a memory
map reader:

* a change between two checks (up to ``CHECK_EVERY - 1`` reads, or until the
  next epoch) is served as the new bytes are: a shared map shows what is in
  the file now. A truncation met in that window is a ``SIGBUS``, as for every
  mmap reader: never truncate or rewrite a pack that a job is reading (write
  a new file and rename it, as :func:`mlcache.data.pack` does);
* a change that keeps the size and the modification time (``cp -p``,
  ``touch -r``, damage below the file system) is found only by the checksums
  of blocks not verified yet, or by :meth:`PackedDataset.verify`.
"""

from __future__ import annotations

import functools
import logging
import math
import mmap
import multiprocessing.context
import os
import pickle
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import PackChanged, PackCorrupted, UnsupportedValue
from .fetch import is_url, local_copy, sparse_copy
from .format import HEADER, parse_index, read_header

__all__ = ["CHECK_EVERY", "PRIVATE_MAP_MIN", "PackedDataset", "spawning_worker"]

logger = logging.getLogger("mlcache")

#: arrays of at least this many bytes are returned as a private copy-on-write map
#: of their pages, smaller ones as a copy: read whole, a copy costs less below about
#: 300 KiB (a map is ~5 us, and each page read faults), a map less above
#: (benchmarks/bench_reader.py); a map never doubles the memory of a large sample
PRIVATE_MAP_MIN = 256 << 10
#: a reader looks at its file (one fstat) every this many reads, besides at each
#: epoch (``len``, ``iter``), batch and worker start
CHECK_EVERY = 256


def spawning_worker() -> bool:
    """True while a process is being started by spawn or forkserver (a DataLoader
    worker): a dataset pickled now can hand the child its open file."""
    return multiprocessing.context.get_spawning_popen() is not None


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


def _refuse(kind: type[PackCorrupted], message: str, *_: Any) -> Any:
    raise kind(message)


# memoryview formats that give the Python scalars of int/float/bool columns directly
_PY_FORMATS = {("int", "<i8"): "q", ("float", "<f8"): "d", ("bool", "|b1"): "?"}
_LITTLE = sys.byteorder == "little"


class _Region:
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


class _Field:
    """One field of the pack: its index entry, its regions, and, once the pack is
    first read, its verified tables as the generated reader indexes them."""

    __slots__ = (
        "dtype",
        "inner",
        "kind",
        "name",
        "ndim",
        "offsets",
        "regions",
        "row",
        "shapes",
        "spec",
    )

    def __init__(self, spec: dict[str, Any], regions: dict[str, _Region], path: str) -> None:
        self.spec, self.regions = spec, regions
        self.name: str = spec["name"]
        self.kind: str = spec["kind"]
        if self.kind not in ("none", "column", "ragged", "str", "bytes", "pickle"):
            raise PackCorrupted(f"{path}: field {self.name!r} has unknown kind {self.kind!r}")
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

    def prepare(self, n: int, path: str) -> None:
        """Verify this field's tables (offsets, shapes, columns of Python scalars: 8
        bytes a sample) whole, and check that they agree with each other and with the
        data, so that a read needs no bounds checks of its own."""
        kind, data = self.kind, self.regions.get("data")
        if kind == "none" or data is None:
            return
        bad = f"{path}: field {self.name!r}"
        valid = self.regions.get("valid")
        if valid is not None:
            valid.check(0, valid.len)
            if valid.len != n:
                raise PackCorrupted(f"{bad} has a validity table of the wrong size")
        if kind == "column":
            shape = tuple(self.spec["shape"])  # checked ints (format.parse_index)
            self.row = self.dtype.itemsize * math.prod(shape)
            if data.len != n * self.row:
                raise PackCorrupted(f"{bad} has the wrong size")
            if self.spec.get("py") in ("int", "float", "bool"):
                data.check(0, data.len)
            return
        table = self.regions["offsets"].table(n + 1)[:, 0]
        if table[0] != 0 or table[-1] != data.len or (table[1:] < table[:-1]).any():
            raise PackCorrupted(f"{bad} has bad offsets")
        self.offsets = self.regions["offsets"].mv.cast("q") if _LITTLE else table.tolist()
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
            self.shapes = (
                self.regions["shapes"].mv.cast("q") if _LITTLE else shapes.ravel().tolist()
            )
            # the common case, a variable first axis only ([T, C] series, [T] tokens):
            # a sample is a slice of one [-1, *inner] view, no shape table needed
            inner = shapes[0, 1:]
            row = self.dtype.itemsize * int(np.prod(inner, dtype=np.int64))
            if row and (shapes[:, 1:] == inner).all():
                self.inner, self.row = tuple(inner.tolist()), row

    def code(
        self,
        k: int,
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
        lines = self._value_code(k, n, ns, unpickle)
        if private and (self.kind == "ragged" or (self.kind == "column" and self.spec["shape"])):
            ns[f"p{k}"] = functools.partial(_private_map, fd, self.regions["data"].off, path)
            if self.kind == "column":  # one size for every row: decided here
                if self.row < PRIVATE_MAP_MIN:
                    lines.append(f"v{k} = v{k}.copy()")
                else:
                    lines.append(f"v{k} = p{k}(a, a + w{k}, v{k})")
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

    def _value_code(self, k: int, n: int, ns: dict[str, Any], unpickle: Any) -> list[str]:
        kind, spec = self.kind, self.spec
        if kind == "none":
            return [f"v{k} = None"]
        data = self.regions["data"]
        ns.update({f"r{k}": data.mv, f"c{k}": data.checked, f"k{k}": data.check})
        ns[f"s{k}"] = data.shift
        if kind == "column":
            py = spec.get("py")
            fmt: Any = _PY_FORMATS.get((str(py), self.dtype.str)) if _LITTLE else None
            if fmt is not None:
                ns[f"g{k}"] = data.mv.cast(fmt).__getitem__  # Python scalars, no numpy
                return [f"v{k} = g{k}(j)"]
            column = np.frombuffer(data.mv, dtype=self.dtype).reshape((n, *spec["shape"]))
            if py in ("int", "float", "bool"):  # a format memoryview cannot give directly
                ns[f"g{k}"] = column.item
                return [f"v{k} = g{k}(j)"]
            ns[f"g{k}"], ns[f"w{k}"] = column, self.row
            start, stop, value = f"j * w{k}", f"a + w{k}", f"g{k}[j]"
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
            elif kind in ("str", "bytes"):  # bytes sliced from the map: the fastest copy
                ns["mm"], ns[f"b{k}"] = data.mv.obj, data.off
                value = f"mm[b{k} + a : b{k} + z]"
            else:
                ns["unpickle"] = unpickle
                value = f"unpickle(r{k}[a:z], n{k})"
        lines = [f"a = {start}"]
        if data.pending or "z" in value or kind == "ragged":
            lines.append(f"z = {stop}")
        if data.pending:  # blocks not yet verified: test the one byte, verify if needed
            lines += [
                f"b = a >> s{k}",
                f"if not c{k}[b] or (z - 1) >> s{k} != b:",
                f"    k{k}(a, z)",
            ]
        if kind == "str":  # strict UTF-8 is the fast decoder; surrogates need the other
            lines += [
                "try:",
                f"    v{k} = {value}.decode()",
                "except UnicodeDecodeError:",
                f'    v{k} = {value}.decode("utf-8", "surrogatepass")',
            ]
        else:
            lines.append(f"v{k} = {value}")
        return lines


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> types.CodeType:
    """Compiled once per process: every pack of one layout has the same source."""
    return compile(source, "<mlcache pack reader>", "exec")


def _compile(
    fields: list[_Field],
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


def _unpickle(path: str, allow: bool, data: memoryview, name: str) -> Any:
    if not allow:
        raise UnsupportedValue(
            f"{path}: field {name!r} holds pickles; open the pack with allow_pickle=True "
            "to load them"
        )
    return pickle.loads(data)


class PackedDataset(Sequence[dict[str, Any]]):
    """A pack file opened for random access: ``len(ds)``, ``ds[i]`` (a dict of
    fields), ``ds.get_batch(indices)``.

    Arrays come back writable and private to each read (zero-copy until written
    for large ones; see the module docstring), or, with ``writable=False``, as
    read-only views of the shared map (the fastest read). Opening is O(1) in the
    number of samples. The first read verifies the small per-sample
    tables (offsets and shapes, 8 bytes a sample); each 4 MiB block of data is
    checksummed the first time it is read. So a damaged pack raises
    :class:`PackCorrupted` (a ``ValueError``) naming the file, never returns a
    wrong sample. A file changed in place under an open reader raises
    :class:`PackChanged` or is verified again (see the module docstring).

    Pickling a PackedDataset sends its path, not its data. To a DataLoader
    worker being started (spawn, forkserver), it sends its open file: the
    worker reads the very pack this dataset opened, even if the path has since
    been rebuilt or removed. Sent anywhere else, it is reopened by path and
    raises :class:`PackChanged` if the path now holds another pack.

    Parameters
    ----------
    path:
        The pack file, as written by :func:`mlcache.data.pack`, or its URL
        (``s3://bucket/train.pack``, any fsspec URL): then a local copy is read,
        fetched once (see :mod:`mlcache.data.fetch`).
    allow_pickle:
        Unpickle fields stored with pickle (refused by default).
    storage_options:
        fsspec options for a URL (credentials, ``client_kwargs``...).
    local_cache_dir:
        Where a URL's local copy goes (default: the user cache folder).
    fetch:
        For a URL: ``"whole"`` copies the pack once; ``"ranges"`` fetches only
        the blocks that reads touch (see :mod:`mlcache.data.fetch`).
    writable:
        Arrays private to each read, writable (the default). ``False`` gives
        read-only zero-copy views of the one shared map, about 0.3 µs faster per
        small array: numpy then refuses an in-place operation (``ValueError``),
        but a tensor made from such a view (``torch.as_tensor``, a
        ``DataLoader`` with ``batch_size=None``) crashes the process on one, as
        PyTorch warns.
    """

    def __new__(cls, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        if os.fspath(path).endswith(".shards"):  # a sharded pack's manifest
            from .shards import ShardedDataset

            return ShardedDataset(path, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_pickle: bool = False,
        storage_options: dict[str, Any] | None = None,
        local_cache_dir: str | None = None,
        fetch: str = "whole",
        writable: bool = True,
    ) -> None:
        if fetch not in ("whole", "ranges"):
            raise ValueError(f"fetch must be 'whole' or 'ranges', got {fetch!r}")
        self.url = path if is_url(path) else None
        self._remote = (storage_options, local_cache_dir, fetch)
        fetcher = None
        if self.url is not None and fetch == "ranges":
            path, fetcher = sparse_copy(str(self.url), storage_options, local_cache_dir)
        elif self.url is not None:
            path = local_copy(str(self.url), storage_options, local_cache_dir)
        self.path = os.path.abspath(os.fspath(path))
        self.allow_pickle = allow_pickle
        self.writable = bool(writable)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(f"no pack file at {self.path}") from None
        self._load(fd, fetcher)

    def _load(self, fd: int, fetcher: Any = None) -> None:
        """Read the pack open as ``fd``, which this dataset keeps (for its checks and
        its private maps) and closes when it is freed."""
        try:
            st = os.fstat(fd)
            size = st.st_size
            #: which file this is, to tell a pack rebuilt under the same name from it
            #: (its inode cannot be reused while this map holds it)
            self.file_id = (st.st_dev, st.st_ino)
            self._head = os.pread(fd, HEADER.size, 0)
            n, i_off, i_len, i_sum = read_header(self._head, size, self.path)
            index = parse_index(os.pread(fd, i_len, i_off), i_sum, n, size, self.path)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        weakref.finalize(self, os.close, fd)
        #: a sparse copy is filled in place as it is read: only its size is checked
        self._sparse = fetcher is not None
        self._size = size
        self._stat = self._stat_key(st)
        #: why this reader refuses to read, once its file changed to another pack
        self._broken: tuple[type[PackCorrupted], str] | None = None
        self._n = n
        self._index_len = i_len
        self._index_sum = i_sum
        self.layout = index  # the parsed index (see mlcache.data.format)
        block = index["block"]  # a power of two (format.parse_index)
        self._fields: list[_Field] = []
        try:
            for spec in index["fields"]:
                regions = {
                    key: _Region(spec[key], self._mm, block, self.path)
                    for key in ("data", "offsets", "shapes", "valid")
                    if key in spec
                }
                self._fields.append(_Field(spec, regions, self.path))
                for region in regions.values():
                    region.fetch = fetcher
                    region.fd, region.file_size = fd, size
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PackCorrupted):
                raise
            raise PackCorrupted(f"{self.path}: bad field in the index ({exc})") from None
        self._sample: Callable[[int], dict[str, Any]] | None = None  # see _prepare()
        self._batch_readers: dict[tuple[str, ...], Callable[[int], dict[str, Any]]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        fingerprint = (self._n, self._index_len, self._index_sum)
        if self.url is None and spawning_worker():
            # a worker being started: its own descriptor of this very file (the
            # path may name a rebuilt pack by the time it runs, or none)
            from multiprocessing.reduction import DupFd

            fd = DupFd(self._fd)
            args = (fd, self.path, self.allow_pickle, fingerprint, self._stat, self.writable)
            return (_reopen_fd, args)
        # a URL travels as a URL: a worker on another machine fetches its own copy
        where = self.url or self.path
        return (_reopen, (where, self.allow_pickle, *self._remote, fingerprint, self.writable))

    # -- the file under the map -----------------------------------------------------
    def _stat_key(self, st: os.stat_result) -> tuple[int, ...]:
        return (st.st_size,) if self._sparse else (st.st_size, st.st_mtime_ns)

    def _check_file(self) -> None:
        """Raise :class:`PackChanged` if the file changed to another pack since it
        was opened; if it holds the same pack's header and index again, make every
        block be verified again as it is read."""
        if self._broken is not None:
            _refuse(*self._broken)
        st = os.fstat(self._fd)
        if self._stat_key(st) != self._stat:
            self._changed(st)

    def _tick(self) -> Callable[[int], dict[str, Any]] | None:
        """The periodic check of the generated reader: the reader to use instead,
        when blocks must be verified again, else None."""
        if self._broken is None and self._stat_key(os.fstat(self._fd)) == self._stat:
            return None
        self._check_file()
        return self._sample or self._prepare()

    def _changed(self, st: os.stat_result) -> None:
        where = self.path
        if st.st_size != self._size:
            self._refuse_from_now(
                PackChanged,
                f"{where}: the pack file was rewritten in place since it was opened (it had "
                f"{self._size} bytes, now {st.st_size}); mlcache never changes a pack in "
                "place: open it again",
            )
        fd = self._fd
        head = os.pread(fd, HEADER.size, 0)
        index = os.pread(fd, self._index_len, self._size - self._index_len)
        if head != self._head or xxhash.xxh3_64_intdigest(index) != self._index_sum:
            self._refuse_from_now(
                PackChanged,
                f"{where}: the pack file was rewritten in place with another pack since it "
                "was opened; open it again",
            )
        # the same header and index (a copy of the same pack, a touch, or damage to
        # the data): whatever changed is found by checking every block again
        logger.info("mlcache: %s changed on disk; its blocks are verified again", where)
        self._stat = self._stat_key(st)
        for field in self._fields:
            for region in field.regions.values():
                region.checked[: region.nblocks] = bytes(region.nblocks)
                region.pending = region.nblocks
        self._sample = None
        self._batch_readers.clear()

    def _refuse_from_now(self, kind: type[PackCorrupted], message: str) -> None:
        self._broken = (kind, message)
        self._sample = functools.partial(_refuse, kind, message)
        self._batch_readers.clear()
        raise kind(message)

    def __repr__(self) -> str:
        return f"PackedDataset({self.path!r}, samples={self._n}, fields={self.field_names})"

    def __mlcache_token__(self) -> tuple[Any, ...]:
        """What a memoized function taking this dataset is keyed by: the pack's
        fingerprint (its index's checksum, which covers the checksum of every
        block, and the sizes), not its bytes, and not where it lies."""
        return ("pack", self._n, self._index_len, self._index_sum, self.allow_pickle)

    def __len__(self) -> int:
        # a sampler asks at the start of every epoch: the file is checked then
        self._check_file()
        return self._n

    def __iter__(self) -> Any:
        self._check_file()
        for i in range(self._n):
            yield self[i]

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self._fields]

    def _index(self, i: int) -> int:
        return sample_index(i, self._n)

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        sample = self._sample or self._prepare()
        if i.__class__ is not int or not 0 <= i < self._n:
            i = self._index(i)
        try:  # free unless raised (3.11+)
            return sample(i)
        except UnicodeDecodeError as exc:
            raise self._bad_text(i, exc) from None
        except PackChanged as exc:  # met by a read (a truncated file): refuse from now on
            if self._broken is None:
                self._refuse_from_now(PackChanged, str(exc))
            raise

    def _bad_text(self, i: int, exc: UnicodeDecodeError) -> PackCorrupted:
        # the writer stores any str it is given (lone surrogates too): bytes that do
        # not decode were not written by it
        return PackCorrupted(f"{self.path}: sample {i} holds text that is not UTF-8 ({exc})")

    def _prepare(self) -> Callable[[int], dict[str, Any]]:
        """Verify the tables and generate the sample reader (at the first read).

        The reader tests the data blocks it touches until each is verified; when
        every block of a region has been, the reader is generated again without
        that region's test.
        """
        self._check_file()
        try:
            for field in self._fields:
                field.prepare(self._n, self.path)
            self._sample = self._compile()
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PackCorrupted):
                raise
            raise PackCorrupted(f"{self.path}: bad field in the index ({exc})") from None
        for field in self._fields:
            for region in field.regions.values():
                if region.pending:
                    region.on_complete = weakref.WeakMethod(self._recompile)
        return self._sample

    def _compile(self, fields: list[_Field] | None = None) -> Callable[[int], dict[str, Any]]:
        unpickle = functools.partial(_unpickle, self.path, self.allow_pickle)  # no self: no cycle
        return _compile(
            self._fields if fields is None else fields,
            self._n,
            unpickle,
            self._fd,
            self.path,
            weakref.WeakMethod(self._tick),
            self.writable,
        )

    def _recompile(self) -> None:
        if self._broken is not None:
            return
        self._sample = self._compile()
        self._batch_readers.clear()

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``indices`` as one dict: column fields stacked into arrays of shape
        ``[len(indices), ...]`` (one read, no Python loop), other fields (and fields
        that are ``None`` in some samples) as lists."""
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.astype(np.intp)  # np.asarray([]) is float
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise TypeError("indices must be a 1-d sequence of integers")
        idx = np.where(idx < 0, idx + self._n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            raise IndexError(f"indices out of range for a pack of {self._n} samples")
        self._check_file()
        self._sample or self._prepare()
        batch: dict[str, Any] = {}
        others = []
        for field in self._fields:
            if field.kind == "column" and "valid" not in field.regions:
                batch[field.name] = self._column_batch(field, idx)
            else:
                others.append(field)
                batch[field.name] = []
        if others:
            key = tuple(f.name for f in others)
            read = self._batch_readers.get(key)
            if read is None:
                read = self._batch_readers[key] = self._compile(others)
            try:
                rows = [read(j) for j in idx.tolist()]
            except UnicodeDecodeError as exc:
                raise self._bad_text(-1, exc) from None
            for field in others:
                batch[field.name] = [row[field.name] for row in rows]
        return batch

    def _column_batch(self, field: _Field, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of a column field, verifying only the blocks they touch."""
        data, row = field.regions["data"], field.row
        column = np.frombuffer(data.mv, dtype=field.dtype).reshape((self._n, *field.spec["shape"]))
        if row >= data.block:
            for j in idx.tolist():
                data.check(j * row, (j + 1) * row)
        elif idx.size and data.pending:
            starts = idx.astype(np.int64) * row
            for b in np.unique(np.concatenate([starts, starts + row - 1]) >> data.shift).tolist():
                if not data.checked[b]:
                    data.check(b << data.shift, (b + 1) << data.shift)
        result: np.ndarray = column[idx]
        return result

    def verify(self) -> None:
        """Check every byte of the pack now: each block against its checksum, and the
        padding between regions (which no read uses) for zeros. Raises
        :class:`PackCorrupted` if anything is damaged."""
        self._check_file()
        spans = [(0, HEADER.size)]
        for field in self._fields:
            for region in field.regions.values():
                region.check(0, region.len)
                spans.append((region.off, region.off + region.len))
        index_off = len(self._mm) - self._index_len
        spans.append((index_off, len(self._mm)))
        pos = 0
        for start, stop in sorted(spans):
            if start > pos and any(self._mm[pos:start]):
                raise PackCorrupted(f"{self.path}: damaged bytes between regions at {pos}")
            pos = max(pos, stop)


def sample_index(i: Any, n: int) -> int:
    """``i`` as an index in ``[0, n)`` (negative counts from the end)."""
    if not isinstance(i, (int, np.integer)):
        raise TypeError(f"sample indices must be integers, got {type(i).__name__}")
    j = int(i) + n if i < 0 else int(i)
    if not 0 <= j < n:
        raise IndexError(f"sample {i} out of range for a dataset of {n} samples")
    return j


def _same_pack(ds: PackedDataset, fingerprint: tuple[int, int, int] | None) -> PackedDataset:
    if fingerprint is not None and tuple(fingerprint) != (ds._n, ds._index_len, ds._index_sum):
        raise PackChanged(
            f"{ds.url or ds.path} now holds another pack than the one this dataset was "
            "opened on (rebuilt since?): open it again to read the new one"
        )
    return ds


def _reopen(
    path: str,
    allow_pickle: bool,
    options: dict[str, Any] | None,
    local_dir: str | None,
    fetch: str = "whole",
    fingerprint: tuple[int, int, int] | None = None,
    writable: bool = True,
) -> PackedDataset:
    ds = PackedDataset(
        path,
        allow_pickle=allow_pickle,
        storage_options=options,
        local_cache_dir=local_dir,
        fetch=fetch,
        writable=writable,
    )
    return _same_pack(ds, fingerprint)


def _reopen_fd(
    fd: Any,
    path: str,
    allow_pickle: bool,
    fingerprint: tuple[int, int, int],
    stat: tuple[int, ...],
    writable: bool = True,
) -> PackedDataset:
    """In a worker being started: the pack its parent opened, by a descriptor the
    parent handed over (``multiprocessing.reduction.DupFd``); if it cannot be read
    any more, a stand-in that raises why at its first use."""
    ds: PackedDataset = object.__new__(PackedDataset)
    ds.url, ds._remote, ds.path, ds.allow_pickle = None, (None, None, "whole"), path, allow_pickle
    ds.writable = writable
    try:
        ds._load(fd.detach())
        if ds._stat != tuple(stat):  # changed in place since the parent opened it
            ds._stat = tuple(stat)
            ds._check_file()
        return _same_pack(ds, fingerprint)
    except PackCorrupted as exc:
        # raised here, it would only show as "worker exited unexpectedly"; raised
        # by a read, the DataLoader hands it to the training loop
        return _Unreadable(type(exc), str(exc))  # type: ignore[return-value]


class _Unreadable(Sequence[dict[str, Any]]):
    """A pack a worker could not reopen: every use raises the error it met."""

    file_id = None

    def __init__(self, kind: type[PackCorrupted], message: str) -> None:
        self._kind, self._message = kind, message

    def __len__(self) -> int:
        raise self._kind(self._message)

    def __getitem__(self, i: Any) -> Any:
        raise self._kind(self._message)

    def get_batch(self, indices: Any) -> dict[str, Any]:
        raise self._kind(self._message)
