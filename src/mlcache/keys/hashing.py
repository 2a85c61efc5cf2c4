"""Cache keys: a canonical byte stream of any argument, hashed with xxh3-128.

Every value is written to the stream as a one-byte tag and a payload; buffers
(numpy arrays, bytes, torch tensors) are fed to the hash straight from memory,
without pickling or copying when they are contiguous. The result is a 32-digit
hex string.

Decisions (tested in ``tests/keys/test_hashing.py``):

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
* **What a function can see of a value is in its key**: an ndarray subclass's
  attributes (its ``__dict__`` and slots), a masked array's mask, fill value and
  hard-mask flag, a dtype's metadata, a pandas index's ``freq``, a RangeIndex's
  start, stop and step, a MultiIndex's levels and codes, ``.attrs`` and
  ``.flags`` of frames and series. All of them are still hashed from buffers.
* **Functions and classes are keyed by what they run.** A user function or
  class (an argument, a default, a captured value) is its identity plus its
  code version (:func:`mlcache.keys.code_version.code_version`: the helpers and methods it
  reaches), so editing ``_inner`` that a passed ``transform`` calls is a miss.
  While a code walk is in progress (:func:`code_walk`: the walk hashes
  constants, which may hold functions) a function is its identity and its own
  normalised bytecode only, so the walk cannot recurse into itself and a code
  version never depends on what was hashed before it. Library functions and
  classes are their qualified name and the library's version; they are not
  walked.
* **Probes are type-level.** Whether a value is an array, a frame, a tensor, a
  wrapper or carries ``__mlcache_token__`` is decided from its type (and its
  instance ``__dict__``), never by ``hasattr`` on the instance, so a
  ``__getattr__`` that raises ``KeyError`` (``class dotdict(dict)``) or a lazy
  proxy raising ``RuntimeError`` is not run by a probe. Torch meta tensors are
  keyed by dtype, shape, strides and device (they hold no data), nested tensors
  by their components.
* A value that cannot be hashed raises ``TypeError``: whatever the failure
  (an object whose ``__reduce_ex__`` refuses, a proxy that raises
  ``RuntimeError``), the public entry points turn it into ``TypeError`` naming
  the type and the original error, and the caller makes the call uncached.
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
import contextlib
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

__all__ = ["HASH_SCHEME", "REF_ATTR", "Hasher", "bytes_hashed", "code_walk", "hash_value"]

#: Version of the canonical stream; part of every key, bump it on any change here.
#: 5: subclass attributes, pandas freq/flags/RangeIndex/MultiIndex levels, masked
#: arrays from buffers, dtype metadata, code versions of functions and classes,
#: library versions, torch meta and nested tensors
HASH_SCHEME = 5

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
    h.update_checked(obj)
    return h.hexdigest()


def _unhashable(obj: Any, exc: BaseException) -> TypeError:
    """The ``TypeError`` that says ``obj`` could not be hashed because of ``exc``."""
    return TypeError(f"cannot hash object of type {_typename(obj)}: {type(exc).__name__}: {exc}")


_walk_state = threading.local()


@contextlib.contextmanager
def code_walk() -> Iterator[None]:
    """Mark a code walk in progress on this thread (see the module docstring):
    inside it, functions and classes are hashed by identity and their own code
    only, never by :func:`mlcache.keys.code_version.code_version`.

    Examples
    --------
    >>> with code_walk():
    ...     key = hash_value(len)
    """
    depth = getattr(_walk_state, "depth", 0)
    _walk_state.depth = depth + 1
    try:
        yield
    finally:
        _walk_state.depth = depth


def _in_code_walk() -> bool:
    return getattr(_walk_state, "depth", 0) > 0


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
        self.update_checked(obj)
        self._h.update(self._buf)
        return self._h.digest()

    def update_checked(self, obj: Any) -> None:
        """:meth:`update`, with whatever reading ``obj`` raises (a proxy's
        ``__getattr__``, a broken ``__reduce__``) as a ``TypeError`` naming it."""
        try:
            self.update(obj)
        except TypeError:
            raise
        except Exception as exc:  # whatever a value raises while it is read
            raise _unhashable(obj, exc) from exc

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
        """Add ``obj`` to the stream. Raises ``TypeError`` if it cannot be hashed (and
        may raise what reading ``obj`` raises: :func:`hash_value` and
        :meth:`digest_of` turn that into ``TypeError``)."""
        handler = _DISPATCH.get(type(obj))
        if handler is not None:
            handler(self, obj)
            return
        if self._seen(obj):
            return
        t = type(obj)
        special = _SPECIAL_BY_TYPE.get(t, _UNKNOWN)
        if special is _UNKNOWN:  # every check depends on the type only: decide once
            special = _SPECIAL_BY_TYPE[t] = next((s for c, s in _SPECIAL if c(t)), None)
        if special is None and _is_wrapper(obj, t):  # __wrapped__ is set per instance
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
        if dt.metadata:  # np.dtype(..., metadata={"unit": "m"}): a function can read it
            self._buf += b"d"
            self.update(dict(dt.metadata))
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
        if not _is_user(module):
            if module != "builtins":  # a library's class or function: by its version
                self._buf += b"v"
                self._str(_library_version(module))
            return
        if isinstance(obj, type) and not _in_code_walk():
            # a user class: what its methods run (and the helpers they reach)
            self._buf += b"V"
            self._str(_class_version(obj))
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
        deep = not _in_code_walk()
        cached = _FUNCTION_TOKENS.get(obj)
        if cached is None or cached[0] is not obj.__code__:
            # a function's name and code change only if __code__ is replaced: its
            # tokens are made once per function (and again after such a replacement)
            cached = _FUNCTION_TOKENS[obj] = [obj.__code__, None, None]
        token = cached[2 if deep else 1]
        if token is None:
            token = cached[2 if deep else 1] = _function_token(obj, deep)
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
            raise _unhashable(obj, exc) from None
        if isinstance(rv, str):  # a global reference
            self._buf += b"g"
            self._str(str(getattr(type(obj), "__module__", "") or ""))
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
            if issubclass(type(obj), collections.OrderedDict):
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
#: function -> [its __code__, its token inside a code walk, its token outside]
_FUNCTION_TOKENS: weakref.WeakKeyDictionary[types.FunctionType, list[Any]] = (
    weakref.WeakKeyDictionary()
)
#: user class -> its code version digest
_CLASS_VERSIONS: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()


def _is_user(module: str | None) -> bool:
    """User code (walked for its code version), as :mod:`mlcache.keys.code_version` decides;
    code without a module (``exec`` without ``__name__``) is the user's."""
    from .code_version import is_user_module

    return not module or is_user_module(module)


