"""What else a cache folder holds, for the byte budget that results share with it.

A :class:`~mlcache.Memory`'s ``bytes_limit`` is one budget for everything mlcache
can make again under its folder: function results, and the dataset packs a
:class:`~mlcache.data.CachedDataset` built there. The function cache
(:mod:`mlcache.memo`) and the datasets (:mod:`mlcache.data`) do not know each
other (DESIGN.md's layers), so they meet here: the datasets register a
function that lists what they hold under a folder (:data:`holders`), and the
function cache's eviction counts it, weighs it as it weighs a result (its
cost is its build time) and removes it through :attr:`Held.remove`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .._registry import Registry

__all__ = ["Held", "held_under", "holders"]


@dataclasses.dataclass(frozen=True)
class Held:
    """One thing (not a function result) that a cache folder holds."""

    name: str  #: its path relative to the cache folder
    size: int  #: bytes on disk
    last_used: float  #: epoch seconds of its last use
    #: seconds it took to make (what removing it costs the next user), None when
    #: not recorded
    cost: float | None
    #: a process has it open now: it is counted, never removed
    in_use: bool
    #: removes it (an ``OSError`` when it cannot be)
    remove: Callable[[], object] = dataclasses.field(compare=False, repr=False)


def _check_holder(obj: object) -> None:
    if not callable(obj):
        raise TypeError(f"a holder is a function (folder -> list of Held), got {obj!r}")


#: name -> a function listing what that part of mlcache holds under a local
#: cache folder, as :class:`Held` rows of what it can make again
holders: Registry[Callable[[str], list[Held]]] = Registry("holder", _check_holder)
# by name: the datasets are imported only when a budget first counts them
holders.register("packs", "mlcache.data.holdings:held")


def held_under(folder: str) -> list[Held]:
    """What every registered holder holds under the local folder ``folder``."""
    found: list[Held] = []
    for list_held in holders.values():
        found += list_held(folder)
    return found
