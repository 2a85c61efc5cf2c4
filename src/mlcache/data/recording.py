"""How a :class:`~mlcache.data.filling.Filler` records samples: each into this
process's append-only segment of ``<pack>.fill/``, with one warning and the samples
still served when they cannot be written (a full disk, a folder removed meanwhile).
A base of ``Filler``, kept apart from finding records and sealing.

The process that opened the dataset keeps the records of the samples it loads as
read and writes them :data:`_READ_BATCH` at a time, in one ``writev``: a ``writev``
a sample was a fifth of what filling cost beside ``load_item``. A record is written
before anything could need it on the disk: a batch is written when it is full or
:data:`_READ_WAIT` old (checked as the next sample comes), when this process reads
one of its samples again, seals, forks (a DataLoader's workers find the records),
is pickled (a spawned worker), opens the same pack again, drops the dataset or
exits, and for good once another process records samples of the pack (it would
load them again). A kill loses the batch: samples the next run loads again, as it
loads the one being loaded (the records on the disk stay whole). Worker processes
write each record at once: a worker's sample goes to the main process at once.
An up-front fill, which serves nothing before its seal, writes its records in
batches of :data:`_FILL_BATCH`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import warn_at_user
from .records import NoRoom, Segment, encode_sample, record_head
from .sealing import MISSING as _MISSING
from .sealing import PENDING as _PENDING
from .values import other_fields, read_back
from .writer import not_fields

__all__ = ["RecordWriting"]

#: after a record could not be written (a full disk), the next try waits this long
#: (seconds): the samples are served meanwhile, unrecorded
_RETRY_AFTER = 1.0
#: an up-front fill writes its records this many at a time (one ``writev``, within
#: the usual limit of 1,024 buffers of one call), or fewer when the next sample
#: comes more than this many seconds after the batch's first (samples that come
#: slowly, from workers); a batch waits for its next sample, so a kill loses what
#: is in it: samples the next run loads again (nothing is served before the seal)
_FILL_BATCH, _FILL_WAIT = 64, 0.02
#: the process that opened a dataset writes the records of what it loads as read
#: this many at a time, or fewer once the batch is this many seconds old (see the
#: module docstring)
_READ_BATCH, _READ_WAIT = 32, 0.05
#: this process's id, kept up to date in a forked child: ``os.getpid()`` is a
#: system call (~1 us in a VM), and a miss asked it three times
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
#: the fillers of this process holding records not written yet
_HOLDING: weakref.WeakSet[RecordWriting] = weakref.WeakSet()
#: the fillers of this process whose pack is not sealed yet
_OPEN: weakref.WeakSet[RecordWriting] = weakref.WeakSet()


def write_held() -> None:
    """Write the records this process holds: before a fork (the child finds them
    on the disk) and at exit. Never raises."""
    for writer in list(_HOLDING):
        with contextlib.suppress(Exception):
            writer.flush()


def _forked() -> None:
    """In the parent after a fork: its children (DataLoader workers) may fill the
    packs it fills, so it holds no record back and looks at every miss again."""
    for writer in list(_OPEN):
        with contextlib.suppress(Exception):
            writer.stop_holding()


os.register_at_fork(before=write_held, after_in_parent=_forked)
atexit.register(write_held)


class RecordWriting:
    """The recording half of a filler; ``Filler.__init__`` sets the attributes
    below, and :meth:`_found` notes where a record landed."""

    path: str
    folder: str
    items: list[Any]
    allow_pickle: bool
    src: np.ndarray
    loaded: int
    segments: list[Segment]
    _ks: list[bytes]
    _fps: list[bytes]
    _named: dict[str, int]
    _mine: tuple[int, int, int, int] | None  # pid, fd, segment, size
    _write_lock: threading.Lock
    _fields: tuple[int, frozenset[Any]] | None
    _unwritable: bool
    _retry_at: float
    present: int
    _twins: dict[int, list[int]]
    #: this process's records not written yet, and when the first of them was made
    _held: list[tuple[int, bytes, bytes]]
    _held_since: float
    #: the process that may hold records (the one that opened the filler), or 0
    #: once another process records samples of the pack
    _holder: int

    def _found(self, key: bytes, fp: bytes, segment: int, offset: int) -> None:
        raise NotImplementedError

    def record(self, i: int, sample: Mapping[str, Any]) -> None:
        """Append item ``i``'s sample to this process's segment. A sample that cannot
        be recorded (a full disk, a folder removed meanwhile) is loaded again by a
        later read: one warning, and the read goes on."""
        encoded = self._encoded(i, sample)
        if encoded is None:
            return
        if self._holder != _PID[0] or self._twins:  # (an item listed twice: at once)
            self._write([encoded])
            return
        now = time.monotonic()
        with self._write_lock:
            held = self._held
            if not held:
                try:  # the segment is made now: other processes see this one fill
                    self._mine = (_PID[0], *self._writer())
                except OSError as exc:  # a read-only cache: served, not recorded
                    self._retry_at = now + _RETRY_AFTER
                    self._cannot_write(exc, "record samples of")
                    return
                self._held_since = now
                _HOLDING.add(self)
            held.append(encoded)
            # present, read from the batch (written first) if this process reads it again
            self.src[i] = _PENDING
            self.present += 1
            full = len(held) >= _READ_BATCH or now - self._held_since > _READ_WAIT
        if full:
            self.flush()

    def flush(self) -> None:
        """Write the records this process holds (see the module docstring); those it
        cannot write are missing again (one warning)."""
        with self._write_lock:
            held = self._held
            if not held:
                return
            self._held = []
            _HOLDING.discard(self)
            if not self._write_locked(held):
                for i, _head, _payload in held:
                    if self.src[i] == _PENDING:
                        self.src[i] = _MISSING
                        self.present -= 1

    def start_holding(self) -> None:
        """Hold records when no other filler of the pack is open in this process
        (two fillers of a pack in one process see each other's records as two
        processes do: the others write theirs and hold no more, and this one holds
        none)."""
        others = [writer for writer in list(_OPEN) if writer.folder == self.folder]
        for writer in others:
            with contextlib.suppress(Exception):
                writer.stop_holding()
        self._holder = 0 if others else _PID[0]
        _OPEN.add(self)

    def stop_holding(self, sealed: bool = False) -> None:
        """Another process records samples of the pack: what this one holds is
        written, and from now on each record at once. ``sealed``: the pack is, so
        this filler records no more (a filler opened later in this process holds)."""
        self._holder = 0
        self.flush()
        if sealed:
            _OPEN.discard(self)

    def _encoded(self, i: int, sample: Mapping[str, Any]) -> tuple[int, bytes, bytes] | None:
        """Item ``i``'s record (its index, header and payload); None while records
        are not tried (a write failed just now: the sample is served, unrecorded)."""
        self._same_fields(i, sample)
        payload = encode_sample(sample, self.allow_pickle, i)
        if self._retry_at and time.monotonic() < self._retry_at:
            return None  # a write failed just now (a full disk): served, not recorded
        return i, record_head(self._ks[i], self._fps[i], payload), payload

    def _write(self, records: list[tuple[int, bytes, bytes]]) -> None:
        """Append ``records`` to this process's segment in one ``writev`` (the
        payloads are not copied); on a failure none of them is kept (one warning)."""
        with self._write_lock:
            self._write_locked(records)

    def _write_locked(self, records: list[tuple[int, bytes, bytes]]) -> bool:
        """:meth:`_write` with the write lock held; False when nothing was kept."""
        if len(records) == 1:  # a read's record: no list to build
            _i, head, payload = records[0]
            parts: Sequence[bytes] = (head, payload)
            size = len(head) + len(payload)
        else:
            parts = [part for _i, head, payload in records for part in (head, payload)]
            size = sum(map(len, parts))
        try:
            fd, number, off = self._writer()
            try:
                written = os.writev(fd, parts)
                if written < size:  # a short write (a signal, a full disk): the rest
                    rest = memoryview(b"".join(parts))[written:]
                    while rest:
                        rest = rest[os.write(fd, rest) :]
            except OSError:  # a full disk: no torn record, no empty file, no fd left
                self._mine = None
                if self.segments[number].abandon(fd, off):
                    self._named.pop(os.path.basename(self.segments[number].path), None)
                raise
            self._mine = (_PID[0], fd, number, off + size)
            for i, head, payload in records:
                self._found(self._ks[i], self._fps[i], number, off)
                off += len(head) + len(payload)
        except OSError as exc:
            self._retry_at = time.monotonic() + _RETRY_AFTER
            self._cannot_write(exc, "record samples of")
            return False
        return True

    def _same_fields(self, i: int, sample: Mapping[str, Any]) -> None:
        """Every sample of a pack has the fields of the first: one with others (an
        optional JSON key) is refused when it is loaded, naming its item, not at
        the seal an epoch later (as an up-front build refuses it)."""
        first = self._fields
        if first is None:
            self._fields = (i, frozenset(sample))
            return
        j, names = first
        if sample.keys() != names:
            raise other_fields(i, self.items[i], sample.keys(), j, self.items[j], names)

    def _cannot_write(self, exc: OSError, what: str) -> None:
        """ONE warning per filler for what it cannot write (a read-only or full disk,
        a folder removed meanwhile): the samples are still served."""
        if not self._unwritable:
            self._unwritable = True
            warn_at_user(
                str(exc)
                if isinstance(exc, NoRoom)
                else f"mlcache: cannot {what} {self.path} ({exc}); samples not recorded are "
                "loaded again when read again"
            )

    def _writer(self) -> tuple[int, int, int]:
        """This process's segment (made on its first record): descriptor, number, size."""
        mine = self._mine
        if mine is not None and mine[0] == _PID[0]:
            return mine[1], mine[2], mine[3]
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        name = f"{_PID[0]}-{secrets.token_hex(4)}.seg"
        path = os.path.join(self.folder, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        self._named[name] = number = len(self.segments)
        self.segments.append(Segment(path))
        return fd, number, 0

    def fill(self, samples: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """Record ``(index, sample)`` pairs loaded elsewhere (an up-front build), in
        the form a read records them (:func:`~mlcache.data.values.read_back`): the
        seal mixes both, and a 0-d array beside a numpy scalar is two kinds."""
        # written _FILL_BATCH records at a time (or after _FILL_WAIT), one writev each:
        # nothing is served before the seal, so a kill loses at most these (loaded
        # again by the next run)
        batch: list[tuple[int, bytes, bytes]] = []
        since = 0.0
        try:
            for i, sample in samples:
                if self.src[i] == _MISSING:
                    if not isinstance(sample, Mapping):
                        raise not_fields(i, sample)
                    encoded = self._encoded(i, read_back(sample, self.allow_pickle, i))
                    self.loaded += 1
                    if encoded is not None:
                        now = time.monotonic()
                        if not batch:
                            since = now
                        batch.append(encoded)
                        if len(batch) == _FILL_BATCH or now - since > _FILL_WAIT:
                            self._write(batch)
                            batch = []
        finally:  # what was loaded before an error of load_item is kept
            if batch:
                self._write(batch)
