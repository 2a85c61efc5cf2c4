"""What a :class:`~mlcache.data.CachedDataset` is keyed by besides its code and
attributes: the fingerprint of its source (the files and items it loads), and the
module-level values its builds change (state, remembered in the class's folder
of packs so that they count by type only).

Nothing here opens or builds a pack: :mod:`mlcache.data.cached` does, with these.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
import re
import shutil
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from stat import S_ISREG
from typing import Any

import xxhash

from .._atomic import write_bytes_atomic
from ..errors import warn
from ..keys.hashing import hash_value
from .format import is_newer_pack
from .replaced import forget_records, same_code

__all__ = [
    "CHECKS",
    "EVERY_RUN_BUILDS",
    "EVERY_RUN_WINDOW",
    "GRACE_SECONDS",
    "NO_NAME",
    "UNUSED_PACKS_KEPT_FOR",
    "DeclaredSource",
    "SourceRecord",
    "add_stats",
    "attribute_files",
    "attributes_first",
    "candidates",
    "check_mode",
    "existing_path",
    "files_digest",
    "items_digest",
    "new_every_run",
    "path_parts",
    "paths_digest",
    "remove_older_versions",
    "remove_pack",
    "source_fingerprint",
    "stat_fields",
    "warn_if_new_every_run",
]

logger = logging.getLogger("mlcache")

#: builds of one class by this many runs, within this many seconds, each with a new
#: value of the same attribute (or other files in a folder attribute), make a
#: warning naming it (see cache_ignore)
EVERY_RUN_BUILDS = 3
EVERY_RUN_WINDOW = 3600.0
_WARNED_EVERY_RUN: set[tuple[type, frozenset[str]]] = set()
#: an older version of a pack is removed once it has not been rebuilt for this long
GRACE_SECONDS = 600.0
#: a pack of other attributes goes once it has not been opened for this long: as
#: long as the function cache keeps results of an old code version
#: (``mlcache.memo.versions.OLD_VERSIONS_KEPT_FOR``, a test checks they agree); the
#: data package does not import the function cache, its sibling layer
UNUSED_PACKS_KEPT_FOR = 30 * 86400


#: the values of ``CachedDataset(check_source=...)``
CHECKS = ("open", "background", "never")


@contextlib.contextmanager
def attributes_first(dataset: Any) -> Iterator[None]:
    """An attribute of ``dataset`` that its own methods read while it opens (in
    ``super().__init__()``) but that is not set yet, is an ``AttributeError``
    that says what to do, instead of a bare one from inside ``load_source()``."""
    try:
        yield
    except AttributeError as exc:
        name = exc.name
        if exc.obj is not dataset or name is None or name in vars(dataset):
            raise
        cls = type(dataset).__qualname__
        raise AttributeError(
            f"{cls}.{name} is not set when the dataset opens: set the attributes its "
            f"methods use (self.{name} = ...) before calling super().__init__() in "
            f"{cls}.__init__, since opening reads the source and may build the pack",
            name=name,
            obj=dataset,
        ) from exc


def check_mode(check_source: object) -> None:
    """A clear error for a ``check_source`` that is not one of :data:`CHECKS`."""
    if not isinstance(check_source, str) or check_source not in CHECKS:
        choices = ", ".join(map(repr, CHECKS))
        raise ValueError(f"check_source must be one of {choices}, got {check_source!r}")


class DeclaredSource:
    """The files a dataset declares it is built from: those of ``folder`` whose
    name matches ``pattern`` (one listing, one ``stat`` each; sorted by name),
    or ``paths`` (in their order). Its :meth:`digest` is :func:`files_digest` of
    :meth:`files`, so declaring the source of a ``sorted(Path(root).glob(...))``
    changes no key."""

    def __init__(
        self,
        folder: str | os.PathLike[str] | None,
        pattern: str | None,
        paths: Iterable[str | os.PathLike[str]] | None,
    ) -> None:
        if (folder is None) == (paths is None):
            raise TypeError(
                "declare the source by source_dir (and source_glob) or by source_paths, "
                f"one of the two: got source_dir={folder!r}, source_paths={paths!r} (in "
                "__init__, set them before calling super().__init__(), which opens the "
                "dataset)"
            )
        if pattern is not None and (not isinstance(pattern, str) or "/" in pattern):
            raise ValueError(
                f"source_glob must be a pattern of file names in source_dir (no '/'), "
                f"got {pattern!r}"
            )
        if paths is not None and isinstance(paths, (str, bytes, os.PathLike)):
            raise TypeError(f"source_paths must be a list of paths, got {paths!r}")
        self.folder = None if folder is None else os.path.abspath(os.fspath(folder))
        self.pattern = pattern or "*"
        self.paths = None if paths is None else tuple(os.path.abspath(p) for p in paths)

    @classmethod
    def of(
        cls,
        given: tuple[Any, Any, Any],
        attributes: tuple[Any, Any, Any],
        name: str,
        own: tuple[bool, bool],
    ) -> DeclaredSource | None:
        """The source declared by the constructor's ``(source_dir, source_glob,
        source_paths)``, else by the dataset's attributes of these names; or None.
        ``own``: whether the class defines ``source_files()`` and ``source_items()``:
        then attributes of these names are its own business, not a declaration
        (a class of before declared sources keeps its key), and a declaration
        by the constructor along with ``source_files()`` is an error."""
        folder, pattern, paths = given
        if not any(own):
            if folder is None and paths is None:
                folder, paths = attributes[0], attributes[2]
            pattern = pattern if pattern is not None else attributes[1]
        if folder is None and paths is None and pattern is None:
            return None
        if own[0]:
            raise TypeError(
                f"{name}: declare the source or define source_files(), not both "
                "(with a declared source, source_files() returns its files)"
            )
        return cls(folder, pattern, paths)

    def __repr__(self) -> str:
        what = self.paths if self.folder is None else (self.folder, self.pattern)
        return f"DeclaredSource({what!r})"

    def token(self) -> str:
        """The declaration itself (not the files): what a recorded fingerprint is for."""
        return hash_value(("declared", self.folder, self.pattern, self.paths))

    def listed(self, local: bool = True) -> tuple[list[str], array]:
        """The files and, for a folder, their :func:`stat_fields` (four each).

        The folder is listed by ``os.listdir`` and each name that matches is
        stat'ed once (a folder or other non-file is then left out): with one stat
        per file anyway, ``os.scandir``'s entries cost ~10% more than the names."""
        if self.paths is not None:
            return list(self.paths), array("q")
        assert self.folder is not None
        names = os.listdir(self.folder)
        suffix = self.pattern[1:]
        if self.pattern.startswith("*") and not any(c in suffix for c in "*?["):
            names = [n for n in names if n.endswith(suffix)]  # "*.csv": no regex
        else:
            match = re.compile(fnmatch.translate(self.pattern)).match
            names = [n for n in names if match(n)]
        names.sort()
        base, stat, regular = os.path.join(self.folder, ""), os.stat, S_ISREG
        paths, stats, left_out = [base + n for n in names], array("q"), set()
        add = stats.extend
        for path in paths:  # the one cost that grows with the dataset: one stat a file
            try:
                st = stat(path)
            except FileNotFoundError:  # removed meanwhile: its absence counts
                left_out.add(path)
                continue
            if not regular(st.st_mode):
                left_out.add(path)
                continue
            # inlined stat_fields (the one loop that grows with the dataset)
            add(
                (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                if local
                else (st.st_size, st.st_mtime_ns, 0, 0)
            )
        return ([p for p in paths if p not in left_out] if left_out else paths), stats

    def files(self) -> list[str]:
        """The declared files, as absolute paths."""
        return self.listed()[0]

    def digest(self, local: bool = True) -> str:
        """Paths and :func:`stat_fields` of the files, as :func:`files_digest`."""
        paths, stats = self.listed(local)
        if self.paths is not None:
            return files_digest(paths, local)
        return paths_digest(paths, stats).hexdigest()


class SourceRecord:
    """The source fingerprint a dataset's last open found, in its folder of packs
    (``.<attributes>-<declaration>.source``): ``check_source="background"`` and
    ``"never"`` name the pack by it instead of fingerprinting the source first."""

    def __init__(
        self, root: str, folder: str, args_id: str, declared: DeclaredSource | None
    ) -> None:
        token = declared.token() if declared is not None else hash_value("undeclared")
        name = f".{args_id[:32]}-{token[:16]}.source"
        self.root, self.path = root, os.path.join(folder, name)

    def read(self) -> str | None:
        try:
            with open(self.path, "rb") as f:
                found = json.loads(f.read()).get("source")
        except (OSError, ValueError, AttributeError):  # none, or unreadable: fingerprinted
            return None
        return found if isinstance(found, str) else None

    def write(self, fingerprint: Any) -> None:
        if not isinstance(fingerprint, str) or self.read() == fingerprint:
            return  # a fingerprint that is not a str is not recorded: checked at open
        try:
            data = json.dumps({"source": fingerprint}).encode()
            write_bytes_atomic(self.path, data, durable=False, root=self.root)
        except OSError as exc:  # the next open fingerprints the source again
            logger.debug("mlcache: could not record the source fingerprint: %s", exc)

    def check_in_background(
        self, dataset: Any, opened: str, fingerprint: Callable[[], str] | None = None
    ) -> None:
        """Fingerprint ``dataset``'s source (``fingerprint()``, default its
        ``source_fingerprint()``) in a daemon thread; if it is not ``opened``: set
        its ``is_stale``, record the new fingerprint (the next open rebuilds, or
        re-reads the changed items) and warn (a :class:`CacheWarning`: the log record
        alone is silent where logging is not configured, and this run trains on
        the old samples)."""
        what = f"{type(dataset).__qualname__} ({dataset.pack_path})"
        fingerprint = fingerprint or dataset.source_fingerprint

        def check() -> None:
            try:
                now = fingerprint()
            except Exception as exc:  # a source gone: the next open says so
                logger.warning("mlcache: could not check the source of %s: %s", what, exc)
                return
            if now != opened:
                dataset.is_stale = True
                self.write(now)
                warn(
                    f"mlcache: the source of {what} changed since its pack was built: this "
                    "open serves the old pack (is_stale is True), the next open rebuilds it"
                )

        #: the check (tests join it); not sent with the dataset to a worker
        self.thread = threading.Thread(target=check, name="mlcache-source-check", daemon=True)
        self.thread.start()


def stat_fields(st: os.stat_result, local: bool = True) -> tuple[int, int, int, int]:
    """What a file's ``stat`` says of its content: size, modification time, and
    (``local``) inode and change time, from the same call at no extra cost.

    The last two catch a file replaced by one of equal size and modification
    time (``cp -p``, ``rsync -t``, ``tar x``, a checkout that restores times):
    the copy is a new inode, or its ctime (which no user call can set) moved.
    They are this machine's: a pack in a remote ``cache_dir``, shared by
    machines that each hold their own copy of the files, counts size and
    modification time only (``local=False``), or each machine would refill it
    for the others."""
    if local:
        return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns
    return st.st_size, st.st_mtime_ns, 0, 0


def source_fingerprint(
    files: Iterable[str | os.PathLike[str]] | None,
    items: Callable[[], Iterable[Any]] | None,
    bases: Sequence[str] = (),
    local: bool = True,
) -> str:
    """The default source fingerprint of a dataset (see
    :meth:`~mlcache.data.CachedDataset.source_fingerprint`): ``files`` by path and
    :func:`stat_fields`, then, when the dataset defines its own items,
    ``items()`` by value and the files they name (relative to ``bases`` too)."""
    found = "" if files is None else files_digest(files, local)
    if items is None:
        return found  # the items are the files: counted above
    return hash_value(("items", found, items_digest(items(), bases, local)))


def paths_digest(paths: Sequence[str], stats: array) -> xxhash.xxh3_128:
    """The running hash (``xxh3_128``) of ``paths`` and their :func:`stat_fields`
    (``stats``, four each): the digest every listing of source files is kept by."""
    digest = xxhash.xxh3_128("\0".join(paths).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    return digest


def files_digest(files: Iterable[str | os.PathLike[str]], local: bool = True) -> str:
    """Paths and :func:`stat_fields` of ``files`` (which must exist)."""
    paths, stats = [], array("q")
    for f in files:  # the one cost that grows with the dataset when opening it
        path = os.fspath(f)
        if not os.path.isabs(path):
            path = os.path.abspath(path)
        paths.append(path)
        stats.extend(stat_fields(os.stat(path), local))
    return paths_digest(paths, stats).hexdigest()


#: how deep :func:`path_parts` looks into an item (``{"image": [(p, q)]}`` is 3)
_PARTS_DEPTH = 4
#: items that name no file, told at once (``range(n)``'s rows: ~2 µs an item otherwise)
NO_NAME = frozenset({int, float, bool, complex, type(None)})


def path_parts(item: Any, depth: int = 0) -> Iterator[Any]:
    """The parts of ``item`` that may name a file: the item itself if it is a
    ``str`` or path; else the values of a dict (the MONAI datalist's ``{"image":
    p, "label": y}``; not its keys, which name fields), the members of a tuple
    or list (``(path, label)``, a namedtuple) and the fields of a dataclass, a
    few levels deep. Other values (numbers, arrays, sets) name no file."""
    if item.__class__ in NO_NAME:
        return
    if isinstance(item, (str, os.PathLike)):
        yield item
        return
    if depth >= _PARTS_DEPTH:
        return
    if isinstance(item, (tuple, list)):
        parts: Iterable[Any] = item
    elif isinstance(item, Mapping):
        parts = item.values()
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        parts = [getattr(item, f.name) for f in dataclasses.fields(item)]
    else:
        return
    for part in parts:
        if isinstance(part, (str, os.PathLike)):  # the common part: no generator
            yield part
        else:
            yield from path_parts(part, depth + 1)


def items_digest(items: Iterable[Any], bases: Sequence[str] = (), local: bool = True) -> str:
    """The items of ``source_items()``: by value (their order and count too), and
    every existing file or folder they name by its path and :func:`stat_fields`:
    an item that is a path, or any part of it :func:`path_parts` finds (``(path,
    label)``, ``{"image": path, "label": y}``), or a name relative to one of
    ``bases`` (the dataset's own folder attributes, for ``os.listdir(self.root)``).
    A folder counts by every file in it (editing ``p0/a.txt`` changes nothing of
    ``p0`` itself)."""
    items = list(items)
    paths, stats = [], array("q")
    for item in items:
        for part in path_parts(item):
            path = existing_path(part, bases)
            if path is None:
                continue
            paths.append(path)
            add_stats(path, paths, stats, local)
    digest = paths_digest(paths, stats)
    digest.update(hash_value(items).encode())
    return digest.hexdigest()


def existing_path(part: Any, bases: Sequence[str]) -> str | None:
    """``part`` as the absolute path of an existing file or folder, or None: the
    first of its :func:`candidates` that exists."""
    try:
        for candidate in candidates(part, bases):
            if os.path.exists(candidate):
                return os.path.abspath(candidate)
    except (OSError, ValueError, TypeError):
        return None
    return None


def candidates(part: Any, bases: Sequence[str]) -> tuple[str, ...]:
    """The paths ``part`` may name, in the order :func:`existing_path` tries
    them (the name, then the name under each of ``bases``); none for a part that
    is no name. No ``stat``."""
    if not isinstance(part, (str, os.PathLike)):
        return ()
    try:
        name = os.fsdecode(os.fspath(part))
    except (ValueError, TypeError):
        return ()
    if not name or "\0" in name:
        return ()
    if name[0] == os.sep:  # under any base, the same path: tried once
        return (name,)
    return (name, *(os.path.join(b, name) for b in bases))


def add_stats(path: str, paths: list[str], stats: array, local: bool = True) -> None:
    """:func:`stat_fields` of ``path``; of a folder, of each file in it too."""
    st = os.stat(path)
    stats.extend(stat_fields(st, local))
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
            stats.extend(stat_fields(st, local))


def attribute_files(values: Iterable[Any], root: str, local: bool = True) -> str:
    """The regular files that ``values`` (a dataset's key attributes) name, by
    path and :func:`stat_fields`, or ``""`` when they name none: the
    ``self.path = "table.npy"`` that ``load_item(i)`` reads rows of.

    Only ``str`` and path values count, and only existing regular files outside
    the cache folder ``root``; a folder attribute counts through the items that
    name files in it (a folder also holds outputs, logs and caches, which would
    make every open a miss, and walking it would cost a ``stat`` per file the
    items do not use)."""
    inside = os.path.join(root, "")
    paths, stats = [], array("q")
    for value in values:
        if not isinstance(value, (str, os.PathLike)):
            continue
        try:
            st = os.stat(value)
            path = os.path.abspath(os.fsdecode(os.fspath(value)))
        except (OSError, ValueError, TypeError):  # not a file: a name, a label, a URL
            continue
        if S_ISREG(st.st_mode) and not path.startswith(inside):
            paths.append(path)
            stats.extend(stat_fields(st, local))
    if not paths:
        return ""
    return paths_digest(paths, stats).hexdigest()


# -- attributes: one that is new at every run --------------------------------------
def new_every_run(runs: Sequence[tuple[float, Any, Mapping[str, Any]]], now: float) -> set[str]:
    """The names whose digest was new at each of the last :data:`EVERY_RUN_BUILDS`
    of ``runs`` (when, which process, a digest by name; sorted by time, this
    run's last), when those were made by as many processes within
    :data:`EVERY_RUN_WINDOW` of ``now``; empty otherwise. A name missing from a
    run counts as one more value."""
    recent = [r for r in runs if now - r[0] < EVERY_RUN_WINDOW][-EVERY_RUN_BUILDS:]
    if len(recent) < EVERY_RUN_BUILDS or len({r[1] for r in recent}) < len(recent):
        return set()
    names = {n for _, _, d in recent for n in d}
    return {n for n in names if len({d.get(n) for _, _, d in recent}) == len(recent)}


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
            if now - when < EVERY_RUN_WINDOW:
                with open(path, "rb") as f:
                    data = json.loads(f.read())
                pid, attrs = data.get("pid"), data.get("attrs")
                if isinstance(pid, int) and pid != os.getpid() and isinstance(attrs, dict):
                    others.append((when, data["pid"], data["attrs"]))
    runs = sorted([*others, (now, os.getpid(), mine)], key=lambda r: r[0])
    differ = new_every_run(runs, now)
    last = [a for _, _, a in runs[-EVERY_RUN_BUILDS:]]
    if not differ or any(set(a) != set(mine) for a in last):
        return
    same = all(a[n] == mine[n] for a in last for n in mine if n not in differ)
    key = (cls, frozenset(differ))
    if same and key not in _WARNED_EVERY_RUN:
        _WARNED_EVERY_RUN.add(key)
        names = ", ".join(repr(n) for n in sorted(differ))
        plural = "s" if len(differ) > 1 else ""
        warn(
            f"mlcache: {cls.__qualname__}: the attribute{plural} {names} had a new "
            f"value in each of the last {EVERY_RUN_BUILDS} runs, so each built a new pack (unused "
            "packs are removed after 30 days); if it does not change the samples, leave it "
            f"out of the key: cache_ignore = ({names},)",
            stacklevel=8,  # the subclass's super().__init__(), through the build
        )


# -- which packs are kept ------------------------------------------------------------
def remove_pack(path: str) -> bool:
    """Delete a pack (a reader that has it mapped keeps its map), and the records
    of its filling (``<pack>.fill/``); False, and nothing removed, for a pack a
    newer mlcache wrote (never this one's to remove: a cache shared
    mid-upgrade). Its lock file stays: a builder may hold it, and a new lock
    file would let a second build in."""
    if is_newer_pack(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    shutil.rmtree(path + ".fill", ignore_errors=True)
    forget_records(path)
    return True


def remove_older_versions(pack_path: str, args_id: str) -> None:
    """Delete the packs ``pack_path`` replaces (same attributes ``args_id`` and
    code, an older source) once they are :data:`GRACE_SECONDS` old, and the
    packs (and records) of other code or attributes not opened for
    :data:`UNUSED_PACKS_KEPT_FOR` (as the function cache does with code
    versions: two scripts with a dataset class of one name keep theirs); a
    process still reading one keeps its map (the file goes when it closes)."""
    folder, mine = os.path.split(pack_path)
    now = time.time()
    for name in os.listdir(folder):
        if name.startswith(".") and name.endswith(".pack.code"):
            # a pack's code, written once the pack is there: goes with it
            if not os.path.exists(os.path.join(folder, name[1:-5])):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
            continue
        ours = name.startswith(args_id + "-")
        sidecar = name.startswith(".") and name.endswith(
            (".args", ".source", ".listing", ".folder")
        )
        # the records of a version being filled go with it (or alone, if never sealed)
        pack = name.removesuffix(".fill")
        if not (pack.endswith(".pack") or sidecar) or pack == mine:
            continue
        if sidecar and name.startswith(f".{args_id}"):
            continue
        path = os.path.join(folder, name)
        try:
            age = now - os.stat(path, follow_symlinks=False).st_mtime
            replaced = ours and same_code(pack_path, os.path.join(folder, pack))
            if age < (GRACE_SECONDS if replaced else UNUSED_PACKS_KEPT_FOR):
                continue  # maybe another job's current version: leave it a while
            if sidecar:
                os.unlink(path)
                continue
            if pack != name and os.path.exists(os.path.join(folder, pack)):
                continue  # the pack's own age decides for both
            remove_pack(os.path.join(folder, pack))
        except OSError as exc:  # housekeeping: never fail the build for it
            logger.debug("mlcache: could not remove %s: %s", name, exc)
        else:
            logger.info("mlcache: removed the %s pack %s", "older" if ours else "unused", name)
