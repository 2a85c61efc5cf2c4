"""Cache keys: a canonical byte stream of any argument, hashed with xxh3-128.

Every value is written to the stream as a one-byte tag and a payload; buffers
(numpy arrays, bytes, torch tensors) are fed to the hash straight from memory,
without pickling or copying when they are contiguous. The result is a 32-digit
hex string.

Decisions (tested in ``tests/test_hashing.py``):

* **Types are part of the key.** ``1``, ``1.0``, ``True`` and ``numpy.int64(1)``
  hash differently although Python calls them equal: a function can observe the
  type (``np.array(x).dtype``, ``str(x)``), and a cache must never return a
  result computed for a different input. Same for ``list`` versus ``tuple``.
* **Arrays** are keyed by dtype, shape, memory order (C or F) and contents.
  A non-contiguous view hashes like its C-ordered copy.
* **Equal dicts hash equal** whatever their insertion order, and sets and
  frozensets do not depend on hash randomisation. Subclasses such as
  ``OrderedDict``, whose equality is order-sensitive, keep their order.
* **Other objects** (an sklearn estimator, a user's class) are hashed through
  ``__reduce_ex__``, i.e. the same information pickle would save, walked by this
  same canonical stream, so their dicts and sets are canonical too and their
  arrays are hashed from their buffers.
* A value that cannot be reduced raises ``TypeError``.
* **Values that came out of the cache are not hashed again.** A read-only
  memory-mapped array that a memoized function returned carries the name of its
  entry and its place in it (:data:`REF_ATTR`); it is keyed by that name, so
  passing it on to the next step of a pipeline costs nothing, whatever its
  size. Only read-only maps carry it (they cannot be changed through Python);
  writable results, views and slices are hashed by their contents.
* :func:`bytes_hashed` counts the buffer bytes this process has hashed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import pathlib
import struct
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xxhash

__all__ = ["HASH_SCHEME", "REF_ATTR", "Hasher", "bytes_hashed", "hash_value"]

#: Version of the canonical stream; part of every key, bump it on any change here.
HASH_SCHEME = 4

_BIG = 1 << 16  # buffers at least this large bypass the staging buffer
_CHUNK = 1 << 24  # copy size when hashing a non-contiguous array
# Buffers of at least _TREE_MIN bytes are hashed as the xxh3-128 digests of their
# _BLOCK-sized blocks, so that the blocks can be hashed on all cores at once. The
# digests do not depend on how many threads computed them.
_TREE_MIN = 1 << 26
_BLOCK = 1 << 24
_pack_q = struct.Struct("<q").pack
_pack_d = struct.Struct("<d").pack
_pack_Q = struct.Struct("<Q").pack
#: the attribute of a cached read-only map that names where it came from
REF_ATTR = "_mlcache_ref"
_hashed = [0]  # bytes of buffers hashed by this process


def bytes_hashed() -> int:
    """How many bytes of buffers (arrays, bytes, tensors) this process has hashed."""
    return _hashed[0]


def hash_value(obj: Any) -> str:
    """Return the 128-bit key of ``obj`` as 32 hex digits.

    Examples
    --------
    >>> hash_value({"a": 1, "b": 2}) == hash_value({"b": 2, "a": 1})
    True
    >>> hash_value(1) == hash_value(1.0)
    False
    """
    h = Hasher()
    h.update(obj)
    return h.hexdigest()


class Hasher:
    """Streams canonical tokens of values into one xxh3-128 state.

    Use :meth:`update` for each value, then :meth:`hexdigest`. A ``Hasher`` is
    single-use and not thread-safe.
    """

    __slots__ = ("_buf", "_h", "_memo", "_outer")

    def __init__(self, prefix: bytes = b"") -> None:
        self._h = xxhash.xxh3_128()
        self._buf = bytearray(prefix)
        # id -> (index, obj): back-references for shared and cyclic objects. The
        # object is kept so that its id cannot be reused during this hash.
        self._memo: dict[int, tuple[int, Any]] = {}
        # the memos of the hashers this one is a sub-hash of (set elements, dict
        # keys): a cycle through a set refers back to them instead of recursing
        self._outer: list[dict[int, tuple[int, Any]]] = []

    def hexdigest(self) -> str:
        self._h.update(self._buf)
        self._buf.clear()
        return self._h.hexdigest()

    def digest_of(self, obj: Any) -> bytes:
        """The 16-byte digest of ``obj`` alone, as a fresh ``Hasher`` would give it;
        the hasher is reset first, so one hasher can digest many values in turn."""
        self._h.reset()
        self._buf.clear()
        if self._memo:
            self._memo.clear()
        self.update(obj)
        self._h.update(self._buf)
        return self._h.digest()

    # -- helpers -----------------------------------------------------------
    def _raw(self, data: Any) -> None:
        """Feed a contiguous buffer; large ones go straight to the hash."""
        mv = memoryview(data)
        n = mv.nbytes
        _hashed[0] += n
        self._buf += _pack_Q(n)
        if n >= _TREE_MIN:
            self._buf += _tree_digest(mv if mv.format == "B" else mv.cast("B"))
        elif n >= _BIG:
            self._h.update(self._buf)
            self._buf.clear()
            self._h.update(mv)
        else:
            self._buf += mv

    def _str(self, s: str) -> None:
        data = s.encode("utf-8", "surrogatepass")
        self._buf += _pack_Q(len(data))
        self._buf += data

    def _sub_digest(self, obj: Any) -> bytes:
        sub = Hasher()
        sub._outer = [*self._outer, self._memo]
        sub.update(obj)
        sub._h.update(sub._buf)
        return sub._h.digest()

    # -- the walk ----------------------------------------------------------
    def update(self, obj: Any) -> None:
        """Add ``obj`` to the stream. Raises ``TypeError`` if it cannot be hashed."""
        handler = _DISPATCH.get(type(obj))
        if handler is not None:
            handler(self, obj)
            return
        if self._seen(obj):
            return
        t = type(obj)
        special = _SPECIAL_BY_TYPE.get(t, _UNKNOWN)
        if special is _UNKNOWN:  # every check depends on the type only: decide once
            special = _SPECIAL_BY_TYPE[t] = next((s for c, s in _SPECIAL if c(obj)), None)
        if special is None and _is_wrapper(obj):  # __wrapped__ is set per instance
            special = _wrapper
        if special is not None:
            special(self, obj)
        else:
            self._reduce(obj)

    def _seen(self, obj: Any) -> bool:
        """Write a back-reference and return True if ``obj`` was met before (shared
        or cyclic); else remember it and return False."""
        key = id(obj)
        seen = self._memo.get(key)
        if seen is not None:
            self._buf += b"@" + _pack_Q(seen[0])
            return True
        for level, memo in enumerate(self._outer):
            outer = memo.get(key)
            if outer is not None:
                self._buf += b"^" + _pack_Q(level) + _pack_Q(outer[0])
                return True
        self._memo[key] = (len(self._memo), obj)
        return False

    def _container(self, tag: bytes, items: Any) -> None:
        if self._seen(items):
            return
        self._buf += tag + _pack_Q(len(items))
        for item in items:
            self.update(item)

    def _dict(self, d: dict[Any, Any]) -> None:
        if self._seen(d):
            return
        self._buf += b"{" + _pack_Q(len(d))
        for k, v in _canonical_items(self, d):
            self.update(k)
            self.update(v)

    def _set(self, s: set[Any] | frozenset[Any]) -> None:
        self._buf += (b"S" if type(s) is set else b"Z") + _pack_Q(len(s))
        if all(type(x) is str for x in s):
            for x in sorted(s):
                self._str(x)
            return
        for digest in sorted(self._sub_digest(x) for x in s):
            self._buf += digest

    def _ndarray(self, a: np.ndarray) -> None:
        dt = a.dtype
        self._buf += b"A"
        self._str(str(dt) if dt.fields is not None else dt.str)
        self._buf += _pack_Q(a.ndim) + b"".join(_pack_Q(n) for n in a.shape)
        if dt.hasobject:
            self._buf += b"O"
            for item in a.flat:
                self.update(item)
            return
        if a.flags.c_contiguous:
            self._buf += b"C"
            self._raw(a.reshape(-1).view(np.uint8))
        elif a.flags.f_contiguous:
            self._buf += b"F"
            self._raw(a.T.reshape(-1).view(np.uint8))
        else:
            # the same stream as its C-contiguous copy, without making that copy
            _hashed[0] += a.nbytes
            self._buf += b"C" + _pack_Q(a.nbytes)
            rows = max(1, _CHUNK // max(1, a[:1].nbytes))
            chunks = (
                memoryview(np.ascontiguousarray(a[i : i + rows]).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
                for i in range(0, a.shape[0], rows)
            )
            if a.nbytes >= _TREE_MIN:
                self._buf += _tree_digest_chunks(chunks)
            else:
                self._h.update(self._buf)
                self._buf.clear()
                for chunk in chunks:
                    self._h.update(chunk)

    def _global(self, obj: Any) -> None:
        bound = getattr(obj, "__self__", None)
        if (
            isinstance(obj, types.BuiltinFunctionType)
            and bound is not None
            and not isinstance(bound, types.ModuleType)
        ):
            self._buf += b"B"
            self.update(bound)
            self._str(obj.__name__)
            return
        module = str(getattr(obj, "__module__", None) or "")
        qualname = str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", ""))
        self._buf += b"G"
        self._str(module)
        self._str(qualname)
        if isinstance(obj, type) and not _resolves(obj):
            # a class that is not importable by its name (defined in a function, or
            # shipped by value to a worker): what it does is its bases and its
            # namespace, methods by their code
            self.update(obj.__bases__)
            for name, value in sorted(vars(obj).items()):
                if name in _CLASS_HOUSEKEEPING:
                    continue
                self._str(name)
                try:
                    self._buf += self._sub_digest(_unwrap_descriptor(value))
                except (TypeError, RecursionError):  # a lock, an ABC cache: by type
                    self._str(_typename(value))

    def _function(self, obj: types.FunctionType) -> None:
        """A Python function: its name, the code that runs, and its closure's values."""
        if self._seen(obj):  # also ends cycles of functions reaching each other
            return
        token = _FUNCTION_TOKENS.get(obj)
        if token is None or _FUNCTION_CODES.get(obj) is not obj.__code__:
            # a function's name and code change only if __code__ is replaced: its
            # token is made once per function (and again after such a replacement)
            from .deps import _code_digest

            parts = (obj.__module__ or "", obj.__qualname__, _code_digest(obj.__code__))
            token = b"Fn" + b"".join(
                _pack_Q(len(b)) + b for b in (p.encode("utf-8", "surrogatepass") for p in parts)
            )
            _FUNCTION_TOKENS[obj], _FUNCTION_CODES[obj] = token, obj.__code__
        self._buf += token
        self.update(obj.__defaults__)
        self.update(obj.__kwdefaults__)
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is not None:  # a decorator's wrapper: what it wraps counts too
            self.update(wrapped)
        for cell in obj.__closure__ or ():
            try:
                self.update(cell.cell_contents)
            except ValueError:  # an empty cell
                self._buf += b"-"

    def _reduce(self, obj: Any) -> None:
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as exc:
            raise TypeError(f"cannot hash object of type {_typename(obj)}: {exc}") from None
        if isinstance(rv, str):  # a global reference
            self._buf += b"g"
            self._str(getattr(obj, "__module__", "") or "")
            self._str(rv)
            return
        if not isinstance(rv, tuple) or len(rv) < 2:
            raise TypeError(f"cannot hash object of type {_typename(obj)}: bad __reduce_ex__")
        func, args, *rest = rv + (None,) * (6 - len(rv))
        state, listitems, dictitems = rest[0], rest[1], rest[2]
        self._buf += b"R"
        self.update(func)
        self.update(args)
        self.update(state)
        if listitems is not None:
            self._buf += b"L"
            self.update(list(listitems))
        if dictitems is not None:
            # dict subclasses: keep their order only if equality depends on it
            self._buf += b"D"
            if isinstance(obj, collections.OrderedDict):
                self.update(list(dictitems))
            else:
                d = dict(dictitems)
                self.update([list(kv) for kv in _canonical_items(self, d)])


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """Threads for hashing blocks (xxhash releases the GIL); None on one core."""
    global _pool
    workers = min(os.cpu_count() or 1, 8)
    if workers < 2:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="mlcache-hash"
            )
        return _pool


