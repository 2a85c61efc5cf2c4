"""A rebuilt dataset's old pack goes as soon as no reader holds it.

A :class:`~mlcache.data.CachedDataset` pack is ``<attributes>-<version>.pack``; a
new version of the *source* (the same code and attributes) replaces the packs of
the same code built before it. Versions of other code are kept side by side, by
last use, as the function cache keeps code versions: two scripts whose dataset
classes share a name and a ``cache_dir`` (``train.py`` and ``eval.py``, a
notebook and a script, two branches) each keep their pack (see
:func:`~mlcache.data.sources.remove_older_versions`). A pack's code is recorded
beside it, in ``.<pack name>.code`` (:func:`write_code_tag`); a pack without one
is never taken for a replaced one. Every :class:`~mlcache.data.PackedDataset` holds a
shared ``flock`` on its file while it has it open, and so do the DataLoader
workers it was handed to: a lock belongs to the open file, which a forked worker
inherits and a spawned one receives (``PackedDataset.__reduce__`` sends the
descriptor, never the path). So a replaced pack that a process can lock
exclusively at once is read by nobody: it is removed then, when the new version
is built or opened (:func:`remove_replaced`). One still being read stays, and
goes at a later build or open once released (or after
:data:`~mlcache.data.sources.GRACE_SECONDS`, as before: a reader keeps its map of
a removed file on POSIX). Only a process still running the old code or source
would open it by name again: it builds it again (a miss, never a wrong sample).

:func:`replaced_by` tells which pack is current, for ``mlcache ls``: the latest
built or opened of its attributes (the one with the newest modification time;
an open marks its use, see :meth:`CachedDataset._try_open`).

A pack that a newer mlcache wrote (a higher format version: a cache shared
mid-upgrade) is never removed nor replaced here: the dataset uses its own pack
beside it (:func:`own_beside`), and :func:`remove_replaced` leaves it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re

import xxhash

from .._atomic import write_bytes_atomic
from ..errors import warn_at_user
from .format import FORMAT_VERSION, is_newer_pack

__all__ = [
    "code_tag_path",
    "in_use",
    "own_beside",
    "remove_replaced",
    "replaced_by",
    "same_code",
    "write_code_tag",
]

logger = logging.getLogger("mlcache")

#: a CachedDataset's pack name: ``<attributes>-<version>.pack``, 16 hex digits each
_NAME = re.compile(r"([0-9a-f]{16})-[0-9a-f]{16}\.pack")


def code_tag_path(pack_path: str) -> str:
    """Where the code (and attributes) a pack was built by is recorded."""
    folder, name = os.path.split(pack_path)
    return os.path.join(folder, f".{name}.code")


def forget_records(pack_path: str) -> None:
    """Remove what is recorded beside a removed pack: the code that built it
    (:func:`code_tag_path`), its build time and its opens (``.<pack>.built``,
    ``.opens``: :mod:`mlcache.data.holdings`)."""
    folder, name = os.path.split(pack_path)
    for record in ("code", "built", "opens"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, f".{name}.{record}"))


def write_code_tag(pack_path: str, code: str, root: str) -> None:
    """Record that ``pack_path`` was built by ``code`` (a digest of the dataset's
    class, code and attributes: everything of its name but the source).
    Housekeeping: never raises (a pack without it is kept by last use)."""
    path = code_tag_path(pack_path)
    try:
        with open(path, "rb") as f:
            if f.read() == code.encode():
                return
    except OSError:
        pass
    try:  # below root, never through a planted link
        write_bytes_atomic(path, code.encode(), durable=False, root=root)
    except OSError as exc:
        logger.debug("mlcache: could not record the code of %s: %s", pack_path, exc)


def _code_of(pack_path: str) -> bytes | None:
    try:
        with open(code_tag_path(pack_path), "rb") as f:
            return f.read(64) or None
    except OSError:
        return None


def same_code(pack_path: str, other: str) -> bool:
    """Both packs were built by the same code and attributes, as recorded (they
    differ by their source only): the older is replaced by the newer. False when
    either is not recorded."""
    mine = _code_of(pack_path)
    return mine is not None and mine == _code_of(other)


def in_use(path: str) -> bool:
    """Whether a process (this one included) has the pack file ``path`` open as a
    reader; True when that cannot be told (a file system without locks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held; another error: cannot tell, so keep it
        return True
    finally:
        os.close(fd)
    return False


def _versions(pack_path: str) -> list[tuple[int, str]]:
    """(modification time in ns, path) of the packs of the same attributes as
    ``pack_path`` in its folder, itself included; [] for another kind of name."""
    folder, name = os.path.split(pack_path)
    mine = _NAME.fullmatch(name)
    if mine is None:
        return []
    prefix = mine.group(1) + "-"
    names = [n for n in os.listdir(folder) if n.startswith(prefix) and _NAME.fullmatch(n)]
    if names == [name]:  # the usual open: no other version, no stat
        return [(0, pack_path)]
    found = []
    for other in names:
        path = os.path.join(folder, other)
        try:
            found.append((os.stat(path, follow_symlinks=False).st_mtime_ns, path))
        except FileNotFoundError:
            continue
    return found


def replaced_by(pack_path: str) -> str | None:
    """The path of the pack that replaced ``pack_path`` (a later version of the
    same dataset attributes), or None when ``pack_path`` is current (or is not a
    :class:`~mlcache.data.CachedDataset` pack: a :func:`~mlcache.data.pack` file
    is never replaced)."""
    try:
        versions = _versions(pack_path)
    except OSError:
        return None
    mine = [t for t, p in versions if p == pack_path]
    newer = [(t, p) for t, p in versions if mine and t > mine[0] and same_code(pack_path, p)]
    return max(newer)[1] if newer else None


def remove_replaced(pack_path: str) -> list[str]:
    """Remove the packs that ``pack_path`` replaces (same code and attributes,
    another source; built or opened before it) that no process has open; return
    their paths. Packs of other code stay (by last use). Never raises:
    housekeeping never fails an open or a build."""
    removed = []
    try:
        versions = _versions(pack_path)
        mine = [t for t, p in versions if p == pack_path]
        for t, path in versions:
            if not mine or t >= mine[0] or not same_code(pack_path, path) or in_use(path):
                continue
            if is_newer_pack(path):  # a newer mlcache's: not this one's to remove
                continue
            os.unlink(path)  # a reader that opens it meanwhile keeps its file
            forget_records(path)
            removed.append(path)
            logger.info("mlcache: removed %s, replaced by %s", path, pack_path)
    except OSError as exc:
        logger.debug("mlcache: could not remove the packs %s replaces: %s", pack_path, exc)
    return removed


#: the packs of a newer mlcache this process said it keeps (once each)
_NEWER_SAID: set[str] = set()


def own_beside(path: str) -> str:
    """The pack this version uses when a newer mlcache's pack is at ``path``: a
    name of the same attributes, its version made of ``path``'s and this
    version's pack format (said once per path, with one warning)."""
    folder, name = os.path.split(path)
    found = _NAME.fullmatch(name)
    mine = xxhash.xxh3_64_hexdigest(f"{name}\0pack format {FORMAT_VERSION}".encode())
    beside = os.path.join(folder, f"{found.group(1) if found else name}-{mine}.pack")
    if path not in _NEWER_SAID:
        _NEWER_SAID.add(path)
        warn_at_user(
            f"mlcache: {path} was written by a newer mlcache (a newer pack format): it is "
            f"kept as it is, and this version uses its own pack beside it "
            f"({os.path.basename(beside)}); upgrade mlcache to share one"
        )
    return beside
