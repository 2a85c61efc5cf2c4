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
site-packages folder (and ``__main__``: scripts, notebook cells; and code made
by ``exec`` in a namespace without a ``__name__``). mlcache itself counts as a
library.

*What a call changes is state, not input.* A module-level value that is
mutable (a dict, a list, an object) counts by value, because the code reads it;
the values the walk met are returned in :attr:`CodeVersion.watched`, and
:class:`~mlcache.memo.func.MemorizedFunc` compares them before and after each
computed call. One that a call changed (a memo such as ``_VOCAB_CACHE = {}``,
a counter) is state: its name is remembered with the function's cache and,
passed back here in ``state``, it counts by type only.

*Normalised code* is the bytecode without line numbers: instructions, names,
constants (recursively through nested functions, lambdas and comprehensions),
argument counts and flags, and which instructions sit inside ``try``. Constants
that no instruction loads are left out: that is where a docstring lives. So
comments, docstrings, blank lines and formatting never change a version; any
change to what runs does, including a moved line or a debug print.

Each dependency gets its own short digest, so that a miss can say which one
changed. The walk runs once per function per process (:class:`MemorizedFunc`
caches it); a hit never pays for it.
"""

from __future__ import annotations

import collections
import contextlib
import dis
import functools
import importlib.util
import inspect
import logging
import os
import site
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import xxhash

__all__ = [
    "CODE_MODES",
    "CodeVersion",
    "CodeWalkError",
    "code_version",
    "is_user_module",
    "learnable",
    "library_version",
    "plain_object",
    "state_parts",
    "watched_digests",
]

#: what ``Memory(code=...)`` accepts
CODE_MODES = ("transitive", "source", "off")
_PY = f"py{sys.version_info[0]}.{sys.version_info[1]}"
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_DEREF_OPS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF"})
_CONST_OPS = frozenset(dis.hasconst)
_MISSING = object()
#: a container with more items than this is identified by its type and length
#: only, not by every value (a constant table that big is data, not code)
_MAX_ITEMS = 100_000


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


def code_version(
    func: Callable[..., Any],
    mode: str = "transitive",
    pin: str | None = None,
    state: frozenset[str] = frozenset(),
) -> CodeVersion:
    """The version of the code behind ``func`` (see the module docstring).

    ``mode`` is ``"transitive"`` (the function and the user code it reaches),
    ``"source"`` (the function's source text only, as joblib does: comments
    count, helpers do not) or ``"off"`` (no code check: results are kept until
    cleared, whatever the code does). ``pin`` (``cache(version="2")``) is a
    version set by hand: the code is not looked at. ``state`` names the
    module-level values that calls change: they count by type only.

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
    target = _target(func)
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
    key = (id(code), id(getattr(target, "__globals__", None)), held, state)
    cached = _VERSIONS.get(key)
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
        return _is_code(cell.cell_contents)
    except ValueError:  # empty
        return False


def _forget(key: tuple[Any, ...], _gone: Any) -> None:
    _VERSIONS.pop(key, None)


class CodeWalkError(Exception):
    """Reading something a function's code refers to raised: ``where`` is its
    name (a global, an attribute chain)."""

    def __init__(self, where: str, exc: BaseException) -> None:
        super().__init__(f"reading {where} raised {type(exc).__name__}: {exc}")
        self.where = where


def _walk_version(func: Callable[..., Any], state: frozenset[str] = frozenset()) -> CodeVersion:
    walk = _Walk(state)
    f: Any = func
    seen: set[int] = set()
    while f is not None and id(f) not in seen:  # a decorator's wrapper and what it wraps
        seen.add(id(f))
        target = _target(f)
        # the function itself under its bare name: the same code moved to another
        # module is the same version (its identity, the cache folder, differs)
        name = getattr(target, "__qualname__", "<callable>")
        walk.value(
            name + (f" <wrapped {len(seen) - 1}>" if len(seen) > 1 else ""), target, root=True
        )
        f = getattr(target, "__wrapped__", None)
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
    )


