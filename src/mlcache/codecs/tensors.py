"""The ``torch.Tensor`` leaf: tensors of every dtype stored as raw buffers, never pickled.

A tensor (``torch.Tensor`` or ``torch.nn.Parameter``, exact types only) is a
node of the ``npy`` tree (:mod:`mlcache.codecs.leaves`)::

    {"x": "torch.Tensor", "dtype": "bfloat16", "shape": [3, 4], "seg": 0,
     "device": "cuda:0", "grad": true, "param": true}

``seg`` is the segment holding its elements, C-contiguous, in the machine's
byte order; ``device`` (absent for the CPU), ``grad`` (``requires_grad``) and
``param`` (a ``Parameter``) only when they apply. A tensor over a stored
storage (below) is instead::

    {"x": "torch.Tensor.strided", "dtype": "float32", "shape": [10, 4],
     "stride": [4, 1], "at": 0, "store": [0, 160]}

``store`` is [segment, its length in bytes], ``at`` the tensor's first byte in
it (a multiple of its element size), ``stride`` in elements; the other keys as
above. Every node over one segment decodes onto one storage. A reader before
this layout does not know the name: the entry is ``UnknownFormat`` there (a
miss, kept), never a storage's bytes read as one tensor's elements. What is
stored and why:

- **Every dtype** torch can view as bytes: the numpy ones (bool, uint8..uint64,
  int8..int64, float16/32/64, complex64/128) directly; the others (bfloat16,
  complex32, float8 kinds, ...) as unsigned integers of their size, viewed back
  with :meth:`torch.Tensor.view`. Quantized tensors, sparse layouts, nested
  tensors, named tensors and tensors carrying Python attributes are refused
  (pickle, or unstored).
- **Storages shared, layouts kept**: tensors of one tree that view one storage
  (tied weights of a ``state_dict``, a tensor and its slices or transpose) keep
  sharing one storage, each with its offset and strides: the part of the
  storage they reach is stored once (from a multiple of 16 bytes: offsets are
  kept relative to it), as one segment of bytes, and each is a
  ``torch.Tensor.strided`` node over it (below). A tensor alone on its storage
  stores only its own elements: in their memory order with its strides when it
  covers them without gaps (``channels_last``, a transpose), else in C order
  (a slice with gaps or a broadcast is made contiguous, its strides not kept;
  a conjugate/negative view is resolved and never shares). A tree inside a
  leaf (an ordered dict's items) shares within itself only. Identity is not
  kept: a tensor met twice comes back as two tensors over one storage.
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

from .leaves import tree_scope

if TYPE_CHECKING:
    import torch

    from . import Segments

__all__ = ["STRIDED", "TensorLeaf"]

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


# -- storages: what tensors of one tree share, and the layout of one alone ----------------
#: the ``also`` name of the leaf's nodes over a storage (readers before it: a miss)
STRIDED = "torch.Tensor.strided"
#: the stored part of a shared storage starts at a multiple of this (relative to the
#: storage): every dtype's offset from it is then a whole number of elements
_SPAN_ALIGN = 16


def _shareable(t: Any) -> bool:
    """A tensor stored as a view of its storage when another of the tree shares it:
    elements in memory (not a conjugate or negative view, whose values are not
    its storage's), on a device with data."""
    return (
        t.device.type != "meta"
        and t.numel() > 0
        and not t.is_conj()
        and not t.is_neg()
        and t.untyped_storage().nbytes() > 0
    )


def _storage_key(t: Any) -> tuple[str, int, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr(), storage.nbytes())


def _reach(t: Any) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of its storage that ``t`` reads (numel > 0)."""
    size = t.element_size()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    start = t.storage_offset()
    return start * size, (start + last + 1) * size


def _dense(t: Any) -> bool:
    """Whether ``t`` covers its elements' bytes exactly, in some order of its
    dimensions (C order, a transpose, ``channels_last``): no gap, no overlap."""
    if t.numel() == 0:
        return False
    expect = 1
    for stride, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expect:
            return False
        expect *= n
    return True


def _shared_spans(root: Any) -> dict[tuple[str, int, int], tuple[int, int]]:
    """The storages that two or more tensors of the tree ``root`` view (plain lists,
    tuples and dicts walked; other leaves are trees of their own), each with the
    span of it they reach, its start aligned down to :data:`_SPAN_ALIGN`."""
    import torch

    seen: dict[tuple[str, int, int], list[int]] = {}  # key -> [count, lo, hi]
    stack, depth = [root], 0
    while stack and depth < 1_000_000:  # bounded: the tree is bounded anyway
        depth += 1
        v = stack.pop()
        t = type(v)
        if t is list or t is tuple:
            stack.extend(v)
        elif t is dict:
            stack.extend(v.keys())
            stack.extend(v.values())
        elif (t is torch.Tensor or t is torch.nn.Parameter) and _shareable(v):
            key, (lo, hi) = _storage_key(v), _reach(v)
            got = seen.get(key)
            if got is None:
                seen[key] = [1, lo, hi]
            else:
                got[0], got[1], got[2] = got[0] + 1, min(got[1], lo), max(got[2], hi)
    return {k: (lo - lo % _SPAN_ALIGN, hi) for k, (count, lo, hi) in seen.items() if count > 1}


def _span_bytes(t: Any, lo: int, hi: int) -> np.ndarray:
    """Bytes ``[lo, hi)`` of ``t``'s storage, as a CPU uint8 array."""
    import torch

    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    raw.set_(t.untyped_storage(), lo, (hi - lo,), (1,))
    return raw.cpu().numpy()


def _encode_strided(
    t: Any, node: dict[str, Any], add: Callable[[Any], int]
) -> dict[str, Any] | None:
    """``node`` made a view of ``t``'s stored storage (:data:`STRIDED`) when the tree
    shares the storage, or when ``t`` alone is dense but not in C order; None: the
    first layout (its elements, C order)."""
    scope = tree_scope()
    memo = scope.memo(STRIDED)
    if "spans" not in memo:  # once per tree: which storages its tensors share
        memo["spans"] = _shared_spans(scope.root)
        memo["segments"] = {}
    span = memo["spans"].get(_storage_key(t)) if _shareable(t) else None
    if span is not None:
        lo, hi = _reach(t)
        if lo < span[0] or hi > span[1]:  # a tensor the walk did not meet (another leaf's)
            span = None
    if span is None:
        if t.is_contiguous() or not _dense(t) or t.is_conj() or t.is_neg():
            return None
        span = _reach(t)  # alone: just its own elements, in their order
        seg = add(_span_bytes(t, *span))
    else:
        seg = memo["segments"].get(_storage_key(t))
        if seg is None:
            seg = memo["segments"][_storage_key(t)] = add(_span_bytes(t, *span))
    lo, hi = span
    at = t.storage_offset() * t.element_size() - lo
    return {"x": STRIDED, **node, "stride": list(t.stride()), "at": at, "store": [seg, hi - lo]}


def _decode_strided(node: dict[str, Any], segments: Segments, dt: Any, device: str) -> Any:
    """A tensor over the stored storage its node names, made once per tree."""
    import torch

    shape, stride, at, store = node["shape"], node["stride"], node["at"], node["store"]
    if type(stride) is not list or len(stride) != len(shape):
        raise ValueError(f"bad tensor strides {stride!r}")
    if not all(type(d) is int and d >= 0 for d in stride):
        raise ValueError(f"bad tensor strides {stride!r}")
    if type(store) is not list or len(store) != 2 or not all(type(x) is int for x in store):
        raise ValueError(f"bad tensor storage {store!r}")
    seg, nbytes = store
    size = dt.itemsize
    if type(at) is not int or at < 0 or at % size or nbytes < 0:
        raise ValueError(f"bad tensor storage offset {at!r}")
    if all(shape):  # elements: the last one read must lie in the storage
        last = sum((n - 1) * st for n, st in zip(shape, stride))
        if at + (last + 1) * size > nbytes:
            raise ValueError("a tensor reaches past its storage")
    elif at > nbytes:
        raise ValueError("a tensor starts past its storage")
    memo = tree_scope().memo(STRIDED)
    storage = memo.get(seg)
    if storage is None:
        a = segments.array(seg, np.dtype(np.uint8), (nbytes,), "C")
        if not a.flags.writeable:  # a read-only map: copied (see the module docstring)
            a = a.copy()
        raw = torch.from_numpy(a)
        if device != "cpu":
            raw = _to_device(raw, device)
        storage = memo[seg] = raw.untyped_storage()
    if storage.nbytes() != nbytes:
        raise ValueError("two sizes for one tensor storage")
    t = torch.empty(0, dtype=dt, device=storage.device)
    return t.set_(storage, at // size, shape, stride)


def _to_device(t: Any, device: str) -> Any:
    if _device_available(device):
        return t.to(device)
    if device not in _MISSING:
        _MISSING.add(device)
        _LOG.info("tensors stored from %s come back on the CPU: no such device", device)
    return t


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
        strided = _encode_strided(t, node, add)
        if strided is not None:
            return strided
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
        if node.get("x") == STRIDED:
            t = _decode_strided(node, segments, dt, device)
        elif device.startswith("meta"):
            t = torch.empty(shape, dtype=dt, device="meta")
        else:
            a = segments.array(node["seg"], storage, tuple(shape), "C")
            if not a.flags.writeable:  # a read-only map: see the module docstring
                a = a.copy()
            t = torch.from_numpy(a)
            if view:
                t = t.view(dt)
            if device != "cpu":
                t = _to_device(t, device)
        grad = node.get("grad", False)
        param = node.get("param", False)
        if type(grad) is not bool or type(param) is not bool:
            raise ValueError("bad tensor flags")
        if param:
            return torch.nn.Parameter(t, requires_grad=grad)
        return t.requires_grad_(True) if grad else t
