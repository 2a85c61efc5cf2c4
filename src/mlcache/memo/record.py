"""The record of a code folder's small entries: the next run's first hits without
reading, checking and decoding each entry file.

A process that reads small entries of a local store keeps them in the hit tier
(:mod:`mlcache.memo.tier`), checked as any read checks them. When its usage log
flushes (every couple of seconds of activity, and at exit), the tier writes what
it keeps of each code folder whose rows changed into that folder's ``record``
file (entries whose payload is at most :data:`MAX_ROW` bytes once decompressed,
:data:`MAX_RECORD` bytes of rows at most, the most recently used first;
temporary file and rename: two writers racing leave one whole record, the
last). Rows that only carried mlcache's touch over are written by the last
flush (at exit), not by the flushes made on a hit's way. The next process to hit an
entry of the folder reads the record once (~100 µs for 200 rows) and serves each
entry it holds for one ``os.stat`` of the entry file and a load of the value's
bytes (~13 µs a first hit of a small dict, all of the call, against ~47 µs
reading the entry file). Writing never fails a call: a folder that cannot be
written (a read-only cache) is logged at debug level, once per process and
folder, and not tried again; nor is a record written while the Memory refuses
writes.

The record is only a cache of the entry files. A row is served while the entry
file still has the identity it had when its bytes were read and checked
(device, inode, size, mtime_ns, ctime_ns), judged as the tier judges a kept entry
(see :mod:`mlcache.memo.tier`: a file is recorded only once its last change is
settled, so a later change shows in its times). Eviction, ``clear()``, a new code
version, ``verify --fix``, a recomputed entry (always a new file, by rename) or a
changed one give another identity or no file: the entry is read the ordinary
way, and the next record leaves the row out. mlcache's own last-use touch sets
the mtime of the entries it hit (eviction by age reads it, so hits served from a
record are touched as any hit); the process that touched them carries their
rows over (:meth:`HitTier.retouch`): it opens each file before the touch, whose
``fstat`` must be the recorded identity, and holds it open across the touch,
so that its inode cannot be freed and reused by a file made meanwhile (an
entry evicted and computed again by another process); after the touch the
path must name that same file, of the same size. The touch writes an explicit
mtime with sub-microsecond digits; a write after it sets the kernel's time of
that moment instead, which shows. A touch by a process that did not serve the
rows (an older mlcache, a mapped read) makes them stale: read again, never
wrong.

What a row holds is the value, pickled by the process that read, checked and
decoded it (:func:`freeze`), when it is made of ``dict``, ``list``, ``tuple``,
``set``, ``frozenset``, ``str``, ``bytes``, ``bytearray``, ``int``, ``float``,
``bool`` and ``None``, and numpy arrays of numbers (rebuilt by :func:`_array`);
a value of any other type (a numpy scalar, ``complex``, a class) is not
recorded, and its entry is read as before. A row is loaded by an unpickler that
refuses every global but :func:`_array` (:func:`thaw`), so a record forged by
whoever can write the cache folder cannot run code. With a signing key the
record is HMAC-signed with it, and a reader holding the key uses only a record
signed with its key that verifies; it then loads rows as it loads a signed
pickle entry, with ``pickle.loads`` when it allows pickle (``thaw`` otherwise).
A reader without a key uses only unsigned records (their checksum checked).

File layout (little-endian)::

    offset  size  field
    0       8     magic b"mlcrec\r\n"
    8       4     format version (1)
    12      4     rows
    16      8     body length
    24      8     signing key id (zeros: unsigned)
    32      16    xxh3-128 of the body
    48            body: the rows' entry keys (32 ASCII hex digits and a newline
                  each), the rows, then the data they point at
    end - 32  32  HMAC-SHA256 of everything before it (zeros: unsigned)

    row (57 bytes): st_ino, st_dev, st_size (u64), st_mtime_ns, st_ctime_ns
    (i64), data offset in the body (u64), info length, value length (u32),
    codec (u8: 0 npy, 1 pickle); the data is what a hit notes
    of the entry's info (JSON: ``func`` and ``duration``, for statistics and
    audits, see :func:`brief`) then the value's bytes.

A damaged, torn, truncated or foreign record is ignored (the entries are read
as before) and replaced by the next write; a record that is not a regular file
(a planted fifo) is not waited on. Only local stores have records (on a remote
store the identity proof would cost a request per hit), and only on file
systems whose times this machine's kernel sets (:func:`mlcache._util.sets_times`:
a local disk's, tmpfs, overlay...): on NFS a new process's ``stat`` may be answered
from the client's attribute cache for up to ``acregmax`` (60 s) while another
machine removed or recomputed the entry, so a record there could serve a value
its file no longer holds; FUSE and SMB mounts are left out alike.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import struct
from stat import S_ISREG
from typing import Any, Literal

import numpy as np
import xxhash

from .._atomic import write_bytes_atomic
from ..entry.signing import KEY_ID_SIZE, MAC_SIZE, Signer

__all__ = [
    "MAX_RECORD",
    "MAX_ROW",
    "NAME",
    "Record",
    "brief",
    "freeze",
    "load",
    "pack",
    "thaw",
]

logger = logging.getLogger("mlcache")

#: the record's file name in a code folder (beside the ``code`` manifest)
NAME = "record"
#: entries whose payload is larger than this once decompressed are not recorded
MAX_ROW = 4096
#: a record holds at most this many bytes of body (the most recently used first)
MAX_RECORD = 2 * 1024 * 1024
MAGIC = b"mlcrec\r\n"
VERSION = 1
_HEAD = struct.Struct("<8sIIQ8s16s")
_ROW = struct.Struct("<QQQqqQIIB")
_KEY = 33  # 32 hex digits and a newline
CODECS = ("npy", "pickle")
_NO_KEY = bytes(KEY_ID_SIZE)
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

Ident = tuple[int, int, int, int, int]
#: one recorded entry: (identity, codec name, info bytes, value bytes)
Row = tuple[Ident, str, bytes, bytes]


# -- the value's bytes ------------------------------------------------------------
def _array(dtype: str, shape: tuple[int, ...], data: bytes, order: str) -> np.ndarray:
    """A writable array of numbers rebuilt from a record (the only global it names)."""
    dt = np.dtype(dtype) if isinstance(dtype, str) else None
    if dt is None or dt.kind not in "biufc" or dt.hasobject or order not in ("C", "F"):
        raise pickle.UnpicklingError(f"a recorded array of dtype {dtype!r} is refused")
    if not isinstance(data, bytes) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise pickle.UnpicklingError("a recorded array's shape or bytes are not valid")
    return np.frombuffer(data, dt).reshape(shape, order=order).copy(order="K")  # type: ignore[call-overload]


class _Plain(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and obj.dtype.kind in "biufc" and not obj.dtype.hasobject:
            order: Literal["C", "F"] = (
                "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
            )
            return _array, (obj.dtype.str, obj.shape, obj.tobytes(order=order), order)
        return NotImplemented


class _Safe(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_array":
            return _array
        raise pickle.UnpicklingError(f"a record may not name {module}.{name}")


def thaw(blob: bytes) -> Any:
    """The value of a row's bytes; refuses (``UnpicklingError``) any global but
    :func:`_array`: bytes read from a file never run code."""
    return _Safe(io.BytesIO(blob)).load()


def freeze(value: Any) -> bytes | None:
    """``value``'s bytes for a record, or None when it is not made of plain values
    and arrays of numbers (checked by loading them back as a record's are)."""
    buf = io.BytesIO()
    try:
        _Plain(buf, protocol=5).dump(value)
        blob = buf.getvalue()
        thaw(blob)
    except Exception:  # a global (a class, a numpy scalar...), or it does not pickle
        return None
    return blob


def brief(info: bytes) -> bytes:
    """What a row keeps of an entry's info: what a hit notes of it (the function's
    name for statistics, its compute time for statistics and audits), not the
    description of its arguments."""
    try:
        meta = json.loads(info)
    except ValueError:
        return b"{}"
    if not isinstance(meta, dict):
        return b"{}"
    kept = {k: meta[k] for k in ("duration", "func") if k in meta}
    return json.dumps(kept, separators=(",", ":")).encode()


# -- the file ---------------------------------------------------------------------
def pack(rows: dict[str, Row], signer: Signer | None) -> bytes:
    """The bytes of a record of ``rows`` (entry key -> row)."""
    table: list[bytes] = []
    data: list[bytes] = []
    offset = (_KEY + _ROW.size) * len(rows)
    for ident, codec, info, blob in rows.values():
        ino, dev, size, mtime, ctime = ident
        table.append(
            _ROW.pack(
                ino, dev, size, mtime, ctime, offset, len(info), len(blob), CODECS.index(codec)
            )
        )
        data += (info, blob)
        offset += len(info) + len(blob)
    keys = "".join(key + "\n" for key in rows).encode("ascii")
    if len(keys) != _KEY * len(rows):
        raise ValueError("a record's keys are 32 hex digits")
    body = b"".join([keys, *table, *data])
    key_id = _NO_KEY if signer is None else signer.key_id
    head = _HEAD.pack(MAGIC, VERSION, len(rows), len(body), key_id, xxhash.xxh3_128_digest(body))
    signed = head + body
    return signed + (bytes(MAC_SIZE) if signer is None else signer.sign(signed))


class Record:
    """The rows of one code folder's record: parsed as they are first asked for,
    then held in :attr:`served` while they hold (the tier drops a row whose file
    changed)."""

    __slots__ = ("_at", "_body", "served")

    def __init__(self, body: bytes = b"", at: dict[str, int] | None = None) -> None:
        # the whole file: offsets in the body are from _HEAD.size (bytes sliced out
        # of bytes: one copy a slice, where a view's slice is two objects)
        self._body = body
        self._at = at or {}  # rows not parsed yet: key -> offset in the body
        #: rows parsed (and served) by this process: key -> row
        self.served: dict[str, Row] = {}

    def __len__(self) -> int:
        return len(self._at) + len(self.served)

    def row(self, key: str) -> Row | None:
        """The row of entry ``key``, or None when there is none (or a damaged one:
        the record's checksum passed, so only a writer's bug makes one)."""
        found = self.served.get(key)
        if found is None:
            at = self._at.pop(key, None)
            if at is None:
                return None
            found = _row(self._body, at)
            if found is not None:
                self.served[key] = found
        return found

    def drop(self, key: str) -> None:
        """Forget the row of ``key`` (its file changed)."""
        self.served.pop(key, None)

    def rest(self) -> dict[str, Row]:
        """Every row held, those served first."""
        found = ((key, _row(self._body, at)) for key, at in list(self._at.items()))
        return {**self.served, **{key: row for key, row in found if row is not None}}


def _row(data: bytes, at: int) -> Row | None:
    ino, dev, size, mtime, ctime, offset, n_info, n_blob, codec = _ROW.unpack_from(data, at)
    start = _HEAD.size + offset
    end = start + n_info
    if end + n_blob > len(data) - MAC_SIZE or codec >= len(CODECS):
        return None
    return (ino, dev, size, mtime, ctime), CODECS[codec], data[start:end], data[end : end + n_blob]


def load(folder: str, signer: Signer | None) -> Record | None:
    """The record of the code folder ``folder`` (a local path), or None when there
    is none, or it is damaged, torn, of another format or signed otherwise."""
    path = os.path.join(folder, NAME)
    try:  # O_NONBLOCK: a planted fifo opens without waiting for a writer
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        # a record is its rows' keys and table (under 100 bytes a row) and their
        # data (MAX_RECORD bytes at most): twice MAX_RECORD bounds any record
        # written, and a planted huge file is not read
        if not S_ISREG(st.st_mode) or st.st_size > _HEAD.size + 2 * MAX_RECORD:
            return None
        data = os.read(fd, st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return _parse(data, signer)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError) as exc:
        logger.debug("mlcache: the record %s is not used: %s", path, exc)
        return None


def _parse(data: bytes, signer: Signer | None) -> Record | None:
    # the body is a view: a copy of a record of 200 rows cost more than checking it
    if len(data) < _HEAD.size + MAC_SIZE:
        return None
    magic, version, count, length, key_id, digest = _HEAD.unpack_from(data)
    view = memoryview(data)
    body = view[_HEAD.size : len(data) - MAC_SIZE]
    if magic != MAGIC or version != VERSION or length != len(body):
        return None  # torn, truncated or another format: never guessed at
    if key_id != (_NO_KEY if signer is None else signer.key_id):
        return None
    if signer is not None:  # the MAC covers all the checksum does
        if not signer.verify(view[len(data) - MAC_SIZE :], view[: len(data) - MAC_SIZE]):
            return None
    elif xxhash.xxh3_128_digest(body) != digest:
        return None
    table = count * _KEY
    if table + count * _ROW.size > len(body):
        return None
    names = str(body[:table], "ascii").split("\n")  # one call, not one slice a row
    if len(names) != count + 1:
        return None
    # the rows are checked as they are taken (most runs take a few of them)
    first = _HEAD.size + table
    return Record(data, dict(zip(names, range(first, first + count * _ROW.size, _ROW.size))))


def save(folder: str, rows: dict[str, Row], signer: Signer | None) -> None:
    """Write the record of ``folder`` (replacing it atomically); raises ``OSError``."""
    write_bytes_atomic(os.path.join(folder, NAME), pack(rows, signer), durable=False)