def _source_version(func: Callable[..., Any]) -> CodeVersion:
    target = _target(func)
    try:
        text = inspect.getsource(target)
    except (OSError, TypeError):  # no source: a builtin, or code made at run time
        code = getattr(target, "__code__", None)
        text = _code_digest(code) if code is not None else repr(_library_part(target))
    return CodeVersion(xxhash.xxh3_128_hexdigest(f"{_PY}\0{text}".encode()), {})


def _target(func: Any) -> Any:
    from .identity import target_function

    inner = getattr(func, "func", None)  # a MemorizedFunc used as a helper
    if inner is not None and hasattr(func, "__mlcache_token__"):
        func = inner
    return target_function(func)


def _name_of(obj: Any) -> str:
    from .identity import module_name

    module = module_name(getattr(obj, "__module__", None))
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or "?"
    return f"{module}.{name}"


class _Walk:
    """One walk of a dependency graph: ``parts`` maps names to digests."""

    def __init__(self, state: frozenset[str] = frozenset()) -> None:
        self._found: dict[str, set[str]] = {}
        self._shape: dict[str, set[str]] = {}  # the same, mutable values by type
        self.state_used: set[str] = set()  # names of ``state`` met
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # what ``_seen`` refers to, alive for the walk
        self._state = state  # names of values that calls change: by type only
        self._static: set[str] = set()  # modules read from their files
        #: mutable values counted by content: (name, value)
        self.watched: list[tuple[str, Any]] = []

    def _first_time(self, obj: Any) -> bool:
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self._keep.append(obj)
        return True

    def _record(self, name: str, digest: str, shape: str | None = None) -> None:
        """Add ``digest`` under ``name``; two things of one name (two lambdas of a
        module, two closures of one factory) are both kept, in an order that does
        not depend on the order they were met in (see :meth:`result`). ``shape``
        stands for it in :attr:`CodeVersion.shape` (a mutable value's type)."""
        self._found.setdefault(name, set()).add(digest)
        self._shape.setdefault(name, set()).add(digest if shape is None else shape)

    def result(self, *, shape: bool = False) -> dict[str, str]:
        """Name -> digest (the sorted digests of every thing of that name)."""
        found = self._shape if shape else self._found
        return {k: "+".join(sorted(v)) for k, v in sorted(found.items())}

    def value(self, name: str, obj: Any, *, root: bool = False) -> None:
        """Record what ``obj``, met under ``name``, contributes."""
        if isinstance(obj, (types.MethodType, functools.partial)) or hasattr(
            type(obj), "__mlcache_token__"
        ):
            if isinstance(obj, functools.partial):
                self.value(f"{name}.<partial args>", (obj.args, obj.keywords))
            obj = _target(obj)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, types.FunctionType):
            if root or obj.__module__ is None or is_user_module(obj.__module__):
                self._function(name if root else _name_of(obj), obj, root=root)
            else:
                self._record(name, _library_part(obj))
        elif isinstance(obj, type):
            if _is_user_class(obj) or (root and _has_python_code(obj)):
                self._class(name if root else _name_of(obj), obj)
            elif obj.__module__ != "builtins" or root:
                self._record(name, _library_part(obj))
        elif isinstance(obj, types.ModuleType):
            if not is_user_module(obj.__name__):
                self._record(name, library_version(obj.__name__))
            # a user module: what is used of it is reached through attribute chains
        elif isinstance(obj, property):
            for accessor in (obj.fget, obj.fset, obj.fdel):
                if accessor is not None:
                    self.value(name, accessor)
        elif isinstance(obj, (types.BuiltinFunctionType, np.ufunc)):
            module = getattr(obj, "__module__", None) or type(obj).__module__
            if module != "builtins" or root:
                self._record(name, _library_part(obj))
        elif callable(obj) and _probe(obj, "__wrapped__") is not None:
            self.value(name, obj.__wrapped__)  # functools.lru_cache and other wrappers
        elif isinstance(obj, (list, tuple, dict, set, frozenset)):
            self._container(name, obj)
        elif isinstance(obj, logging.Logger):
            # what it prints is not what the function returns (and its name is
            # __mp_main__ in spawn workers)
            self._record(name, "<logger>")
        else:
            # a value: an instance of a user class brings its class's code too
            cls = type(obj)
            if _is_user_class(cls):
                self._class(_name_of(cls), cls)
            self._data(name, obj)

    def _data(self, name: str, obj: Any) -> None:
        """A value: by content, and watched for changes when it is mutable. What
        calls are known to change (``state``: the value itself, or some keys of a
        dict or attributes of an object, see :func:`state_parts`) is left out."""
        kind = f"<{type(obj).__qualname__}>"
        if name in self._state:
            self.state_used.add(name)
            self._record(name, f"<state {type(obj).__qualname__}>", kind)
            return
        if not _immutable(obj) and not _large_array(obj):
            self.watched.append((name, obj))
            parts = state_parts(name, obj)
            if parts is not None:  # counted key by key, or attribute by attribute
                kept = [(sub[len(name) :], v) for sub, v in parts if sub not in self._state]
                self.state_used.update(sub for sub, _ in parts if sub in self._state)
                self._record(name, _constant((type(obj).__qualname__, kept)), kind)
                return
            self._record(name, _constant(obj), kind)
            return
        self._record(name, _constant(obj))

    def _container(self, name: str, obj: Any) -> None:
        """A container: the code of the functions and classes in it (a dispatch
        table) is walked; its data counts by value (see :meth:`_data`)."""
        if len(obj) <= _MAX_ITEMS:
            values = obj.values() if isinstance(obj, dict) else obj
            for item in values:  # under the container's name: no order, no index
                if callable(item) and not isinstance(item, (types.BuiltinFunctionType, np.ufunc)):
                    self.value(f"{name}[]", item)
        self._data(name, obj)

    def _function(self, name: str, f: types.FunctionType, *, root: bool = False) -> None:
        if not self._first_time(f):
            return
        code = f.__code__
        self._record(name, _code_digest(code))
        owner = _owner_class(f)
        if owner is not None:  # a method: self.helper() reaches the rest of its class
            self._class(_name_of(owner), owner)
        # the memoized function's own defaults and closure values are part of each
        # call's key (read at call time), not of its code version
        if not root:
            if f.__defaults__:
                self.value(f"{name}.<defaults>", f.__defaults__)
            if f.__kwdefaults__:
                self.value(f"{name}.<kwdefaults>", f.__kwdefaults__)
            for var, cell in zip(code.co_freevars, f.__closure__ or ()):
                try:
                    held = cell.cell_contents
                except ValueError:  # not assigned yet
                    continue
                self.value(f"{name}.<closure {var}>", held)
        for ref in _references(code):
            self._reference(f, ref, root=root)

    def _class(self, name: str, cls: type) -> None:
        if not self._first_time(cls):
            return
        self._record(name, _constant(cls.__qualname__))
        for klass in cls.__mro__:
            if klass is object or not _is_user_class(klass):
                if klass is not object and klass.__module__ != "builtins":
                    self._record(f"{name}<{_name_of(klass)}>", _library_part(klass))
                continue
            for attr, member in sorted(vars(klass).items()):
                if attr.startswith("__") and attr.endswith("__") and not callable(member):
                    continue  # __module__, __doc__, __dict__, __weakref__ ...
                self.value(f"{_name_of(klass)}.{attr}", member)

    def _reference(self, f: types.FunctionType, ref: tuple[str, ...], *, root: bool) -> None:
        """Follow a name the code reads: ``("g", name, *attrs)`` for a global,
        ``("d", name, *attrs)`` for a closure variable, ``("i", module, level,
        *names)`` for an import in the body."""
        if ref[0] == "d":
            names = f.__code__.co_freevars
            if ref[1] not in names or f.__closure__ is None:
                return  # a variable of a nested function's own
            try:
                obj = f.__closure__[names.index(ref[1])].cell_contents
            except ValueError:  # not assigned yet
                return
            if root and not _is_code(obj):
                return  # the memoized function's closure data is part of each key
            where, attrs = f"{_name_of(f)}.<closure {ref[1]}>", ref[2:]
        elif ref[0] == "g":
            head, attrs = ref[1], ref[2:]
            obj = f.__globals__.get(head, _MISSING)
            if obj is _MISSING:
                return  # a builtin (Python's version counts) or not defined yet
            if head == "__name__" and isinstance(obj, str):
                obj = _module_name(obj)  # spawn workers' __mp_main__ is __main__
            where = f"{_module_name(f.__module__)}.{head}"
        else:
            name, level, attrs = ref[1], int(ref[2]), ref[3:]
            try:
                package = f.__globals__.get("__package__") or ""
                full = importlib.util.resolve_name("." * level + name, package)
            except (ImportError, ValueError):
                return
            obj = sys.modules.get(full, _MISSING)
            if obj is _MISSING:  # imported only when the body runs: read its file
                self._static_module(full)
                if attrs:  # `from pkg import submodule`
                    self._static_module(f"{full}.{attrs[0]}")
                return
            where = full
        reading = where
        try:
            for attr in attrs:  # down user modules and classes only
                if not _walkable(obj):
                    break
                reading = f"{where}.{attr}"
                nxt = getattr(obj, attr, _MISSING)
                if nxt is _MISSING:
                    if isinstance(obj, types.ModuleType):  # a submodule not imported yet
                        self._static_module(f"{obj.__name__}.{attr}")
                    break
                obj, where = nxt, f"{where}.{attr}"
            self.value(where, obj)
        except CodeWalkError:
            raise
        except Exception as exc:  # a global whose attribute access raises (a proxy)
            raise CodeWalkError(reading, exc) from exc

    def _static_module(self, full: str) -> None:
        """Record the module ``full`` from its file without running it: the
        normalised code of the whole module, and of the user modules it imports
        (a library by its version). Nothing is recorded when it cannot be found."""
        if full in self._static:
            return
        self._static.add(full)
        if full.split(".")[0] in _NOT_USER:
            self._record(full, library_version(full))
            return
        path = _module_file(full)
        if path is None:
            return
        if not _is_user_file(path):
            self._record(full, library_version(full))
            return
        code = _compile_file(path, *_file_stamp(path))
        self._record(f"{full} <file>", "<unreadable>" if code is None else _code_digest(code))
        if code is None:
            return
        package = (
            full if os.path.basename(path).startswith("__init__.") else full.rpartition(".")[0]
        )
        for ref in _references(code):
            if ref[0] != "i":
                continue
            try:
                dep = importlib.util.resolve_name("." * int(ref[2]) + ref[1], package)
            except (ImportError, ValueError):
                continue
            self._static_module(dep)
            if len(ref) > 3:  # `from pkg import submodule`
                self._static_module(f"{dep}.{ref[3]}")


