"""How the function cache names what it stores (the one module that knows).

Inside a store::

    <function folder>/<code version>/<key>     an entry: one result
    <function folder>/stats/<process>          one process's hit and miss counts
    <function folder>/<code version>/code      what the version depends on (JSON:
                                               name -> digest), to say what changed
    <function folder>/<code version>/record    the next run's copy of the version's
                                               small entries, checked against
                                               their files (:mod:`mlcache.memo.record`;
                                               not an entry: never counted,
                                               listed or served as one)
    <function folder>/<code shape>.state       what calls of the function change
                                               (a signed entry: captured names,
                                               module-level value names): state,
                                               not input, for code of that shape
                                               (its version with mutable values
                                               by type: the same in every process)
    eviction/inflation                         the history of eviction's inflation
                                               (:mod:`mlcache.memo.eviction`)

``<function folder>`` is a slug of the function's identity with a short hash
(:func:`mlcache._util.slug`), ``<code version>`` 16 hex digits, ``<key>``
32. Anything else under a cache folder (dataset packs, a user's files) is not
the function cache's: :func:`cached_objects` leaves it out, so eviction,
``clear`` and ``verify`` never touch it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..store import EntryStat, Store

__all__ = [
    "CODE_MANIFEST",
    "INFLATION",
    "STATE",
    "STATS",
    "cached_objects",
    "entries",
    "entry_folder",
    "is_entry",
    "is_stats",
]

#: the folder of a function's statistics, beside its code versions
STATS = "stats"
#: a code version's manifest, beside its entries
CODE_MANIFEST = "code"
#: the history of GreedyDual-Size's inflation (no function folder ends this way:
#: theirs end with a short hash)
INFLATION = "eviction/inflation"
#: what calls of a function change: ``<folder>/<code shape>.state``
STATE = "state"
_ENTRY = re.compile(r"[^/]+/[0-9a-f]{16}/[0-9a-f]{32}")
_STATS = re.compile(r"[^/]+/stats/[^/]+")


def is_entry(name: str) -> bool:
    """``name`` is a result entry."""
    return _ENTRY.fullmatch(name) is not None


def is_stats(name: str) -> bool:
    """``name`` is a statistics entry."""
    return _STATS.fullmatch(name) is not None


def entry_folder(name: str) -> str:
    """The function folder an entry or statistics name belongs to."""
    return name.partition("/")[0]


def cached_objects(store: Store, prefix: str = "") -> Iterator[EntryStat]:
    """What the function cache stored under ``prefix``: result and statistics
    entries, nothing else found there."""
    for e in store.list(prefix):
        if _ENTRY.fullmatch(e.name) or _STATS.fullmatch(e.name):
            yield e


def entries(store: Store, prefix: str = "") -> Iterator[EntryStat]:
    """The result entries under ``prefix`` (what eviction and limits count)."""
    for e in store.list(prefix):
        if _ENTRY.fullmatch(e.name):
            yield e
