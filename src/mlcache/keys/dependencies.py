"""The walk behind a code version: from a function through what its code reaches.

:class:`DependencyWalk` records, under a name each, the digest of every thing a
function depends on (see :mod:`mlcache.keys.code_version` for what counts and
how): the function's normalised code, the globals, attribute chains and body
imports it reads (:func:`mlcache.keys.bytecode.references`), their functions
and classes recursively, module-level values by content (watched for changes
a call makes: :mod:`mlcache.keys.state`) and libraries by their version.

A module imported in a function's body that is not imported yet is read from
its file, never run: :func:`module_file` finds the file as the import system
would, :func:`compile_module_file` compiles it (running it could have any
effect; reading it has none).
"""

from __future__ import annotations

import builtins
import functools
import gc
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from .bytecode import attribute_reads, code_digest, global_reads, references, subscript_uses
from .identity import module_name, target_function
from .origin import is_user_file, is_user_module, library_version
from .state import MAX_ITEMS, ancestors, keyed_parts, state_parts, value_digest, watchable

__all__ = [
    "Binding",
    "CodeWalkError",
    "DependencyWalk",
    "call_target",
    "class_namespace",
    "compile_module_file",
    "is_code",
    "library_part",
    "module_file",
    "rebound",
    "rebound_names",
    "without",
]

_MISSING = object()
#: Python's builtins, by name
_BUILTINS = frozenset(vars(builtins))
#: a module-level name the walked code reads: its namespace (a module's dict, a
#: class's view), the name, and what it named then (or ``_MISSING``)
Binding = tuple[Mapping[str, Any], str, Any]


#: values a call consumes that no key can hold (what they yield next)
_CONSUMED = (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)


class CodeWalkError(Exception):
    """Reading something a function's code refers to raised: ``where`` is its
    name (a global, an attribute chain)."""

    def __init__(self, where: str, exc: BaseException) -> None:
        super().__init__(f"reading {where} raised {type(exc).__name__}: {exc}")
        self.where = where


def rebound(bindings: tuple[Binding, ...]) -> bool:
    """Whether a module-level name of ``bindings`` (a walk's: namespace, name,
    value) names another value now, or none: identities only, ~40 ns a name."""
    missing = _MISSING
    for namespace, name, obj in bindings:  # noqa: SIM110 (a loop: any() of a generator is slower)
        if namespace.get(name, missing) is not obj:
            return True
    return False


def rebound_names(
    bindings: tuple[Binding, ...],
) -> set[tuple[int, str]]:
    """The (namespace id, name) of each name of ``bindings`` that :func:`rebound`
    finds rebound."""
    return {(id(ns), name) for ns, name, obj in bindings if ns.get(name, _MISSING) is not obj}


def class_namespace(klass: type) -> dict[str, Any]:
    """The dict that holds ``klass``'s own attributes, as a binding's namespace
    (:meth:`DependencyWalk._bind`): ``Config.scale = 3`` sets it. ``vars(klass)``
    is a new read-only proxy at each access, and a binding's namespace must keep
    one identity across walks (a name the cached call sets itself is left out by
    it: ``Tally.calls += 1``), so the proxy's dict is taken; a proxy that does not
    show it is kept as it is (checked alike, its identity only for this walk)."""
    proxy = vars(klass)
    found = gc.get_referents(proxy)  # a mappingproxy refers to its mapping alone
    if len(found) == 1 and type(found[0]) is dict:
        return found[0]
    return proxy  # type: ignore[return-value]  # a Mapping: .get is all a binding uses


def without(bindings: tuple[Binding, ...], names: set[tuple[int, str]]) -> tuple[Binding, ...]:
    """``bindings`` less those of ``names`` (namespace id, name: :func:`rebound_names`)."""
    return tuple(b for b in bindings if (id(b[0]), b[1]) not in names)


def call_target(func: Any) -> Any:
    """The function whose code runs when ``func`` is called (a memoized function
    used as a helper: the function it memoizes)."""
    inner = getattr(func, "func", None)  # a MemorizedFunc used as a helper
    if inner is not None and hasattr(func, "__mlcache_token__"):
        func = inner
    return target_function(func)


