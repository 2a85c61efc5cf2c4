"""The in-process tier of small entries: a repeated small hit without re-reading,
re-checking and re-verifying its file.

An entry of a local store whose file is under :data:`MAX_ENTRY` bytes, read into
memory (no ``mmap_mode``) and stored with a codec that decodes from its segments
alone (:data:`CODECS`), is kept here when this process reads it, checking its
checksum and its signature then, as any read does. Keeping costs ~2 µs of a
~50 µs first read (the file's identity is one ``fstat`` of the file it opens);
a later hit of the same file costs one ``os.stat`` of it and a decode of the
kept bytes, not a second read and check (~25 against ~55 µs a hit, for a
process hitting 200 small entries twice):

- The file's identity (device, inode, size, mtime_ns, ctime_ns) must be the one
  it had when it was read. An entry removed (``clear()``), replaced (a new
  entry is always published by a rename: another inode) or rewritten in place
  (another mtime or ctime) is read and verified again at once; a missing file
  is a miss.
- Every hit decodes from private copies of the kept bytes: a caller mutating a
  returned dict or array never changes what the next hit returns.
- A file is kept only once its last change is :data:`~mlcache.entry.SETTLED_NS`
  old (:data:`~mlcache.entry.COARSE_SETTLED_NS` for whole-second file times):
  file times advance by clock ticks, and a rewrite within the tick of the read
  would not show in them.
- Bounded: at most :data:`BUDGET` bytes of files in all, least recently used
  first out.
- Kept for the next run: what a process keeps of a code folder is written to the
  folder's record at its usage flushes (:meth:`HitTier.save`), and a process that
  finds no kept entry for a path serves the record's row of it while the file has
  the identity recorded (:mod:`mlcache.memo.record`).

What one ``stat`` cannot see: a rewrite of the same file, to the same size,
whose mtime *and* ctime are both restored. A user can restore the mtime
(``os.utime``) but not the ctime, which the kernel sets to the time of any
change; setting it takes root (changing the system clock, or writing the raw
disk). Someone with root can also change this process's memory, so the tier
trusts nothing more than the process already does. The same holds for the
mapped-read marks of :mod:`mlcache.entry.reader`. Where the ctime is not the
time of the last change (Windows: it is the creation time) the tier is off.

On a network file system a ``stat`` may be answered from the client's attribute
cache (NFS: ``acregmin`` 3 s to ``acregmax`` 60 s, unless mounted with
``actimeo=0`` or ``noac``), while an ``open`` asks the server: there an entry
removed or recomputed by another machine is seen when that cache expires, not
at once. What is served meanwhile is the value this process verified for the
same key (the key names function, code version and arguments), never bytes it
has not checked; an expiry callback (``cache_validation_callback``) still reads
the entry's header at every hit. Records are not read or written there
(:mod:`mlcache.memo.record`): a new process has verified nothing.

An entry is kept by the size of its payload once decompressed (a compressed
file of 100 bytes may hold megabytes), not by the size of its file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._util import sets_times
from ..codecs import Codec, codecs
from ..entry.reader import EntryReader, decode, settled
from ..entry.signing import Signer
from ..errors import EntryCorrupted, EntryNotFound, UnknownFormat
from . import record
from .record import MAX_RECORD, MAX_ROW, Record, Row, brief, freeze, thaw

__all__ = ["BUDGET", "CODECS", "MAX_ENTRY", "OPEN_AT_ONCE", "HitTier", "tier"]

logger = logging.getLogger("mlcache")

#: entries whose file is at least this large are read, never kept
MAX_ENTRY = 64 * 1024
#: the bytes of entry files the tier keeps at most (least recently used out)
BUDGET = 16 * 1024 * 1024
#: codecs whose decoded values hold nothing of the (shared) layout that a caller
#: could mutate: their values are built from the segments, or are immutable
CODECS = frozenset({"npy", "pickle"})

_Ident = tuple[int, int, int, int, int]
_UNFIT = object()
#: files :meth:`HitTier.retouch` holds open at once (the caller touches in batches)
OPEN_AT_ONCE = 256
# never follow a link; a planted fifo opens without waiting for a writer
_OPEN = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)


def _identity(st: os.stat_result) -> _Ident:
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Copies:
    """The segments of a kept, verified entry, each handed out as a fresh copy."""

    __slots__ = ("_reader",)

    def __init__(self, reader: EntryReader) -> None:
        self._reader = reader

    def __len__(self) -> int:
        return len(self._reader)

    def buffer(self, index: int) -> memoryview:
        return memoryview(bytearray(self._reader.buffer(index)))

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        return self._reader.array(index, dtype, shape, order).copy(order="K")


class _Kept:
    """One verified entry: its segments, and for ``npy`` values a pickle this process
    made of the value it decoded from them (``pickle.loads`` of it builds the same
    tree of plain values and arrays in a quarter of the time; it is this process's
    own memory, never bytes of the file). ``plain``: small enough for a record,
    and not yet found to hold a value a record cannot (``row`` holds its bytes
    for a record once made, :func:`~mlcache.memo.record.freeze`)."""

    __slots__ = (
        "blob",
        "codec",
        "ident",
        "info_bytes",
        "layout",
        "name",
        "plain",
        "row",
        "segments",
        "served",
        "signer",
    )

    def __init__(
        self,
        ident: _Ident,
        name: str,
        signer: Signer | None,
        codec: Codec,
        info_bytes: bytes,
        reader: EntryReader | None = None,
        blob: bytes | None = None,
    ) -> None:
        self.ident, self.name, self.signer = ident, name, signer
        self.codec = codec
        self.layout = reader.codec_layout if reader is not None else None
        self.segments = _Copies(reader) if reader is not None else None
        self.info_bytes = info_bytes
        self.blob = blob
        self.plain = False
        self.row: bytes | None = None
        self.served = False

    def decode(self) -> Any:
        if self.blob is not None:
            return pickle.loads(self.blob)
        assert self.layout is not None and self.segments is not None  # read, not recorded
        value = self.codec.decode(self.layout, self.segments)
        if not self.served:  # a first hit pays nothing more than reading would
            self.served = True
        elif self.codec.name == "npy":  # plain values, tuples, lists, dicts, arrays
            # a value that does not pickle is decoded from the segments every time
            with contextlib.suppress(Exception):
                self.blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return value


class _Folder:
    """What this process knows of one code folder's record."""

    __slots__ = ("dirty", "record", "signer", "touched", "unwritable")

    def __init__(self, signer: Signer | None, found: Record | None) -> None:
        self.signer = signer
        self.record = found if found is not None else Record()
        self.dirty = False  # rows to add or drop
        # rows only carried over a touch: written by the last flush (at exit), not
        # by each flush of a hit path (a whole record for a few new mtimes)
        self.touched = False
        self.unwritable = False  # a write failed: not tried again by this process


