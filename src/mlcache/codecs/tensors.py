"""The ``torch.Tensor`` leaf: tensors of every dtype stored as raw buffers, never pickled.

A tensor (``torch.Tensor`` or ``torch.nn.Parameter``, exact types only) is a
node of the ``npy`` tree (:mod:`mlcache.codecs.leaves`)::

    {"x": "torch.Tensor", "dtype": "bfloat16", "shape": [3, 4], "seg": 0,
     "device": "cuda:0", "grad": true, "param": true}

``seg`` is the segment holding its elements, C-contiguous, in the machine's
byte order; ``device`` (absent for the CPU), ``grad`` (``requires_grad``) and
``param`` (a ``Parameter``) only when they apply. What is stored and why:

- **Every dtype** torch can view as bytes: the numpy ones (bool, uint8..uint64,
  int8..int64, float16/32/64, complex64/128) directly; the others (bfloat16,
  complex32, float8 kinds, ...) as unsigned integers of their size, viewed back
  with :meth:`torch.Tensor.view`. Quantized tensors, sparse layouts, nested
  tensors, named tensors and tensors carrying Python attributes are refused
  (pickle, or unstored).
- **Only the tensor's own elements**: a view of a bigger storage, a
  non-contiguous tensor (made contiguous; strides are not kept) or a
  conjugate/negative view (resolved) stores just its values.
- **Devices**: a tensor on another device is stored from a CPU copy with its
  device noted. Decoding puts it back on that device when this process has it
  (as ``torch.load`` does without ``map_location``) and gives a CPU tensor
  otherwise (a machine without the GPU can still read the value; it is logged
  once per device on the ``mlcache`` logger). A ``meta`` tensor has no data: its
  node has no segment and it decodes to a ``meta`` tensor of the same dtype and
  shape.
- **Autograd**: ``requires_grad`` is kept; the graph is not (a tensor with a
  ``grad_fn`` comes back as a leaf tensor that requires grad, its ``.grad`` is
  not stored).

Memory maps: with ``mmap_mode="c"`` (copy-on-write) or ``"r+"``, a decoded
tensor is a view of the mapped entry file (``torch.from_numpy`` over the
segment: no copy). With ``"r"`` the map is read-only, and torch has no read-only
tensors: a view would let a write reach a read-only page (a crash), so each
tensor is copied out of the map instead, with no warning (as
:func:`mlcache.torch.as_tensor` does for read-only samples). Without
``mmap_mode`` the tensors share the entry's payload read into memory.

torch is imported only when a tensor is met or decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from . import Segments

__all__ = ["TensorLeaf"]

_LOG = logging.getLogger("mlcache")

#: numpy dtype each torch dtype without a numpy twin is stored as (by its size)
_RAW: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
}
#: torch dtype names that numpy holds as they are
_NATIVE = (
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
#: dtypes torch has but that do not hold plain elements (refused)
_REFUSED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")

#: dtype name -> (torch dtype, numpy storage dtype, whether a view is needed); built
#: on first use, from the dtypes this torch has
_TABLE: dict[str, tuple[torch.dtype, np.dtype, bool]] = {}
#: the devices already logged as missing in this process
_MISSING: set[str] = set()


def _table() -> dict[str, tuple[torch.dtype, np.dtype, bool]]:
    if not _TABLE:
        import torch

        table = {}  # built whole, then published at once (threads may race here)
        for name in dir(torch):
            dt = getattr(torch, name)
            if not isinstance(dt, torch.dtype) or name in _REFUSED:
                continue
            key = str(dt).removeprefix("torch.")
            if key != name:  # an alias (torch.half, torch.long): one entry per dtype
                continue
            if key in _NATIVE:
                table[key] = (dt, np.dtype(key), False)
            elif dt.itemsize in _RAW and not key.startswith("q"):
                table[key] = (dt, _RAW[dt.itemsize], True)
        _TABLE.update(table)
    return _TABLE


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _device_available(device: str) -> bool:
    """Whether this process can put a tensor on ``device`` ("cuda:1", "mps")."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return False
    if dev.type in ("cpu", "meta"):
        return True
    module = getattr(torch, dev.type, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        return False
    count = getattr(module, "device_count", None)
    return dev.index is None or not callable(count) or dev.index < count()


class TensorLeaf:
    """``torch.Tensor`` and ``torch.nn.Parameter`` as raw buffers (see the module)."""

    name = "torch.Tensor"
    types: tuple[str, ...] = ("torch.Tensor", "torch.nn.parameter.Parameter")

    def can_encode(self, value: Any) -> bool:
        import torch

        t = type(value)
        if t is not torch.Tensor and t is not torch.nn.Parameter:
            return False
        try:
            return (
                value.layout == torch.strided
                and not value.is_quantized
                and not value.is_nested
                and not any(n is not None for n in getattr(value, "names", ()))
                and not vars(value)  # no Python attributes set on it
                and _dtype_name(value.dtype) in _table()
            )
        except (RuntimeError, TypeError, AttributeError):  # a tensor torch cannot describe
            return False

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        import torch

        t = value.detach()
        name = _dtype_name(t.dtype)
        _dt, storage, view = _table()[name]
        node: dict[str, Any] = {"dtype": name, "shape": list(t.shape)}
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        if value.requires_grad:
            node["grad"] = True
        if type(value) is torch.nn.Parameter:
            node["param"] = True
        if t.device.type == "meta":
            return node  # no data to store
        t = t.to("cpu").resolve_conj().resolve_neg().contiguous()
        if view:
            t = t.view(getattr(torch, str(storage)))
        node["seg"] = add(t.numpy())  # only its own elements, even over a bigger storage
        return node

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        import torch

        entry = _table().get(node["dtype"]) if type(node.get("dtype")) is str else None
        if entry is None:
            raise ValueError(f"unknown tensor dtype {node.get('dtype')!r}")
        dt, storage, view = entry
        shape = node["shape"]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"bad tensor shape {shape!r}")
        device = node.get("device", "cpu")
        if type(device) is not str:
            raise ValueError(f"bad tensor device {device!r}")
        if device.startswith("meta"):
            t = torch.empty(shape, dtype=dt, device="meta")
        else:
            a = segments.array(node["seg"], storage, tuple(shape), "C")
            if not a.flags.writeable:  # a read-only map: see the module docstring
                a = a.copy()
            t = torch.from_numpy(a)
            if view:
                t = t.view(dt)
            if device != "cpu":
                if _device_available(device):
                    t = t.to(device)
                elif device not in _MISSING:
                    _MISSING.add(device)
                    _LOG.info("tensors stored from %s come back on the CPU: no such device", device)
        grad = node.get("grad", False)
        param = node.get("param", False)
        if type(grad) is not bool or type(param) is not bool:
            raise ValueError("bad tensor flags")
        if param:
            return torch.nn.Parameter(t, requires_grad=grad)
        return t.requires_grad_(True) if grad else t