def _forget_pool() -> None:  # a forked child inherits neither the threads nor a free lock
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _tree_digest(mv: memoryview) -> bytes:
    """b"T" + the xxh3-128 digests of ``mv``'s blocks, computed in parallel."""
    blocks = [mv[i : i + _BLOCK] for i in range(0, mv.nbytes, _BLOCK)]
    pool = _hash_pool()
    digests = (
        pool.map(xxhash.xxh3_128_digest, blocks) if pool else map(xxhash.xxh3_128_digest, blocks)
    )
    return b"T" + b"".join(digests)


def parallel_map(func: Callable[[memoryview], Any], blocks: list[memoryview]) -> list[Any]:
    """``[func(b) for b in blocks]``, run on the hashing threads (all cores) when
    there are several blocks; ``func`` should release the GIL, as xxhash's do.
    The entry reader checks large payloads' block tables with it."""
    pool = _hash_pool() if len(blocks) > 1 else None
    return list(pool.map(func, blocks)) if pool else [func(b) for b in blocks]


def _tree_digest_chunks(chunks: Iterator[memoryview]) -> bytes:
    """:func:`_tree_digest` of the concatenation of ``chunks`` (fed sequentially)."""
    out = [b"T"]
    block = xxhash.xxh3_128()
    filled = 0
    for chunk in chunks:
        while chunk.nbytes:
            take = chunk[: _BLOCK - filled]
            block.update(take)
            filled += take.nbytes
            chunk = chunk[take.nbytes :]
            if filled == _BLOCK:
                out.append(block.digest())
                block, filled = xxhash.xxh3_128(), 0
    if filled:
        out.append(block.digest())
    return b"".join(out)


