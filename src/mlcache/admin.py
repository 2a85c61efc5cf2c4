"""What a cache folder holds: functions (through the store) and dataset packs.

The ``mlcache`` command's ``ls``, ``info``, ``clear``, ``prune`` and ``verify``
are built on these; they are plain functions returning data, so scripts can
use them too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from .data.cached import remove_pack
from .data.reader import PackedDataset
from .entry import read_entry_info
from .errors import PackCorrupted
from .memo.eviction import plan_eviction
from .memo.layout import cached_objects, entries, is_entry
from .memo.memory import Memory
from .memo.usage import FunctionStats
from .store import EntryStat

__all__ = [
    "Cleared",
    "PackInfo",
    "clear",
    "find_function",
    "find_pack",
    "function_entries",
    "functions",
    "pack_entries",
    "packs",
    "prune",
    "verify_packs",
]

#: how deep under the location dataset packs are looked for
_PACK_DEPTH = 4


@dataclasses.dataclass
class PackInfo:
    """One dataset pack found under a cache folder."""

    path: str
    name: str  #: path relative to the cache folder
    size: int
    built: float  #: modification time (epoch seconds)
    last_used: float  #: the later of its access and modification times
    samples: int | None = None  #: None when the pack cannot be opened
    version: int | None = None  #: the pack format version
    fields: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def functions(mem: Memory) -> list[FunctionStats]:
    """Every function cached in ``mem``, sorted by identity."""
    return sorted(mem.stats().values(), key=lambda st: st.func)


def find_function(mem: Memory, name: str) -> FunctionStats | None:
    """The function whose identity is ``name``, or the only one ending with
    ``.name``; ``ValueError`` naming the candidates when several do."""
    found = [st for st in functions(mem) if st.func == name or st.func.endswith("." + name)]
    exact = [st for st in found if st.func == name]
    if exact:
        return exact[0]
    if len(found) > 1:
        names = ", ".join(st.func for st in found)
        raise ValueError(f"{name!r} names several functions: {names}; give the full name")
    return found[0] if found else None


def function_entries(mem: Memory, st: FunctionStats) -> list[dict[str, Any]]:
    """The entries of one function: key, arguments, size, age, compute time."""
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


def _pack_paths(location: str) -> Iterator[str]:
    base = os.path.abspath(location)
    for root, dirs, files in os.walk(base):
        depth = root[len(base) :].count(os.sep)
        dirs[:] = [d for d in dirs if not d.startswith(".") and depth < _PACK_DEPTH]
        for f in files:
            if f.endswith(".pack") and not f.startswith("."):
                yield os.path.join(root, f)


def packs(location: str, *, detail: bool = True) -> list[PackInfo]:
    """The dataset packs under ``location`` (opening each is O(1))."""
    found = (_describe(path, location, detail) for path in sorted(_pack_paths(location)))
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
        built=st.st_mtime,
        last_used=max(st.st_atime, st.st_mtime),
    )
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
        except (PackCorrupted, OSError) as exc:
            info.error = str(exc)
    return info


def find_pack(location: str, name: str) -> PackInfo | None:
    """The pack whose relative path, file name or path is ``name`` (only that one
    is opened)."""
    for p in packs(location, detail=False):
        if name in (p.name, os.path.basename(p.path), p.path, os.path.abspath(name)):
            return _describe(p.path, location, True)
    return None


def pack_entries(location: str) -> list[EntryStat]:
    """The packs as :class:`EntryStat` rows (name relative to ``location``), for
    eviction plans."""
    return [EntryStat(p.name, p.size, p.last_used) for p in packs(location, detail=False)]


@dataclasses.dataclass
class Cleared:
    """What :func:`clear` removed."""

    functions: list[FunctionStats]
    packs: list[PackInfo]

    @property
    def names(self) -> list[str]:
        """The functions' identities, then the packs' names."""
        return [st.func for st in self.functions] + [p.name for p in self.packs]


def clear(mem: Memory, location: str, name: str | None = None) -> Cleared | None:
    """Remove every function result and dataset pack of the cache (``name`` None),
    or the one function or pack ``name`` names (see :func:`find_function` and
    :func:`find_pack`); None when nothing has that name."""
    if name is None:
        funcs, found = functions(mem), packs(location, detail=False)
        mem.clear(warn=False)
        for p in found:
            remove_pack(p.path)
        return Cleared(funcs, found)
    st = find_function(mem, name)
    if st is not None:
        mem.remove_function(st.folder)
        return Cleared([st], [])
    pack = find_pack(location, name)
    if pack is not None:
        remove_pack(pack.path)
        return Cleared([], [pack])
    return None


def verify_packs(location: str, *, fix: bool = False) -> list[dict[str, Any]]:
    """Check every byte of each dataset pack under ``location``; the damaged and
    unreadable ones as ``{"name", "error", "removed"}`` (a damaged pack is removed
    when ``fix``; an unreadable one is reported, never removed)."""
    bad = []
    for p in packs(location, detail=False):
        try:
            PackedDataset(p.path).verify()
        except PackCorrupted as exc:
            if fix:
                remove_pack(p.path)
            bad.append({"name": p.name, "error": str(exc), "removed": fix})
        except OSError as exc:  # unreadable is not damaged
            bad.append({"name": p.name, "error": f"cannot read: {exc}", "removed": False})
    return bad


def prune(
    mem: Memory,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    dry_run: bool = False,
) -> list[EntryStat]:
    """Remove least recently used function entries and dataset packs until the
    cache holds at most ``max_size`` bytes, and everything unused for
    ``older_than`` seconds; return what was (or, with ``dry_run``, would be)
    removed. Pack names are relative to the location, ending in ``.pack``."""
    assert mem.store is not None
    location = mem.store.location
    mem.flush_usage()
    candidates = list(entries(mem.store))
    candidates += pack_entries(location)
    plan = plan_eviction(candidates, bytes_limit=max_size, age_limit=older_than)
    if dry_run:
        return plan
    removed = []
    for e in plan:
        try:
            if e.name.endswith(".pack"):
                remove_pack(os.path.join(location, e.name))
            else:
                mem.store.delete(e.name)
        except (OSError, ValueError):
            continue
        removed.append(e)
    return removed
