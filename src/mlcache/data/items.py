"""What each sample of a pack filled item by item is loaded from: every item's
*key* (what it is: its path, or its value) and *fingerprint* (what it holds now),
16 bytes each, as the pack's item table records them (``docs/format.md``).
:mod:`mlcache.data.filling` compares them to tell which items changed.
"""

from __future__ import annotations

import contextlib
import os
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from stat import S_ISREG
from typing import Any

import numpy as np
import xxhash

from .._log import logger_for
from ..errors import PackCorrupted
from ..keys.hashing import Hasher, hash_value
from .reader import PackedDataset
from .sources import NO_NAME, add_stats, existing_path, path_parts, paths_digest, stat_fields

__all__ = [
    "default_fingerprint",
    "default_fingerprints",
    "item_keys",
    "item_table",
    "key_bytes",
    "same_items",
    "say_unfingerprinted",
    "table_digest",
]

#: the dataset classes told that none of their items names a file (once a process)
_SAID_UNFINGERPRINTED: set[type] = set()


def say_unfingerprinted(cls: type, n: int, declared: Callable[[], Any]) -> None:
    """Once per class and process: none of the ``n`` items of ``cls`` names a file,
    so a change of what its ``load_item`` reads is seen only through what
    ``declared()`` gives (its own ``source_fingerprint``, the files its attributes
    name; if nothing, not at all): say how to declare it."""
    if cls in _SAID_UNFINGERPRINTED:
        return
    _SAID_UNFINGERPRINTED.add(cls)
    if declared():
        return  # e.g. the file of the rows is the source: a change of it is a new pack
    logger_for(1).warning(
        "mlcache: %s: none of its %d items names a file, nor does any attribute, so "
        "a change of what load_item reads is not seen and its old samples are "
        "served: define item_fingerprint(item) (what an item holds now: an "
        "updated_at, an ETag) or source_fingerprint() (a data version, a "
        "manifest's checksum)",
        cls.__qualname__,
        n,
    )


_STAT = struct.Struct("<qqqq")


def key_bytes(item: Any, hasher: Hasher | None = None) -> bytes:
    """What an item is (its key in the item table): its path (a ``str`` or path),
    else its value (by ``hasher``, reused: a new one per item is half the cost of
    a row number's key)."""
    if item.__class__ is str:  # the common item: a path listed by the dataset
        return xxhash.xxh3_128_digest(b"p" + item.encode("utf-8", "surrogateescape"))
    if isinstance(item, (str, os.PathLike)):
        name = os.fspath(item)
        raw = name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
        return xxhash.xxh3_128_digest(b"p" + raw)
    if hasher is None:
        return xxhash.xxh3_128_digest(b"v" + hash_value(item).encode())
    try:
        value = hasher.digest_of(item).hex()
    except TypeError:  # as hash_value says it
        value = hash_value(item)
    return xxhash.xxh3_128_digest(b"v" + value.encode())


def item_keys(items: Iterable[Any]) -> bytes:
    """The :func:`key_bytes` of each item, joined (16 bytes each)."""
    hasher = Hasher()
    digest = xxhash.xxh3_128_digest
    # a path listed by the dataset (the common item) inline: the call per item was
    # a third of the cost
    return b"".join(
        [
            digest(b"p" + item.encode("utf-8", "surrogateescape"))
            if item.__class__ is str
            else key_bytes(item, hasher)
            for item in items
        ]
    )


def default_fingerprint(item: Any, bases: Sequence[str] = (), local: bool = True) -> bytes:
    """What an item holds now: a file by its :func:`~mlcache.data.sources.stat_fields`
    (one ``stat``: size, modification time, inode and change time); a folder by
    its files'; any other item by the files its parts name (relative to ``bases``
    too; see :func:`~mlcache.data.sources.path_parts`: a tuple, a list, a dict's
    values, a dataclass); an item naming no file by nothing (its value is its
    key: the dataset's attributes, or ``item_fingerprint``, must say more)."""
    if item.__class__ in NO_NAME:  # a row number
        return bytes(16)
    if isinstance(item, (str, os.PathLike)):
        try:
            st = os.stat(item)
        except (OSError, ValueError, TypeError):
            pass
        else:
            if S_ISREG(st.st_mode):
                return xxhash.xxh3_128_digest(_STAT.pack(*stat_fields(st, local)))
    paths: list[str] = []
    stats = array("q")
    for part in path_parts(item):
        path = existing_path(part, bases)
        if path is None:
            continue
        paths.append(path)
        with contextlib.suppress(OSError):  # removed meanwhile: its absence counts
            add_stats(path, paths, stats, local)
    if not paths:
        return bytes(16)
    return paths_digest(paths, stats).digest()