_UNKNOWN = object()
_SPECIAL_BY_TYPE: dict[type, Any] = {}
_FUNCTION_TOKENS: weakref.WeakKeyDictionary[types.FunctionType, bytes] = weakref.WeakKeyDictionary()
_FUNCTION_CODES: weakref.WeakKeyDictionary[types.FunctionType, types.CodeType] = (
    weakref.WeakKeyDictionary()
)

_CLASS_HOUSEKEEPING = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__module__",
        "__qualname__",
        "__doc__",
        "__annotations__",
        "_abc_impl",
        "__dataclass_fields__",
        "__dataclass_params__",
        "__match_args__",
        "__slots__",
    }
)


def _resolves(cls: type) -> bool:
    """True if ``cls`` is what its module and qualified name lead to."""
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is cls


def _unwrap_descriptor(value: Any) -> Any:
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    if isinstance(value, property):
        return (value.fget, value.fset, value.fdel)
    return value


def _typename(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _canonical_items(h: Hasher, d: dict[Any, Any]) -> list[tuple[Any, Any]]:
    items = list(d.items())
    if all(type(k) is str for k, _ in items):
        items.sort(key=lambda kv: kv[0])
        return items
    decorated = sorted(((h._sub_digest(k), i) for i, (k, _) in enumerate(items)))
    return [items[i] for _, i in decorated]


# -- handlers for exact types (the fast path) -------------------------------
def _none(h: Hasher, obj: Any) -> None:
    h._buf += b"N"


def _bool(h: Hasher, obj: bool) -> None:
    h._buf += b"T" if obj else b"F"


def _int(h: Hasher, obj: int) -> None:
    if -(1 << 63) <= obj < (1 << 63):
        h._buf += b"i" + _pack_q(obj)
    else:
        data = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
        h._buf += b"I" + _pack_Q(len(data)) + data


def _float(h: Hasher, obj: float) -> None:
    h._buf += b"f" + _pack_d(obj)


def _complex(h: Hasher, obj: complex) -> None:
    h._buf += b"c" + _pack_d(obj.real) + _pack_d(obj.imag)


def _str(h: Hasher, obj: str) -> None:
    h._buf += b"s"
    h._str(obj)


def _bytes(h: Hasher, obj: bytes) -> None:
    h._buf += b"b"
    h._raw(obj)


def _bytearray(h: Hasher, obj: bytearray) -> None:
    h._buf += b"y"
    h._raw(obj)


def _memoryview(h: Hasher, obj: memoryview) -> None:
    h._buf += b"m"
    h._str(obj.format)
    h._buf += _pack_Q(obj.ndim) + b"".join(_pack_Q(n) for n in (obj.shape or ()))
    h._raw(obj if obj.c_contiguous else obj.tobytes())


def _tuple(h: Hasher, obj: tuple[Any, ...]) -> None:
    # immutable: identity is not observable, so no back-references
    h._buf += b"(" + _pack_Q(len(obj))
    for item in obj:
        h.update(item)


def _list(h: Hasher, obj: list[Any]) -> None:
    h._container(b"[", obj)


def _dict(h: Hasher, obj: dict[Any, Any]) -> None:
    h._dict(obj)


def _set(h: Hasher, obj: set[Any]) -> None:
    h._set(obj)


def _ndarray(h: Hasher, obj: np.ndarray) -> None:
    h._ndarray(obj)


def _dtype(h: Hasher, obj: np.dtype) -> None:
    h._buf += b"d"
    h._str(str(obj) if obj.fields is not None else obj.str)


def _global(h: Hasher, obj: Any) -> None:
    h._global(obj)


def _module(h: Hasher, obj: types.ModuleType) -> None:
    h._buf += b"Mod"
    h._str(obj.__name__)


def _path(h: Hasher, obj: pathlib.PurePath) -> None:
    h._buf += b"P"
    h._str(type(obj).__name__)
    h._str(str(obj))


_DISPATCH: dict[type, Callable[[Hasher, Any], None]] = {
    type(None): _none,
    bool: _bool,
    int: _int,
    float: _float,
    complex: _complex,
    str: _str,
    bytes: _bytes,
    bytearray: _bytearray,
    memoryview: _memoryview,
    tuple: _tuple,
    list: _list,
    dict: _dict,
    set: _set,
    frozenset: _set,
    np.ndarray: _ndarray,
    type: lambda h, cls: None if h._seen(cls) else h._global(cls),
    types.FunctionType: lambda h, f: h._function(f),
    types.BuiltinFunctionType: _global,
    types.ModuleType: _module,
    type(Ellipsis): lambda h, _: h._buf.extend(b"E"),
    range: lambda h, r: h._buf.extend(b"r" + _pack_q(r.start) + _pack_q(r.stop) + _pack_q(r.step)),
}
for _cls in (
    pathlib.PurePath,
    pathlib.PurePosixPath,
    pathlib.PureWindowsPath,
    pathlib.Path,
    pathlib.PosixPath,
    pathlib.WindowsPath,
):
    _DISPATCH[_cls] = _path


# -- handlers found by isinstance checks (after the memo) ---------------------
def _is_np_scalar(obj: Any) -> bool:
    return isinstance(obj, np.generic)


def _np_scalar(h: Hasher, obj: np.generic) -> None:
    if obj.dtype.hasobject:
        h._buf += b"o"
        h.update(obj.item())
        return
    h._buf += b"n"
    h._str(obj.dtype.str)
    h._raw(np.asarray(obj).tobytes())


def _is_ndarray(obj: Any) -> bool:  # subclasses: np.memmap, np.matrix, ...
    return isinstance(obj, np.ndarray)


def _ndarray_subclass(h: Hasher, obj: np.ndarray) -> None:
    if isinstance(obj, np.memmap):
        ref = obj.__dict__.get(REF_ATTR)
        if ref is not None and not obj.flags.writeable:
            # a cached result, mapped read-only: its entry names its contents; its
            # dtype, shape and strides are read now (they can be set in place)
            h._buf += b"R"
            h._str(ref)
            h._str(obj.dtype.str)
            h._buf += b"".join(_pack_q(n) for n in (*obj.shape, *obj.strides))
            return
        h._ndarray(obj.view(np.ndarray))
        return
    if type(obj) is not np.ndarray:
        h._reduce(obj)
        return
    h._buf += b"X"
    h._str(_typename(obj))
    h._ndarray(obj.view(np.ndarray))


def _is_wrapper(obj: Any) -> bool:
    return hasattr(obj, "__wrapped__") and callable(obj) and not isinstance(obj, type)


def _wrapper(h: Hasher, obj: Any) -> None:
    # functools.lru_cache and other wrapper objects: they do what they wrap
    h._buf += b"W"
    h._str(_typename(obj))
    h.update(obj.__wrapped__)


def _is_ufunc(obj: Any) -> bool:
    return isinstance(obj, np.ufunc)


def _ufunc(h: Hasher, obj: np.ufunc) -> None:
    h._buf += b"U"
    h._str(obj.__name__)


def _is_dtype(obj: Any) -> bool:
    return isinstance(obj, np.dtype)


def _has_token(obj: Any) -> bool:
    return hasattr(type(obj), "__mlcache_token__")


def _token(h: Hasher, obj: Any) -> None:
    # objects that know what identifies them (a memoized function: its function)
    h._buf += b"k"
    h._str(_typename(obj))
    h.update(obj.__mlcache_token__())


def _is_callable_global(obj: Any) -> bool:
    return isinstance(obj, (type, types.BuiltinFunctionType))


def _is_method(obj: Any) -> bool:
    return isinstance(obj, types.MethodType)


def _method(h: Hasher, obj: types.MethodType) -> None:
    h._buf += b"M"
    h.update(obj.__self__)
    h.update(obj.__func__)


def _is_pandas(obj: Any) -> bool:
    mod = type(obj).__module__
    return (mod == "pandas" or mod.startswith("pandas.")) and "pandas" in sys.modules


def _pandas(h: Hasher, obj: Any) -> None:
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        h._buf += b"pD"
        h.update(obj.columns)
        h.update(obj.index)
        h._buf += _pack_Q(obj.shape[1])
        for i in range(obj.shape[1]):
            _pandas_values(h, obj.iloc[:, i])
        h.update(dict(obj.attrs))
    elif isinstance(obj, pd.Series):
        h._buf += b"pS"
        h.update(obj.name)
        h.update(obj.index)
        _pandas_values(h, obj)
        h.update(dict(obj.attrs))
    elif isinstance(obj, pd.Index):
        h._buf += b"pI"
        h._str(_typename(obj))
        h.update(obj.names if isinstance(obj, pd.MultiIndex) else obj.name)
        _pandas_values(h, obj)
    else:
        h._reduce(obj)


def _pandas_values(h: Hasher, obj: Any) -> None:
    # repr(dtype) names categories, timezones and the storage of string dtypes
    h._str(repr(obj.dtype))
    if hasattr(obj.dtype, "categories"):
        h.update(obj.dtype.categories)
    values = (
        obj.to_numpy() if not hasattr(obj, "levels") else np.asarray(obj.tolist(), dtype=object)
    )
    h.update(np.asarray(values))


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and "torch" in sys.modules


def _torch(h: Hasher, obj: Any) -> None:
    import torch

    if not isinstance(obj, torch.Tensor):
        h._reduce(obj)
        return
    t = obj.detach()
    h._buf += b"t"
    h._str(_typename(obj))
    h._str(str(t.dtype))
    h._str(t.device.type)
    h._buf += b"1" if obj.requires_grad else b"0"
    h._buf += _pack_Q(t.dim()) + b"".join(_pack_Q(n) for n in t.shape)
    if t.layout != torch.strided:
        h._reduce(t.cpu())
        return
    t = t.cpu().resolve_conj().resolve_neg().contiguous()
    h._raw(t.reshape(-1).view(torch.uint8).numpy())


_SPECIAL: list[tuple[Callable[[Any], bool], Callable[[Hasher, Any], None]]] = [
    (_is_np_scalar, _np_scalar),
    (_is_ndarray, _ndarray_subclass),
    (_is_dtype, _dtype),
    (_is_ufunc, _ufunc),
    (_is_torch, _torch),
    (_is_pandas, _pandas),
    (_has_token, _token),
    (_is_callable_global, _global),
    (_is_method, _method),
]
