"""A copy of a :class:`~mlcache.data.CachedDataset` unpickled where its code reads
other values than where it was opened.

A spawned DataLoader worker imports the script again: a module-level value set
under ``if __name__ == "__main__":`` (``SIZE = args.size``), or a class attribute
set at run time, is not what the worker's ``load_item`` reads. The pack is named by
the values of the process that opened the dataset; the worker's samples are not
that pack's, so they must not be recorded in it (the next run, with those values,
would read them), and the pack's are not what the worker's code gives. Such a copy
reads neither: each ``ds[i]`` loads its item, unstored, as the same code without
the cache would, and one warning says why. A copy whose code reads the same values
(the common case) is the dataset as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import warn
from ..keys.code_version import CodeVersion, code_version
from ..keys.learned import keyed_digest
from .audit import DatasetAuditor
from .checking import ItemCheck
from .filling import Filler
from .reader import PackedDataset
from .sequence import sample_index, sample_indices
from .values import read_back

__all__ = ["Copies", "Unstored", "code_key"]


def code_key(cls: type, state: dict[str, str]) -> tuple[tuple[str, str], CodeVersion]:
    """What names a pack of ``cls`` of its code: the version of the code as it is now
    and the digest of the mutable values it reads (``state``: those learned to be
    bookkeeping, counted by their baseline); and that version."""
    code = code_version(cls, state=state, fresh=True)
    return (code.digest, keyed_digest(code.watched, state)), code


class Copies:
    """The half of a :class:`~mlcache.data.CachedDataset` that looks, once it is
    unpickled, whether its code reads the values its pack was named by; the dataset
    sets the attributes below (``_code_key`` when it names its pack)."""

    _code_key: tuple[str, str]
    _fill: str
    _state: dict[str, str]
    _allow_pickle: bool
    _pack: PackedDataset | None
    _pinned: list[Any] | None
    _checking: ItemCheck | None
    _filler: Filler | None
    _audit: DatasetAuditor | None
    #: set on a copy whose code reads other values (a build's worker then loads
    #: nothing: :mod:`mlcache.data.workers`)
    elsewhere = False

    def source_items(self) -> Iterable[Any]:
        raise NotImplementedError  # CachedDataset's

    def load_item(self, item: Any) -> Mapping[str, Any]:
        raise NotImplementedError  # CachedDataset's

    def _read_elsewhere(self) -> None:
        """Just unpickled: when the code reads other values here than where the pack
        was named, reads become unstored loads (:class:`Unstored`; one warning)."""
        named = getattr(self, "_code_key", None)
        if named is None or not self._fill:  # a whole build: no item to load alone
            return
        try:
            now, code = code_key(type(self), self._state)
        except Exception:  # a walk that fails here: nothing says the values are the same
            now, code = ("", ""), None
        if now == named and code is not None:
            if self._filler is not None:  # what a rebinding here is told by
                self._filler.bindings = code.bindings
            return
        self._unstore(
            now,
            "(a spawned DataLoader worker?) than in the one that opened it: a module-level "
            "value set under `if __name__ == '__main__':`, which a spawned worker does not "
            "run, or a class attribute set at run time",
        )

    def _rebound(self, names: list[str]) -> Unstored:
        """A name the code reads was rebound since the open (``SIZE = 3``): reads become
        unstored loads (one warning); what ``ds[i]`` reads now."""
        try:
            now = code_key(type(self), self._state)[0]
        except Exception:  # a walk that fails: keyed by no version (see __mlcache_token__)
            now = ("", "")
        self._unstore(now, f"than when it was opened ({', '.join(names)} rebound since)")
        return self._pack  # type: ignore[return-value]

    def _unstore(self, now: tuple[str, str], where: str) -> None:
        """``ds[i]``, ``len(ds)`` and ``ds.packed`` read neither the pack nor its
        records: each sample is loaded, unstored (one warning saying ``where``)."""
        self.elsewhere = True
        checking, filler = self._checking, self._filler
        items = (
            self._pinned
            or (checking.items() if checking is not None else None)
            or (filler.items if filler is not None else None)
            or list(self.source_items())
        )
        warn(
            f"mlcache: {type(self).__qualname__}'s code reads other values in this process "
            f"{where}. Its samples here are loaded, not read from nor stored in the pack "
            "named by the other values: set such a value at the module's top level, pass "
            "it to the dataset as an attribute, or open the dataset again"
        )
        unstored = Unstored(self.load_item, list(items), self._allow_pickle, now)
        self._pack = unstored  # type: ignore[assignment]
        self._checking = self._filler = self._audit = None


class Unstored:
    """``ds[i]`` of such a copy: its item loaded by ``load_item`` and read back as a
    pack's sample is (the first epoch's types), nothing stored. ``code``: the
    copy's :func:`code_key`, which keys it when passed to a memoized function."""

    def __init__(
        self,
        load: Callable[[Any], Mapping[str, Any]],
        items: list[Any],
        allow_pickle: bool,
        code: tuple[str, str],
    ) -> None:
        self.load, self.items, self.allow_pickle, self.code = load, items, allow_pickle, code

    def __len__(self) -> int:
        return len(self.items)

    def _one(self, i: int) -> dict[str, Any]:
        return read_back(self.load(self.items[i]), self.allow_pickle, i)

    def __getitem__(self, i: Any) -> Any:
        many = sample_indices(i, len(self.items))
        if many is None:
            return self._one(sample_index(i, len(self.items)))
        return [self._one(j) for j in many]

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """The samples' fields as columns: stacked when they stack, else lists."""
        samples = [self[int(i)] for i in indices]
        columns: dict[str, Any] = {}
        for name in samples[0] if samples else ():
            values = [s[name] for s in samples]
            try:
                columns[name] = np.stack([np.asarray(v) for v in values])
            except ValueError:  # ragged, or not numbers: as they are
                columns[name] = values
        return columns

    def __mlcache_token__(self) -> tuple[Any, ...]:
        # its items and this process's code (its values), never the pack's
        return ("unstored", self.code, self.items)
