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
  code version (:func:`mlcache.keys.code_version.code_version`: the helpers and
  methods it reaches), so editing ``_inner`` that a passed ``transform`` calls
  is a miss. Library functions and classes are their qualified name and the
  library's version; they are not walked. Their handlers are registered here by
  :mod:`mlcache.keys.code_version` (this module cannot import it: code versions
  hash constants with this module); ``mlcache.keys`` imports both, so importing
  any ``mlcache.keys`` module registers them, and until then hashing a function
  fails rather than giving a key without its code.
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
  entry and its place in it (:data:`mlcache.entry.REF_ATTR`); it is keyed by
  that name, so passing it on to the next step of a pipeline costs nothing,
  whatever its size. Only read-only maps carry it (they cannot be changed through Python);
  writable results, views and slices are hashed by their contents.
* :func:`bytes_hashed` counts the buffer bytes this process has hashed.

Dispatch
--------
A value's handler is found by its type, in this order, and the answer is cached
per type (a hit pays one dict lookup):

1. the exact type among the core types (``int``, ``str``, ``tuple``, ``dict``,
   ``numpy.ndarray``, functions, ...), before the back-reference check (their
   handlers check it themselves where identity is observable);
2. otherwise, after the back-reference check (shared and cyclic objects), the
   type's MRO, most specific first, in the table of value families (numpy
   scalars, arrays and dtypes, ufuncs, torch tensors) and of the hashers users
   register with :func:`register_hasher`;
3. the library the type is defined in (pandas, torch) when its handler decides
   by the module, not by a base class;
4. ``__mlcache_token__`` defined on the type (an object that says what
   identifies it);
5. the kinds of callables by MRO (classes of a metaclass, bound methods);
6. a callable wrapper with ``__wrapped__`` (``functools.lru_cache``): what it
   wraps; anything else through ``__reduce_ex__``.

