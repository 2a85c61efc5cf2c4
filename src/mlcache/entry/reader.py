"""Reading entries: :class:`EntryReader` checks an entry and hands its segments
to the codec; :func:`open_entry`, :func:`read_entry_info` and :func:`decode`
read an entry of a store.

The bytes are those of :mod:`mlcache.entry.format`; a damaged entry raises
:class:`~mlcache.errors.EntryCorrupted` (a miss, recomputed), never a wrong
value.

When the payload is checked
    Before its first use in a process, whatever the size or the mode. The
    header checksum (which covers the block table) is checked at every read.
    A read into memory checks the payload as it reads it, each chunk while it
    is in the CPU cache, the blocks of a block table on all cores
    (:mod:`mlcache.entry.payload`). A memory-mapped read (``"r"``, ``"c"``)
    checks the mapped payload unless this process has already checked that file: each
    block of a block table on all cores (:func:`mlcache._util.parallel_map`),
    an older entry without one in one pass. A file that passed is remembered by
    its identity (device, inode, size, mtime, ctime) once its last change is
    :data:`SETTLED_NS` old (:data:`COARSE_SETTLED_NS` for whole-second file
    times), so a repeated mapped hit stays O(1) in the array size; a file
    replaced or changed in place has another identity and is checked again.
    mlcache's own last-use touch (which sets the mtime) keeps the mark
    (:func:`keep_verified`); another process's touch makes one new check.
    ``"r+"`` maps are the caller's to change (as in joblib, edits persist), so
    they are not checked; handing one out drops the file's mark, and while one
    is alive in this process the file's other mapped reads are checked every
    time (writes through a shared map need not change the mtime at once).
    A read-only map is keyed by its entry's name while its file is as it was
    checked (:mod:`mlcache.entry.marks`). ``"c"`` maps are private: nothing
    reaches the file. A mismatch raises
    :class:`EntryCorrupted`: a miss, recomputed. :func:`verify_file`
    (``Memory.verify()``) reads and checks every byte.

Signed entries (:mod:`mlcache.entry.signing`)
    A reader given a signer refuses, before decoding anything, an entry that is
    unsigned or whose signature does not verify (:class:`EntrySignatureError`).
    The signature covers the header (with the payload's checksum), the layout,
    the info, the block table and the entry's name, and the whole of segment 0
    of entries whose codec runs code when decoding (the pickle stream): it is
    read into private memory, checked there and decoded from there. Other segments (raw arrays,
    a pickle's out-of-band buffers) are bound to the signature only through
    their signed xxh3 checksums (of the payload, or of each block), checked as
    above: altered array bytes can give wrong numbers but never run code.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO, Literal

import numpy as np
import xxhash

from .._util import parallel_map
from ..codecs import codecs
from ..errors import (
    EntryCorrupted,
    EntryNotFound,
    EntrySignatureError,
    UnknownFormat,
    UnsupportedValue,
)
from ..store import LocalPaths, Store
from .format import (
    CODE_SIGNED,
    HEADER,
    SIGNED,
    Header,
    complete_head,
    pack_sums,
    signed_message,
)
from .marks import (
    COARSE_SETTLED_NS,
    HELD_ATTR,
    SETTLED_NS,
    checked,
    forget_verified,
    handed_writable,
    has_writable,
    identity,
    is_verified,
    keep_verified,
    settled,
)
from .payload import read_payload
from .signing import KEY_ID_SIZE, MAC_SIZE, Signer

__all__ = [
    "COARSE_SETTLED_NS",
    "FIRST_READ",
    "REF_ATTR",
    "SETTLED_NS",
    "EntryReader",
    "decode",
    "forget_verified",
    "keep_verified",
    "local_file",
    "open_entry",
    "read_entry_info",
    "read_info",
    "settled",
    "verify_file",
]

#: the attribute a read-only mapped array carries: ``"<entry name>#<segment>@<payload
#: xxh3-64 hex>"``, what it holds; :mod:`mlcache.keys` keys such an array by it
#: instead of hashing its bytes again (the keys import it from here: entries are
#: below keys)
REF_ATTR = "_mlcache_ref"
#: bytes read at once when an entry is opened: a small entry (most hits) is read
#: whole in one read, a larger one's header, layout and info are
FIRST_READ = 1 << 16

_MMAP_ACCESS = {"r": mmap.ACCESS_READ, "r+": mmap.ACCESS_WRITE, "c": mmap.ACCESS_COPY}


def _size(f: BinaryIO) -> int:
    try:
        return os.fstat(f.fileno()).st_size
    except (OSError, AttributeError, ValueError):
        pos = f.tell()
        size = f.seek(0, os.SEEK_END)
        f.seek(pos)
        return size


class EntryReader:
    """Reads one entry; its :meth:`array` and :meth:`buffer` serve the codec.

    Parameters
    ----------
    path:
        The entry file.
    mmap_mode:
        ``None`` reads the payload into memory; ``"r"``, ``"r+"`` or ``"c"`` map
        arrays from the file (as :class:`numpy.memmap`).
    signer:
        Require a valid signature made with this key for the store name ``name``
        (:class:`~mlcache.errors.EntrySignatureError` otherwise). The code
        segment of a signed entry is then read into private memory, checked
        there and decoded from there, so that the file cannot be changed between
        the check and the decoding.
    name:
        The entry's name in its store (signed entries are bound to it).
    identify:
        With a path: keep the opened file's ``os.fstat`` in :attr:`stat` (the
        in-process tier notes what it read by it: cheaper than a ``stat`` of the
        path before opening it).
    """

    #: the opened file's status, with ``identify=True`` (else None)
    stat: os.stat_result | None = None

    def __init__(
        self,
        source: str | BinaryIO,
        mmap_mode: str | None = None,
        signer: Signer | None = None,
        name: str = "",
        *,
        identify: bool = False,
    ) -> None:
        self._signer, self._name = signer, name
        self._code: bytes | None = None
        if isinstance(source, str):
            # a raw descriptor: a small hit is one open, one read and one close
            self.path = source
            # O_NONBLOCK: a fifo planted under an entry's name opens at once (and
            # reads as empty: a damaged entry) instead of waiting for a writer
            fd = os.open(source, (os.O_RDWR if mmap_mode == "r+" else os.O_RDONLY) | _NONBLOCK)
            try:
                if identify:
                    self.stat = os.fstat(fd)
                head = os.read(fd, FIRST_READ)
                # a short read of a regular file means we have all of it
                size = len(head) if len(head) < FIRST_READ else os.fstat(fd).st_size
                self._read(head, size, fd, mmap_mode)
            finally:
                os.close(fd)
        else:  # an open file of a store without local paths
            self.path = str(getattr(source, "name", "<entry>"))
            try:
                fd = source.fileno()
            except (OSError, AttributeError, ValueError):
                fd, mmap_mode = -1, None  # nothing to map
            size = _size(source)
            source.seek(0)
            self._read(source.read(min(size, FIRST_READ)), size, fd, mmap_mode, source)

    def _read(
        self, head: bytes, size: int, fd: int, mmap_mode: str | None, f: BinaryIO | None = None
    ) -> None:
        path = self.path
        if len(head) < size:  # else the whole file is read: nothing can follow
            head = complete_head(head, size, fd, f)
        h = self._h = Header(head, path)
        end = h.payload_off + h.payload_len
        if size != end and fd >= 0 and f is None:
            size = os.fstat(fd).st_size  # the short read was not the end of the file
        if size != end:
            raise EntryCorrupted(f"{path}: size {size} bytes, header says {end}")
        lay = h.layout
        if self._signer is not None:
            self._check_signable(lay.codec)
        self.codec: str = lay.codec
        self.codec_layout: dict[str, Any] = lay.codec_layout
        self._seg = lay.seg
        self._raw_len = lay.raw
        self._comp = lay.comp
        # compressed entries cannot be mapped: they are read into memory
        self._mode = mmap_mode if self._comp is None else None
        self._mm: mmap.mmap | None = None
        self._payload: Any
        if self._mode is not None:
            # map now, through this open file: mapping later by path could
            # see a newer entry published under the same name meanwhile
            self._mm = mmap.mmap(fd, 0, access=_MMAP_ACCESS[self._mode])
            self._payload = memoryview(self._mm)[h.payload_off :]
            self._check_mapped(fd)
        elif end <= len(head):
            # small: already read. A private writable copy when not mapping, so
            # that arrays come back writable as they would from a fresh compute.
            view = memoryview(head)[h.payload_off : end]
            self._check(view)
            self._payload = bytearray(view)
        else:
            self._payload = self._read_payload(fd, f)
        if self._signer is not None:
            self._check_signature()

    def _read_payload(self, fd: int, f: BinaryIO | None) -> np.ndarray:
        """The payload in fresh memory, checked as it is read (on all cores for an
        entry with a block table: :mod:`mlcache.entry.payload`)."""
        h = self._h
        buf, digests = read_payload(fd, f, h.payload_off, h.payload_len, h.block, self.path)
        self._compare(digests)
        return buf

    def _compare(self, digests: list[int]) -> None:
        """Raise unless ``digests`` (one per block, or one of the whole payload) are
        the entry's."""
        h = self._h
        if h.block:
            if pack_sums(digests) != h.sums:
                raise EntryCorrupted(f"{self.path}: payload checksum mismatch (block table)")
        elif digests != [h.payload_sum]:
            raise EntryCorrupted(f"{self.path}: payload checksum mismatch")

    def _check(self, payload: Any) -> None:
        """Check the whole ``payload`` (in memory or mapped): the blocks of an entry
        with a block table on all cores, other entries in one pass."""
        block = self._h.block
        if block:
            mv = memoryview(payload)
            blocks = [mv[i : i + block] for i in range(0, mv.nbytes, block)]
            self._compare(parallel_map(xxhash.xxh3_64_intdigest, blocks))
        elif xxhash.xxh3_64_intdigest(payload) != self._h.payload_sum:
            raise EntryCorrupted(f"{self.path}: payload checksum mismatch")

    def _check_mapped(self, fd: int) -> None:
        """Check a mapped payload before its first use in this process.

        A file that passed is remembered by its identity (device, inode, size,
        mtime, ctime), so that later mapped reads of it stay O(1) in its size; a
        file replaced or changed has another identity and is checked again. An
        ``"r+"`` map is the caller's to change (joblib's semantics: edits persist),
        so it is not checked; while one is alive in this process, the file's other
        mapped reads are checked every time (writes through a shared map need not
        update the mtime at once), and its mark is dropped. Copy-on-write maps
        (``"c"``) never reach the file: they are checked and marked as ``"r"``."""
        now = time.time_ns()
        st = os.fstat(fd)
        ident = self._ident = identity(st)
        if self._mode == "r+":
            assert self._mm is not None
            handed_writable(ident, self._mm)
            return
        live = has_writable(ident[:2])
        if not live and is_verified(ident):
            checked(ident, verified=False)
            return
        self._check(self._payload)
        checked(ident, verified=not live and settled(st, now))

    def _check_signable(self, codec: str) -> None:
        """Refuse, before reading the payload, an entry that cannot carry a valid
        signature: unsigned, or a code-running codec whose code is not signed."""
        h, signer = self._h, self._signer
        assert signer is not None
        if not h.flags & SIGNED:
            raise EntrySignatureError(f"{self.path}: the entry is not signed", "unsigned")
        if (
            not h.flags & CODE_SIGNED
            and h.layout.seg
            and not (codec in codecs and codecs[codec].safe)
        ):
            raise EntrySignatureError(
                f"{self.path}: the {codec!r} code is not covered by the signature", "mismatch"
            )

    def _check_signature(self) -> None:
        """Verify the signature. The code segment is hashed from a private copy,
        which is what the codec will decode."""
        signer, h = self._signer, self._h
        assert signer is not None
        code = b""
        if h.flags & CODE_SIGNED:
            off, n = self._seg[0]
            self._code = bytes(memoryview(self._payload)[off : off + n])
            code = hashlib.sha256(self._code).digest()
        head = h.head
        at = h.meta_end + KEY_ID_SIZE
        message = signed_message(head[:48], head[HEADER.size : h.meta_end], self._name, code)
        if signer.verify(head[at : at + MAC_SIZE], message):
            if head[h.meta_end : at] == signer.key_id:
                return
        elif head[h.meta_end : at] != signer.key_id:
            raise EntrySignatureError(
                f"{self.path}: the entry was signed with another key", "other key"
            )
        # a MAC of ours that does not verify, or that verifies under a damaged key id
        raise EntrySignatureError(
            f"{self.path}: the signature does not verify (the entry was altered or moved)",
            "mismatch",
        )

    @property
    def info_bytes(self) -> bytes:
        """The entry's metadata as stored (JSON), unparsed."""
        return bytes(self._h.info_b)

    @property
    def info(self) -> dict[str, Any]:
        """The entry's metadata (parsed on demand: hits do not pay for it)."""
        try:
            info = json.loads(self._h.info_b)
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    @property
    def raw_size(self) -> int:
        """The bytes of the payload's segments once decompressed (what decoding
        holds in memory; the file of a compressed entry may be far smaller)."""
        return sum(self._raw_len)

    # -- the Segments protocol ------------------------------------------------
    def __len__(self) -> int:
        return len(self._seg)

    def _segment(self, index: Any) -> list[int]:
        if type(index) is not int or not 0 <= index < len(self._seg):
            raise EntryCorrupted(f"{self.path}: the layout names a missing segment {index!r}")
        return self._seg[index]

    def buffer(self, index: int) -> memoryview:
        off, n = self._segment(index)
        if index == 0 and self._code is not None:
            data = memoryview(self._code)  # the checked private copy
        elif self._comp is None and self._mode is not None:
            return memoryview(self.array(index, np.dtype(np.uint8), (n,), "C"))  # type: ignore[arg-type]
        else:
            data = memoryview(self._payload)[off : off + n]
        if self._comp is not None:
            try:
                out = bytearray(self._comp.decompress(data))
            except Exception as exc:
                raise EntryCorrupted(
                    f"{self.path}: cannot decompress segment {index}: {exc}"
                ) from None
            if len(out) != self._raw_len[index]:
                raise EntryCorrupted(f"{self.path}: segment {index} has the wrong size")
            return memoryview(out)
        return data

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        off, _n = self._segment(index)
        if not all(type(d) is int and d >= 0 for d in shape):
            raise EntryCorrupted(f"{self.path}: array segment {index} has a bad shape {shape}")
        count = math.prod(shape)  # exact: a forged shape cannot wrap around to fit
        if count * dtype.itemsize != self._raw_len[index]:
            raise EntryCorrupted(f"{self.path}: array segment {index} has the wrong size")
        order_: Literal["C", "F"] = "F" if order == "F" else "C"
        if self._mode is not None and self._mode != "c":
            # a numpy.memmap whose base is the mmap itself, as joblib returns: code
            # such as joblib.Parallel recognises it and shares it instead of copying
            mm_arr = np.ndarray.__new__(
                np.memmap,
                tuple(shape),
                dtype=dtype,
                buffer=self._mm,
                offset=self._h.payload_off + off,
                order=order_,
            )
            mm_arr._mmap = self._mm
            mm_arr.filename = os.path.abspath(self.path)
            mm_arr.offset = self._h.payload_off + off
            mm_arr.mode = self._mode
            if self._mode == "r" and self._name:
                # read-only: it holds what the entry holds, so the entry names it
                # (see mlcache.keys.hashing: passed on, it is not hashed again). The
                # payload's checksum is part of the name: an entry recomputed with
                # other contents under the same key is another value.
                ref = f"{self._name}#{index}@{self._h.payload_sum:016x}"
                setattr(mm_arr, REF_ATTR, ref)
                # ... while its file is as it was checked: an "r+" map of the same
                # file (here or in another process) writes into these pages too
                setattr(mm_arr, HELD_ATTR, self._ident)
            return mm_arr
        if self._mode == "c":
            # copy-on-write: private to this process, so it must not look shareable
            # (joblib.Parallel would let workers re-open the file and miss our edits)
            flat = np.frombuffer(
                self._mm,  # type: ignore[arg-type]
                dtype=dtype,
                count=count,
                offset=self._h.payload_off + off,
            )
            private = flat.reshape(shape, order=order_).view(np.memmap)
            private.filename = os.path.abspath(self.path)
            private.offset = self._h.payload_off + off
            private.mode = "c"
            return private
        flat = np.frombuffer(self.buffer(index), dtype=dtype, count=count)
        if self._comp is not None:
            flat = flat.copy()  # decompressed bytes are read-only
        return flat.reshape(shape, order=order_)


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def read_info(path: str) -> dict[str, Any]:
    """The metadata of the entry at ``path``, reading only its header."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = complete_head(os.read(fd, FIRST_READ), os.fstat(fd).st_size, fd, None)
    finally:
        os.close(fd)
    h = Header(head, path)
    try:
        info = json.loads(h.info_b)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def verify_file(path: str, signer: Signer | None = None, name: str = "") -> None:
    """Check every byte of the entry at ``path`` (and its signature for the store
    name ``name``, with ``signer``), reading it into memory whatever this process
    verified before; raise :class:`EntryCorrupted` if damaged."""
    EntryReader(path, None, signer, name)


# -- entries of a store --------------------------------------------------------

#: store class -> its method giving an entry's local file, or None (checked against
#: LocalPaths once per class: a runtime Protocol check costs 10-30 µs, and this
#: runs on every hit of a store whose paths the caller does not know)
_LOCAL_KINDS: dict[type, Callable[[Any, str], str] | None] = {}


def _local_opener(kind: type) -> Callable[[Any, str], str] | None:
    return kind.local_path if issubclass(kind, LocalPaths) else None


def local_file(store: Store, name: str) -> str | None:
    """A local file of entry ``name``: the store's own (a local store), or a copy it
    keeps (a remote store's read-through cache); None if it has neither."""
    kind = type(store)
    try:
        opener = _LOCAL_KINDS[kind]
    except KeyError:
        opener = _LOCAL_KINDS[kind] = _local_opener(kind)
    return opener(store, name) if opener is not None else None


def open_entry(
    store: Store,
    name: str,
    mmap_mode: str | None = None,
    *,
    path: str | None = None,
    signer: Signer | None = None,
) -> EntryReader:
    """Open entry ``name`` of ``store`` (through its local file when it has one, or
    ``path`` when the caller knows it), requiring a valid signature when ``signer``
    is given.

    Raises ``EntryNotFound`` (also for a name that is a folder), ``EntryCorrupted``
    for damage (``EntrySignatureError`` for a missing or wrong signature),
    ``OSError`` when it cannot be read.
    """
    try:
        if path is None:
            path = local_file(store, name)
        if path is not None:
            return EntryReader(path, mmap_mode, signer, name)
        with store.open(name) as f:
            return EntryReader(f, mmap_mode, signer, name)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise EntryNotFound(name) from None


def read_entry_info(store: Store, name: str, *, path: str | None = None) -> dict[str, Any]:
    """The metadata of entry ``name`` of ``store``, reading only its header where
    possible; ``EntryNotFound`` if there is none."""
    try:
        if path is None:
            path = local_file(store, name)
        if path is not None:
            return read_info(path)
        with store.open(name) as f:
            return EntryReader(f).info
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise EntryNotFound(name) from None


def decode(reader: EntryReader, *, allow_pickle: bool) -> Any:
    """The value in an opened entry. Never unpickles when ``allow_pickle`` is false."""
    if reader.codec not in codecs:
        raise UnknownFormat(
            f"{reader.path}: written with the codec {reader.codec!r}, which this process "
            "has not registered (mlcache.register_codec)"
        )
    codec = codecs[reader.codec]
    if not codec.safe and not allow_pickle:
        raise UnsupportedValue(
            f"{reader.path}: stored with the {codec.name!r} codec, and pickle is disabled"
        )
    try:
        return codec.decode(reader.codec_layout, reader)
    except (EntryCorrupted, UnknownFormat):  # a leaf this process lacks: a miss, kept
        raise
    except Exception as exc:
        # a layout that passed its checksum but that the codec cannot follow, or a
        # pickle that no longer loads (a class renamed or removed): not a value
        raise EntryCorrupted(
            f"{reader.path}: cannot decode the {codec.name!r} payload ({type(exc).__name__}: {exc})"
        ) from exc
