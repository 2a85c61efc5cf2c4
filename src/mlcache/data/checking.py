"""A filled pack's items checked as they are first read: the default source check
(``check_source="open"``) of a :class:`~mlcache.data.CachedDataset` built by
``load_item()``, without a ``stat`` of every file before ``ds[0]``.

A sealed pack records, for each sample, the key and the fingerprint of its item
(:mod:`mlcache.data.items`). Opening it with the default check used to list the
items and fingerprint each (one ``stat`` a file: ~100 ms for 20,000 files). Now
the open checks only what can change the *order* of the items, and each item is
checked the first time this process reads its sample:

- **which items, in which order**: for a declared folder (``source_dir`` +
  ``source_glob``), the folder's ``stat`` against the one recorded with the
  listing the pack was filled from (a *listing record*, ``.<...>.listing`` beside
  the packs: the names, in order, and the digest of the item table they made).
  Adding, removing or renaming a file changes the folder's modification and
  change times (the change time no user call can set back). The record is
  trusted only on a file system known to keep them (:data:`KEEPS_TIMES`: ext4,
  xfs, btrfs, tmpfs, overlay...; not NFS, SMB, FUSE mounts), and only when the
  listing began well after the folder's last change (:func:`trusted_after`), so
  that a change in the same clock tick as the listing cannot hide behind an
  unchanged time. Otherwise the folder is listed and every file stat'ed, as
  before. For ``source_paths`` and for ``source_items()``, the items are listed
  (the declaration, or the user's own method) and their keys compared with the
  pack's, without a ``stat``;
- **what each item holds**: at its first read, one ``stat`` (the default
  :meth:`~mlcache.data.CachedDataset.item_fingerprint`: every file the item names)
  compared with the fingerprint its sample was stored with. A match is remembered
  for the rest of the process; a mismatch (an edited, replaced or removed file)
  raises :class:`ItemChanged`, and the dataset then checks every item now, as an
  open does, keeping the items of its open: the changed samples are loaded again
  (``load_item``), never served from the pack.

So no sample is served that its item no longer holds at its first read in the
process; a change after that read is seen by the next open, as before. A class
with its own ``item_fingerprint()`` or ``source_fingerprint()``, a remote
``cache_dir``, ``force_recache`` and a pack still being filled are checked at
the open, as before.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from .._atomic import write_bytes_atomic
from .._util import KEEPS_TIMES, fs_type
from .items import default_fingerprint, item_keys, item_table, table_digest
from .reader import PackedDataset
from .sequence import sample_index, sample_indices
from .sources import DeclaredSource

__all__ = [
    "KEEPS_TIMES",
    "LISTING_SUFFIX",
    "ItemChanged",
    "ItemCheck",
    "folder_table",
    "listed_folder",
    "record_listing",
    "stat_fingerprint",
    "trusted_after",
]

logger = logging.getLogger("mlcache")

#: the listing record's name ends with this (beside the ``.source`` record)
LISTING_SUFFIX = ".listing"
_MAGIC = b"MLCLIST1"
#: magic, digest of the item table, the folder's dev, ino, mtime_ns, ctime_ns, when
#: the listing began (ns), the number of names, the length of the names
_HEAD = struct.Struct("<8s16sqqqqqqq")
_SUM = struct.Struct("<Q")
_M = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")
_LITTLE = sys.byteorder == "little"


class ItemChanged(Exception):
    """An item no longer holds what its sample was stored from (internal: the
    dataset checks every item then)."""


def trusted_after(ctime_ns: int) -> int:
    """How long after a folder's last change (its change time, ``ctime_ns``) a
    listing must begin for a later change to be sure to move that time: a file
    system that keeps whole seconds (ext3, ext4 with small inodes) needs two, one
    with nanoseconds the kernel's clock tick (at most 10 ms; 100 ms kept)."""
    return 2_000_000_000 if ctime_ns % 1_000_000_000 == 0 else 100_000_000