The handlers live in :mod:`mlcache.keys._handlers` (one per type family) and,
for functions and classes, :mod:`mlcache.keys.code_version`. They write to the
stream through the :class:`Hasher` methods documented as its fast API.
"""

from __future__ import annotations

import collections
import contextlib
import struct
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

from ..codecs.leaves import LISTENERS, leaf_for
from ..errors import InvalidRegistration
from .blocks import block_digests, chunk_block_digests

__all__ = [
    "HASH_SCHEME",
    "Handler",
    "Hasher",
    "bytes_hashed",
    "hash_value",
    "register_hasher",
]

#: Version of the canonical stream; part of every key, bump it on any change here.
#: 5: subclass attributes, pandas freq/flags/RangeIndex/MultiIndex levels, masked
#: arrays from buffers, dtype metadata, code versions of functions and classes,
#: library versions, torch meta and nested tensors; 6: pandas from buffers for every
#: column kind (zones, periods, intervals, masked data and mask, arrow strings)
HASH_SCHEME = 6

_BIG = 1 << 16  # buffers at least this large bypass the staging buffer
# Buffers of at least _TREE_MIN bytes are hashed as the xxh3-128 digests of their
# _BLOCK-sized blocks (a block tree), so that the blocks can be hashed on all cores
# at once (mlcache.keys.blocks). The digests do not depend on the threads.
_TREE_MIN = 1 << 26
_BLOCK = 1 << 24
_pack_Q = struct.Struct("<Q").pack
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


def typename(obj: Any) -> str:
    """``module.qualname`` of ``obj``'s type, read from the type (never from the
    instance: its ``__class__`` may be a property that raises); the script's own
    module is ``__main__`` in a spawned worker too (there ``__mp_main__``)."""
    t = type(obj)
    module = "__main__" if t.__module__ == "__mp_main__" else t.__module__
    return f"{module}.{t.__qualname__}"


def _unhashable(obj: Any, exc: BaseException) -> TypeError:
    """The ``TypeError`` that says ``obj`` could not be hashed because of ``exc``."""
    return TypeError(f"cannot hash object of type {typename(obj)}: {type(exc).__name__}: {exc}")


#: ``handler(hasher, value)`` writes ``value`` to ``hasher``'s stream
Handler = Callable[["Hasher", Any], None]


class Hasher:
    """Streams canonical tokens of values into one xxh3-128 state.

    Use :meth:`update` for each value, then :meth:`hexdigest`. A ``Hasher`` is
    single-use (:meth:`digest_of` resets it) and not thread-safe.

    The fast API, for handlers (:func:`register_hasher` needs none of it):
    :attr:`buf`, the staging bytes a handler appends its tags and small
    payloads to; :meth:`update` for a nested value; :meth:`raw` and
    :meth:`raw_chunks` for buffers; :meth:`text` for a string; :meth:`seen`,
    :meth:`sub_digest`, :meth:`canonical_items` and :meth:`reduce` for
    back-references, order-free containers and the ``__reduce_ex__`` fallback.

    Examples
    --------
    >>> h = Hasher()
    >>> h.update(1)
    >>> h.update("a")
    >>> len(h.hexdigest())
    32
    """

    __slots__ = ("_h", "_memo", "_outer", "buf")

    def __init__(self, prefix: bytes = b"") -> None:
        self._h = xxhash.xxh3_128()
        #: bytes written but not yet fed to the hash: handlers append to it
        #: (``h.buf += b"x" + payload``); it is fed in one go when it matters
        self.buf = bytearray(prefix)
        # id -> (index, obj): back-references for shared and cyclic objects. The
        # object is kept so that its id cannot be reused during this hash.
        self._memo: dict[int, tuple[int, Any]] = {}
        # the memos of the hashers this one is a sub-hash of (set elements, dict
        # keys): a cycle through a set refers back to them instead of recursing
        self._outer: list[dict[int, tuple[int, Any]]] = []

    def hexdigest(self) -> str:
        """The 32-hex-digit digest of everything written so far."""
        self._h.update(self.buf)
        self.buf.clear()
        return self._h.hexdigest()

    def digest_of(self, obj: Any) -> bytes:
        """The 16-byte digest of ``obj`` alone, as a fresh ``Hasher`` would give it;
        the hasher is reset first, so one hasher can digest many values in turn."""
        self.buf.clear()
        scalar = _SCALARS.get(type(obj))
        if scalar is not None:  # a few bytes, no reference: one call of the hash
            scalar(self, obj)
            digest = xxhash.xxh3_128_digest(self.buf)
            self.buf.clear()
            return digest
        self._h.reset()
        if self._memo:
            self._memo.clear()
        self.update_checked(obj)
        self._h.update(self.buf)
        return self._h.digest()

    def forget(self) -> None:
        """Drop what this hasher holds of the values it read (its back-references
        keep them alive, its staging bytes hold some of their bytes), so that it
        can wait to be reused; :meth:`digest_of` resets the rest."""
        if self._memo:
            self._memo.clear()
        self.buf.clear()

    def update_checked(self, obj: Any) -> None:
        """:meth:`update`, with whatever reading ``obj`` raises (a proxy's
        ``__getattr__``, a broken ``__reduce__``) as a ``TypeError`` naming it."""
        try:
            self.update(obj)
        except TypeError:
            raise
        except Exception as exc:  # whatever a value raises while it is read
            raise _unhashable(obj, exc) from exc

    def update(self, obj: Any) -> None:
        """Add ``obj`` to the stream. Raises ``TypeError`` if it cannot be hashed (and
        may raise what reading ``obj`` raises: :func:`hash_value` and
        :meth:`digest_of` turn that into ``TypeError``)."""
        handler = _EXACT.get(type(obj))
        if handler is not None:
            handler(self, obj)
            return
        if self.seen(obj):
            return
        t = type(obj)
        try:
            handler = _RESOLVED[t]
        except KeyError:  # every rule depends on the type only: decide once
            handler = _RESOLVED[t] = _resolve(t)
        if handler is None and _is_wrapper(obj, t):  # __wrapped__ is set per instance
            handler = _wrapper
        if handler is not None:
            handler(self, obj)
        else:
            self.reduce(obj)

    # -- the fast API for handlers ---------------------------------------------
    def raw(self, data: Any) -> None:
        """Write a contiguous buffer (anything ``memoryview`` takes) and its length;
        large ones go straight to the hash, very large ones as a block tree."""
        mv = memoryview(data)
        n = mv.nbytes
        _hashed[0] += n
        self.buf += _pack_Q(n)
        if n >= _TREE_MIN:
            self.buf += b"T" + block_digests(mv if mv.format == "B" else mv.cast("B"), _BLOCK)
        elif n >= _BIG:
            self._h.update(self.buf)
            self.buf.clear()
            self._h.update(mv)
        else:
            self.buf += mv

    def raw_chunks(self, chunks: Iterable[memoryview], nbytes: int) -> None:
        """Write ``nbytes`` of buffer given in pieces (byte views): the same stream
        as :meth:`raw` of their concatenation, without making it."""
        _hashed[0] += nbytes
        self.buf += _pack_Q(nbytes)
        if nbytes >= _TREE_MIN:
            self.buf += b"T" + chunk_block_digests(chunks, _BLOCK)
        else:
            self._h.update(self.buf)
            self.buf.clear()
            for chunk in chunks:
                self._h.update(chunk)

    def text(self, s: str) -> None:
        """Write a string (UTF-8, lone surrogates kept) and its length."""
        data = s.encode("utf-8", "surrogatepass")
        self.buf += _pack_Q(len(data))
        self.buf += data

    def seen(self, obj: Any) -> bool:
        """Write a back-reference and return True if ``obj`` was met before (shared
        or cyclic); else remember it and return False."""
        key = id(obj)
        seen = self._memo.get(key)
        if seen is not None:
            self.buf += b"@" + _pack_Q(seen[0])
            return True
        for level, memo in enumerate(self._outer):
            outer = memo.get(key)
            if outer is not None:
                self.buf += b"^" + _pack_Q(level) + _pack_Q(outer[0])
                return True
        self._memo[key] = (len(self._memo), obj)
        return False

    def sub_digest(self, obj: Any) -> bytes:
        """The 16-byte digest of ``obj`` hashed on its own (a set element, a dict
        key: sorted by digest), whose cycles back into this hash still end."""
        sub = Hasher()
        sub._outer = [*self._outer, self._memo]
        sub.update(obj)
        sub._h.update(sub.buf)
        return sub._h.digest()

    def canonical_items(self, d: dict[Any, Any]) -> list[tuple[Any, Any]]:
        """``d``'s items in an order that does not depend on insertion: by key for
        string keys, else by the keys' digests."""
        items = list(d.items())
        if all(type(k) is str for k, _ in items):
            items.sort(key=_first)
            return items
        decorated = sorted(((self.sub_digest(k), i) for i, (k, _) in enumerate(items)))
        return [items[i] for _, i in decorated]

    def reduce(self, obj: Any) -> None:
        """Write ``obj`` as pickle would see it: what ``__reduce_ex__(4)`` returns,
        walked by this stream (the fallback for types without a handler)."""
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as exc:
            raise _unhashable(obj, exc) from None
        if isinstance(rv, str):  # a global reference
            self.buf += b"g"
            self.text(str(getattr(type(obj), "__module__", "") or ""))
            self.text(rv)
            return
        if not isinstance(rv, tuple) or len(rv) < 2:
            raise TypeError(f"cannot hash object of type {typename(obj)}: bad __reduce_ex__")
        func, args, *rest = rv + (None,) * (6 - len(rv))
        state, listitems, dictitems = rest[0], rest[1], rest[2]
        self.buf += b"R"
        self.update(func)
        self.update(args)
        self.update(state)
        if listitems is not None:
            self.buf += b"L"
            self.update(list(listitems))
        if dictitems is not None:
            # dict subclasses: keep their order only if equality depends on it
            self.buf += b"D"
            if issubclass(type(obj), collections.OrderedDict):
                self.update(list(dictitems))
            else:
                d = dict(dictitems)
                self.update([list(kv) for kv in self.canonical_items(d)])


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


