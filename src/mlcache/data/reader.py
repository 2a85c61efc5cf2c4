"""``PackedDataset``: random access to a pack file through one memory map, and
:class:`Pack`, what every opened pack (plain or sharded) offers.

Reading sample ``j`` is one function per pack, generated from the pack's fields
when the pack is first read, over regions checked block by block (see
:mod:`mlcache.data.regions`). Arrays a read returns are private to that read and
writable (``s["x"] /= 255`` works and never reaches another read, nor the
pack): an array of at least :data:`PRIVATE_MAP_MIN` bytes is a copy-on-write map
of its own pages of the file, a smaller one is copied. The pack itself is mapped
read-only, once. A sharded pack's manifest is not a pack file:
:func:`mlcache.data.open_pack` opens either.

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

import contextlib
import fcntl
import functools
import logging
import mmap
import multiprocessing.context
import os
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np
import xxhash

from ..errors import PackChanged, PackCorrupted
from .fetch import is_url, local_copy, sparse_copy
from .format import HEADER, parse_index, read_header
from .regions import (
    CHECK_EVERY,
    PRIVATE_MAP_MIN,
    Field,
    Region,
    compile_reader,
    field_regions,
    refuse,
    unpickle,
)
from .sequence import Many, Pack, sample_index, sample_indices

__all__ = [
    "CHECK_EVERY",
    "PRIVATE_MAP_MIN",
    "SHARDS_SUFFIX",
    "Pack",
    "PackedDataset",
    "sample_index",
    "spawning_worker",
]

#: the name a sharded pack's manifest ends with (see :mod:`mlcache.data.shards`)
SHARDS_SUFFIX = ".shards"

logger = logging.getLogger("mlcache")


def spawning_worker() -> bool:
    """True while a process is being started by spawn or forkserver (a DataLoader
    worker): a dataset pickled now can hand the child its open file."""
    return multiprocessing.context.get_spawning_popen() is not None


class PackedDataset(Pack):
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
        fetched once (see :mod:`mlcache.data.fetch`). A sharded pack's manifest
        (``*.shards``) is refused: :func:`mlcache.data.open_pack` opens either.
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
        if os.fspath(path).endswith(SHARDS_SUFFIX):
            raise ValueError(
                f"{os.fspath(path)} is a sharded pack's manifest, not a pack file: open it "
                "with mlcache.data.open_pack(path) or mlcache.data.ShardedDataset(path)"
            )
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
        # a reader holds a shared lock while it has the file open (its workers too:
        # they share the descriptor): a rebuild removes an old pack nobody holds
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        #: a sparse copy is filled in place as it is read: only its size is checked
        self._sparse = fetcher is not None
        self._size = size
        self._stat = self._stat_key(st)
        #: why this reader refuses to read, once its file changed to another pack
        self._broken: tuple[type[PackCorrupted], str] | None = None
        self._n = n
        self._index_len = i_len
        self._index_sum = i_sum
        #: the pack's parsed index: its fields, their kinds, dtypes and regions (the
        #: JSON table of :mod:`mlcache.data.format`), as read from the file
        self.pack_index: dict[str, Any] = index
        block = index["block"]  # a power of two (format.parse_index)
        self._fields: list[Field] = []
        try:
            for spec in index["fields"]:
                regions = field_regions(spec, self._mm, block, self.path)
                self._fields.append(Field(spec, regions, self.path))
                for region in regions.values():
                    region.fetch = fetcher
                    region.fd, region.file_size = fd, size
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PackCorrupted):
                raise
            raise PackCorrupted(f"{self.path}: bad field in the index ({exc})") from None
        self._sample: Callable[[int], dict[str, Any]] | None = None  # see _prepare()
        self._batch_readers: dict[tuple[str, ...], Callable[[int], dict[str, Any]]] = {}

    @property
    def fingerprint(self) -> tuple[int, int, int]:
        """What identifies this pack's content: its sample count, and its index's
        length and checksum (which covers the checksum of every block)."""
        return (self._n, self._index_len, self._index_sum)

    def item_table(self) -> np.ndarray | None:
        """What a filled pack's samples were loaded from: per sample, the key and
        the fingerprint of its item (an ``(n, 4)`` int64 table, verified now; see
        :mod:`mlcache.data.filling`), or None for a pack written without."""
        spec = self.pack_index.get("items")
        if spec is None:
            return None
        try:
            region = Region(spec, self._mm, self.pack_index["block"], self.path)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PackCorrupted):
                raise
            raise PackCorrupted(f"{self.path}: bad items region ({exc})") from None
        return np.array(region.table(self._n, 4))

    @property
    def index_sum(self) -> int:
        """The checksum of the pack's index (xxh3-64), as a sharded pack's manifest
        records it for each shard."""
        return self._index_sum

    @property
    def layout(self) -> dict[str, Any]:
        """Deprecated name of :attr:`pack_index` (it is the parsed index)."""
        warnings.warn(
            "PackedDataset.layout is deprecated: it is the parsed index, use .pack_index",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.pack_index

    @classmethod
    def _from_fd(
        cls, fd: int, path: str, allow_pickle: bool, stat: tuple[int, ...], writable: bool
    ) -> PackedDataset:
        """The pack open as ``fd`` (which it keeps), as ``path`` named it when its
        size and modification time were ``stat``; checked now if it changed since."""
        ds: PackedDataset = object.__new__(cls)
        ds.url, ds._remote, ds.path, ds.allow_pickle = (
            None,
            (None, None, "whole"),
            path,
            allow_pickle,
        )
        ds.writable = writable
        ds._load(fd)
        if ds._stat != tuple(stat):  # changed in place since the parent opened it
            ds._stat = tuple(stat)
            ds.check_file()
        return ds

    def __reduce__(self) -> tuple[Any, ...]:
        fingerprint = self.fingerprint
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

    def check_file(self) -> None:
        """Raise :class:`PackChanged` if the file changed to another pack since it
        was opened; if it holds the same pack's header and index again, make every
        block be verified again as it is read."""
        if self._broken is not None:
            refuse(*self._broken)
        st = os.fstat(self._fd)
        if self._stat_key(st) != self._stat:
            self._changed(st)

    def _tick(self) -> Callable[[int], dict[str, Any]] | None:
        """The periodic check of the generated reader: the reader to use instead,
        when blocks must be verified again, else None."""
        if self._broken is None and self._stat_key(os.fstat(self._fd)) == self._stat:
            return None
        self.check_file()
        return self._sample or self._prepare()

    def _changed(self, st: os.stat_result) -> None:
        where = self.path
        if st.st_size != self._size:
            self.refuse_from_now(
                PackChanged,
                f"{where}: the pack file was rewritten in place since it was opened (it had "
                f"{self._size} bytes, now {st.st_size}); mlcache never changes a pack in "
                "place: open it again",
            )
        fd = self._fd
        head = os.pread(fd, HEADER.size, 0)
        index = os.pread(fd, self._index_len, self._size - self._index_len)
        if head != self._head or xxhash.xxh3_64_intdigest(index) != self._index_sum:
            self.refuse_from_now(
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

    def refuse_from_now(self, kind: type[PackCorrupted], message: str) -> None:
        self._broken = (kind, message)
        self._sample = functools.partial(refuse, kind, message)
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
        self.check_file()
        return self._n

    def __iter__(self) -> Any:
        self.check_file()
        for i in range(self._n):
            yield self[i]

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self._fields]

    def _index(self, i: Any) -> int:
        return sample_index(i, self._n)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: Many) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: Any) -> Any:
        sample = self._sample or self._prepare()
        if i.__class__ is not int or not 0 <= i < self._n:
            if not isinstance(i, (int, np.integer)):  # ds[2:4], ds[[1, 2]]
                return [self[j] for j in sample_indices(i, self._n) or ()]
            i = self._index(i)
        try:  # free unless raised (3.11+)
            return sample(i)
        except UnicodeDecodeError as exc:
            raise self._bad_text(i, exc) from None
        except PackChanged as exc:  # met by a read (a truncated file): refuse from now on
            if self._broken is None:
                self.refuse_from_now(PackChanged, str(exc))
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
        self.check_file()
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

    def _compile(self, fields: list[Field] | None = None) -> Callable[[int], dict[str, Any]]:
        load = functools.partial(unpickle, self.path, self.allow_pickle)  # no self: no cycle
        return compile_reader(
            self._fields if fields is None else fields,
            self._n,
            load,
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
        self.check_file()
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

    def _column_batch(self, field: Field, idx: np.ndarray) -> np.ndarray:
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
        self.check_file()
        spans = [(0, HEADER.size)]
        for field in self._fields:
            for region in field.regions.values():
                region.check(0, region.len)
                spans.append((region.off, region.off + region.len))
        items = self.pack_index.get("items")
        if items is not None:  # a filled pack's item table
            self.item_table()
            spans.append((items["off"], items["off"] + items["len"]))
        index_off = len(self._mm) - self._index_len
        spans.append((index_off, len(self._mm)))
        pos = 0
        for start, stop in sorted(spans):
            if start > pos and any(self._mm[pos:start]):
                raise PackCorrupted(f"{self.path}: damaged bytes between regions at {pos}")
            pos = max(pos, stop)


def _same_pack(ds: PackedDataset, fingerprint: tuple[int, int, int] | None) -> PackedDataset:
    if fingerprint is not None and tuple(fingerprint) != ds.fingerprint:
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
) -> Pack:
    """In a worker being started: the pack its parent opened, by a descriptor the
    parent handed over (``multiprocessing.reduction.DupFd``); if it cannot be read
    any more, a stand-in that raises why at its first use."""
    try:
        ds = PackedDataset._from_fd(fd.detach(), path, allow_pickle, stat, writable)
        return _same_pack(ds, fingerprint)
    except PackCorrupted as exc:
        # raised here, it would only show as "worker exited unexpectedly"; raised
        # by a read, the DataLoader hands it to the training loop
        return _Unreadable(type(exc), str(exc))


class _Unreadable(Pack):
    """A pack a worker could not reopen: every use raises the error it met."""

    file_id = None

    def __init__(self, kind: type[PackCorrupted], message: str) -> None:
        self._kind, self._message = kind, message

    @property
    def field_names(self) -> list[str]:
        raise self._kind(self._message)

    def check_file(self) -> None:
        raise self._kind(self._message)

    def __len__(self) -> int:
        raise self._kind(self._message)

    def __getitem__(self, i: Any) -> Any:
        raise self._kind(self._message)

    def get_batch(self, indices: Any) -> dict[str, Any]:
        raise self._kind(self._message)