#: top-level names that are never user code
_NOT_USER = frozenset(sys.stdlib_module_names) | {"builtins", "mlcache"}


def _module_file(full: str) -> str | None:
    """The file of the module ``full``, found as the import system would, without
    importing it (an imported parent package's ``__path__`` is used); None when
    there is none (not found, a namespace package, an extension's parent...)."""
    from importlib.machinery import PathFinder

    parts = full.split(".")
    search: Any = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        module = sys.modules.get(name)
        if module is not None:
            if last:
                return vars(module).get("__file__")
            search = vars(module).get("__path__")
        else:
            try:
                spec = PathFinder.find_spec(name, search)
            except (ImportError, ValueError, OSError):
                return None
            if spec is None:
                return None
            if last:
                return spec.origin if spec.has_location else None
            search = spec.submodule_search_locations
        if search is None:
            return None
    return None


def _file_stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _compile_file(path: str, mtime_ns: int, size: int) -> types.CodeType | None:
    """A module's code, compiled from its source file (never run); None when it
    cannot be read or compiled. Cached by the file's stamp."""
    if not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as f:
            source = importlib.util.decode_source(f.read())
        return compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _owner_class(f: types.FunctionType) -> type | None:
    """The user class a function is a method of (found by its qualified name in
    its module), or None."""
    path = f.__qualname__.split(".")
    if len(path) < 2 or "<locals>" in path:
        return None
    obj: Any = f.__globals__.get(path[0])
    for part in path[1:-1]:
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and _is_user_class(obj):
        return obj
    return None


