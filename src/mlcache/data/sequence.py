"""What every opened pack offers (:class:`Pack`), which samples ``ds[key]`` names,
and how a dataset shows itself.

``ds[i]`` is one sample (negative ``i`` counts from the end); ``ds[2:4]``,
``ds[[1, 2]]`` and ``ds[np.array([1, 2])]`` are a list of samples, as a
``Sequence`` promises (:func:`sample_indices`). An int is the training loop's
read: a dataset tests ``i.__class__ is int`` first and comes here only for
anything else, so the int read costs no more for the rest.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

__all__ = ["Many", "Pack", "describe", "sample_index", "sample_indices"]

#: a key naming several samples: ``ds[key]`` is then a list of samples
Many = slice | Sequence[int] | np.ndarray


def sample_index(i: Any, n: int) -> int:
    """``i`` as an index in ``[0, n)`` (negative counts from the end)."""
    if not isinstance(i, (int, np.integer)):
        raise TypeError(
            f"sample indices must be integers, slices or lists of integers, got {type(i).__name__}"
        )
    j = int(i) + n if i < 0 else int(i)
    if not 0 <= j < n:
        raise IndexError(f"sample {i} out of range for a dataset of {n} samples")
    return j


def sample_indices(key: Any, n: int) -> list[int] | None:
    """The indices in ``[0, n)`` that ``key`` names when it names several samples (a
    slice, a list, tuple or range of integers, a 1-d numpy integer array), in its
    order; None when it names one (an integer). ``IndexError`` for an index out
    of range, ``TypeError`` for anything else (a boolean mask, floats, a str)."""
    if isinstance(key, slice):
        return list(range(*key.indices(n)))
    if isinstance(key, (int, np.integer)):
        return None
    if isinstance(key, (list, tuple, range, np.ndarray)):
        idx = np.asarray(key)
        if idx.size == 0 and idx.ndim == 1:
            return []
        if idx.ndim == 1 and np.issubdtype(idx.dtype, np.integer):
            return [sample_index(j, n) for j in idx.tolist()]
    raise TypeError(
        "a dataset is indexed by an integer, a slice, or a list or 1-d array of integers; "
        f"got {type(key).__name__}"
        + (f" of {np.asarray(key).dtype}" if isinstance(key, (list, tuple, np.ndarray)) else "")
    )


def describe(kind: str, **details: Any) -> str:
    """``kind(name=value, ...)``: a dataset's repr, what it holds and where it lies
    (a detail that is None is left out)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in details.items() if v is not None)
    return f"{kind}({shown})"


class Pack(Sequence[dict[str, Any]], abc.ABC):
    """An opened pack, plain (:class:`~mlcache.data.PackedDataset`) or sharded
    (:class:`~mlcache.data.ShardedDataset`): ``len(ds)``, ``ds[i]`` (a dict of
    fields; ``ds[2:4]``, ``ds[[1, 2]]``: a list of them), ``ds.get_batch(indices)``,
    and where it lies. What :func:`mlcache.data.open_pack` and
    :func:`mlcache.data.pack` return."""

    #: the local file (of a plain pack) or the manifest (path or URL) it reads
    path: str
    #: whether fields stored with pickle are unpickled
    allow_pickle: bool
    #: whether arrays come back private to each read and writable
    writable: bool

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: Many) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def __getitem__(self, i: Any) -> Any: ...

    @abc.abstractmethod
    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``indices`` as one dict of fields (arrays stacked where they can be)."""

    @property
    @abc.abstractmethod
    def field_names(self) -> list[str]:
        """The names of the fields of every sample, in pack order."""

    @abc.abstractmethod
    def check_file(self) -> None:
        """Raise :class:`~mlcache.errors.PackChanged` if a file this pack reads changed
        to another pack since it was opened (see
        :meth:`~mlcache.data.PackedDataset.check_file`)."""