def default_fingerprints(
    items: Iterable[Any], bases: Sequence[str] = (), local: bool = True
) -> bytes:
    """The :func:`default_fingerprint` of each item, joined (16 bytes each): an item
    that is a ``str`` naming a regular file inline (its one ``stat``, the same
    digest), any other by :func:`default_fingerprint` (20,000 paths: ~45 ms
    against ~90)."""
    stat, pack, digest = os.stat, _STAT.pack, xxhash.xxh3_128_digest
    out = []
    for item in items:
        if item.__class__ is str:
            try:
                st = stat(item)
            except (OSError, ValueError):
                pass  # gone, or no name: as default_fingerprint says (it stats again)
            else:
                if S_ISREG(st.st_mode):
                    if local:
                        fields = pack(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                    else:
                        fields = pack(st.st_size, st.st_mtime_ns, 0, 0)
                    out.append(digest(fields))
                    continue
        out.append(default_fingerprint(item, bases, local))
    return b"".join(out)


_SHIFT = np.uint64(33)


def _fmix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, on a whole column (uint64 arithmetic
    wraps): a bijection that spreads every input bit over the output."""
    x = x ^ (x >> _SHIFT)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> _SHIFT
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> _SHIFT)


def _stat_fingerprints(stats: bytes, n: int) -> bytes:
    """Four stat fields an item (32 bytes each) as 16 bytes an item, at numpy's
    speed: size mixed with inode, modification time with change time (a change
    of either field of a pair always changes its half: each step is a bijection)."""
    fields = np.frombuffer(stats, dtype="<u8").reshape(n, 4)
    out = np.empty((n, 2), dtype="<u8")
    out[:, 0] = _fmix(fields[:, 0] ^ _fmix(fields[:, 2] ^ np.uint64(0x9E3779B97F4A7C15)))
    out[:, 1] = _fmix(fields[:, 1] ^ _fmix(fields[:, 3] ^ np.uint64(0x632BE59BD9B4E019)))
    return out.tobytes()


def item_table(
    items: Sequence[Any],
    fingerprint: Callable[[Any], Any] | None = None,
    bases: Sequence[str] = (),
    stats: bytes | None = None,
    local: bool = True,
    keys: bytes | None = None,
) -> np.ndarray:
    """The key and the fingerprint of each item, an ``(n, 4)`` int64 table (16
    bytes each). ``fingerprint(item)``, when given, says what an item holds (by
    value); ``stats``, of items that are the files of a folder just listed (their four
    :func:`~mlcache.data.sources.stat_fields`, 32 bytes each), spares their ``stat``;
    ``keys``, their :func:`item_keys` when known."""
    n = len(items)
    if stats is not None and len(stats) != 32 * n:
        raise ValueError(f"{len(stats)} bytes of stats for {n} items")
    if keys is None:
        keys = item_keys(items)
    if stats is not None:
        fps = _stat_fingerprints(stats, n)
    elif fingerprint is not None:
        fps = b"".join(
            xxhash.xxh3_128_digest(hash_value(fingerprint(item)).encode()) for item in items
        )
    else:
        fps = default_fingerprints(items, bases, local)
    table = np.empty((n, 4), dtype="<i8")
    table[:, :2] = np.frombuffer(keys, dtype="<i8").reshape(n, 2)
    table[:, 2:] = np.frombuffer(fps, dtype="<i8").reshape(n, 2)
    return table


def same_items(pack: PackedDataset, table: np.ndarray) -> bool:
    """Whether ``pack`` was filled from exactly these items, as they are now."""
    try:
        old = pack.item_table()
    except PackCorrupted:
        return False
    return old is not None and old.shape == table.shape and bool(np.array_equal(old, table))


def table_digest(table: np.ndarray | None) -> str:
    """An item table in a few bytes (what a background check compares)."""
    return "" if table is None else xxhash.xxh3_128_hexdigest(table.tobytes())