# -- the dispatch tables ------------------------------------------------------------
#: exact type -> handler, tried before the back-reference check (the fast path)
_EXACT: dict[type, Handler] = {}
#: those whose handler only appends a few bytes to ``buf`` (no sub-value, nothing
#: that raises): :meth:`Hasher.digest_of` hashes them in one call
_SCALARS: dict[type, Handler] = {}
#: type -> handler for it and its subclasses (value families, users' hashers)
_BY_TYPE: dict[type, Handler] = {}
#: top-level module name -> handler for the types defined in that library
_BY_LIBRARY: dict[str, Handler] = {}
#: (library, attribute, handler): a base class of a library that is imported
#: lazily, entered into _BY_TYPE once the library is imported
_LIBRARY_BASES: list[tuple[str, str, Handler]] = []
#: type -> handler of the kinds of callables, consulted after __mlcache_token__
_CALLABLE_KINDS: dict[type, Handler] = {}
#: type -> its handler (None: __reduce_ex__), decided once per type
_RESOLVED: dict[type, Handler | None] = {}
LISTENERS.append(_RESOLVED.clear)  # a leaf registered may key its type (its token())
#: types whose stream mlcache defines itself: register_hasher refuses them
_OWN: set[type] = {object}


def handle_exact(cls: type, handler: Handler, *, scalar: bool = False) -> None:
    """mlcache's own handler for values of exactly ``cls``, before the
    back-reference check (the handler checks :meth:`Hasher.seen` itself where
    identity is observable); ``scalar``: see :data:`_SCALARS`. For handler modules."""
    _EXACT[cls] = handler
    if scalar:
        _SCALARS[cls] = handler
    _OWN.add(cls)
    _RESOLVED.clear()


