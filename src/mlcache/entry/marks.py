"""What this process knows of the entry files it has mapped.

Three marks, each by the file's identity (device, inode, size, mtime_ns,
ctime_ns), kept by :class:`~mlcache.entry.reader.EntryReader`:

- *verified*: the payload was checked under this identity, and the change
  before it was :data:`SETTLED_NS` old, so a later mapped read of the file with
  the same identity skips the check (O(1) in the array size).
- *writable*: the ``"r+"`` maps of a file this process has handed out. While
  one is alive, the file's other mapped reads are checked every time (writes
  through a shared map need not change the file's times at once); a read-only
  map of a file this process ever mapped ``"r+"`` is not keyed by its entry's
  name.
- *checked*: the last identity under which this process checked the file's
  mapped payload (or found it verified). A read-only map is keyed by its
  entry's name (:data:`~mlcache.entry.reader.REF_ATTR`) only while its file
  still has the identity it was checked under, or one that was checked since
  (:func:`map_holds`): an ``"r+"`` map of the same file, in this process or in
  another, shares the read-only map's pages, and its writes change what the
  read-only map holds (and the file's mtime and ctime, at the first write to a
  clean page). Such a map is then hashed by its contents, as any array.

mlcache's own last-use touch only sets times: :func:`keep_verified` carries
the verified and checked marks of the files it touches over to their new
identity. What the file times cannot show: a write within the clock tick of the
identity taken (a writer mapping a file the moment it is published), and a
rewrite whose mtime and ctime are both restored (which takes root).
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "COARSE_SETTLED_NS",
    "HELD_ATTR",
    "SETTLED_NS",
    "Ident",
    "checked",
    "forget_verified",
    "handed_writable",
    "has_writable",
    "identity",
    "is_verified",
    "keep_verified",
    "map_holds",
    "settled",
]

#: a mapped file is remembered as verified only when its last change (mtime,
#: ctime) is at least this old: file times are coarse (a clock tick, 1 to 10 ms
#: on Linux), and a change made within the same tick as the check would not show
#: in them. Files whose times are whole seconds (FAT, HFS+, some network file
#: systems) need COARSE_SETTLED_NS.
SETTLED_NS = 50_000_000
COARSE_SETTLED_NS = 2_000_000_000
_MARKS_MAX = 1 << 16
#: the attribute a read-only mapped array carries beside its entry's name: the
#: identity of its file when its payload was checked (see map_holds)
HELD_ATTR = "_mlcache_held"

Ident = tuple[int, int, int, int, int]

#: identities of the mapped files this process has checked, settled
_verified: dict[Ident, None] = {}
#: (device, inode) -> the "r+" maps of that file this process has handed out
_writable: dict[tuple[int, int], weakref.WeakSet[mmap.mmap]] = {}
#: (device, inode) -> the identity its mapped payload was last checked under
_checked: dict[tuple[int, int], Ident] = {}
#: files this process has handed an "r+" map of: a write within the clock tick of
#: the file's last change does not show in its times, even once the map is gone
_ever_writable: set[tuple[int, int]] = set()


def identity(st: os.stat_result) -> Ident:
    """A file's identity: device, inode, size, mtime and ctime (ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(st: os.stat_result, now: int) -> bool:
    """The file's last change was old enough at ``now`` (ns, a time taken before
    ``st`` was) that a new one would show in its times: a thread held up between
    the stat and this judgement must not count a change made meanwhile as old."""
    coarse = not (st.st_mtime_ns % 1_000_000_000 or st.st_ctime_ns % 1_000_000_000)
    margin = COARSE_SETTLED_NS if coarse else SETTLED_NS
    return now - max(st.st_mtime_ns, st.st_ctime_ns) >= margin


def is_verified(ident: Ident) -> bool:
    """The payload of the file with this identity was checked here, settled."""
    return ident in _verified


def checked(ident: Ident, *, verified: bool) -> None:
    """The mapped payload of the file with this identity passed a check (or was
    found verified); ``verified``: remember it as verified too."""
    if len(_checked) >= _MARKS_MAX:
        _checked.clear()  # forgotten: held maps are hashed by contents, never wrong
    _checked[ident[:2]] = ident
    if verified:
        _remember(ident)


def _remember(ident: Ident) -> None:
    if len(_verified) >= _MARKS_MAX:
        _verified.clear()
    _verified[ident] = None


def handed_writable(ident: Ident, mm: mmap.mmap) -> None:
    """An ``"r+"`` map of the file was handed out: its edits persist unchecked, so
    the file's marks go."""
    _verified.pop(ident, None)
    _checked.pop(ident[:2], None)
    if len(_ever_writable) >= _MARKS_MAX:
        _ever_writable.clear()
    _ever_writable.add(ident[:2])
    _writable.setdefault(ident[:2], weakref.WeakSet()).add(mm)


def has_writable(inode: tuple[int, int]) -> bool:
    """An ``"r+"`` map of the file ``(device, inode)`` is alive in this process."""
    live = _writable.get(inode)
    if live is not None and not live:  # its writable maps are all gone
        _writable.pop(inode, None)
        return False
    return live is not None


def map_holds(arr: Any) -> bool:
    """The read-only map ``arr`` still holds what it held when its file's payload
    was checked: this process never mapped the file ``"r+"``, and the file has
    the identity of that check, or one this process checked since (one ``stat``).
    A file replaced under its path (a new entry) or changed in place does not."""
    held = arr.__dict__.get(HELD_ATTR)
    if held is None or held[:2] in _ever_writable:
        return False
    try:
        now = identity(os.stat(arr.filename))
    except (OSError, TypeError, ValueError):
        return False
    return now[:3] == held[:3] and (now == held or _checked.get(now[:2]) == now)


def keep_verified(paths: list[str], change: Callable[[], Any]) -> None:
    """Run ``change()``, which changes only the times of the entry files ``paths``
    (mlcache's last-use touch sets their mtime), keeping the marks of those this
    process has verified or checked, so that recording use does not make the next
    mapped hit check the payload again, nor a held read-only map be hashed. A
    file whose device, inode or size differs afterwards is not carried over."""
    if not _verified and not _checked:  # no mapped read here: nothing to carry
        change()
        return
    before = {}
    for path in paths:
        try:
            ident = identity(os.stat(path, follow_symlinks=False))
        except (OSError, ValueError):
            continue
        was_checked = _checked.get(ident[:2]) == ident
        if ident in _verified or was_checked:
            before[path] = (ident, ident in _verified, was_checked)
    change()
    for path, (old, was_verified, was_checked) in before.items():
        try:
            new = identity(os.stat(path, follow_symlinks=False))
        except (OSError, ValueError):
            continue
        if new[:3] != old[:3] or has_writable(new[:2]):
            continue
        if was_checked and _checked.get(old[:2]) == old:  # no other check meanwhile
            _checked[new[:2]] = new
        if was_verified:
            _remember(new)


def forget_verified() -> None:
    """Forget which files this process has verified: the next mapped read of each
    checks its payload again (tests, benchmarks of a first hit)."""
    _verified.clear()