def _module_name(name: str | None) -> str:
    from .identity import module_name

    return module_name(name)


def _is_user_class(cls: type) -> bool:
    """A class of user code, also one made by ``exec`` in a namespace without a
    ``__name__`` (its ``__module__`` is then ``"builtins"``)."""
    module = cls.__module__
    if module == "builtins":
        return _has_python_code(cls)
    return is_user_module(module)


def _probe(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)`` that never raises (a proxy's ``__getattr__``
    may raise anything)."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, np.generic, type)


#: a module-level array larger than this (bytes) is not watched for in-place
#: changes: hashing it before and after every computed call would cost more than
#: the rare accumulator array is worth
_WATCH_ARRAY_MAX = 1 << 20


def _large_array(obj: Any) -> bool:
    return isinstance(obj, np.ndarray) and obj.nbytes > _WATCH_ARRAY_MAX


def state_parts(name: str, obj: Any) -> list[tuple[str, Any]] | None:
    """``obj``, met under ``name``, as the parts that a call may change one by one:
    a dict by key (``name[<key digest>]``), an object whose state is its
    ``__dict__`` by attribute (``name.attr``); anything else whole. So a call that
    records into one key of a dict it also reads (``REG["seen"]``) makes only that
    key state, never the keys it reads (``REG["scale"]``). None: ``obj`` counts
    whole (a list, a set, a big dict, an object with its own pickling)."""
    try:  # by type: a proxy's __class__ or __getattr__ may raise anything
        if issubclass(type(obj), dict) and len(obj) <= STATE_PARTS_MAX:
            items = list(dict.items(obj))
            return sorted(((f"{name}[{_key_digest(k)}]", v) for k, v in items), key=_first)
        if plain_object(obj) and len(vars(obj)) <= STATE_PARTS_MAX:
            return sorted(((f"{name}.{k}", v) for k, v in vars(obj).items()), key=_first)
    except Exception:
        return None
    return None


