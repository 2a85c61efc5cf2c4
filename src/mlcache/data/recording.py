"""How a :class:`~mlcache.data.filling.Filler` records samples: each into this
process's append-only segment of ``<pack>.fill/``, with one warning and the samples
still served when they cannot be written (a full disk, a folder removed meanwhile).
A base of ``Filler``, kept apart from finding records and sealing.

A sample loaded as read is recorded at once, one ``writev``: a kill loses only
the sample being loaded (the records on the disk stay whole). Held back in
batches, they were cheaper by ~2 µs a sample, but a kill, a forked child's
``os._exit`` or hours idle in a notebook lost the batch (loaded again later).
An up-front fill, which serves nothing before its seal, writes its records in
batches of :data:`_FILL_BATCH`.
"""

from __future__ import annotations

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
from ..keys.dependencies import Binding, rebound_names, without
from .layouts import SampleLayout
from .records import NoRoom, Segment, encode_sample, record_head
from .sealing import MISSING as _MISSING
from .values import as_sealed, other_fields, read_back
from .writer import not_fields

__all__ = ["Rebound", "RecordWriting"]

#: after a record could not be written (a full disk), the next try waits this long
#: (seconds): the samples are served meanwhile, unrecorded
_RETRY_AFTER = 1.0
#: an up-front fill writes its records this many at a time (one ``writev``, within
#: the usual limit of 1,024 buffers of one call), or fewer when the next sample
#: comes more than this many seconds after the batch's first (samples that come
#: slowly, from workers); a batch waits for its next sample, so a kill loses what
#: is in it: samples the next run loads again (nothing is served before the seal)
_FILL_BATCH, _FILL_WAIT = 64, 0.02
#: this process's id, kept up to date in a forked child: ``os.getpid()`` is a
#: system call (~1 us in a VM), and a miss asked it three times
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
#: a filler makes a layout of its samples (:mod:`mlcache.data.layouts`) at most
#: this many times, and keeps the last :data:`_KEPT`: a field that is sometimes
#: None, or an int and sometimes a float, keeps the layout of the others; samples
#: whose fields change from one to the next are recorded the general way, without
#: a new layout tried at each
_LAYOUTS, _KEPT = 8, 4
#: the fillers of this process that may be alone in filling their pack (not sealed)
_OPEN: weakref.WeakSet[RecordWriting] = weakref.WeakSet()


def _forked() -> None:
    """In the parent after a fork: its children (DataLoader workers) may fill the
    packs it fills, so it looks for their records at every miss again."""
    for writer in list(_OPEN):
        with contextlib.suppress(Exception):
            writer.stop_alone()


os.register_at_fork(after_in_parent=_forked)


