"""PyTorch adapter (optional extra: ``pip install torch==2.13.0``, then ``mlcache[torch]``).

``TorchDataset(ds)`` wraps a ``PackedDataset``, ``ShardedDataset`` or
``CachedDataset`` so that its numpy arrays come out as ``torch.Tensor``, without
a copy: a pack's reads are private to each read and writable (see
:mod:`mlcache.data.reader`), so in-place operations (``s["x"] /= 255``) work and
never reach the pack, another read or the next epoch. A plain
``DataLoader(ds, batch_size=None)`` over those datasets is as safe: the arrays it
turns into tensors are the same private ones.

In a ``collate_fn``, use :func:`collate` (or :func:`as_tensor` for one array),
not ``torch.as_tensor``: over a pack opened with ``writable=False`` (read-only
views of the shared map, the fastest read) ``torch.as_tensor`` and PyTorch's
``default_collate`` print "The given NumPy array is not writable" once per
worker, and an in-place operation on such a tensor would crash the process.
:func:`collate` stacks each field's arrays straight into the batch tensor (the
one write of the batch any collate does), so a read-only sample is neither
copied on its own nor warned about::

    loader = DataLoader(PackedDataset(path, writable=False), batch_size=64,
                        num_workers=4, collate_fn=mlcache.torch.collate)

``TensorDataset``, its name before, is a deprecated alias (it clashes with
``torch.utils.data.TensorDataset``, which is another thing): using it warns once.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised without torch only
    raise ImportError(
        "mlcache.torch needs PyTorch: pip install torch==2.13.0 (the CPU wheel)"
    ) from exc

__all__ = ["TorchDataset", "as_tensor", "as_tensors", "collate"]


def as_tensor(value: np.ndarray) -> torch.Tensor:
    """``value`` as a tensor: sharing its memory when it is writable (a pack's
    default reads), a copy when it is read-only (``writable=False``: a tensor over
    read-only memory would crash the process on an in-place operation). Never
    PyTorch's "not writable" warning.

    >>> import numpy as np
    >>> a = np.arange(3.0)
    >>> t = as_tensor(a); t += 1; a.tolist()
    [1.0, 2.0, 3.0]
    >>> a.flags.writeable = False
    >>> as_tensor(a).tolist()
    [1.0, 2.0, 3.0]
    """
    return torch.from_numpy(value if value.flags.writeable else value.copy())


def _stackable(values: list[Any]) -> bool:
    first = values[0]
    if not isinstance(first, np.ndarray) or first.dtype.kind not in "biufc":
        return False
    return all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    )


def _stack(values: list[np.ndarray]) -> torch.Tensor:
    """The arrays as one tensor ``[len(values), *shape]``, written once, straight
    from the arrays (read-only ones too: no tensor is ever made over them)."""
    return torch.from_numpy(np.stack(values))


def _column(values: list[Any]) -> Any:
    if _stackable(values):
        return _stack(values)
    first = values[0]
    if type(first) is dict and all(type(v) is dict and v.keys() == first.keys() for v in values):
        return collate(values)  # a pack's dict field: a dict of batches
    if isinstance(first, torch.Tensor) and all(  # a pack's tensor field
        isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        return torch.stack(values)
    if isinstance(first, (bool, int, float, np.bool_, np.number)) and all(
        type(v) is type(first) for v in values
    ):
        return torch.as_tensor(np.asarray(values))
    # text, bytes, None, arrays of several shapes: a list (arrays as tensors)
    return [
        as_tensor(v) if isinstance(v, np.ndarray) and v.dtype.kind in "biufc" else v for v in values
    ]


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A ``collate_fn`` for datasets of dicts of fields (packs, ``CachedDataset``):
    each field's arrays of one shape stacked into one tensor ``[batch, ...]``, its
    numbers into a 1-d tensor, its tensors of one shape stacked, a dict field
    into a dict of such batches, anything else (text, ``None``, arrays of several
    shapes, those as tensors) into a list. No per-sample copy, no warning, whether
    the samples are writable or read-only views (``writable=False``).

    >>> import numpy as np
    >>> batch = collate([{"x": np.zeros(2), "y": 1, "s": "a"}, {"x": np.ones(2), "y": 2, "s": "b"}])
    >>> batch["x"].shape, batch["y"].tolist(), batch["s"]
    (torch.Size([2, 2]), [1, 2], ['a', 'b'])
    """
    if not samples:
        return {}
    first = samples[0]
    if not isinstance(first, dict):
        raise TypeError(f"collate takes samples that are dicts of fields, got {type(first)}")
    return {key: _column([s[key] for s in samples]) for key in first}


def as_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """``sample`` with every numpy array replaced by a tensor sharing its memory.

    A read-only array (one a dataset other than a pack handed over) is copied
    first: a tensor over read-only memory crashes the process on an in-place
    operation.
    """
    out: dict[str, Any] = {}
    for key, value in sample.items():
        if isinstance(value, np.ndarray):
            if not value.flags.writeable:
                value = value.copy()
            out[key] = torch.from_numpy(value)
        elif type(value) is dict:  # a pack's dict field
            out[key] = as_tensors(value)
        else:
            out[key] = value
    return out


class TorchDataset(torch.utils.data.Dataset):
    """A map-style dataset giving tensors; pickles to workers as the dataset it
    wraps does (a pack as its file or path, never its samples)."""

    def __init__(self, dataset: Sequence[dict[str, Any]]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return as_tensors(self.dataset[i])


#: whether the deprecated name was used in this process (it warns once)
_warned_tensor_dataset = False


def __getattr__(name: str) -> Any:
    # the old name, still importable: resolved here (not bound in the module) so
    # that each use can be seen, and warned about once
    global _warned_tensor_dataset
    if name == "TensorDataset":
        if not _warned_tensor_dataset:
            _warned_tensor_dataset = True
            warnings.warn(
                "mlcache.torch.TensorDataset is deprecated: use mlcache.torch.TorchDataset "
                "(the old name clashes with torch.utils.data.TensorDataset)",
                DeprecationWarning,
                stacklevel=2,
            )
        return TorchDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