#: mutable values that a call can only add to or take from: an accumulator
_ACCUMULATORS = (list, set, bytearray, collections.deque)


def learnable(entries: Iterable[tuple[str, Any]], *, expanded: bool) -> set[str]:
    """The names among ``entries`` (name, value) that may become state: the parts
    of dicts and plain objects, and accumulators. ``expanded``: the entries are
    already split into parts (as :meth:`mlcache.memo.func.MemorizedFunc._captured` gives them), so a
    part is any entry named below another (``self.calls``, ``conf[<key>]``)."""
    names = set()
    for name, value in entries:
        if issubclass(type(value), _ACCUMULATORS):  # by type: a proxy may raise
            names.add(name)
        elif expanded:
            if "." in name or "[" in name:
                names.add(name)
        else:
            parts = state_parts(name, value)
            names.update(sub for sub, _ in parts or ())
    return names


def watched_digests(watched: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """Digests of mutable values met by the walk (:attr:`CodeVersion.watched`), part
    by part (:func:`state_parts`): compared before and after a call to find what
    it changes."""
    digests: dict[str, str] = {}
    for name, value in watched:
        parts = state_parts(name, value)
        for sub, v in [(name, value)] if parts is None else parts:
            digests[sub] = _constant(v)
    return digests


#: a dict with more keys (an object with more attributes) than this counts whole:
#: comparing it key by key before and after every computed call would cost more
#: than telling a memo's keys from the ones a function reads is worth
STATE_PARTS_MAX = 1000


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def _key_digest(key: Any) -> str:
    from .hashing import hash_value

    try:
        return hash_value(key)[:16]
    except Exception:  # a key the hash cannot take: its text
        return xxhash.xxh3_64_hexdigest(repr(key).encode("utf-8", "surrogatepass"))


def plain_object(obj: Any) -> bool:
    """An object whose state is its ``__dict__`` (no custom pickling, no slots),
    so that its attributes can count one by one."""
    cls = type(obj)
    try:
        return (
            isinstance(vars(obj), dict)
            and not issubclass(cls, (type, types.ModuleType, types.FunctionType))
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", None) is getattr(object, "__getstate__", None)
            and not any("__slots__" in vars(k) for k in cls.__mro__)
            and not hasattr(cls, "__mlcache_token__")
        )
    except Exception:  # no __dict__ (TypeError), or a proxy that raises
        return False


def _immutable(obj: Any, depth: int = 0) -> bool:
    """Whether a call cannot change ``obj`` in place (tuples and frozensets of
    such values included)."""
    if isinstance(obj, _IMMUTABLE):
        return True
    if isinstance(obj, (tuple, frozenset)) and depth < 4:
        return len(obj) <= 1000 and all(_immutable(v, depth + 1) for v in obj)
    return False


def _is_code(obj: Any) -> bool:
    """A module, class or function: something whose code, not value, matters (by
    its type: isinstance would read a proxy's ``__class__``, which may raise)."""
    return issubclass(type(obj), (types.ModuleType, type, types.FunctionType, types.MethodType))


def _has_python_code(cls: type) -> bool:
    return any(
        isinstance(getattr(v, "__func__", v), types.FunctionType)
        for k in cls.__mro__
        for v in vars(k).values()
    )


def _walkable(obj: Any) -> bool:
    """A user module or class: an attribute read on it is followed."""
    if isinstance(obj, types.ModuleType):
        return is_user_module(obj.__name__)
    return isinstance(obj, type) and _is_user_class(obj)


def _references(code: types.CodeType) -> list[tuple[str, ...]]:
    return _references_cached(code)


@functools.lru_cache(maxsize=4096)
def _references_cached(code: types.CodeType) -> list[tuple[str, ...]]:
    """The globals, attribute chains and body imports ``code`` reads, in nested
    code too (cached: code objects are immutable). A module imported in the
    body and bound to a local name (``import proj.helpers as h``, ``from proj
    import helpers``) is followed through that name (``h.clean(x)``)."""
    refs: list[tuple[str, ...]] = []
    for c in _all_code(code):
        chain: list[str] | None = None
        consts: list[Any] = []
        imported: dict[str, tuple[str, ...]] = {}  # local name -> ("i", module, level, *names)
        pending: tuple[str, ...] | None = None  # what the next STORE_FAST binds
        for ins in dis.get_instructions(c):
            op = ins.opname
            if op in _ATTR_OPS and chain is not None:
                chain.append(str(ins.argval))
                continue
            if chain is not None:
                refs.append(tuple(chain))
                chain = None
            if op in _GLOBAL_OPS:
                chain = ["g", str(ins.argval)]
            elif op in _DEREF_OPS:
                chain = ["d", str(ins.argval)]
            elif op == "LOAD_FAST" and str(ins.argval) in imported:
                chain = list(imported[str(ins.argval)])
            elif op == "IMPORT_NAME":
                level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
                names = consts[-1] if consts and isinstance(consts[-1], tuple) else ()
                module = str(ins.argval)
                refs.append(("i", module, str(level)))
                refs.extend(("i", module, str(level), str(n)) for n in names)
                pending = ("i", module, str(level))
            elif op == "IMPORT_FROM" and pending is not None:
                source, attr = pending[1], str(ins.argval)
                # `import a.b as h` binds the module a.b; `from a import b`, a.b
                if not source.endswith("." + attr):
                    pending = (*pending[:3], attr)
            elif op == "STORE_FAST" and pending is not None:
                imported[str(ins.argval)] = pending
                pending = None
            elif op != "IMPORT_FROM":
                pending = None if op not in ("POP_TOP", "LOAD_CONST") else pending
            if op == "LOAD_CONST":
                consts.append(ins.argval)
        if chain is not None:
            refs.append(tuple(chain))
    return list(dict.fromkeys(refs))


def _all_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_code(const)


# -- normalised code ------------------------------------------------------------------
@functools.lru_cache(maxsize=8192)
def _code_digest(code: types.CodeType) -> str:
    h = xxhash.xxh3_64(_PY.encode())
    _code_bytes(code, h)
    return h.hexdigest()


def _loaded_consts(code: types.CodeType) -> set[int]:
    """Indices of the constants some instruction loads (a docstring is not one)."""
    used: set[int] = set()
    for ins in dis.get_instructions(code):
        if (ins.opcode in _CONST_OPS or ins.opname == "KW_NAMES") and ins.arg is not None:
            used.add(ins.arg)
    return used


def _code_bytes(code: types.CodeType, h: xxhash.xxh3_64) -> None:
    h.update(code.co_code)
    h.update(getattr(code, "co_exceptiontable", b""))
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode())
    counts = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    h.update(repr(counts).encode())
    used = _loaded_consts(code)
    for i, const in enumerate(code.co_consts):
        if i not in used:
            continue  # the docstring (or the None that stands for its absence)
        h.update(b"%d:" % i)
        if isinstance(const, types.CodeType):
            h.update(b"<code>")
            _code_bytes(const, h)
        elif isinstance(const, frozenset):  # its repr depends on the hash seed
            h.update(repr(sorted(map(repr, const))).encode("utf-8", "surrogatepass"))
        else:
            h.update(repr(const).encode("utf-8", "surrogatepass"))