def handle_family(cls: type, handler: Handler, *, callable_kind: bool = False) -> None:
    """mlcache's own handler for ``cls`` and its subclasses (after the
    back-reference check). ``callable_kind``: consulted only after a type's
    ``__mlcache_token__`` (a metaclass that defines one is hashed by it)."""
    (_CALLABLE_KINDS if callable_kind else _BY_TYPE)[cls] = handler
    _OWN.add(cls)
    _RESOLVED.clear()


def handle_library(library: str, handler: Handler, *, base: str | None = None) -> None:
    """mlcache's own handler for the types defined in ``library`` (its top-level
    module name) and, with ``base``, for subclasses of ``library.<base>``
    anywhere, without importing the library: only values of an imported library
    can be met."""
    _BY_LIBRARY[library] = handler
    if base is not None:
        _LIBRARY_BASES.append((library, base, handler))
    _RESOLVED.clear()


def register_hasher(cls: type, function: Callable[[Any], Any]) -> None:
    """Hash instances of ``cls`` (and its subclasses) by what ``function`` returns.

    ``function(obj)`` returns what identifies ``obj``: any value mlcache can hash
    (a tuple of its settings, its arrays, ...); the key is that value's, tagged
    with ``obj``'s type, as if ``cls`` defined ``__mlcache_token__``. Use it for
    a type whose default key (through ``__reduce_ex__``, as pickle sees it) is
    slow, unstable or refused, and that you cannot edit. The most specific
    registration wins (the type's MRO), also over how mlcache hashes the other
    types of a library (a pandas ``Timestamp``); registering a type again
    replaces its function.

    Raises :class:`~mlcache.errors.InvalidRegistration` (a ``TypeError``) when
    ``cls`` is not a class or is one mlcache hashes itself (``int``, ``dict``,
    ``numpy.ndarray``, ...), or when ``function`` is not callable.

    Examples
    --------
    >>> import threading
    >>> import mlcache
    >>> class Tokenizer:
    ...     def __init__(self, vocab):
    ...         self.vocab = vocab
    ...         self.lock = threading.Lock()  # pickle refuses it: no default key
    >>> mlcache.register_hasher(Tokenizer, lambda t: sorted(t.vocab))
    >>> mlcache.hash_value(Tokenizer({"a", "b"})) == mlcache.hash_value(Tokenizer({"b", "a"}))
    True
    """
    if not isinstance(cls, type):
        raise InvalidRegistration(
            f"register_hasher needs a class, got {cls!r} of type {typename(cls)}"
        )
    if _LIBRARY_BASES:
        _enter_library_bases()  # torch.Tensor is mlcache's too, once torch is imported
    if cls in _OWN:
        raise InvalidRegistration(
            f"register_hasher: {cls.__module__}.{cls.__qualname__} is hashed by mlcache "
            "itself; register a hasher for your own class (a subclass works)"
        )
    if not callable(function):
        raise InvalidRegistration(
            f"register_hasher needs a callable (obj -> what identifies it), got "
            f"{function!r} of type {typename(function)}"
        )

    def registered(h: Hasher, obj: Any) -> None:
        _identified_by(h, obj, function(obj), "the hasher registered for it")

    _BY_TYPE[cls] = registered
    _RESOLVED.clear()


