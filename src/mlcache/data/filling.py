"""Write-through filling: the pack of a :class:`~mlcache.data.CachedDataset` built
from ``source_items()`` and ``load_item()`` fills as its samples are read.

Opening such a dataset lists its items and gives each a *key* (what it is: its
path or its value) and a *fingerprint* (what it holds now: a file's size and
modification time, a folder's files', or the dataset's
``item_fingerprint(item)``): :func:`~mlcache.data.items.item_table`. A sealed
pack records both for every sample (its ``items`` region); when they all match,
the pack is read as any other (an O(1) open). Otherwise a :class:`Filler` serves the dataset:

- a sample whose item is unchanged comes from the old pack (the *base*);
- one a filling process recorded comes from its record;
- any other is loaded (``load_item``), recorded and returned.

Records go to append-only *segment* files in ``<pack>.fill/``, one per process
(DataLoader workers, forked or spawned, each write their own: no lock is taken to
record). A sample read is recorded at once, one ``writev`` (an up-front fill
writes a batch at a time: :mod:`mlcache.data.recording`); a record is a 64-byte header
(magic, length, the item's key and fingerprint, the checksums of the payload and
of the header: see :mod:`mlcache.data.records`, which owns the bytes), then the
sample: in a compact form for plain values (numbers, text, bytes, numeric arrays,
lists of str, dicts), else as an entry of the function cache's format
(:mod:`mlcache.entry`: the npy codec, or pickle when the dataset allows it).
The kernel keeps what a process wrote when it is killed; a record torn by a kill
(or a crash of the machine) fails its length or its checksums and is ignored: the
next run loads that item again, and nothing else.

When every item is present the pack is *sealed*: written anew in item order
(from the base, the records, and new loads of records found damaged; the
records' bytes copied when they allow it: :mod:`mlcache.data.sealing`), with its
item table, under the pack's build lock; then the segments are removed. A
process that meets a missing item looks again first (for the sealed pack, and
for other processes' records: a ``stat`` of the folder, listed again - and the
pack looked for - only when its mtime moved, which a seal's removal of the
segments does; an ``fstat`` per other process's segment: a few us against the
milliseconds of a load), so that no item another
process recorded is loaded twice (a DataLoader's persistent workers in their
second epoch), and seals the pack when that look finds every item in. The process
that opened the dataset, until it sees another fill the pack (or forks, or is
pickled), looks at most every :data:`_LOOK_ALONE` s: another process starting
meanwhile costs the loads of those milliseconds at most, each loaded again. A process
that recorded a sample looks once more at its next read of a sample present (not
only at a miss): the process that recorded the last record overall (every other
record was written before it) then finds every item in and seals, so the second
epoch of a DataLoader whose persistent workers each missed the other's last records
seals it, whichever samples it asks; a DataLoader's new workers read the sealed
pack from their first sample.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from ..errors import EntryCorrupted, NewerFormat, PackCorrupted, UnknownFormat, warn_at_user
from ..keys.dependencies import Binding, rebound
from .format import is_newer_pack
from .reader import PackedDataset
from .recording import _PID, Rebound, RecordWriting
from .records import (
    MAGIC,
    RECORD,
    Segment,
    decode_sample,
    room_to_seal,
)
from .replaced import own_beside
from .sealing import BASE as _BASE
from .sealing import MISSING as _MISSING
from .sealing import SealSource
from .sequence import sample_index, sample_indices
from .values import as_sealed
from .writer import not_fields

__all__ = ["FILLS", "RECORD", "Filler", "Rebound"]

logger = logging.getLogger("mlcache")

#: after recording a sample, a process looks whether every item is now in (and
#: seals the pack) at most this often
_SEAL_CHECK_EVERY = 0.25
#: a process that has seen no other fill the pack since it opened it (alone:
#: data/recording.py) looks at a miss for the others' records
#: and for a sealed pack at most this often (seconds): a process starting to fill
#: the pack meanwhile costs at most the loads of this long, each loaded again
_LOOK_ALONE = 0.01
_SCAN_CHUNK = 1 << 20
#: the values of ``CachedDataset(fill=...)``: ``"auto"`` fills as read, or up
#: front with ``num_workers``; ``"as-read"``; ``"up-front"`` (at the open)
FILLS = ("auto", "as-read", "up-front")


# -- the filler --------------------------------------------------------------------------
class Filler(RecordWriting):
    """The samples of a pack being filled (see the module docstring).

    Parameters
    ----------
    path:
        The pack's path: its segments are in ``<path>.fill/``; sealing writes it.
    items, table:
        The dataset's items and their :func:`~mlcache.data.items.item_table`.
    base:
        The pack as it was (its unchanged samples are read from it), or None.
    load:
        ``load_item``: one sample from one item.
    lock:
        The pack's build lock (sealing holds it).
    seal:
        ``seal(samples, table)`` writes the sealed pack of the samples in item
        order with the item table (its bytes) and returns it opened.
    allow_pickle:
        Records of samples that need pickle are pickled.
    first_load:
        Called once, after the first sample this filler loads; returns the pack's
        new path when that moved it (module-level values the loading changed are
        state, not input: see :mod:`mlcache.data.building`), else None.
    ignore:
        The ``file_id`` of a pack at ``path`` never to adopt as the sealed pack
        (one found damaged, or replaced by ``force_recache``).
    moved:
        Called with the pack's new path when a newer mlcache's pack took ``path``
        (a cache shared mid-upgrade): that pack is kept, this one is sealed beside
        it (:func:`~mlcache.data.replaced.own_beside`).
    bindings:
        The module-level names the dataset's code reads and what they named when
        the pack was named (:attr:`~mlcache.keys.code_version.CodeVersion.bindings`):
        one rebound since (``SIZE = 3`` after the open) raises
        :class:`~mlcache.data.recording.Rebound` at the next read, so that no sample
        of the new value is recorded in the pack of the old (those ``load_item``
        rebinds itself are left out: :meth:`own_rebound`).
    """

    def __init__(
        self,
        path: str,
        items: Sequence[Any],
        table: np.ndarray,
        base: PackedDataset | None,
        load: Callable[[Any], Mapping[str, Any]],
        lock: Callable[[], contextlib.AbstractContextManager[None]],
        seal: Callable[[Iterable[Mapping[str, Any]], bytes], PackedDataset],
        allow_pickle: bool,
        first_load: Callable[[], str | None] | None = None,
        ignore: tuple[int, int] | None = None,
        moved: Callable[[str], None] | None = None,
        bindings: tuple[Binding, ...] = (),
    ) -> None:
        self.path, self.folder = path, path + ".fill"
        self._first_load, self._on_move, self.bindings = first_load, moved, bindings
        self.items, self.table, self.n = list(items), table, len(items)
        self.load_item, self._lock, self._seal, self.allow_pickle = load, lock, seal, allow_pickle
        #: where each item's sample is: _MISSING, _BASE (pos: its index in the base)
        #: or a segment's number (pos: the record's offset)
        self.src = np.full(self.n, _MISSING, dtype=np.int32)
        self.pos = np.zeros(self.n, dtype=np.int64)
        self.present = 0
        self.sealed: PackedDataset | None = None
        self.loaded = 0  # items this process loaded (tests and benchmarks count them)
        raw = table.tobytes()
        self._ks = [raw[j : j + 16] for j in range(0, 32 * self.n, 32)]
        self._fps = [raw[j + 16 : j + 32] for j in range(0, 32 * self.n, 32)]
        # each key's first place (built from the end: the first place is set last)
        self._keys: dict[bytes, int] = dict(zip(reversed(self._ks), range(self.n - 1, -1, -1)))
        self._twins: dict[int, list[int]] = {}  # an item listed more than once
        if len(self._keys) < self.n:
            for i, key in enumerate(self._ks):
                first = self._keys[key]
                if first != i:
                    self._twins.setdefault(first, []).append(i)
        self.base = base
        if base is not None:
            self._match_base(base)
        self.segments: list[Segment] = []
        self._named: dict[str, int] = {}
        #: the folder's mtime at the last listing, and when that listing was made
        self._listed: tuple[int, int] | None = None
        self._mine: tuple[int, int, int, int] | None = None  # pid, fd, segment, size
        self._write_lock = threading.Lock()
        #: the first sample's index and field names (every sample has them)
        self._fields: tuple[int, frozenset[Any]] | None = None
        self._unwritable = False  # warned: records or the seal cannot be written
        self._retry_at = 0.0  # a record failed: none is tried before this (monotonic)
        #: the items this process loaded as read (not by workers): the seal probes a few
        self.loaded_here: list[int] = []
        self._forms: dict[str, Any] = {}  # of the fields served: values.as_sealed
        self._layouts, self._made = [], 0  # of the samples loaded here: data/layouts.py
        self.load_error: BaseException | None = None
        self._seal_checked = time.monotonic()
        #: this process recorded a sample since its last look (see the module docstring)
        self._recorded_since_look = False
        self._seen_file: tuple[int, int] | None = base.file_id if base is not None else ignore
        self.start_alone()
        self._looked, self._looked_at = False, 0.0
        self.look_again()
        self._looked = True  # segments and records found from now on: another process's

    # -- what is present ----------------------------------------------------------------
    @property
    def missing(self) -> list[int]:
        """The items no process has recorded yet, in order; an item listed more
        than once by its first place only (its record fills the others)."""
        missing = np.flatnonzero(self.src == _MISSING).tolist()
        if not self._twins:
            return missing
        first = {self._ks[i]: i for i in reversed(missing)}
        return sorted(first.values())

    def _match_base(self, base: PackedDataset) -> None:
        """The items whose key and fingerprint the base records: read from it."""
        try:
            old = base.item_table()
        except PackCorrupted as exc:
            logger.info("mlcache: %s; its samples are loaded again", exc)
            old = None
        if old is None:
            return
        if old.shape == self.table.shape and np.array_equal(old, self.table):
            self.src[:] = _BASE
            self.pos[:] = np.arange(self.n)
            self.present = self.n
            return
        raw = old.tobytes()
        rows = {raw[32 * j : 32 * j + 32]: j for j in range(len(old) - 1, -1, -1)}
        mine = self.table.tobytes()
        for i in range(self.n):
            j = rows.get(mine[32 * i : 32 * i + 32])
            if j is not None:
                self.src[i], self.pos[i] = _BASE, j
                self.present += 1

    def _found(self, key: bytes, fp: bytes, segment: int, offset: int) -> None:
        first = self._keys.get(key)
        if first is None:
            return  # an item no longer listed
        for i in (first, *self._twins.get(first, ())):
            if self.src[i] == _MISSING and self._fps[i] == fp:
                self.src[i], self.pos[i] = segment, offset
                self.present += 1

    def _found_at(self, i: int, segment: int, offset: int) -> None:
        if self._twins:  # an item listed more than once: each of its places
            self._found(self._ks[i], self._fps[i], segment, offset)
        elif self.src[i] == _MISSING:
            self.src[i], self.pos[i] = segment, offset
            self.present += 1

    def look_again(self) -> bool:
        """Look for the sealed pack, and for the records of other processes; True
        when the pack is sealed (then :attr:`sealed` reads it)."""
        if self.sealed is not None:
            return True
        self._recorded_since_look = False  # what is recorded before this look is seen
        self._looked_at = time.monotonic()
        names = self._new_names()
        # the pack is replaced only by a seal, which removes the segments (the
        # folder changes, or goes), or by a process that removed the folder first
        # (force_recache, a stale pack): an unchanged folder spares the pack's stat
        if names is not None and self._find_sealed():
            return True
        before = len(self.segments), self.present
        for name in names or ():
            if name.endswith(".seg") and name not in self._named:
                self._named[name] = len(self.segments)
                self.segments.append(Segment(os.path.join(self.folder, name)))
        gone = False
        for number, segment in enumerate(self.segments):
            if not segment.broken:
                gone |= not self._scan(number, segment)
        if self._alone and self._looked and before != (len(self.segments), self.present):
            self.stop_alone()  # another process fills it too: look at every miss
        # a segment removed since this look found no pack: a seal removes them once
        # its pack is in place, so the pack is looked for again (else the items of
        # that segment are loaded twice: a DataLoader's worker meeting the other's seal)
        return gone and self._find_sealed()

    def _new_names(self) -> list[str] | None:
        """The folder's names, listed only when it changed since the last listing
        (a new segment or a removed one changes its mtime; appends do not): a
        ``stat`` a miss instead of a listing. None when it did not change; ``[]``
        when there is no folder. A listing made within 50 ms of the folder's
        mtime is not trusted to have seen everything of that clock tick."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            self._listed = None
            return []
        listed = self._listed
        if listed is not None and listed[0] == mtime and listed[1] - mtime > 50_000_000:
            return None
        now = time.time_ns()
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        self._listed = (mtime, now)
        return names

    def _find_sealed(self) -> bool:
        """Whether the file at :attr:`path` is now a sealed pack of these items."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) == self._seen_file:
            return False
        self._seen_file = (st.st_dev, st.st_ino)
        try:
            pack = PackedDataset(self.path, allow_pickle=self.allow_pickle)
            table = pack.item_table()
        except (FileNotFoundError, PackCorrupted):
            return False
        except NewerFormat:  # a newer mlcache sealed this name: kept, never replaced
            self._beside_newer()
            return self._find_sealed()  # another process of this version's, beside it?
        if (
            table is None
            or table.shape != self.table.shape
            or not np.array_equal(table, self.table)
        ):
            return False
        self._adopt(pack)
        return True

    def _scan(self, number: int, segment: Segment) -> bool:
        """The records appended to ``segment`` since it was last scanned (a record
        still being written is left for the next look; a torn one ends the file);
        False when the segment is gone (removed by a seal, or a new fill)."""
        mine = self._mine
        if mine is not None and mine[2] == number and mine[0] == _PID[0]:
            return True  # this process's own: known as written
        try:
            fd = segment.open()
            size = os.fstat(fd).st_size
        except FileNotFoundError:
            segment.broken = True
            return False
        off, buf, buf_off = segment.scanned, b"", 0
        while off + RECORD.size <= size:
            if not buf_off <= off <= buf_off + len(buf) - RECORD.size:
                buf, buf_off = os.pread(fd, min(_SCAN_CHUNK, size - off), off), off
                if len(buf) < RECORD.size:
                    break
            head = buf[off - buf_off : off - buf_off + RECORD.size]
            magic, _flags, length, key, fp, _psum, hsum = RECORD.unpack(head)
            if magic != MAGIC or xxhash.xxh3_64_intdigest(head[:56]) != hsum:
                segment.broken = True  # a torn record: its writer was killed
                break
            end = off + RECORD.size + length
            if end > size:
                break  # being written (or torn: then the file grows no more)
            self._found(key, fp, number, off)
            off = end
        segment.scanned = off
        return True

    # -- reading and filling ------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def get(self, i: int) -> Mapping[str, Any]:
        """Sample ``i`` (an index in ``[0, n)``): read if present, else loaded and
        recorded."""
        if self.sealed is not None:
            return self.sealed[i]
        if self.bindings and rebound(self.bindings):  # SIZE = 3 since the open
            self.check_bound()
        src = int(self.src[i])
        if self._recorded_since_look and src != _MISSING and self._sealed_now():
            assert self.sealed is not None
            return self.sealed[i]
        if src == _BASE and self.base is not None:
            try:
                return self.base[int(self.pos[i])]
            except PackCorrupted as exc:
                self.drop_base(exc)
        elif src >= 0:
            sample = self.read_record(i)
            if sample is not None:
                return sample if self.allow_pickle else as_sealed(sample, self._forms)
        # missing here: another process may have recorded it since (see the
        # module docstring); throttling this look loaded items twice (a DataLoader's
        # workers), but for a process that has seen none other fill the pack
        now = time.monotonic()
        if self._alone != _PID[0] or now - self._looked_at > _LOOK_ALONE:
            if self.look_again():
                assert self.sealed is not None
                return self.sealed[i]
            if self.src[i] != _MISSING:
                if self.present == self.n:
                    self.try_seal()
                return self.get(i)
        loaded = self.load_item(self.items[i])
        self.loaded += 1
        if self.bindings and rebound(self.bindings):
            self.own_rebound()
        if self._first_load is not None:
            first, self._first_load = self._first_load, None
            moved = first()
            if moved is not None:
                self._moved(moved)
        if loaded.__class__ is not dict and not isinstance(loaded, Mapping):
            raise not_fields(i, loaded)
        served = self.recorded(i, loaded)
        self._recorded_since_look = True
        self.loaded_here.append(i)
        if self.present < self.n and now - self._seal_checked > _SEAL_CHECK_EVERY:
            self._seal_checked = now
            self.look_again()
        if self.present == self.n and self.sealed is None:
            self.try_seal()
        return served

    def _sealed_now(self) -> bool:
        """The first read of a present sample since this process recorded one: look
        again (once) and seal when every item is in; True when the pack is sealed.
        Without it, workers that each missed the other's last records seal only
        when a later read misses, which no epoch promises."""
        if not self.look_again() and self.present == self.n:
            self.try_seal()
        return self.sealed is not None

    def __getitem__(self, i: Any) -> Any:
        if i.__class__ is int and 0 <= i < self.n:
            return self.get(i)
        many = sample_indices(i, self.n)
        if many is None:
            return self.get(sample_index(i, self.n))
        return [self.get(j) for j in many]

    def read_record(
        self, i: int, maps: dict[int, mmap.mmap] | None = None
    ) -> dict[str, Any] | None:
        """Item ``i``'s record, or None when it is damaged (then it is missing).
        ``maps``: the segments mapped once (a seal reads every record)."""
        number = int(self.src[i])
        segment = self.segments[number]
        off = int(self.pos[i])
        try:
            fd = segment.open()
            mapped = None if maps is None else maps.get(number)
            if maps is not None and mapped is None and os.fstat(fd).st_size:
                mapped = maps[number] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            if mapped is not None and off + RECORD.size <= len(mapped):
                head = mapped[off : off + RECORD.size]
                _m, _f, length, _k, _fp, psum, _h = RECORD.unpack(head)
                payload = mapped[off + RECORD.size : off + RECORD.size + length]
            else:
                head = os.pread(fd, RECORD.size, off)
                _m, _f, length, _k, _fp, psum, _h = RECORD.unpack(head)
                payload = os.pread(fd, length, off + RECORD.size)
            if len(payload) != length or xxhash.xxh3_64_intdigest(payload) != psum:
                raise EntryCorrupted("checksum mismatch")
            return decode_sample(payload, self.allow_pickle)
        except (OSError, struct.error, EntryCorrupted, UnknownFormat) as exc:
            logger.info(
                "mlcache: a record of %s is unreadable (%s): loading it again", self.path, exc
            )
            self.src[i] = _MISSING
            self.present -= 1
            return None

    def drop_base(self, exc: PackCorrupted) -> None:
        """The base is damaged: its samples are loaded again."""
        warn_at_user(f"mlcache: {exc}; loading its samples again")
        based = self.src == _BASE
        self.present -= int(based.sum())
        self.src[based] = _MISSING
        self.base = None

    # -- sealing ------------------------------------------------------------------------------
    def seal(self) -> PackedDataset:
        """Write the sealed pack (or adopt the one another process sealed)."""
        with self._lock():
            if self.sealed is None and is_newer_pack(self.path):
                self._beside_newer()  # (when its file is ignored: force_recache)
            if self.sealed is None and not self._find_sealed():
                self.look_again()
                kept = [s.path for s in self.segments]  # on the disk until it is written
                if self.base is not None and (self.src == _BASE).any():
                    kept.append(self.base.path)
                room_to_seal(self.path, kept)
                source = SealSource(self)  # records copied, or decoded (data/sealing.py)
                try:
                    sealed = self._seal(source, self.table.tobytes())
                except (TypeError, ValueError) as exc:
                    raise self._naming_the_item(exc) from None
                finally:
                    source.close()
                self._adopt(sealed)
        assert self.sealed is not None
        return self.sealed

    def _naming_the_item(self, exc: BaseException) -> BaseException:
        """The pack writer's error about ``sample N``, with the item it came from."""
        found = re.match(r"sample (\d+)\b", str(exc))
        if exc is self.load_error or found is None or int(found[1]) >= self.n:
            return exc
        return type(exc)(f"{exc} (sample {found[1]} is item {self.items[int(found[1])]!r})")

    def try_seal(self) -> PackedDataset | None:
        """:meth:`seal`, or None when the pack cannot be written (a read-only or
        full disk: one warning; the samples are still read from the records, or
        loaded). An error of ``load_item`` is raised."""
        try:
            return self.seal()
        except OSError as exc:
            if exc is self.load_error:
                raise
            self._cannot_write(exc, "seal")
            return None

    def _moved(self, path: str) -> None:
        """The pack (and its records' folder) is now ``path``."""
        old = self.folder
        self.path, self.folder, self._seen_file = path, path + ".fill", None
        self._listed = None
        for segment in self.segments:
            if segment.path.startswith(old + os.sep):
                segment.path = self.folder + segment.path[len(old) :]

    def _beside_newer(self) -> None:
        """A newer mlcache's pack is at :attr:`path`: this version's pack and its
        records go beside it (one warning names the cause), as a new open names it."""
        beside = own_beside(self.path)
        try:
            os.rename(self.folder, beside + ".fill")
        except OSError:  # moved there by another process, or removed by the newer seal:
            self.close()  # this process's next record starts a segment there
        self._moved(beside)
        if self._on_move is not None:
            self._on_move(beside)

    def _adopt(self, pack: PackedDataset) -> None:
        """Read ``pack`` from now on; the segments go."""
        self.sealed, self.base = pack, None
        self.stop_alone(sealed=True)
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        """Close this process's segment (a later record starts another) and the
        others' (a later read opens them again)."""
        mine = self._mine
        if mine is not None and mine[0] == _PID[0]:
            with contextlib.suppress(OSError):
                os.close(mine[1])
        self._mine = None
        for segment in self.segments:
            segment.close()

    def __del__(self) -> None:
        # a dataset dropped while it fills: no descriptor left open (a notebook
        # opening it again and again, a folder to unmount)
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self) -> dict[str, Any]:
        # to a spawned worker: what is known, not this process's files
        self.stop_alone()  # the worker fills the pack too: this process looks at every miss
        state = self.__dict__.copy()
        state["segments"] = [Segment(s.path) for s in self.segments]
        state["_mine"] = None
        state["_write_lock"] = None
        state["loaded_here"] = []  # what that process loads: its own probes
        # a layout's encoding is a function written for it, which no pickle holds:
        # the worker makes its own from the samples it loads
        state["_layouts"], state["_made"] = [], 0
        state["bindings"] = ()  # namespaces: the worker's are set there (data/copies.py)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._write_lock = threading.Lock()