class HitTier:
    """Small verified entries of this process, revalidated by one ``stat`` per hit."""

    def __init__(self, max_entry: int = MAX_ENTRY, budget: int = BUDGET) -> None:
        self.max_entry, self.budget = max_entry, budget
        #: off where the ctime is not the time of the last change (see above)
        self.enabled = os.name == "posix"
        #: code folders' records are read and written (:mod:`mlcache.memo.record`);
        #: off, a first hit reads its file (what benchmarks of that read turn off)
        self.records = True
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: code folder (local path) -> what this process knows of its record
        self._folders: dict[str, _Folder] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        """Forget every kept entry (the next hit of each reads its file again)."""
        with self._lock:
            self._kept.clear()
            self._bytes = 0
            self._folders.clear()

    def read(
        self, path: str, name: str, signer: Signer | None, allow_pickle: bool
    ) -> tuple[Any, bytes] | None:
        """(value, info bytes) of entry ``name`` at ``path``, or None when the tier
        is off (the caller reads it the ordinary way). An entry that cannot be
        kept (too large, changed too recently, of another codec) is read and
        decoded as :func:`~mlcache.entry.decode` does, and not kept.

        Raises what :func:`~mlcache.entry.open_entry` raises: ``EntryNotFound``
        for a missing file, ``EntryCorrupted`` / ``EntrySignatureError`` for
        damage, ``OSError`` when it cannot be read."""
        if not self.enabled:
            return None
        kept = self._kept.get(path)
        if kept is None:
            folder, _, key = path.rpartition(os.sep)
            state = self._folders.get(folder)
            if state is None or state.signer is not signer:  # once per folder
                state = self._folders[folder] = self._folder(folder, signer)
            row = state.record.row(key)
            if row is not None and (allow_pickle or codecs[row[1]].safe):
                # served while the file has the identity recorded (inlined: a call
                # is a tenth of this path)
                try:
                    st = os.stat(path)
                except (FileNotFoundError, NotADirectoryError):  # evicted, cleared
                    state.record.drop(key)
                    state.dirty = True
                    raise EntryNotFound(name) from None
                if (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == row[0]:
                    try:  # a record signed with the reader's key was verified when
                        # read: loaded as a signed pickle entry is where pickle is
                        # allowed (~0.6 µs a small dict, ~1.5 µs refusing globals)
                        if allow_pickle and signer is not None:
                            return pickle.loads(row[3]), row[2]
                        return thaw(row[3]), row[2]
                    except Exception as exc:  # the record's fault, never the entry's
                        logger.debug("mlcache: a record's row of %s is not used: %s", path, exc)
                state.record.drop(key)  # read as if there were no row
                state.dirty = True
            return self._first(path, name, signer, allow_pickle)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):  # cleared: a miss at once
            self._drop(path, stale=kept.plain)
            raise EntryNotFound(name) from None
        if (
            kept.ident == _identity(st)
            and kept.name == name
            and kept.signer is signer
            and (kept.codec.safe or allow_pickle)  # kept by a Memory that allows pickle
        ):
            try:  # one C call, atomic under the GIL: no lock on the hit
                self._kept.move_to_end(path)
            except KeyError:  # dropped by another thread meanwhile
                pass
            return self._decode(kept, path), kept.info_bytes
        # changed since, or kept for another reader: read again
        self._drop(path, stale=kept.plain and kept.ident != _identity(st))
        return self._first(path, name, signer, allow_pickle)

    def _folder(self, folder: str, signer: Signer | None) -> _Folder:
        """What this process knows of the record of ``folder``: read when records
        are on and the folder's file system sets its files' times itself."""
        local = self.records
        if local:  # once per folder and process: a stat, and the mount table once
            try:
                local = sets_times(os.stat(folder).st_dev)
            except (OSError, ValueError):
                local = False
        state = _Folder(signer, record.load(folder, signer) if local else None)
        # NFS: a new process's stat may be answered from the client's attribute
        # cache while another machine recomputed the entry: no records there
        state.unwritable = not local
        return state

    def _first(
        self, path: str, name: str, signer: Signer | None, allow_pickle: bool
    ) -> tuple[Any, bytes]:
        """Read, verify and decode entry ``name`` as :func:`~mlcache.entry.decode`
        does, and keep it when it can be kept: the file's identity is that of the
        file it read (one ``fstat`` of the open file, before reading it)."""
        # settled is judged at a time taken before the fstat, not after the read: a
        # thread held up while reading must not count a change made meanwhile as old
        now = time.time_ns()
        try:
            reader = EntryReader(path, None, signer, name, identify=True)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise EntryNotFound(name) from None
        st = reader.stat
        codec = codecs.get(reader.codec) if reader.codec in CODECS else None
        if (
            st is None
            or st.st_size >= self.max_entry
            # decompressed, a small file may hold far more (bz2: 160 MB in 640 bytes)
            or reader.raw_size >= self.max_entry
            or not settled(st, now)
            or codec is None
            or not (codec.safe or allow_pickle)
        ):
            return decode(reader, allow_pickle=allow_pickle), reader.info_bytes
        # The identity was taken before the read and the file's last change was
        # settled (older than the margin) then, so any change since, even one made
        # while it was being read, gives it a later mtime or ctime: the next hit
        # reads it again.
        fresh = _Kept(_identity(st), name, signer, codec, reader.info_bytes, reader)
        self._keep(path, fresh)
        value = self._decode(fresh, path)
        if reader.raw_size <= MAX_ROW:  # a record may hold it: made when it is written
            fresh.plain = True
            self._changed(path)
        return value, fresh.info_bytes

    def _decode(self, kept: _Kept, path: str) -> Any:
        try:
            return kept.decode()
        except (EntryCorrupted, UnknownFormat):  # unknown here (a leaf not registered):
            self._drop(path)  # not damage, as mlcache.entry.decode says; the entry stays
            raise
        except Exception as exc:  # as mlcache.entry.decode: damage, never a value
            self._drop(path)
            raise EntryCorrupted(
                f"{path}: cannot decode the {kept.codec.name!r} payload "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def _keep(self, path: str, kept: _Kept) -> None:
        size = kept.ident[2]
        with self._lock:
            old = self._kept.pop(path, None)
            if old is not None:
                self._bytes -= old.ident[2]
            self._kept[path] = kept
            self._bytes += size
            while self._bytes > self.budget and self._kept:
                _, out = self._kept.popitem(last=False)
                self._bytes -= out.ident[2]

    def _drop(self, path: str, *, stale: bool = False) -> None:
        with self._lock:
            old = self._kept.pop(path, None)
            if old is not None:
                self._bytes -= old.ident[2]
        if stale:  # a recorded entry changed: its record is written again without it
            self._changed(path)

    def _changed(self, path: str) -> None:
        # the folder's state was made by the read that found no kept entry
        state = self._folders.get(path.rpartition(os.sep)[0])
        if state is not None:
            state.dirty = True

    def _touched(self, path: str) -> None:
        state = self._folders.get(path.rpartition(os.sep)[0])
        if state is not None:
            state.touched = True

    # -- the records of the next runs --------------------------------------------------
    def retouch(self, paths: Iterable[str], change: Callable[[], Any]) -> None:
        """Run ``change()``, which only sets the times of the entry files ``paths``
        (mlcache's last-use touch), carrying over what is kept of those files (see
        :mod:`mlcache.memo.record`).

        Each file with something to carry is opened before the touch, and its
        ``fstat`` must be the kept identity: the open file pins its inode, so no
        file made meanwhile (an entry evicted and computed again by another
        process while this one touches) can reuse it. After the touch, the path
        must still name that very file, of the same size: it is kept with the
        times the touch gave it. Anything else is read again, never carried.
        At most :data:`OPEN_AT_ONCE` files are held open: the caller touches in
        batches of that size."""
        held: list[tuple[str, _Kept | None, _Ident, int]] = []
        try:
            for path in paths if self._kept or self._folders else ():
                kept = self._kept.get(path)
                if kept is not None:
                    ident = kept.ident
                else:  # a row of a record served here
                    folder, _, key = path.rpartition(os.sep)
                    state = self._folders.get(folder)
                    row = state.record.served.get(key) if state is not None else None
                    if row is None:
                        continue
                    ident = row[0]
                if len(held) >= OPEN_AT_ONCE:
                    break  # not carried over: read again by the next hit (never wrong)
                try:
                    fd = os.open(path, _OPEN)
                except (OSError, ValueError):
                    continue
                try:
                    same = _identity(os.fstat(fd)) == ident
                except OSError:
                    same = False
                if same:
                    held.append((path, kept, ident, fd))
                else:
                    os.close(fd)
            change()
            for path, kept, ident, fd in held:
                try:
                    new = _identity(os.fstat(fd))  # the pinned inode
                    if _identity(os.stat(path, follow_symlinks=False)) != new:
                        continue  # the path names another file now
                except (OSError, ValueError):
                    continue
                if new[2] != ident[2]:
                    continue
                self._carry(path, kept, ident, new)
        finally:
            for *_, fd in held:
                os.close(fd)

    def _carry(self, path: str, kept: _Kept | None, ident: _Ident, new: _Ident) -> None:
        """Keep the entry at ``path`` (kept, or a record's row served) with the
        identity ``new`` its file has after mlcache's touch."""
        if kept is not None:
            if self._kept.get(path) is kept:
                kept.ident = new
                if kept.plain:
                    self._touched(path)
            return
        folder, _, key = path.rpartition(os.sep)
        state = self._folders.get(folder)
        row = state.record.served.get(key) if state is not None else None
        if state is not None and row is not None and row[0] == ident:
            state.record.served[key] = (new, *row[1:])
            state.touched = True

    @staticmethod
    def _row_of(kept: _Kept) -> bytes | None:
        """The bytes of ``kept``'s value for a record (decoded again from its
        verified segments when the record is written, not on the hit that read it:
        ~3 µs of a first read), or None when a record cannot hold that value."""
        if kept.row is None and kept.plain:
            try:
                value = (
                    pickle.loads(kept.blob)
                    if kept.blob is not None
                    else kept.codec.decode(kept.layout, kept.segments)  # type: ignore[arg-type]
                )
            except Exception:  # as a hit would: not this row's to say
                value = _UNFIT
            kept.row = freeze(value) if value is not _UNFIT else None
            kept.plain = kept.row is not None
        return kept.row

    def save(self, root: str, *, touched: bool = True) -> None:
        """Write the records of the code folders under ``root`` (a local store's
        folder) that changed in this process: what it keeps of each folder, the
        most recently used first, then the rows of the record it read that it did
        not take, each only while its file has the identity recorded. A folder
        whose rows only were carried over a touch is written only when
        ``touched`` (the last flush; a flush on a hit's path passes False).

        A folder that cannot be written (a read-only cache) is logged at debug
        level and not tried again by this process; one removed (``clear()``) is
        tried again once rows of it are kept again. Nothing here raises."""
        if not self.records:
            return
        prefix = os.path.join(root, "")
        todo = {
            folder: state
            for folder, state in list(self._folders.items())
            if (state.dirty or (touched and state.touched))
            and not state.unwritable
            and folder.startswith(prefix)
        }
        if not todo:
            return
        kept_rows: dict[str, list[tuple[str, Row]]] = {folder: [] for folder in todo}
        for path, kept in reversed(list(self._kept.items())):
            folder, _, key = path.rpartition(os.sep)
            state = todo.get(folder)
            if state is not None and kept.plain and kept.signer is state.signer:
                blob = self._row_of(kept)
                if blob is not None:
                    row = (kept.ident, kept.codec.name, brief(kept.info_bytes), blob)
                    kept_rows[folder].append((key, row))
        for folder, state in todo.items():
            state.dirty = state.touched = False
            rows: dict[str, Row] = {}
            total = 0
            for key, row in [*kept_rows[folder], *state.record.rest().items()]:
                size = len(row[2]) + len(row[3]) + 128
                if key in rows or total + size > MAX_RECORD:
                    continue  # a big row leaves room for the smaller ones after it
                try:
                    if _identity(os.stat(os.path.join(folder, key))) != row[0]:
                        continue
                except (OSError, ValueError):
                    continue
                total += size
                rows[key] = row
            try:
                record.save(folder, rows, state.signer)
            except (FileNotFoundError, NotADirectoryError) as exc:  # cleared meanwhile
                logger.debug("mlcache: the record of %s was not written: %s", folder, exc)
            except (OSError, ValueError) as exc:  # read-only; a key of a foreign name
                state.unwritable = isinstance(exc, OSError)
                logger.debug("mlcache: the record of %s was not written: %s", folder, exc)

    def _after_fork(self) -> None:
        # a forked child inherits the lock in whatever state another thread held it
        self._lock = threading.Lock()
        # the parent writes what it changed: a child (a DataLoader worker) writes
        # only the folders it changes itself
        for state in self._folders.values():
            state.dirty = state.touched = False


#: the tier every memoized function of this process shares
tier = HitTier()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=tier._after_fork)
