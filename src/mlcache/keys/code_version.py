"""Which code a memoized function's results depend on: its own, and the user code
it reaches.

:func:`code_version` walks from the function through what its bytecode names:

- globals it reads (``helper(x)``, ``CONSTANT``, ``cfg = {...}``), attribute
  chains on user modules and classes (``utils.clean(x)``, ``Config.scale``),
  and imports inside its body (``from .helpers import normalize``): a module
  imported there that is not imported yet is read from its file, never run
  (the whole module counts, with the user modules it imports);
- its default arguments and the values its closure holds (for the memoized
  function itself, only the modules, classes and functions there: the data it
  captures is part of each call's key);
- the functions and classes found there, recursively (cycles are fine), and
  the methods of user classes it reaches.

What it finds is identified as follows:

=============================  ================================================
user function or method        its normalised code (below)
user class                     the normalised code of its methods and its
                               simple class attributes
module-level value             its value: numbers, strings, tuples, containers,
                               arrays, objects (by content, with the fast hash
                               of :mod:`mlcache.keys.hashing`), unless a call changes
                               it (below)
anything from a library        the library's name and version: the standard
                               library by Python's version, packages by their
                               installed version (their source is not walked)
=============================  ================================================

*User code* is every module whose file is not in the standard library or in a
site-packages folder (:mod:`mlcache.keys.origin`); mlcache itself counts as a
library.

*What a call changes is state, not input.* A module-level value that is
mutable (a dict, a list, an object) counts by value, because the code reads it;
the values the walk met are returned in :attr:`CodeVersion.watched`, and
:class:`~mlcache.memo.func.MemorizedFunc` compares them before and after each
computed call, and a dataset's builds (:mod:`mlcache.keys.learned`). A part
that calls (builds) only raised or grew (a counter, a memo such as
``_VOCAB_CACHE = {}`` that they fill) is bookkeeping: its name is remembered
with the function's cache (the dataset's packs) and, passed back here in
``state``, it counts by its baseline, what it held before they changed it.

*Normalised code* is the bytecode without line numbers, docstrings and
comments (:func:`mlcache.keys.bytecode.code_digest`): formatting never changes
a version; any change to what runs does, including a moved line or a debug
print.

Each dependency gets its own short digest, so that a miss can say which one
changed. The walk runs once per function per process (:class:`MemorizedFunc`
caches it); a hit never pays for it.

*Functions and classes as values.* This module also registers the hashing
handlers of functions and classes (:mod:`mlcache.keys.hashing` cannot import
it): a user function passed as an argument, a default or a captured value is
its identity plus its code version (``Fv``), inside a code walk its own
normalised code only (``Fn``: the walk hashes constants, which may hold
functions), a library's function its name and the library's version (``Fl``);
a user class is its name and code version, and its bases and namespace when it
cannot be imported by its name.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import struct
import sys
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import xxhash

from ._handlers import write_global
from .bytecode import PY, code_digest
from .dependencies import (
    Binding,
    CodeWalkError,
    DependencyWalk,
    call_target,
    is_code,
    library_part,
)
from .hashing import Hasher, handle_exact, handle_family, typename
from .origin import is_user_code, library_version
from .state import FunctionShell, epoch
from .walking import code_walk, in_code_walk, meet

__all__ = ["CODE_MODES", "CodeVersion", "CodeWalkError", "code_version"]

#: what ``Memory(code=...)`` accepts
CODE_MODES = ("transitive", "source", "off")
_pack_Q = struct.Struct("<Q").pack


class CodeVersion(NamedTuple):
    """A function's code version: ``digest`` (32 hex digits) and, for the
    transitive mode, the digest of each thing it depends on by name, and the
    mutable values that count by content (name, value), to be checked for
    changes a call makes."""

    digest: str
    parts: dict[str, str]
    watched: tuple[tuple[str, Any], ...] = ()
    #: the digest of the same code with every mutable value counted by its type
    #: only: what stays when calls change those values (where what calls change
    #: is remembered); equal to ``digest`` when there is no such value
    shape: str = ""
    #: the names of ``state`` the walk met (and so counted by type)
    state_used: frozenset[str] = frozenset()
    #: the attribute names the walked code reads other than to raise them in place
    #: (:func:`~mlcache.keys.bytecode.attribute_reads`); None: not walked
    attr_reads: frozenset[str] | None = None
    #: how the walked code uses containers' keys
    #: (:func:`~mlcache.keys.bytecode.subscript_uses`); None: not walked
    subscripts: frozenset[tuple[str, Any, Any]] | None = None
    #: each module-level name the walked code reads, and what it named then
    #: (namespace, name, value): :func:`~mlcache.keys.dependencies.rebound` tells
    #: when one names another value (the version is then no longer the code's)
    bindings: tuple[Binding, ...] = ()
    #: the globals the walked code loads other than to raise them in place
    #: (:func:`~mlcache.keys.bytecode.global_reads`)
    global_reads: frozenset[str] = frozenset()


def code_version(
    func: Callable[..., Any],
    mode: str = "transitive",
    pin: str | None = None,
    state: Mapping[str, str] = types.MappingProxyType({}),
    fresh: bool = False,
) -> CodeVersion:
    """The version of the code behind ``func`` (see the module docstring).

    ``mode`` is ``"transitive"`` (the function and the user code it reaches),
    ``"source"`` (the function's source text only, as joblib does: comments
    count, helpers do not) or ``"off"`` (no code check: results are kept until
    cleared, whatever the code does). ``pin`` (``cache(version="2")``) is a
    version set by hand: the code is not looked at. ``state`` names the parts of
    module-level values that calls change as bookkeeping (name -> kind, see
    :mod:`mlcache.keys.state`): they count by their baseline. ``fresh`` walks
    again though this process walked ``func`` already (the walk kept is replaced):
    for a caller that asks seldom, as a dataset's open does, a module-level value
    or class attribute rebound since (``SIZE = s`` in a sweep, a notebook cell)
    is then a new version, not the one the first walk read.

    Raises :class:`CodeWalkError` when reading something the code refers to
    raises (a global whose attribute access fails).
    """
    if pin is not None:
        return CodeVersion(xxhash.xxh3_128_hexdigest(f"pinned\0{pin}".encode()), {})
    if mode == "off":
        return CodeVersion(xxhash.xxh3_128_hexdigest(b"off"), {})
    if mode == "source":
        return _source_version(func)
    if mode != "transitive":
        raise ValueError(f"code must be one of {CODE_MODES}, got {mode!r}")
    target = call_target(func)
    if getattr(func, "__wrapped__", None) is not None:
        return _walk_version(func, state)  # a decorator chain: not worth caching
    # functions made from one code object (closures of a factory) share a version:
    # their closure values are part of each call's key, not of the code. By
    # identity: equal code objects in two modules have different dependencies.
    code = getattr(target, "__code__", target)
    # code that the closure holds (a factory's helper) is part of the version
    held = tuple(
        id(c.cell_contents) for c in getattr(target, "__closure__", None) or () if _cell_is_code(c)
    )
    # a value a cached call changed as input, or a reset baseline: a new walk
    learned = frozenset(state.items()) if state else ()
    key = (id(code), id(getattr(target, "__globals__", None)), held, learned, epoch())
    cached = None if fresh else _VERSIONS.get(key)
    if cached is not None and cached[0]() is code:
        return cached[1]
    found = _walk_version(func, state)
    with contextlib.suppress(TypeError):  # not weakly referenceable: not cached
        _VERSIONS[key] = (weakref.ref(code, functools.partial(_forget, key)), found)
    return found


#: (code object or class, globals) -> its version: one walk per function per
#: process, and again when %autoreload gives a function new code
_VERSIONS: dict[tuple[Any, ...], tuple[weakref.ref[Any], CodeVersion]] = {}


def _cell_is_code(cell: Any) -> bool:
    try:
        return is_code(cell.cell_contents)
    except ValueError:  # empty
        return False


def _forget(key: tuple[Any, ...], _gone: Any) -> None:
    _VERSIONS.pop(key, None)


def _walk_version(
    func: Callable[..., Any], state: Mapping[str, str] = types.MappingProxyType({})
) -> CodeVersion:
    walk = DependencyWalk(state)
    f: Any = func
    seen: set[int] = set()
    while f is not None and id(f) not in seen:  # a decorator's wrapper and what it wraps
        seen.add(id(f))
        target = call_target(f)
        # the function itself under its bare name: the same code moved to another
        # module is the same version (its identity, the cache folder, differs)
        name = getattr(target, "__qualname__", "<callable>")
        walk.value(
            name + (f" <wrapped {len(seen) - 1}>" if len(seen) > 1 else ""), target, root=True
        )
        wrapped = getattr(target, "__wrapped__", None)
        if wrapped is None and target is not f:  # a class-based decorator's instance
            try:  # holds it (functools.update_wrapper), not its __call__
                wrapped = getattr(f, "__wrapped__", None)
            except Exception:  # a proxy's __getattr__ may raise anything
                wrapped = None
        f = wrapped
    parts = walk.result()
    digest = xxhash.xxh3_128_hexdigest("\0".join(f"{k}={v}" for k, v in parts.items()).encode())
    shape = walk.result(shape=True)
    blob = "\0".join(f"{k}={v}" for k, v in shape.items()).encode()
    return CodeVersion(
        digest,
        parts,
        tuple(walk.watched),
        xxhash.xxh3_128_hexdigest(blob),
        frozenset(walk.state_used),
        frozenset(walk.attr_reads),
        frozenset(walk.subscripts),
        walk.all_bindings(),
        frozenset(walk.global_reads),
    )


def _source_version(func: Callable[..., Any]) -> CodeVersion:
    target = call_target(func)
    try:
        text = inspect.getsource(target)
    except (OSError, TypeError):  # no source: a builtin, or code made at run time
        code = getattr(target, "__code__", None)
        text = code_digest(code) if code is not None else repr(library_part(target))
    return CodeVersion(xxhash.xxh3_128_hexdigest(f"{PY}\0{text}".encode()), {})


# -- functions and classes as values: their hashing handlers -----------------------------
#: function -> [its __code__, its token inside a code walk, its token outside]
_FUNCTION_TOKENS: weakref.WeakKeyDictionary[types.FunctionType, list[Any]] = (
    weakref.WeakKeyDictionary()
)
#: user class -> its code version digest
_CLASS_VERSIONS: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()


def _hash_function(h: Hasher, obj: types.FunctionType, shell: bool = False) -> None:
    """A Python function: its name, the code that runs, and its closure's values
    (``shell``: only its name and code, see :class:`~mlcache.keys.state.FunctionShell`)."""
    if h.seen(obj):  # also ends cycles of functions reaching each other
        return
    deep = not in_code_walk()
    if not deep and is_user_code(obj.__module__ or ""):
        meet(obj)  # a function a value holds: the walk follows what it reaches
    cached = _FUNCTION_TOKENS.get(obj)
    if cached is None or cached[0] is not obj.__code__:
        # a function's name and code change only if __code__ is replaced: its
        # tokens are made once per function (and again after such a replacement)
        cached = _FUNCTION_TOKENS[obj] = [obj.__code__, None, None]
    token = cached[2 if deep else 1]
    if token is None:
        token = cached[2 if deep else 1] = _function_token(obj, deep)
    h.buf += token
    if shell:
        h.buf += b"S"
        return
    h.update(obj.__defaults__)
    h.update(obj.__kwdefaults__)
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None:  # a decorator's wrapper: what it wraps counts too
        h.update(wrapped)
    for cell in obj.__closure__ or ():
        try:
            h.update(cell.cell_contents)
        except ValueError:  # an empty cell
            h.buf += b"-"


def _function_token(f: types.FunctionType, deep: bool) -> bytes:
    """A function's token: ``Fl`` module, name and library version for a library's
    function; ``Fn`` module, name and own normalised code for a user function in a
    code walk; ``Fv`` module, name and code version (what it reaches) otherwise."""
    module = f.__module__ or ""
    module = "__main__" if module == "__mp_main__" else module  # as a spawned worker runs it
    if not is_user_code(module):
        tag, version = b"Fl", library_version(module)
    elif deep:
        tag, version = b"Fv", _version_in_walk(f)
    else:
        tag, version = b"Fn", code_digest(f.__code__)
    parts = (module, f.__qualname__, version)
    return tag + b"".join(
        _pack_Q(len(b)) + b for b in (p.encode("utf-8", "surrogatepass") for p in parts)
    )


def _hash_class(h: Hasher, cls: type) -> None:
    """A class: its name; a library's by the library's version, a user's by its
    code version and, when it is not importable by its name (defined in a
    function, or shipped by value to a worker), by its bases and namespace."""
    if not write_global(h, cls):
        return
    if not in_code_walk():  # what its methods run (and the helpers they reach)
        h.buf += b"V"
        h.text(_class_version(cls))
    else:
        meet(cls)  # the class of a value (a registry's model): the walk follows it
    if not _resolves(cls):
        h.update(cls.__bases__)
        for name, value in sorted(vars(cls).items()):
            if name in _CLASS_HOUSEKEEPING:
                continue
            h.text(name)
            try:
                h.buf += h.sub_digest(_unwrap_descriptor(value))
            except (TypeError, RecursionError):  # a lock, an ABC cache: by type
                h.text(typename(value))


def _hash_plain_class(h: Hasher, cls: type) -> None:
    """A class whose metaclass is ``type`` (the exact-type fast path, before the
    back-reference check)."""
    if not h.seen(cls):
        _hash_class(h, cls)


def _version_in_walk(obj: Any) -> str:
    """``code_version(obj).digest``, computed inside :func:`code_walk` (so the
    constants it hashes do not start walks of their own)."""
    with code_walk():
        return code_version(obj).digest


def _class_version(cls: type) -> str:
    found = _CLASS_VERSIONS.get(cls)
    if found is None:
        found = _version_in_walk(cls)
        with contextlib.suppress(TypeError):  # not weakly referenceable: not cached
            _CLASS_VERSIONS[cls] = found
    return found


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


def _hash_function_shell(h: Hasher, obj: FunctionShell) -> None:
    _hash_function(h, obj.func, shell=True)


handle_exact(types.FunctionType, _hash_function)
handle_exact(FunctionShell, _hash_function_shell)
handle_exact(type, _hash_plain_class)
handle_family(type, _hash_class, callable_kind=True)  # classes of a metaclass