# -- constants and libraries ----------------------------------------------------------
def _constant(obj: Any) -> str:
    """A value's short digest (its type and size only when it cannot be hashed or is
    a huge container)."""
    from .hashing import code_walk, hash_value

    try:
        if isinstance(obj, (list, tuple, dict, set, frozenset)) and len(obj) > _MAX_ITEMS:
            return f"{type(obj).__qualname__}[{len(obj)}]"
        with code_walk():  # functions in it by their own code: no walk inside the walk
            return hash_value(obj)[:16]
    except Exception:  # an open file, a lock, a logger: what it is, not what it holds
        return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def _library_part(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{library_version(module)}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


@functools.lru_cache(maxsize=1024)
def library_version(module: str) -> str:
    """``"package==version"`` for a library module (``"python==3.11"`` for the
    standard library)."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return f"python=={sys.version_info[0]}.{sys.version_info[1]}"
    found = sys.modules.get(top)
    version = getattr(found, "__version__", None)
    if not isinstance(version, str):
        version = _distribution_version(top)
    return f"{top}=={version}"


def _distribution_version(top: str) -> str:
    from importlib import metadata

    try:
        dists = _distributions().get(top) or [top]
        return metadata.version(dists[0])
    except Exception:
        return "?"


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    try:
        return dict(metadata.packages_distributions())
    except Exception:
        return {}


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # virtualenv's old site module
        pass
    roots.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


@functools.lru_cache(maxsize=4096)
def is_user_module(name: str | None) -> bool:
    """Whether the module ``name`` is the user's own code (walked), not a library."""
    if not name:
        return False
    if name in ("__main__", "__mp_main__"):
        return True
    top = name.split(".")[0]
    if top == "mlcache" or top in sys.stdlib_module_names or top == "builtins":
        return False
    module = sys.modules.get(name)
    if module is None:
        return True  # code made at run time (exec, a notebook's own namespace)
    # vars(): a module's own __getattr__ (PEP 562) may raise anything
    path = vars(module).get("__file__")
    if not path:
        # made at run time (types.ModuleType) when it has no import spec; else
        # builtin, frozen, or a namespace package without files
        return vars(module).get("__spec__") is None and name not in sys.builtin_module_names
    return _is_user_file(path)


def _is_user_file(path: str) -> bool:
    """A module file of the user's (not in the standard library or site-packages)."""
    real = os.path.realpath(path)
    if os.sep + "site-packages" + os.sep in real or os.sep + "dist-packages" + os.sep in real:
        return False
    return not real.startswith(_library_roots())