def _folder_stat(folder: str) -> tuple[int, int, int, int]:
    st = os.stat(folder)
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _fmix(x: int) -> int:
    """:func:`mlcache.data.items._fmix` on one Python int."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M
    return x ^ (x >> 33)


def stat_fingerprint(st: os.stat_result, local: bool = True) -> bytes:
    """The fingerprint a folder's listing gives one file (as
    :func:`mlcache.data.items.item_table` does from its ``stats``), from its ``stat``."""
    ino, ctime = (st.st_ino, st.st_ctime_ns) if local else (0, 0)
    a = _fmix((st.st_size & _M) ^ _fmix((ino & _M) ^ 0x9E3779B97F4A7C15))
    b = _fmix((st.st_mtime_ns & _M) ^ _fmix((ctime & _M) ^ 0x632BE59BD9B4E019))
    return _PAIR.pack(a, b)


def folder_table(paths: Sequence[str], local: bool = True) -> np.ndarray:
    """The item table of the files ``paths`` of a folder listed earlier, as they are
    now (one ``stat`` each; a file gone, or no longer a file, matches nothing)."""
    stats = bytearray()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stats += bytes(32)
            continue
        fields = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns) if local else None
        stats += struct.pack("<qqqq", *(fields or (st.st_size, st.st_mtime_ns, 0, 0)))
    return item_table(paths, stats=bytes(stats))


def listed_folder(
    declared: DeclaredSource, record: str, root: str, local: bool
) -> tuple[list[Any], np.ndarray]:
    """The files of a declared folder and their item table (one listing, one ``stat``
    a file), the listing recorded in ``record`` (for a local cache) so that the next
    open can check the items as they are read."""
    assert declared.folder is not None
    began = time.time_ns()
    try:
        before = _folder_stat(declared.folder) if local else None
    except OSError:
        before = None
    paths, stats = declared.listed(local)
    table = item_table(paths, stats=stats.tobytes())
    if before is not None:
        record_listing(record, root, declared.folder, before, began, paths, table)
    return list(paths), table


# -- the listing record --------------------------------------------------------------
def record_listing(
    record: str,
    root: str,
    folder: str,
    before: tuple[int, int, int, int],
    began: int,
    paths: Sequence[str],
    table: np.ndarray,
) -> None:
    """Record the listing of ``folder`` that gave ``paths`` and their ``table``:
    it began at ``began`` (``time.time_ns()``), when the folder's stat was
    ``before``. Not recorded when the folder changed meanwhile, nor when a record
    of the same listing is already there. Never raises (the next open lists)."""
    try:
        if _folder_stat(folder) != before:
            return
        digest = bytes.fromhex(table_digest(table))
        found = read_listing(record)
        if (
            found is not None
            and found[0] == digest
            and found[1] == before
            and found[2] - before[3] > trusted_after(before[3])
        ):
            return  # the same listing, already trusted
        base = os.path.join(folder, "")
        names = [p[len(base) :] if p.startswith(base) else p for p in paths]
        raw = [n.encode("utf-8", "surrogateescape") for n in names]
        ends = np.zeros(len(raw) + 1, dtype="<u8")
        np.cumsum([len(r) for r in raw], out=ends[1:])
        blob = b"".join(raw)
        head = _HEAD.pack(_MAGIC, digest, *before, began, len(raw), len(blob))
        body = head + ends.tobytes() + blob
        write_bytes_atomic(record, body + _SUM.pack(xxhash.xxh3_64_intdigest(body)), root=root)
    except (OSError, ValueError) as exc:  # housekeeping: the next open lists the folder
        logger.debug("mlcache: could not record the listing of %s: %s", folder, exc)


def read_listing(
    record: str,
) -> tuple[bytes, tuple[int, int, int, int], int, Sequence[int], bytes] | None:
    """A listing record: the table digest, the folder's stat, when the listing
    began, the ends of the names and the names' bytes; None if missing or damaged."""
    try:
        with open(record, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD.size + _SUM.size or data[:8] != _MAGIC:
        return None
    body = memoryview(data)[: -_SUM.size]
    if _SUM.unpack_from(data, len(data) - _SUM.size)[0] != xxhash.xxh3_64_intdigest(body):
        return None
    _magic, digest, dev, ino, mtime, ctime, began, n, size = _HEAD.unpack_from(data)
    start = _HEAD.size + 8 * (n + 1)
    if n < 0 or size < 0 or start + size != len(body):
        return None
    table = memoryview(data)[_HEAD.size : start]
    # where each name ends, by index at Python speed (the checksum vouches for them)
    ends: Sequence[int] = table.cast("Q") if _LITTLE else struct.unpack(f"<{n + 1}Q", table)
    if ends[0] != 0 or ends[n] != size:
        return None
    return digest, (dev, ino, mtime, ctime), began, ends, data[start:]


# -- the check -------------------------------------------------------------------------
class _FolderFiles:
    """The items of a pack filled from a folder's files, as its listing record names
    them, and each one's fingerprint now: methods of a module-level class, not
    closures, so that a check is pickled whole to a spawned DataLoader worker."""

    def __init__(self, base: str, blob: bytes, ends: Sequence[int], n: int, local: bool):
        self.base, self.blob, self.ends, self.n, self.local = base, blob, ends, n, local

    def path(self, i: int) -> str:
        blob, ends = self.blob, self.ends
        return self.base + blob[ends[i] : ends[i + 1]].decode("utf-8", "surrogateescape")

    def fingerprint(self, i: int) -> bytes | None:
        try:
            return stat_fingerprint(os.stat(self.path(i)), self.local)
        except OSError:
            return None

    def items(self) -> list[Any]:
        return [self.path(i) for i in range(self.n)]

    def __getstate__(self) -> dict[str, Any]:
        # the ends are a view of the record read at the open: sent as a list
        return {**self.__dict__, "blob": bytes(self.blob), "ends": list(self.ends)}


class _ListedItems:
    """The items ``source_items()`` listed at the open, and each one's fingerprint
    now (picklable, as :class:`_FolderFiles`)."""

    def __init__(self, items: list[Any], bases: tuple[str, ...], local: bool) -> None:
        self.listed, self.bases, self.local = items, bases, local

    def fingerprint(self, i: int) -> bytes:
        return default_fingerprint(self.listed[i], self.bases, self.local)

    def items(self) -> list[Any]:
        return self.listed


class ItemCheck:
    """The pack of a dataset whose items are checked as they are first read (see
    the module docstring): ``check[i]`` serves sample ``i`` once its item is found
    unchanged, else raises :class:`ItemChanged`.

    Built by :meth:`of_folder` or :meth:`of_items`, which return None when the
    pack cannot be checked this way (then the dataset checks at the open)."""

    def __init__(
        self,
        pack: PackedDataset,
        table: np.ndarray,
        fingerprint: Callable[[int], bytes | None],
        items: Callable[[], list[Any]],
    ) -> None:
        self.pack, self.n = pack, len(table)
        #: items not checked yet (0: the pack is read as it is)
        self.left = self.n
        self._fps = np.ascontiguousarray(table[:, 2:]).tobytes()
        self._checked = bytearray(self.n)
        self._fingerprint, self._items = fingerprint, items

    @classmethod
    def of_folder(
        cls, pack: PackedDataset, folder: str, record: str, local: bool
    ) -> ItemCheck | None:
        """The check of a pack filled from the files of ``folder``, if the listing
        record ``record`` holds for the pack and for the folder as it is now."""
        table = _usable_table(pack)
        found = read_listing(record)
        if table is None or found is None:
            return None
        digest, then, began, ends, blob = found
        try:
            now = _folder_stat(folder)
        except OSError:
            return None
        if (
            now != then
            or began - then[3] <= trusted_after(then[3])
            or len(ends) != len(table) + 1
            or fs_type(now[0]) not in KEEPS_TIMES
            or digest != bytes.fromhex(table_digest(table))
        ):
            return None
        source = _FolderFiles(os.path.join(folder, ""), blob, ends, len(table), local)
        return cls(pack, table, source.fingerprint, source.items)

    @classmethod
    def of_items(
        cls,
        pack: PackedDataset,
        items: list[Any],
        bases: Sequence[str],
        local: bool,
        keys: bytes | None = None,
    ) -> ItemCheck | None:
        """The check of a pack filled from ``items`` (listed now; ``keys``: their
        keys, if known), if they are the items it was filled from, in the same order."""
        table = _usable_table(pack)
        if table is None or len(items) != len(table):
            return None
        if keys is None:
            keys = item_keys(items)
        if keys != np.ascontiguousarray(table[:, :2]).tobytes():
            return None
        source = _ListedItems(items, tuple(bases), local)
        return cls(pack, table, source.fingerprint, source.items)

    def items(self) -> list[Any]:
        """The items of the open, in order (the recheck keeps them)."""
        return self._items()

    def check(self, i: int) -> None:
        """Item ``i`` as its sample was stored (remembered), else :class:`ItemChanged`."""
        if self._checked[i]:
            return
        if self._fingerprint(i) != self._fps[16 * i : 16 * i + 16]:
            raise ItemChanged(i)
        self._checked[i] = 1
        self.left -= 1  # two threads' first reads of one item may both count it: see done()

    def done(self) -> bool:
        """Whether every item was checked: ``left`` counted again when it says so
        (threads reading at once may have counted an item twice, and an item not
        checked is never served unchecked), kept by the recount otherwise."""
        if self.left > 0:
            return False
        self.left = self._checked.count(0)
        return not self.left

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if i.__class__ is int and 0 <= i < self.n:
            if not self._checked[i]:
                self.check(i)
            return self.pack[i]
        many = sample_indices(i, self.n)
        for j in many if many is not None else (sample_index(i, self.n),):
            self.check(j)
        return self.pack[i]


def _usable_table(pack: PackedDataset) -> np.ndarray | None:
    """The pack's item table, if its items can be checked one by one: it has one,
    and some item names a file (a table of items naming none is checked at the
    open, which says once how to fingerprint them)."""
    try:
        table = pack.item_table()
    except ValueError:  # PackCorrupted: the open says so and rebuilds
        return None
    if table is None or not len(table) or not table[:, 2:].any():
        return None
    return table
