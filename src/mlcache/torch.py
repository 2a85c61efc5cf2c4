"""PyTorch adapter (optional extra: ``pip install torch==2.13.0``, then ``mlcache[torch]``).

``TensorDataset(ds)`` wraps a ``PackedDataset`` or ``CachedDataset`` so that its
numpy arrays come out as ``torch.Tensor`` sharing the pack's memory map (no
copy). The tensors are views of read-only memory: do not write to them in place
(clone first), as with any tensor made from a read-only buffer.
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

__all__ = ["TensorDataset", "as_tensors"]


def as_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """``sample`` with every numpy array replaced by a zero-copy tensor."""
    out = {}
    with warnings.catch_warnings():
        # torch warns about read-only buffers; the tensors are documented read-only
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        for key, value in sample.items():
            out[key] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return out


class TensorDataset(torch.utils.data.Dataset):
    """A map-style dataset giving tensors; pickles to workers as its path."""

    def __init__(self, dataset: Sequence[dict[str, Any]]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return as_tensors(self.dataset[i])
