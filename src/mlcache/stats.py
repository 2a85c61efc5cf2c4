"""Hits, misses and the compute time the hits saved, per function.

Counting happens in memory on the hot path (a dict update on a hit); the usage
log turns those notes into totals when it flushes (every couple of seconds of
activity, and at exit), and :class:`StatsLog` writes each function's running
totals for this process as one small entry, ``<function folder>/stats/<process>``
(see :mod:`mlcache.names`). Those entries are ordinary checksummed entries of
plain numbers: ``verify`` checks them; eviction and size limits count results
only; losing one loses statistics only, never a result. :func:`collect` sums them with what the
store lists (entries, bytes, last use).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
from typing import Any

from .codecs import codecs
from .entry import write_entry
from .names import STATS, cached_objects, entry_folder, is_stats
from .results import decode, open_entry, read_entry_info
from .store import Store

__all__ = ["FunctionStats", "StatsLog", "collect"]

_COUNTS = ("hits", "misses", "saved", "computed")


@dataclasses.dataclass
class FunctionStats:
    """What one function has in a cache, and what the cache did for it."""

    folder: str  #: its folder in the store
    func: str = ""  #: its identity, e.g. ``"pipeline.features.extract"``
    entries: int = 0  #: cached results
    size: int = 0  #: bytes on disk
    last_used: float = 0.0  #: epoch seconds of the most recent use of any result
    hits: int = 0
    misses: int = 0  #: calls that computed (and stored) a result
    saved: float = 0.0  #: seconds of computing that the hits avoided
    computed: float = 0.0  #: seconds spent computing the misses

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _process_name() -> str:
    host = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:32] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


class StatsLog:
    """This process's running totals per function, written at each flush."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._totals: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._process = _process_name()

    def add(
        self,
        folder: str,
        func: str,
        *,
        hits: int = 0,
        misses: int = 0,
        saved: float = 0.0,
        computed: float = 0.0,
    ) -> None:
        with self._lock:
            t = self._totals.get(folder)
            if t is None:
                t = self._totals[folder] = dict.fromkeys(_COUNTS, 0) | {"func": func}
            t["func"] = func or t["func"]
            t["hits"] += hits
            t["misses"] += misses
            t["saved"] += saved
            t["computed"] += computed
            self._dirty.add(folder)

    def forget(self, folder: str | None = None) -> None:
        """Drop this process's totals for ``folder`` (all when None): its results
        were cleared, so its counts start again."""
        with self._lock:
            if folder is None:
                self._totals.clear()
                self._dirty.clear()
            else:
                self._totals.pop(folder, None)
                self._dirty.discard(folder)

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            totals = {folder: dict(self._totals[folder]) for folder in dirty}
        codec = codecs["npy"]
        for folder, value in totals.items():
            value["updated"] = time.time()
            try:
                with self._store.write(f"{folder}/{STATS}/{self._process}") as f:
                    write_entry(f, codec.name, codec.encode(value), {"stats": True}, None)
            except (OSError, ValueError):
                pass  # statistics are advisory

    def _after_fork(self) -> None:
        # the child counts its own calls, under its own name
        self._lock = threading.Lock()
        self._totals, self._dirty = {}, set()
        self._process = _process_name()


def collect(store: Store, folder: str = "") -> dict[str, FunctionStats]:
    """Every function in ``store`` (or only the one in ``folder``), by folder: its
    entries, size and last use (one listing), plus the counts of every process's
    statistics entry."""
    found: dict[str, FunctionStats] = {}
    some_entry: dict[str, list[str]] = {}
    for e in cached_objects(store, folder):
        folder = entry_folder(e.name)
        st = found.get(folder)
        if st is None:
            st = found[folder] = FunctionStats(folder)
        if is_stats(e.name):
            try:
                value = decode(open_entry(store, e.name), allow_pickle=False)
            except Exception:  # damaged or removed meanwhile: statistics only
                continue
            st.func = st.func or str(value.get("func", ""))
            st.hits += int(value.get("hits", 0))
            st.misses += int(value.get("misses", 0))
            st.saved += float(value.get("saved", 0.0))
            st.computed += float(value.get("computed", 0.0))
        else:
            st.entries += 1
            st.size += e.size
            st.last_used = max(st.last_used, e.last_used)
            some_entry.setdefault(folder, []).append(e.name)
    for folder, st in found.items():
        for name in some_entry.get(folder, [])[:8] if not st.func else []:
            try:  # the first entry that reads names the function
                st.func = str(read_entry_info(store, name).get("func", ""))
            except Exception:
                continue
            if st.func:
                break
        st.func = st.func or folder
    return found