def _name_of(obj: Any) -> str:
    module = module_name(getattr(obj, "__module__", None))
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or "?"
    return f"{module}.{name}"


class DependencyWalk:
    """One walk of a dependency graph: ``parts`` maps names to digests."""

    def __init__(self, state: Mapping[str, str] = types.MappingProxyType({})) -> None:
        self._found: dict[str, set[str]] = {}
        self._shape: dict[str, set[str]] = {}  # the same, mutable values by type
        self.state_used: set[str] = set()  # names of ``state`` met
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # what ``_seen`` refers to, alive for the walk
        #: parts of values that calls change as bookkeeping (name -> kind, see
        #: mlcache.keys.state): by their baseline (or type), the rest by value
        self._state = state
        self._split_at = ancestors(state)
        self._static: set[str] = set()  # modules read from their files
        #: mutable values counted by content: (name, value)
        self.watched: list[tuple[str, Any]] = []
        #: the attribute names the walked code reads other than to raise them
        self.attr_reads: set[str] = set()
        #: each module-level name the code reads, and what it named: (id of the
        #: namespace, name) -> (namespace, name, value or MISSING)
        self.bindings: dict[tuple[int, str], Binding] = {}
        #: the globals the walked code loads other than to raise them in place
        self.global_reads: set[str] = set()
        #: how the walked code uses containers' keys (raised, read, the container whole)
        self.subscripts: set[tuple[str, Any, Any]] = set()
        #: the data attributes of the classes walked: bound when some code reads them
        self._class_data: list[tuple[type, str]] = []

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
            obj = call_target(obj)
        if isinstance(obj, functools.partialmethod):
            self.value(f"{name}.<partial args>", (obj.args, obj.keywords))
            obj = obj.func
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, functools.cached_property):
            obj = obj.func  # its body is code (and its lock cannot be hashed: 3.11)
        if type(obj) is types.FunctionType:  # not a proxy posing as one (wrapt's)
            if root or obj.__module__ is None or is_user_module(obj.__module__):
                self._function(name if root else _name_of(obj), obj, root=root)
            else:
                self._record(name, library_part(obj))
        elif isinstance(obj, type):
            if _is_user_class(obj) or (root and _has_python_code(obj)):
                self._class(name if root else _name_of(obj), obj)
            elif obj.__module__ != "builtins" or root:
                self._record(name, library_part(obj))
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
                self._record(name, library_part(obj))
        elif (
            callable(obj)
            and _probe(obj, "__wrapped__") is not None
            # a user's class-based decorator (its __call__ runs too): below
            and not (_is_user_class(type(obj)) and _has_python_code(type(obj)))
        ):
            self.value(name, obj.__wrapped__)  # functools.lru_cache and other wrappers
            wrapper = _probe(obj, "_self_wrapper")  # wrapt's: the decorator's function
            if isinstance(wrapper, types.FunctionType):
                self.value(name, wrapper)
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
        calls are known to change as bookkeeping (``state``: the value itself, or
        some of its parts) counts by its baseline (:func:`keyed_parts`). A
        generator cannot count: what it yields next is neither hashed nor seen
        changing (it would count by its type), so the walk fails on it."""
        if isinstance(obj, _CONSUMED):
            raise CodeWalkError(name, TypeError("a generator: what it yields next is no key"))
        met: list[Any] = []  # the user code the value holds: followed below
        self._record(name, *self._digest(name, obj, met))
        for code in met:  # a registry's model, a config's function, np.vectorize(h)
            self.value(f"{name}<held>", code)

    def _digest(self, name: str, obj: Any, met: list[Any]) -> tuple[str, str | None]:
        """The digest of the value ``obj`` (see :meth:`_data`) and what stands for
        it in the code's shape (its type when it is watched, else None)."""
        kind = f"<{type(obj).__qualname__}>"
        if name in self._state or name in self._split_at:
            if watchable(obj):
                self.watched.append((name, obj))
            kept = keyed_parts(name, obj, self._state, self._split_at)
            self.state_used.update(n for n, _ in kept if n in self._state)
            return value_digest([(n[len(name) :], v) for n, v in kept], met), kind
        if watchable(obj):
            self.watched.append((name, obj))
            parts = state_parts(name, obj)
            if parts is not None:  # counted key by key, or attribute by attribute
                kept_parts = [(sub[len(name) :], v) for sub, v in parts]
                return value_digest((type(obj).__qualname__, kept_parts), met), kind
            return value_digest(obj, met), kind
        return value_digest(obj, met), None

    def _container(self, name: str, obj: Any) -> None:
        """A container: the code of the functions and classes in it (a dispatch
        table) is walked; its data counts by value (see :meth:`_data`)."""
        if len(obj) <= MAX_ITEMS:
            values = obj.values() if isinstance(obj, dict) else obj
            for item in values:  # under the container's name: no order, no index
                if callable(item) and not isinstance(item, (types.BuiltinFunctionType, np.ufunc)):
                    self.value(f"{name}[]", item)
        self._data(name, obj)

    def _function(self, name: str, f: types.FunctionType, *, root: bool = False) -> None:
        if not self._first_time(f):
            return
        code = f.__code__
        self._record(name, code_digest(code))
        self.attr_reads |= attribute_reads(code)
        self.global_reads |= global_reads(code)
        self.subscripts |= subscript_uses(code)
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
        registry = vars(f).get("registry")  # functools.singledispatch: what it dispatches to
        if isinstance(registry, types.MappingProxyType) and "dispatch" in vars(f):
            self.value(f"{name}.<registry>", dict(registry))
        for ref in references(code):
            self._reference(f, ref, root=root)

    def _class(self, name: str, cls: type) -> None:
        if not self._first_time(cls):
            return
        self._record(name, value_digest(cls.__qualname__))
        meta = type(cls)
        if meta is not type and _is_user_class(meta):  # its __call__ makes the instances
            self._class(_name_of(meta), meta)
        for klass in cls.__mro__:
            if klass is object or not _is_user_class(klass):
                if klass is not object and klass.__module__ != "builtins":
                    self._record(f"{name}<{_name_of(klass)}>", library_part(klass))
                continue
            for attr, member in sorted(vars(klass).items()):
                if attr.startswith("__") and attr.endswith("__") and not callable(member):
                    continue  # __module__, __doc__, __dict__, __weakref__ ...
                if not callable(member):  # data (self.offset): other code may set it
                    self._class_data.append((cls, attr))
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
            if root and not is_code(obj):
                return  # the memoized function's closure data is part of each key
            where, attrs = f"{_name_of(f)}.<closure {ref[1]}>", ref[2:]
        elif ref[0] == "g":
            head, attrs = ref[1], ref[2:]
            obj = f.__globals__.get(head, _MISSING)
            self._bind(f.__globals__, head, obj)
            if obj is _MISSING:
                return  # a builtin (Python's version counts) or not defined yet
            if head == "__name__" and isinstance(obj, str):
                obj = module_name(obj)  # spawn workers' __mp_main__ is __main__
            where = f"{module_name(f.__module__)}.{head}"
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
                if _function_data(obj, attr):  # h.k, h.__doc__: data a function carries
                    obj = call_target(obj)
                elif not _walkable(obj):
                    break
                reading = f"{where}.{attr}"
                nxt = getattr(obj, attr, _MISSING)
                if isinstance(obj, types.ModuleType):  # config.SIZE: a module's name
                    # (as its namespace holds it: a module __getattr__'s is no binding)
                    self._bind(vars(obj), attr, vars(obj).get(attr, _MISSING))
                elif isinstance(obj, type):  # Config.scale: on it, or on a base it inherits
                    self._bind_class(obj, attr)
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

    def _bind(self, namespace: Mapping[str, Any], name: str, obj: Any) -> None:
        """``name`` of the module ``namespace`` named ``obj`` when the code was
        walked: rebound later (``SIZE = 3`` in a notebook cell, a helper defined
        again), the version is no longer the code's (see :func:`rebound`). Each is
        checked at every call (and every read of a dataset being filled), so a
        module (``np``, ``os``: imported once) and a builtin no module defines
        (``len``) are not."""
        if isinstance(obj, types.ModuleType) or (obj is _MISSING and name in _BUILTINS):
            return
        self.bindings.setdefault((id(namespace), name), (namespace, name, obj))

    def all_bindings(self) -> tuple[Binding, ...]:
        """:attr:`bindings`, with the data attributes of the classes walked that the
        walked code reads (``self.offset``; checked at every call: ~40 ns each, so
        not the ones no code reads)."""
        for cls, attr in self._class_data:
            if attr in self.attr_reads:
                self._bind_class(cls, attr)
        return tuple(self.bindings.values())

    def _bind_class(self, cls: type, attr: str) -> None:
        """``cls.attr`` as the code reads it: bound in each user class of the MRO
        down to the one that holds it (absent from those before it: set on the
        subclass later, it is found there first), so that setting it on any of
        them walks again (``Config.scale = 3`` in a notebook cell)."""
        for klass in cls.__mro__:
            if klass is object or not _is_user_class(klass):
                return  # a library's or a metaclass's attribute: by version
            namespace = class_namespace(klass)
            held = namespace.get(attr, _MISSING)
            self._bind(namespace, attr, held)
            if held is not _MISSING:
                return

    def _static_module(self, full: str) -> None:
        """Record the module ``full`` from its file without running it: the
        normalised code of the whole module, and of the user modules it imports
        (a library by its version). Nothing is recorded when it cannot be found."""
        if full in self._static:
            return
        self._static.add(full)
        if full.split(".")[0] in ("mlcache", "builtins"):
            self._record(full, library_version(full))
            return
        # found as the import would find it: a user's package named as a standard
        # module (code/) shadows it, and its file is the user's
        path = module_file(full)
        if path is None:
            return
        if not is_user_file(path):
            self._record(full, library_version(full))
            return
        code = compile_module_file(path)
        self._record(f"{full} <file>", "<unreadable>" if code is None else code_digest(code))
        if code is None:
            return
        package = (
            full if os.path.basename(path).startswith("__init__.") else full.rpartition(".")[0]
        )
        for ref in references(code):
            if ref[0] != "i":
                continue
            try:
                dep = importlib.util.resolve_name("." * int(ref[2]) + ref[1], package)
            except (ImportError, ValueError):
                continue
            self._static_module(dep)
            if len(ref) > 3:  # `from pkg import submodule`
                self._static_module(f"{dep}.{ref[3]}")


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


