"""What a :class:`~mlcache.data.CachedDataset` is keyed by besides its code and
attributes: the fingerprint of its source (the files and items it loads), and the
module-level values its builds change (state, remembered in the class's folder
of packs so that they count by type only).

Nothing here opens or builds a pack: :mod:`mlcache.data.cached` does, with these.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import xxhash

from .._atomic import write_bytes_atomic
from ..errors import warn
from ..keys.hashing import hash_value

__all__ = [
    "STATE_FILE",
    "files_digest",
    "items_digest",
    "read_state",
    "source_fingerprint",
    "warn_if_new_every_run",
    "write_state",
]

logger = logging.getLogger("mlcache")

#: the file, in a class's folder of packs, naming the module-level values its builds
#: change (state: counted by type, not content)
STATE_FILE = ".state"
#: builds of one class by this many runs, within this many seconds, each with a new
#: value of the same attribute, make a warning naming it (see cache_ignore)
_EVERY_RUN_BUILDS = 3
_EVERY_RUN_WINDOW = 3600.0
_WARNED_EVERY_RUN: set[tuple[type, frozenset[str]]] = set()


def source_fingerprint(
    files: Iterable[str | os.PathLike[str]] | None,
    items: Callable[[], Iterable[Any]] | None,
    bases: Sequence[str] = (),
) -> str:
    """The default source fingerprint of a dataset (see
    :meth:`~mlcache.data.CachedDataset.source_fingerprint`): ``files`` by path, size
    and modification time, then, when the dataset defines its own items,
    ``items()`` by value and the files they name (relative to ``bases`` too)."""
    found = "" if files is None else files_digest(files)
    if items is None:
        return found  # the items are the files: counted above
    return hash_value(("items", found, items_digest(items(), bases)))


def files_digest(files: Iterable[str | os.PathLike[str]]) -> str:
    """Paths, sizes and modification times of ``files`` (which must exist)."""
    paths, stats = [], array("q")
    for f in files:  # the one cost that grows with the dataset when opening it
        path = os.fspath(f)
        if not os.path.isabs(path):
            path = os.path.abspath(path)
        st = os.stat(path)
        paths.append(path)
        stats.extend((st.st_size, st.st_mtime_ns))
    digest = xxhash.xxh3_128("\0".join(paths).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    return digest.hexdigest()


def items_digest(items: Iterable[Any], bases: Sequence[str] = ()) -> str:
    """The items of ``source_items()``: by value (their order and count too), and
    every existing file or folder they name by its path, size and modification
    time: an item that is a path, or a tuple or list holding paths (``(path,
    label)``), or a name relative to one of ``bases`` (the dataset's own folder
    attributes, for ``os.listdir(self.root)``). A folder counts by every file in
    it (editing ``p0/a.txt`` changes nothing of ``p0`` itself)."""
    items = list(items)
    paths, stats = [], array("q")
    for item in items:
        for part in item if isinstance(item, (tuple, list)) else (item,):
            path = _existing_path(part, bases)
            if path is None:
                continue
            paths.append(path)
            _add_stats(path, paths, stats)
    digest = xxhash.xxh3_128("\0".join(paths).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    digest.update(hash_value(items).encode())
    return digest.hexdigest()


def _existing_path(part: Any, bases: Sequence[str]) -> str | None:
    """``part`` as the absolute path of an existing file or folder, or None."""
    if not isinstance(part, (str, os.PathLike)):
        return None
    try:
        name = os.fsdecode(os.fspath(part))
        if not name or "\0" in name:
            return None
        for candidate in (name, *(os.path.join(b, name) for b in bases)):
            if os.path.exists(candidate):
                return os.path.abspath(candidate)
    except (OSError, ValueError, TypeError):
        return None
    return None


def _add_stats(path: str, paths: list[str], stats: array) -> None:
    """Size and modification time of ``path``; of a folder, of each file in it too."""
    st = os.stat(path)
    stats.extend((st.st_size, st.st_mtime_ns))
    if not os.path.isdir(path):
        return
    for folder, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            inner = os.path.join(folder, name)
            try:
                st = os.stat(inner)
            except OSError:  # removed meanwhile: its absence counts
                continue
            paths.append(inner)
            stats.extend((st.st_size, st.st_mtime_ns))


# -- state: module-level values a build changes ------------------------------------
def read_state(folder: str, shape: str) -> frozenset[str]:
    """The names of the module-level values (or their parts: see
    :func:`mlcache.keys.code_version.state_parts`) that builds of this class, with code of this
    shape, change."""
    try:
        with open(os.path.join(folder, f"{STATE_FILE}-{shape}"), "rb") as f:
            names = json.loads(f.read()).get("globals", [])
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError, AttributeError) as exc:  # unreadable: learned again
        logger.debug("mlcache: could not read %s: %s", STATE_FILE, exc)
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str))


def write_state(root: str, folder: str, shape: str, names: frozenset[str]) -> None:
    try:
        data = json.dumps({"globals": sorted(names)}).encode()
        path = os.path.join(folder, f"{STATE_FILE}-{shape}")
        write_bytes_atomic(path, data, durable=False, root=root)
    except OSError as exc:  # learned again by the next build
        logger.debug("mlcache: could not record what building changes: %s", exc)


# -- attributes: one that is new at every run --------------------------------------
def warn_if_new_every_run(cls: type, folder: str, args_id: str, mine: dict[str, str]) -> None:
    """One warning when the last builds of ``cls``, by other processes in the last
    hour, each had a new value of the same attributes and the same value of every
    other one: such an attribute (a temporary folder, a time) makes a new pack at
    every run. ``mine`` is this build's digest of each key attribute, recorded in
    ``folder`` as ``.<args_id>.args`` (as the other builds' are)."""
    now, others = time.time(), []
    for name in os.listdir(folder):
        if not (name.startswith(".") and name.endswith(".args")):
            continue
        if name == f".{args_id}.args":
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError, ValueError):
            when = os.stat(path, follow_symlinks=False).st_mtime
            if now - when < _EVERY_RUN_WINDOW:
                with open(path, "rb") as f:
                    data = json.loads(f.read())
                if data.get("pid") != os.getpid() and isinstance(data.get("attrs"), dict):
                    others.append((when, data["attrs"]))
    if len(others) < _EVERY_RUN_BUILDS - 1:
        return
    last = [a for _, a in sorted(others, key=lambda o: o[0])[-(_EVERY_RUN_BUILDS - 1) :]]
    differ = {n for n in mine if any(a.get(n) != mine[n] for a in last)}
    runs = [mine, *last]
    if not differ or any(set(a) != set(mine) for a in last):
        return
    same = all(a[n] == mine[n] for a in last for n in mine if n not in differ)
    new_each_time = all(len({r[n] for r in runs}) == len(runs) for n in differ)
    key = (cls, frozenset(differ))
    if same and new_each_time and key not in _WARNED_EVERY_RUN:
        _WARNED_EVERY_RUN.add(key)
        names = ", ".join(repr(n) for n in sorted(differ))
        plural = "s" if len(differ) > 1 else ""
        warn(
            f"mlcache: {cls.__qualname__}: the attribute{plural} {names} had a new "
            f"value in each of the last {len(runs)} runs, so each built a new pack (unused "
            "packs are removed after 30 days); if it does not change the samples, leave it "
            f"out of the key: cache_ignore = ({names},)",
            stacklevel=8,  # the subclass's super().__init__(), through the build
        )