def _resolve(t: type) -> Handler | None:
    """The handler of values of type ``t`` (see Dispatch in the module docstring),
    None for the ``__reduce_ex__`` fallback."""
    if _LIBRARY_BASES:
        _enter_library_bases()
    mro = t.__mro__
    for klass in mro:
        handler = _BY_TYPE.get(klass)
        if handler is not None:
            return handler
    leaf = leaf_for(t)  # a type stored and keyed by one leaf (mlcache.codecs.leaves)
    token = getattr(leaf, "token", None)
    if leaf is not None and callable(token):
        why = f"the token() of its leaf {leaf.name!r}"
        return lambda h, obj: _identified_by(h, obj, token(obj), why)
    handler = _BY_LIBRARY.get(str(t.__module__).partition(".")[0])
    if handler is not None:
        return handler
    if _type_has(t, "__mlcache_token__"):
        return _token
    for klass in mro:
        handler = _CALLABLE_KINDS.get(klass)
        if handler is not None:
            return handler
    return None


def _enter_library_bases() -> None:
    """Enter the base classes of the libraries imported by now into ``_BY_TYPE``
    (a subclass of one cannot exist before its library is imported)."""
    for entry in list(_LIBRARY_BASES):
        library, base, handler = entry
        found = getattr(sys.modules.get(library), base, None)  # None: not imported (yet)
        if isinstance(found, type):
            _BY_TYPE[found] = handler
            _OWN.add(found)
            with contextlib.suppress(ValueError):  # another thread entered it first
                _LIBRARY_BASES.remove(entry)


def _type_has(t: type, name: str) -> bool:
    """Whether ``name`` is defined on ``t`` or a base (no metaclass, no instance)."""
    return any(name in vars(klass) for klass in t.__mro__)


def _token(h: Hasher, obj: Any) -> None:
    # objects that know what identifies them (a memoized function: its function)
    _identified_by(h, obj, obj.__mlcache_token__(), "its __mlcache_token__()")


def _identified_by(h: Hasher, obj: Any, token: Any, source: str) -> None:
    """Hash ``obj`` as what identifies it, ``token``. The object itself is refused:
    it is in the stream already, so it would hash as a back-reference, and every
    object of the type would share one key."""
    if token is obj:
        raise TypeError(
            f"{source} returned the {typename(obj)} itself; return what identifies it "
            "(its settings, its arrays, a tuple of them)"
        )
    h.buf += b"k"
    h.text(typename(obj))
    h.update(token)


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


def _wrapper(h: Hasher, obj: Any) -> None:
    # lru_cache and other wrappers do what they wrap; a class-based decorator too
    h.buf += b"W"
    h.text(typename(obj))
    h.update(obj.__wrapped__)
    if isinstance(getattr(type(obj), "__call__", None), types.FunctionType):  # noqa: B004
        h.buf += b"s"  # Scaled(f, k=2) is not Scaled(f, k=5)
        h.reduce(obj)


def _needs_code_versions(h: Hasher, obj: Any) -> None:
    raise RuntimeError(
        f"cannot hash {typename(obj)} values yet: functions and classes are hashed with "
        "their code version, registered by mlcache.keys.code_version (import mlcache.keys)"
    )


# Until mlcache.keys.code_version registers its handlers, a function or a class
# fails to hash: never a key that leaves its code out.
handle_exact(types.FunctionType, _needs_code_versions)
handle_exact(type, _needs_code_versions)
handle_family(type, _needs_code_versions, callable_kind=True)