def is_code(obj: Any) -> bool:
    """A module, class or function: something whose code, not value, matters (by
    its type: isinstance would read a proxy's ``__class__``, which may raise)."""
    return issubclass(type(obj), (types.ModuleType, type, types.FunctionType, types.MethodType))


def _has_python_code(cls: type) -> bool:
    return any(
        isinstance(getattr(v, "__func__", v), types.FunctionType)
        for k in cls.__mro__
        for v in vars(k).values()
    )


def _function_data(obj: Any, attr: str) -> bool:
    """Whether ``attr`` of ``obj`` is data a user function carries: an attribute set
    on it (``h.k = 1``) or its docstring, which code that reads it uses as data (a
    docstring is otherwise no part of a version)."""
    t = type(obj)
    if t is not types.FunctionType and not hasattr(t, "__mlcache_token__"):
        return False
    f = call_target(obj)  # a memoized function: the function it runs
    return (
        type(f) is types.FunctionType
        and is_user_module(f.__module__ or "")
        and (attr == "__doc__" or attr in vars(f))
    )


def _walkable(obj: Any) -> bool:
    """A user module or class: an attribute read on it is followed."""
    if isinstance(obj, types.ModuleType):
        return is_user_module(obj.__name__)
    return isinstance(obj, type) and _is_user_class(obj)


def library_part(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"{library_version(module)}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def module_file(full: str) -> str | None:
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


def compile_module_file(path: str) -> types.CodeType | None:
    """A module's code, compiled from its source file ``path`` (never run); None
    when it cannot be read or compiled. Cached until the file changes (its
    modification time or size)."""
    return _compile_file(path, *_file_stamp(path))


def _file_stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _compile_file(path: str, mtime_ns: int, size: int) -> types.CodeType | None:
    if not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as f:
            source = importlib.util.decode_source(f.read())
        return compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