def _library_version(module: str) -> str:
    from .code_version import library_version

    return library_version(module)


def _code_version(obj: Any) -> str:
    """``code_version(obj).digest``, computed inside :func:`code_walk` (so the
    constants it hashes do not start walks of their own)."""
    from .code_version import code_version

    with code_walk():
        return code_version(obj).digest


def _class_version(cls: type) -> str:
    found = _CLASS_VERSIONS.get(cls)
    if found is None:
        found = _code_version(cls)
        with contextlib.suppress(TypeError):  # not weakly referenceable: not cached
            _CLASS_VERSIONS[cls] = found
    return found


def _function_token(f: types.FunctionType, deep: bool) -> bytes:
    """A function's token: ``Fl`` module, name and library version for a library's
    function; ``Fn`` module, name and own normalised code for a user function in a
    code walk; ``Fv`` module, name and code version (what it reaches) otherwise."""
    from .code_version import _code_digest

    module = f.__module__ or ""
    if not _is_user(module):
        tag, version = b"Fl", _library_version(module)
    elif deep:
        tag, version = b"Fv", _code_version(f)
    else:
        tag, version = b"Fn", _code_digest(f.__code__)
    parts = (module, f.__qualname__, version)
    return tag + b"".join(
        _pack_Q(len(b)) + b for b in (p.encode("utf-8", "surrogatepass") for p in parts)
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
    if obj.metadata:
        h._buf += b"d"
        h.update(dict(obj.metadata))


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


# -- handlers found by checks of the type (after the memo) -------------------
# Every check looks at the type only, never at the instance: an instance's
# __getattr__ (or a __class__ property) may raise anything, and the answer is
# cached per type.
def _is_np_scalar(t: type) -> bool:
    return issubclass(t, np.generic)


def _np_scalar(h: Hasher, obj: np.generic) -> None:
    if obj.dtype.hasobject:
        h._buf += b"o"
        h.update(obj.item())
        return
    dt = obj.dtype
    h._buf += b"n"
    # a record (np.void) of a structured array: its fields, as for arrays ("|V8"
    # would not tell ('a', i4), ('b', i4) from ('x', f4), ('y', i4))
    h._str(str(dt) if dt.fields is not None else dt.str)
    if dt.metadata:
        h._buf += b"d"
        h.update(dict(dt.metadata))
    h._raw(np.asarray(obj).tobytes())


def _is_ndarray(t: type) -> bool:  # subclasses: np.memmap, np.matrix, ...
    return issubclass(t, np.ndarray)


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
    # a subclass: its type, what its instances carry (astropy-like units, metadata
    # in __dict__ or slots) and its buffer, never pickled
    h._buf += b"X"
    h._str(_typename(obj))
    attrs, slots = _instance_state(obj)
    if isinstance(obj, np.ma.MaskedArray):
        # the mask, the fill value and the hard-mask flag change what the array
        # does; the other bookkeeping (_sharedmask, _optinfo, ...) does not
        attrs = attrs or {}
        h._buf += b"m"
        h.update(attrs.get("_mask"))
        fill = attrs.get("_fill_value")  # None until read: then the dtype's default
        h.update(np.ma.default_fill_value(obj) if fill is None else fill)
        h._buf += b"T" if attrs.get("_hardmask") else b"F"
        h.update(attrs.get("_baseclass"))
        attrs = {k: v for k, v in attrs.items() if k not in _MASKED_INTERNALS}
    h.update(attrs or None)
    if slots:
        h.update(slots)
    h._ndarray(obj.view(np.ndarray))


_MASKED_INTERNALS = frozenset(
    {"_mask", "_fill_value", "_hardmask", "_sharedmask", "_isfield", "_baseclass"}
    | {"_optinfo", "_basedict"}
)
_NO_SLOTS: tuple[str, ...] = ()
_SLOTS_BY_TYPE: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _slot_names(t: type) -> tuple[str, ...]:
    """The names of the slots of ``t``'s instances (private names mangled)."""
    found = _SLOTS_BY_TYPE.get(t)
    if found is None:
        names = []
        for klass in t.__mro__:
            slots = vars(klass).get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name in ("__dict__", "__weakref__"):
                    continue
                if name.startswith("__") and not name.endswith("__"):
                    name = f"_{klass.__name__.lstrip('_')}{name}"
                names.append(name)
        found = tuple(sorted(set(names))) or _NO_SLOTS
        _SLOTS_BY_TYPE[t] = found
    return found


def _instance_state(obj: Any) -> tuple[dict[str, Any] | None, list[tuple[str, Any]]]:
    """An instance's ``__dict__`` (or None) and its slots' ``(name, value)``, read
    without running its ``__getattr__`` or ``__getattribute__``."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attrs = None
    slots = []
    for name in _slot_names(type(obj)):
        try:
            slots.append((name, object.__getattribute__(obj, name)))
        except AttributeError:  # an unset slot
            slots.append((name, _UNSET_SLOT))
    return attrs, slots


class _UnsetSlot:
    """Stands for an unset slot in the stream."""

    def __reduce__(self) -> str:
        return "_UNSET_SLOT"


_UNSET_SLOT = _UnsetSlot()


def _is_wrapper(obj: Any, t: type) -> bool:
    """A wrapper object (``functools.lru_cache``, a ``functools.wraps`` callable
    object): ``__wrapped__`` in its instance dict or on its type. Looked up there,
    never through the instance's ``__getattr__``."""
    if not callable(obj) or issubclass(t, type):
        return False
    if _type_has(t, "__wrapped__"):
        return True
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return False
    return isinstance(attrs, dict) and "__wrapped__" in attrs


def _type_has(t: type, name: str) -> bool:
    """Whether ``name`` is defined on ``t`` or a base (no metaclass, no instance)."""
    return any(name in vars(klass) for klass in t.__mro__)


def _wrapper(h: Hasher, obj: Any) -> None:
    # functools.lru_cache and other wrapper objects: they do what they wrap
    h._buf += b"W"
    h._str(_typename(obj))
    h.update(obj.__wrapped__)


def _is_ufunc(t: type) -> bool:
    return issubclass(t, np.ufunc)


def _ufunc(h: Hasher, obj: np.ufunc) -> None:
    h._buf += b"U"
    h._str(obj.__name__)
    h._str(_library_version("numpy"))


def _is_dtype(t: type) -> bool:
    return issubclass(t, np.dtype)


def _has_token(t: type) -> bool:
    return _type_has(t, "__mlcache_token__")


def _token(h: Hasher, obj: Any) -> None:
    # objects that know what identifies them (a memoized function: its function)
    h._buf += b"k"
    h._str(_typename(obj))
    h.update(obj.__mlcache_token__())


def _is_callable_global(t: type) -> bool:
    return issubclass(t, (type, types.BuiltinFunctionType))


def _is_method(t: type) -> bool:
    return issubclass(t, types.MethodType)


def _method(h: Hasher, obj: types.MethodType) -> None:
    h._buf += b"M"
    h.update(obj.__self__)
    h.update(obj.__func__)


def _is_pandas(t: type) -> bool:
    mod = str(t.__module__)
    return (mod == "pandas" or mod.startswith("pandas.")) and "pandas" in sys.modules


def _pandas(h: Hasher, obj: Any) -> None:
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        h._buf += b"pD"
        h.update(obj.columns)
        h.update(obj.index)
        h._buf += _pack_Q(obj.shape[1])
        for _, column in obj.items():  # items(): much cheaper than iloc[:, i]
            _pandas_values(h, column)
        h.update(dict(obj.attrs))
        h._buf += b"T" if obj.flags.allows_duplicate_labels else b"F"
    elif isinstance(obj, pd.Series):
        h._buf += b"pS"
        h.update(obj.name)
        h.update(obj.index)
        _pandas_values(h, obj)
        h.update(dict(obj.attrs))
        h._buf += b"T" if obj.flags.allows_duplicate_labels else b"F"
    elif isinstance(obj, pd.Index):
        _pandas_index(h, obj, pd)
    else:
        h._reduce(obj)


def _pandas_index(h: Hasher, obj: Any, pd: Any) -> None:
    h._buf += b"pI"
    h._str(_typename(obj))
    if isinstance(obj, pd.MultiIndex):
        # levels and codes: what .levels shows (unused levels too), without
        # building a tuple per row
        h.update(list(obj.names))
        h._buf += _pack_Q(obj.nlevels)
        for level, codes in zip(obj.levels, obj.codes):
            h.update(level)
            h.update(np.asarray(codes))
        return
    h.update(obj.name)
    if isinstance(obj, pd.RangeIndex):  # its start, stop and step are what it is
        h._buf += b"r" + _pack_q(obj.start) + _pack_q(obj.stop) + _pack_q(obj.step)
        return
    if isinstance(obj, (pd.DatetimeIndex, pd.TimedeltaIndex)):
        h._buf += b"q"  # .freq: a function can read it (asfreq, shift, resample)
        h.update(obj.freq)
    _pandas_values(h, obj)


def _pandas_values(h: Hasher, obj: Any) -> None:
    import pandas as pd

    # repr(dtype) names categories, timezones and the storage of string dtypes
    dtype = obj.dtype
    h._str(repr(dtype))
    if isinstance(dtype, pd.CategoricalDtype):
        h.update(dtype.categories)
        h.update(np.asarray(obj.array.codes))  # codes, not an object array of values
        return
    h.update(np.asarray(obj.to_numpy()))


def _is_torch(t: type) -> bool:
    if "torch" not in sys.modules:
        return False
    # a user's Tensor subclass too: by buffers, not through pickle
    return str(t.__module__).startswith("torch") or issubclass(t, sys.modules["torch"].Tensor)


def _torch(h: Hasher, obj: Any) -> None:
    import torch

    if not issubclass(type(obj), torch.Tensor):
        h._reduce(obj)
        return
    t = obj.detach()
    h._buf += b"t"
    h._str(_typename(obj))
    h._str(str(t.dtype))
    h._str(t.device.type)
    h._buf += b"1" if obj.requires_grad else b"0"
    if t.is_nested:  # a nested tensor is its components (its shape is not a tuple of ints)
        parts = t.unbind()
        h._buf += b"J"
        h._str(str(t.layout))
        h._buf += _pack_Q(len(parts))
        for part in parts:
            _torch(h, part)
        return
    attrs, slots = _instance_state(obj)  # attributes set on it: a function can read them
    h.update(attrs or None)
    if slots:
        h.update(slots)
    h._buf += _pack_Q(t.dim()) + b"".join(_pack_Q(n) for n in t.shape)
    if t.is_meta:  # no data: what it is, as a function sees it
        h._buf += b"m" + b"".join(_pack_q(n) for n in (*t.stride(), t.storage_offset()))
        return
    if t.layout != torch.strided:
        h._reduce(t.cpu())
        return
    t = t.cpu().resolve_conj().resolve_neg().contiguous()
    h._raw(t.reshape(-1).view(torch.uint8).numpy())


_SPECIAL: list[tuple[Callable[[type], bool], Callable[[Hasher, Any], None]]] = [
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
