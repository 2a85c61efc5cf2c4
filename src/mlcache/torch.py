"""PyTorch adapter (optional extra: ``pip install torch==2.13.0``, then ``mlcache[torch]``).

``TorchDataset(ds)`` wraps a ``PackedDataset``, ``ShardedDataset`` or
``CachedDataset`` so that its numpy arrays come out as ``torch.Tensor``, without
a copy: a pack's reads are private to each read and writable (see
:mod:`mlcache.data.reader`), so in-place operations (``s["x"] /= 255``) work and
never reach the pack, another read or the next epoch. A plain
``DataLoader(ds, batch_size=None)`` over those datasets is as safe: the arrays it
turns into tensors are the same private ones.

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

__all__ = ["TorchDataset", "as_tensors"]


def as_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """``sample`` with every numpy array replaced by a tensor sharing its memory.

    A read-only array (one a dataset other than a pack handed over) is copied
    first: a tensor over read-only memory crashes the process on an in-place
    operation.
    """
    out = {}
    for key, value in sample.items():
        if isinstance(value, np.ndarray):
            if not value.flags.writeable:
                value = value.copy()
            out[key] = torch.from_numpy(value)
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
