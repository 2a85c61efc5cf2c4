"""The files under a dataset's folder attributes, as its source.

``self.root = "shards/"``, ``source_items()`` returning ``range(n)`` and
``load_item(i)`` opening ``root/part-{i // 1000}.npy``: no item names a file, so
the shards count through the folder attribute that holds them. Each key attribute
of a :class:`~mlcache.data.CachedDataset` that names an existing folder counts by
the files under it that no item names (those count item by item, so an edit
still costs its own load), by path and the same ``stat`` as any source file
(:func:`~mlcache.data.sources.stat_fields`: size, modification time, and on a
local cache inode and change time). A regenerated shard is a new pack.

What an open costs. A folder's listing is recorded beside the packs
(``.<attributes>-<name>.folder``: the stat of every folder walked, when the walk
began, the files no item names, and a digest of the paths in it that the items
named). At the next open, one ``stat`` of each folder against the record says
whether the listing still holds (adding, removing or renaming an entry moves its
folder's modification and change times), on the file systems that move them
(:data:`~mlcache.data.checking.KEEPS_TIMES`) and once the walk began well after
their last change (:func:`~mlcache.data.checking.trusted_after`), as for a
declared folder (:mod:`mlcache.data.checking`); and, when the walk left files
out because items named them (the path each item's check stats:
:class:`~mlcache.data.names.Named`), whether the items still give the same names
there and the folders of their candidate paths are as they were (one ``stat``
each, none a name): a file no longer named must count here again. The same names
are told by a key (the working folder, the folder attributes and the items' keys
in the item table, which the open computes anyway), so a reopen of the same items
builds none. Then only the files no item names are stat'ed (none, for a folder of
the items). Otherwise the folder is walked again.

What is never walked, or walked in part:

- the cache: a folder attribute inside the packs' folder, or the folder the user
  chose as ``cache_dir``, is left out; a folder holding one is walked without it;
- the declared source folder (``source_dir``) held as an attribute: counted by its
  declaration (a folder holding it is walked, its declared files named by the items);
- hidden folders (``.git``, ``.ipynb_checkpoints``) and ``__pycache__``: tools
  write there at every run; a symbolic link to a folder is walked (once: a
  link back to a folder walked already is not walked again);
- a huge folder (``/``, the home folder or one holding it, or more than
  :data:`MAX_ENTRIES` entries): counted by its path only, with one warning naming
  the attribute and how to declare what ``load_item`` reads.

An output folder that training writes into changes at every run: each run is then
a new pack (a miss, never a stale sample). The attribute digests recorded per
build (:func:`~mlcache.data.sources.warn_if_new_every_run`) count such a folder's
files, so after three such runs one warning names the attribute and says to list
it in ``cache_ignore``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from stat import S_ISDIR, S_ISREG
from typing import Any

import xxhash

from .._atomic import write_bytes_atomic
from .._util import slug
from ..errors import warn
from ..keys.hashing import hash_value
from .names import NONE_NAMED, Named, as_recorded, names_record, same_names
from .sources import (
    EVERY_RUN_BUILDS,
    EVERY_RUN_WINDOW,
    attribute_files,
    new_every_run,
    stat_fields,
)

__all__ = [
    "FOLDER_SUFFIX",
    "MAX_ENTRIES",
    "attribute_source",
    "folder_digests",
    "folder_runs",
]

logger = logging.getLogger("mlcache")

#: a folder attribute's record ends with this (beside the packs)
FOLDER_SUFFIX = ".folder"
#: a folder attribute holding more entries than this is not walked (a home folder)
MAX_ENTRIES = 200_000
#: folders no walk enters: tools write there at every run
_SKIPPED = ("__pycache__",)
_WARNED_HUGE: set[tuple[str, str]] = set()


def attribute_source(
    values: Mapping[str, Any],
    owner: type,
    places: tuple[str, str, str | None],
    record: str | None,
    named: Callable[[], Named],
    local: bool = True,
    trusted: bool = False,
) -> tuple[str, dict[str, str]]:
    """What a dataset's key attributes (``values``) add to its source: the files
    they name (:func:`~mlcache.data.sources.attribute_files`) and, by
    :func:`folder_digests`, the files under the folders they name; ``""`` when
    none. ``places``: the packs' folder (``cache_dir``) and the folder the user
    chose (never walked), the declared source folder (an attribute naming it is the
    declaration: counted by it; a folder holding it is walked, its declared files
    named by the items). Also returns the digest of each folder attribute."""
    root, declared = places[0], places[2]
    files = attribute_files(values.values(), root, local)
    if declared is not None:  # the declaration itself (self.source_dir = root)
        values = {n: v for n, v in values.items() if not _names(v, declared)}
    never = [p for p in places[:2] if p]
    digests = folder_digests(values, owner, record, root, never, named, local, trusted)
    if not digests:
        return files, digests
    return hash_value(("folders", files, sorted(digests.items()))), digests


def _names(value: Any, folder: str) -> bool:
    """Whether ``value`` is a path of ``folder``."""
    try:
        return os.path.abspath(os.fsdecode(os.fspath(value))) == folder
    except (TypeError, ValueError):
        return False


def folder_digests(
    attributes: Mapping[str, Any],
    owner: type,
    record: str | None,
    root: str,
    never: Sequence[str],
    named: Callable[[], Named],
    local: bool = True,
    trusted: bool = False,
) -> dict[str, str]:
    """The digest of each folder attribute's files that no item names (see the
    module docstring); a folder of none is left out (its files count by item).

    ``record``: the prefix of the records' paths (None: nothing recorded, a remote
    cache); ``root``: the cache folder the records are written below; ``never``:
    folders never walked (the cache); ``named()``: the paths
    the items name, asked only when a folder is walked; ``trusted``
    (``check_source="never"``): the digest last recorded, without a ``stat``."""
    found: dict[str, str] = {}
    # a link's target is compared by its real path: the cache's, too
    skip = [os.path.join(f(p), "") for p in never for f in (os.path.abspath, os.path.realpath)]
    known: Named | None = None
    for name, value in attributes.items():
        if not isinstance(value, (str, os.PathLike)):
            continue
        try:
            folder = os.path.abspath(os.fsdecode(os.fspath(value)))
            if not S_ISDIR(os.stat(folder).st_mode):
                continue
        except (OSError, ValueError, TypeError):  # not a folder: a name, a file, a URL
            continue
        inside = os.path.join(folder, "")
        if any(inside.startswith(s) for s in skip):
            continue  # the cache: never counted
        if _huge(folder):
            found[name] = _said_huge(owner, name, folder)
            continue
        path = None if record is None else f"{record}-{slug(name)}{FOLDER_SUFFIX}"
        last = _read(path, folder) if path is not None else None
        if trusted and last is not None and isinstance(last.get("digest"), str):
            digest = last["digest"]
        else:
            recorded = _recorded(last) if last is not None else None
            if recorded is not None and last is not None and last.get("named") != NONE_NAMED:
                # files left out as named: only while the items name them still
                if known is None:
                    known = named()
                if not same_names(last, folder, known):
                    recorded = None
            digest = None if recorded is None else _digest(folder, recorded, local)
            walk = digest is None  # not recorded, or an entry became a folder since
            if walk:
                if known is None:
                    known = named()
                walked = _walk(folder, skip, known.paths)
                if walked is None:
                    found[name] = _said_huge(owner, name, folder)
                    continue
                recorded, dirs, began = walked
                last = {
                    "folder": folder,
                    "began": began,
                    "dirs": dirs,
                    "extras": recorded,
                    **names_record(folder, known),
                }
                digest = _digest(folder, recorded, local)
                if digest is None:  # a file became a folder during the walk: a miss
                    digest, path = f"changing:{began}", None
            # the key of the names the record holds for: the next open builds none
            rekey = (
                known is not None
                and last is not None
                and last.get("named") != NONE_NAMED
                and last.get("names_key") != known.key
            )
            if rekey and known is not None and last is not None:
                last["names_key"] = known.key
            changed = walk or rekey or (last is not None and last.get("digest") != digest)
            if path is not None and last is not None and changed:
                _record(path, root, {**last, "digest": digest})
        if digest:
            found[name] = digest
    return found


def _huge(folder: str) -> bool:
    """``/``, the home folder, or a folder holding it: never walked."""
    home = os.path.join(os.path.abspath(os.path.expanduser("~")), "")
    return folder == os.path.dirname(folder) or home.startswith(os.path.join(folder, ""))


def _said_huge(owner: type, name: str, folder: str) -> str:
    """One warning per attribute and process; the folder counts by its path."""
    key = (f"{owner.__module__}.{owner.__qualname__}", name)
    if key not in _WARNED_HUGE:
        _WARNED_HUGE.add(key)
        warn(
            f"mlcache: {owner.__qualname__}.{name} is the folder {folder}, too large to "
            f"fingerprint (more than {MAX_ENTRIES:,} entries, or a home or root folder): "
            "a change of the files in it is not seen. If load_item reads files there, "
            "declare them (source_dir and source_glob, items that name them, or "
            "source_fingerprint()); if it holds no source, leave it out of the key: "
            f"cache_ignore = ({name!r},)",
            stacklevel=6,
        )
    return f"huge:{folder}"


def _walk(
    folder: str, skip: Sequence[str], named: set[str]
) -> tuple[list[str], list[list[int | str]], int] | None:
    """The files under ``folder`` that ``named`` does not hold (nor a folder of
    theirs), relative and sorted; the stat of each folder walked (taken before
    its listing: a change during the walk leaves the record stale, so the next
    open walks again); when the walk began. None past :data:`MAX_ENTRIES`."""
    began = time.time_ns()
    extras: list[str] = []
    dirs: list[list[int | str]] = []
    stack, seen = [""], 0
    base = os.path.join(folder, "")
    walked: set[tuple[int, int]] = set()  # a link back to a folder walked: no loop
    while stack:
        rel = stack.pop()
        path = base + rel if rel else folder
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in walked:
                continue  # its files are counted where it was walked first
            walked.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(path))
        except OSError:  # gone, or unreadable: its absence counts
            continue
        dirs.append([rel, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
        seen += len(entries)
        if seen > MAX_ENTRIES:
            return None
        held = path in named or any(p in named for p in _parents(path, folder))
        prefix = f"{rel}/" if rel else ""
        for entry in entries:
            try:
                # a link to a folder is walked: its files are as much the source as
                # any (recorded as a file, its digest would be a constant)
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir:
                try:
                    link = entry.is_symlink()
                except OSError:
                    continue
                full = os.path.join(os.path.realpath(entry.path) if link else entry.path, "")
                if not (entry.name.startswith(".") or entry.name in _SKIPPED) and not any(
                    full.startswith(s) for s in skip
                ):
                    stack.append(prefix + entry.name)
            elif not held and entry.path not in named:
                extras.append(prefix + entry.name)
    extras.sort()
    return extras, dirs, began


def _parents(path: str, top: str) -> Iterable[str]:
    """The folders from ``path`` up to ``top`` (an item naming one holds its files)."""
    while len(path) > len(top):
        path = os.path.dirname(path)
        yield path


def _digest(folder: str, extras: Sequence[str], local: bool) -> str | None:
    """Paths and :func:`stat_fields` of ``extras`` (``""`` when there are none);
    None when one is a folder now (a link retargeted, a file replaced): its
    files count only by a new walk, never by a constant."""
    if not extras:
        return ""
    base, stats = os.path.join(folder, ""), array("q")
    for rel in extras:
        try:
            st = os.stat(base + rel)
        except OSError:  # removed meanwhile: its absence counts
            stats.extend((-1, -1, -1, -1))
            continue
        if S_ISDIR(st.st_mode):
            return None
        stats.extend(stat_fields(st, local) if S_ISREG(st.st_mode) else (-2, 0, 0, 0))
    digest = xxhash.xxh3_128(folder.encode("utf-8", "surrogateescape"))
    digest.update("\0".join(extras).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    return digest.hexdigest()


def _record(path: str, root: str, record: dict[str, Any]) -> None:
    """Record a walk of a folder and the digest it gave (never raises: the next
    open walks again)."""
    try:
        body = json.dumps(record).encode("utf-8", "surrogateescape")
        data = body + b"\n" + xxhash.xxh3_64_hexdigest(body).encode()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_bytes_atomic(path, data, durable=False, root=root)
    except (OSError, ValueError) as exc:
        logger.debug("mlcache: could not record the walk of %s: %s", record.get("folder"), exc)


def _read(path: str, folder: str) -> dict[str, Any] | None:
    """The record of ``folder``'s last walk, or None (missing, damaged, another folder)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        body, _, check = data.rpartition(b"\n")
        if xxhash.xxh3_64_hexdigest(body).encode() != check:
            return None
        found = json.loads(body.decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("folder") == folder else None


def _recorded(found: dict[str, Any]) -> list[str] | None:
    """The files no item names, as recorded by the last walk of a folder, if every
    folder walked is as it was then (one ``stat`` each) and the record can be
    trusted (see the module docstring); else None (walk again)."""
    try:
        folder, began, dirs, extras = (
            found["folder"],
            int(found["began"]),
            found["dirs"],
            found["extras"],
        )
        base = os.path.join(folder, "")
        for rel, dev, ino, mtime, ctime in dirs:
            st = os.stat(base + rel if rel else folder)
            if not as_recorded(st, (dev, ino, mtime, ctime), began):
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not dirs or not all(isinstance(e, str) for e in extras):
        return None
    return list(extras)


# -- an output folder: new files at every run ------------------------------------------
_WARNED_EVERY_RUN: set[tuple[type, str]] = set()


def folder_runs(args_path: str, digests: Mapping[str, str], owner: type) -> list[Any]:
    """The folder digests of the last builds of these attributes (read from the
    attributes' record ``args_path``), this build's appended: to record there.
    When each of the last :data:`~mlcache.data.sources.EVERY_RUN_BUILDS` builds,
    by as many runs within the hour, found other files in the same folder
    attribute (:func:`~mlcache.data.sources.new_every_run`, as for an attribute
    new at every run), one warning names it: an output folder that training
    writes into makes a new pack at every run (a miss, never a stale sample),
    and belongs in ``cache_ignore``."""
    now, pid = time.time(), os.getpid()
    try:
        with open(args_path, "rb") as f:
            before = json.loads(f.read()).get("folders", [])
        runs = [
            r
            for r in before
            if now - float(r["t"]) < EVERY_RUN_WINDOW
            and isinstance(r["d"], dict)
            and isinstance(r["pid"], int)
        ]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        runs = []
    runs = [*runs[-(EVERY_RUN_BUILDS - 1) :], {"t": now, "pid": pid, "d": dict(digests)}]
    new = new_every_run([(float(r["t"]), r["pid"], r["d"]) for r in runs], now)
    for name in sorted(new & set(digests)):
        if (owner, name) in _WARNED_EVERY_RUN:
            continue
        _WARNED_EVERY_RUN.add((owner, name))
        warn(
            f"mlcache: {owner.__qualname__}: the folder attribute {name!r} held other "
            f"files at each of the last {EVERY_RUN_BUILDS} runs, so "
            "each built a new pack (a miss, never a stale sample); if it is not where "
            "the samples come from (an output folder that training writes into), leave "
            f"it out of the key: cache_ignore = ({name!r},); or define "
            "source_fingerprint()",
            stacklevel=8,
        )
    return runs