class Rebound(Exception):
    """A module-level name the dataset's code reads names another value than when
    its pack was named (internal: the dataset's reads become unstored loads, see
    :mod:`mlcache.data.copies`); ``args[0]``: the names."""


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
    _forms: dict[str, Any]
    #: the layouts of samples loaded here, the last made first, and how many were made
    _layouts: list[SampleLayout]
    _made: int
    #: the process that may be alone in filling the pack (the one that opened the
    #: filler: it looks for the others' records at most every few milliseconds),
    #: or 0 once another process may record samples of it
    _alone: int
    #: the module-level names the dataset's code reads (``Filler``'s ``bindings``)
    bindings: tuple[Binding, ...]

    def check_bound(self) -> None:
        """Raise :class:`Rebound` when a name the code reads was rebound since the
        open (see ``bindings``): no sample loaded now is the pack's. A name that
        held None is initialised lazily (``_DB = sqlite3.connect(...)`` in
        ``source_items``, a DataLoader ``worker_init_fn`` opening an LMDB or HDF5
        file in each worker): the dataset's own state, as what ``load_item`` binds."""
        names = rebound_names(self.bindings)
        if not names:
            return
        lazy = {(id(ns), n) for ns, n, held in self.bindings if held is None}
        if names - lazy:
            raise Rebound(sorted(name for _, name in names - lazy))
        self.own_rebound()

    def own_rebound(self) -> None:
        """After loads: a name that names another value now was rebound by
        ``load_item`` itself (``global LOADS; LOADS += 1``, a warn-once flag): its
        state, not checked from now on."""
        self.bindings = without(self.bindings, rebound_names(self.bindings))

    def _found(self, key: bytes, fp: bytes, segment: int, offset: int) -> None:
        raise NotImplementedError

    def _found_at(self, i: int, segment: int, offset: int) -> None:
        """Item ``i``'s record, just written here, is at ``offset`` of ``segment``."""
        raise NotImplementedError

    def recorded(self, i: int, loaded: Mapping[str, Any]) -> dict[str, Any]:
        """Append item ``i``'s sample, as ``load_item`` gave it, to this process's
        segment; return it as the sealed pack will give it (the first epoch has the
        types of the later ones). A sample that cannot be recorded (a full disk, a
        folder removed meanwhile) is loaded again by a later read: one warning, and
        the read goes on."""
        payload, served = self._payload(i, loaded)
        entry = self._entry(i, payload)
        if entry is not None:
            self._write([entry])
        return served

    def _payload(self, i: int, loaded: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """Item ``i``'s record's payload and the sample served. A sample of the layout
        of one of the samples before it (:mod:`mlcache.data.layouts`) is encoded in
        one pass; any other is read back, encoded and sealed field by field, and
        gives a layout for the next ones. The layouts are dropped when that sealing
        records something new of a field (another dtype): a sample of a layout
        skips it, so it must have nothing to record."""
        if type(loaded) is dict:
            for layout in self._layouts:
                payload = layout.encode(loaded)
                if payload is not None:
                    return payload, dict(loaded)
        sample = read_back(loaded, self.allow_pickle, i)
        self._same_fields(i, sample)
        payload = encode_sample(sample, self.allow_pickle, i)
        if self.allow_pickle:
            served = sample
        else:
            forms = self._forms
            before = dict(forms)
            served = as_sealed(sample, forms)
            if forms != before:
                self._layouts = []
        if self._made < _LAYOUTS:
            self._made += 1  # the sample as loaded: one read back as it is
            made = SampleLayout.of(loaded, None if self.allow_pickle else self._forms)
            if made is not None:
                self._layouts = [made, *self._layouts][:_KEPT]
        return payload, served

    def start_alone(self) -> None:
        """Alone in filling the pack, until told otherwise, when no other filler of
        it is open in this process (two fillers of a pack in one process see each
        other's records as two processes do)."""
        others = [writer for writer in list(_OPEN) if writer.folder == self.folder]
        for writer in others:
            with contextlib.suppress(Exception):
                writer.stop_alone()
        self._alone = 0 if others else _PID[0]
        _OPEN.add(self)

    def stop_alone(self, sealed: bool = False) -> None:
        """Another process may record samples of the pack: from now on this one looks
        for their records at every miss. ``sealed``: the pack is, so this filler
        records no more (a filler opened later in this process is alone again)."""
        self._alone = 0
        if sealed:
            _OPEN.discard(self)

    def _entry(self, i: int, payload: bytes) -> tuple[int, bytes, bytes] | None:
        """Item ``i``'s record of ``payload`` (its index, header and payload); None
        while records are not tried (a write failed just now: the sample is served,
        unrecorded)."""
        if self._retry_at and time.monotonic() < self._retry_at:
            return None
        return i, record_head(self._ks[i], self._fps[i], payload), payload

    def _write(self, records: list[tuple[int, bytes, bytes]]) -> None:
        """Append ``records`` to this process's segment in one ``writev`` (the
        payloads are not copied); on a failure none of them is kept (one warning)."""
        if len(records) == 1:  # a read's record: no list to build
            _i, head, payload = records[0]
            parts: Sequence[bytes] = (head, payload)
            size = len(head) + len(payload)
        else:
            parts = [part for _i, head, payload in records for part in (head, payload)]
            size = sum(map(len, parts))
        try:
            with self._write_lock:
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
                    self._found_at(i, number, off)
                    off += len(head) + len(payload)
        except OSError as exc:
            self._retry_at = time.monotonic() + _RETRY_AFTER
            self._cannot_write(exc, "record samples of")

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
                    encoded = self._entry(i, self._payload(i, sample)[0])
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
