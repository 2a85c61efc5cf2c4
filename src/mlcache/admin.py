"""What a cache folder holds: functions (through the store) and dataset packs.

The ``mlcache`` command's ``ls``, ``info``, ``clear``, ``prune`` and ``verify``
are built on these; they are plain functions returning data, so scripts can
use them too.

Which packs mlcache can rebuild: a pack a :class:`~mlcache.data.CachedDataset`
built (its ``load_source()`` makes it again at the next open) is cache; a pack
written by :func:`mlcache.data.pack` is the user's data, which only the user's
code can make again. ``prune`` and ``verify(fix=True)`` remove only the first
kind unless asked (``all_packs=True``); ``clear`` removes what it is told to.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ._util import progress as _progress
from .data.cached import remove_pack
from .data.format import is_newer_pack
from .data.holdings import build_time, dataset_class, pack_paths, pack_usage
from .data.reader import PackedDataset
from .data.replaced import in_use, replaced_by
from .entry import open_entry, read_entry_info
from .errors import (
    EntryCorrupted,
    EntryNotFound,
    EntrySignatureError,
    NewerFormat,
    PackCorrupted,
    UnknownFormat,
)
from .memo.eviction import EntryCosts, Inflation, Worth, plan_eviction
from .memo.layout import cached_objects, entries, is_entry, is_stats
from .memo.memory import Memory
from .memo.usage import FunctionStats
from .store import EntryStat

__all__ = [
    "PROGRESS_FROM",
    "Cleared",
    "Damage",
    "PackInfo",
    "Pruned",
    "clear",
    "dataset_class",
    "find_function",
    "find_pack",
    "find_packs",
    "function_entries",
    "functions",
    "pack_entries",
    "packs",
    "prune",
    "remove",
    "verify",
    "verify_packs",
]

#: verify and prune show progress (on a terminal) from this many items
PROGRESS_FROM = 100

_T = TypeVar("_T")


def _steps(items: list[_T], desc: str, show: bool) -> Iterable[_T]:
    return _progress(items, desc, unit=" items", enabled=show and len(items) >= PROGRESS_FROM)


@dataclasses.dataclass
class PackInfo:
    """One dataset pack found under a cache folder."""

    path: str
    name: str  #: path relative to the cache folder
    size: int
    #: epoch seconds of its last use: opening a dataset refreshes its pack's
    #: modification time (as the function cache's last-use times)
    last_used: float
    #: the class (``module.qualname``) of the CachedDataset that built it, which
    #: rebuilds it when it is gone; "" for a pack written by ``pack()``
    dataset: str = ""
    samples: int | None = None  #: None when the pack cannot be opened
    version: int | None = None  #: the pack format version
    fields: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str = ""  #: why it cannot be opened, in plain words
    #: the newer pack of the same dataset that replaced this one (it is removed
    #: once no process reads it), or None: the current one
    replaced_by: str | None = None
    hits: int = 0  #: opens that found it built
    misses: int = 0  #: its builds (recorded since this mlcache records them)
    computed: float = 0.0  #: seconds its builds took
    saved: float = 0.0  #: seconds of building its hits avoided (hits x build time)

    @property
    def rebuildable(self) -> bool:
        """mlcache can make it again: a CachedDataset built it, or it is this machine's
        copy of a remote pack (``remote-packs/``: fetched again at its next open)."""
        return bool(self.dataset) or self.name.split(os.sep, 1)[0] == "remote-packs"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"rebuildable": self.rebuildable}


def functions(mem: Memory) -> list[FunctionStats]:
    """Every function cached in ``mem``, sorted by identity."""
    return sorted(mem.stats().values(), key=lambda st: st.func)


def find_function(mem: Memory, name: str) -> FunctionStats | None:
    """The function whose identity or folder is ``name``, or the only one ending
    with ``.name`` (a script's functions, ``__main__.f@/path/f.py``, are matched
    without their ``@path``); ``ValueError`` naming the candidates when several do."""
    everything = functions(mem)
    exact = [st for st in everything if name in (st.func, st.folder)]
    if exact:
        return exact[0]
    found = [
        st
        for st in everything
        if any(f == name or f.endswith("." + name) for f in (st.func, st.func.split("@")[0]))
    ]
    if len(found) > 1:
        names = ", ".join(st.func for st in found)
        raise ValueError(f"{name!r} names several functions: {names}; give the full name")
    return found[0] if found else None


def function_entries(mem: Memory, st: FunctionStats) -> list[dict[str, Any]]:
    """The entries of one function: key, arguments, size, creation time (from the
    entry's own metadata), last use, compute time."""
    assert mem.store is not None
    rows = []
    for e in cached_objects(mem.store, st.folder):
        if not is_entry(e.name):
            continue
        try:
            info = read_entry_info(mem.store, e.name)
        except Exception as exc:  # damaged: shown, not fatal
            info = {"error": str(exc)}
        rows.append(
            {
                "key": e.name.rpartition("/")[2],
                "args": info.get("input_args", {}),
                "size": e.size,
                "created": info.get("time"),
                "last_used": e.last_used,
                "duration": info.get("duration"),
                **({"error": info["error"]} if "error" in info else {}),
            }
        )
    return sorted(rows, key=lambda r: -r["last_used"])


def packs(location: str, *, detail: bool = True) -> list[PackInfo]:
    """The dataset packs under ``location`` (opening each is O(1))."""
    found = (_describe(path, location, detail) for path in sorted(pack_paths(location)))
    return [p for p in found if p is not None]


def _describe(path: str, location: str, detail: bool) -> PackInfo | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    info = PackInfo(
        path=path,
        name=os.path.relpath(path, location),
        size=st.st_size,
        last_used=max(st.st_atime, st.st_mtime),
        dataset=dataset_class(path),
    )
    if info.dataset:
        info.replaced_by = replaced_by(path)
        done = pack_usage(path)
        info.hits, info.misses = int(done["hits"]), int(done["misses"])
        info.computed, info.saved = done["computed"], done["saved"]
    if detail:
        try:
            ds = PackedDataset(path)
            info.samples = len(ds)
            info.version = int(ds.pack_index.get("version", 0))
            info.fields = [
                {k: v for k, v in f.items() if k in ("name", "kind", "dtype", "shape", "ndim")}
                | {"nullable": "valid" in f}
                for f in ds.pack_index["fields"]
            ]
        except PackCorrupted as exc:
            info.error = plain_reason(str(exc))
        except NewerFormat:
            info.error = "written by a newer mlcache (a newer pack format): upgrade to read it"
        except OSError as exc:
            info.error = f"cannot be read ({exc.strerror or exc})"
    return info


def _names(p: PackInfo) -> set[str]:
    return {p.name, os.path.basename(p.path), p.path}


def find_packs(location: str, name: str) -> list[PackInfo]:
    """The packs ``name`` names (only those are opened): one by its relative path,
    file name or path, or every pack of a CachedDataset class by the class's name
    (``Patients``), its qualified name or any dotted end of it."""
    everything = packs(location, detail=False)
    by_path = [p for p in everything if name in _names(p) or p.path == os.path.abspath(name)]
    chosen = by_path[:1] or [
        p for p in everything if p.dataset and (p.dataset == name or p.dataset.endswith("." + name))
    ]
    return [d for d in (_describe(p.path, location, True) for p in chosen) if d is not None]


def find_pack(location: str, name: str) -> PackInfo | None:
    """The first pack :func:`find_packs` finds, or None."""
    found = find_packs(location, name)
    return found[0] if found else None


def pack_entries(location: str) -> list[EntryStat]:
    """The packs as :class:`EntryStat` rows (name relative to ``location``), for
    eviction plans."""
    return [EntryStat(p.name, p.size, p.last_used) for p in packs(location, detail=False)]


@dataclasses.dataclass
class Cleared:
    """What :func:`clear` removed (or, with ``dry_run``, would remove)."""

    functions: list[FunctionStats]
    packs: list[PackInfo]

    @property
    def names(self) -> list[str]:
        """The functions' identities, then the packs' names."""
        return [st.func or st.folder for st in self.functions] + [p.name for p in self.packs]

    @property
    def size(self) -> int:
        """Bytes removed."""
        return sum(st.size for st in self.functions) + sum(p.size for p in self.packs)


def clear(
    mem: Memory, location: str, name: str | None = None, *, dry_run: bool = False
) -> Cleared | None:
    """Remove every function result and dataset pack of the cache (``name`` None),
    or what ``name`` names: one function (see :func:`find_function`), else the
    packs of :func:`find_packs`; None when nothing has that name. With
    ``dry_run``, only say what would go."""
    if name is None:
        funcs, found = functions(mem), packs(location, detail=False)
        # a newer mlcache's pack is not this one's to remove (a cache shared
        # mid-upgrade): it stays, and is not said to go
        found = [p for p in found if not is_newer_pack(p.path)]
        if not dry_run:
            mem.clear(warn=False)
            for p in found:
                remove_pack(p.path)
        return Cleared(funcs, found)
    st = find_function(mem, name)
    if st is not None:
        if not dry_run:
            mem.remove_function(st.folder)
        return Cleared([st], [])
    chosen = [p for p in find_packs(location, name) if not is_newer_pack(p.path)]
    if not chosen:
        return None
    if not dry_run:
        for p in chosen:
            remove_pack(p.path)
    return Cleared([], chosen)


# -- verify -----------------------------------------------------------------------------
# what the readers' messages mean, said without the format's words
_PLAIN = [
    (
        r"checksum mismatch in block|payload checksum mismatch|between regions",
        "its data changed "
        "after it was written (damaged on disk, or in a copy): it does not read back as written",
    ),
    (
        r"header checksum mismatch|truncated header|reserved header|header flags|header longer",
        "its first bytes (which say what the file holds) are damaged",
    ),
    (
        r"index checksum mismatch|bad index|bad field in the index|block table|segment table|"
        r"bad layout|validity table|bad offsets|bad shapes|impossible|wrong length|"
        r"outside the file|wrong size|unknown kind|has dtype|missing segment|bad block size",
        "its table of contents (which says where each part lies) is damaged",
    ),
    (
        r"truncated|does not match the header|header says",
        "the file is incomplete or has extra bytes (an interrupted write or copy)",
    ),
    (r"bad magic", "it is not an mlcache file (it starts with other bytes)"),
    (r"not UTF-8", "a text value is damaged (its bytes are not text)"),
    (r"rewritten in place", "the file was rewritten while it was read"),
]


def plain_reason(message: str) -> str:
    """What damage a reader's message (``EntryCorrupted``, ``PackCorrupted``) means,
    in plain words; the message itself when it is none of the known ones."""
    for pattern, text in _PLAIN:
        if re.search(pattern, message):
            return text
    return message


@dataclasses.dataclass
class Damage:
    """One damaged (or unreadable) entry or pack that :func:`verify` found."""

    name: str  #: the entry's name in the store, or the pack's relative path
    kind: str  #: ``"entry"`` or ``"pack"``
    reason: str  #: what is wrong, in plain words
    detail: str  #: the reader's own message
    removed: bool = False
    #: mlcache makes it again when it is gone (entries: the next call; packs:
    #: the CachedDataset's next open); False for a pack written by ``pack()``
    rebuildable: bool = True
    #: it cannot be read (permissions, a newer format): not damage, never removed
    unreadable: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_entries(
    mem: Memory, found: list[EntryStat], fix: bool, step: Callable[[], None]
) -> list[Damage]:
    store = mem.store
    assert store is not None
    signer = mem.context.signer if mem.context is not None else None
    damaged = []
    for e in found:
        step()
        try:  # reads and checks every byte; statistics are numbers, never signed
            open_entry(store, e.name, signer=None if is_stats(e.name) else signer)
        except EntrySignatureError as exc:
            reason = "its signature does not match this cache's secret key (written with "
            reason += "another key, or changed since)"
            damaged.append(Damage(e.name, "entry", reason, str(exc)))
        except EntryCorrupted as exc:
            damaged.append(Damage(e.name, "entry", plain_reason(str(exc)), str(exc)))
        except NewerFormat as exc:  # not damage: never removed
            why = "written by a newer mlcache (a newer entry format): upgrade to read it"
            damaged.append(Damage(e.name, "entry", why, str(exc), unreadable=True))
            continue
        except (EntryNotFound, UnknownFormat):
            continue  # removed meanwhile; a codec not registered here is not damage
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
            damaged.append(Damage(e.name, "entry", why, str(exc), unreadable=True))
            continue
        else:
            continue
        if fix:
            store.delete(e.name)
            damaged[-1].removed = True
    return damaged


def _check_pack(p: PackInfo, fix: bool, all_packs: bool) -> Damage | None:
    try:
        PackedDataset(p.path).verify()
    except NewerFormat as exc:  # not damage: never removed
        why = "written by a newer mlcache (a newer pack format): upgrade to read it"
        return Damage(p.name, "pack", why, str(exc), rebuildable=p.rebuildable, unreadable=True)
    except PackCorrupted as exc:
        message = str(exc)
        bad = Damage(p.name, "pack", plain_reason(message), message, rebuildable=p.rebuildable)
        if fix and (p.rebuildable or all_packs):
            remove_pack(p.path)
            bad.removed = True
        return bad
    except OSError as exc:  # unreadable is not damaged
        why = f"cannot be read ({exc.strerror or exc})"
        return Damage(p.name, "pack", why, str(exc), rebuildable=p.rebuildable, unreadable=True)
    return None


def verify(
    mem: Memory,
    location: str,
    *,
    fix: bool = False,
    all_packs: bool = False,
    progress: bool = False,
) -> list[Damage]:
    """Check every byte of every entry (and its signature, when signing is on) and
    of every dataset pack under ``location``; the damaged and unreadable ones.

    With ``fix``, a damaged entry is removed (its next call computes it again),
    and so is a damaged pack a CachedDataset built (its next open builds it
    again); a damaged pack written by ``pack()`` only with ``all_packs`` (mlcache
    cannot make it again). What cannot be read (permissions, a newer format) is
    never removed. ``progress``: a progress bar on a terminal from
    :data:`PROGRESS_FROM` items.
    """
    found = packs(location, detail=False)
    assert mem.store is not None
    names = list(cached_objects(mem.store))
    bar = iter(_steps([None] * (len(names) + len(found)), "verify", progress))

    def step() -> None:
        next(bar, None)

    damaged = _check_entries(mem, names, fix, step)
    for p in found:
        step()
        bad = _check_pack(p, fix, all_packs)
        if bad is not None:
            damaged.append(bad)
    step()  # closes the bar
    return damaged


def verify_packs(location: str, *, fix: bool = False) -> list[dict[str, Any]]:
    """The damaged and unreadable packs under ``location`` as ``{"name", "error",
    "removed"}``; ``fix`` removes the damaged ones mlcache can rebuild (see
    :func:`verify`)."""
    bad = (_check_pack(p, fix, False) for p in packs(location, detail=False))
    return [{"name": b.name, "error": b.detail, "removed": b.removed} for b in bad if b]


# -- prune ------------------------------------------------------------------------------
@dataclasses.dataclass
class Pruned:
    """What :func:`prune` removed (or would), each with its worth and the reason
    it goes, and the packs it kept although the limits would have taken them:
    mlcache cannot rebuild them, or a process has them open."""

    removed: list[Worth]
    kept: list[Worth]
    #: the eviction's inflation after it (recorded when it ran)
    inflation: float = 0.0
    #: the names of ``kept`` that a process has open (the others: made by ``pack()``)
    open: set[str] = dataclasses.field(default_factory=set)


def prune(
    mem: Memory,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    dry_run: bool = False,
    all_packs: bool = False,
    progress: bool = False,
) -> Pruned:
    """Remove the function entries and dataset packs worth least (the least
    compute time saved per byte, aged by use: see :mod:`mlcache.memo.eviction`)
    until the cache holds at most ``max_size`` bytes, and everything unused for
    ``older_than`` seconds. A pack's cost is its build time. Packs written by
    ``pack()`` count in the size but are kept (``kept``) unless ``all_packs``,
    and so are packs a process has open. With ``dry_run``, nothing is removed.
    Pack names are relative to the location, ending in ``.pack``."""
    assert mem.store is not None
    location = mem.store.location
    mem.flush_usage()
    found = packs(location, detail=False)
    results = list(entries(mem.store))
    costs: dict[str, float | None] = dict(EntryCosts(mem.store)(e.name for e in results))
    costs.update((p.name, build_time(p.path)) for p in found)
    candidates = results + [EntryStat(p.name, p.size, p.last_used) for p in found]
    reading = {p.name for p in found if in_use(p.path)}
    protect = reading | (set() if all_packs else {p.name for p in found if not p.rebuildable})
    inflation = Inflation.load(mem.store)
    limits: dict[str, Any] = {
        "bytes_limit": max_size,
        "age_limit": older_than,
        "costs": costs,
        "inflation": inflation,
    }
    plan = plan_eviction(candidates, **limits, protect=protect)
    kept = [w for w in plan_eviction(candidates, **limits).chosen if w.name in protect]
    pruned = Pruned(plan.chosen, kept, plan.inflation, reading & {w.name for w in kept})
    if dry_run:
        return pruned
    pruned.removed = remove(mem, plan.chosen, progress=progress)
    inflation.record(mem.store, time.time(), plan.inflation)
    return pruned


_Item = TypeVar("_Item", EntryStat, Worth)


def remove(mem: Memory, items: list[_Item], *, progress: bool = False) -> list[_Item]:
    """Remove the function entries and packs ``items`` names (as :func:`prune`
    plans them); those removed (one that cannot be is skipped)."""
    assert mem.store is not None
    location = mem.store.location
    removed = []
    for e in _steps(items, "prune", progress):
        try:
            if e.name.endswith(".pack"):
                if not remove_pack(os.path.join(location, e.name)):
                    continue  # a newer mlcache's: kept
            else:
                mem.store.delete(e.name)
        except (OSError, ValueError):
            continue
        removed.append(e)
    return removed
