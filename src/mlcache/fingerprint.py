"""Function identity (which function), code version (which code) and call state.

Identity is ``module.qualname``, made into a safe folder name by :func:`slug`:

==========================  =====================================================
module-level function       ``package.module.func``
method                      ``package.module.Class.method`` (``self`` is an argument)
bound method ``obj.meth``   ``package.module.Class.meth``; ``obj`` is part of every
                            call's key, as if it were an argument
``functools.partial``       the wrapped function's identity; the partial's arguments
                            are part of every call's key
callable object             ``package.module.Class.__call__``; the object is part of
                            every call's key
nested function             ``package.module.outer.<locals>.inner``; the values its
                            closure holds at call time are part of every call's key
lambda                      ``package.module.<lambda>-<line>-<column>``
``__main__`` (a script)     ``__main__.<script stem>.func``, so two scripts with a
                            function of the same name do not collide
notebook cell / REPL        ``__main__.func``: the temporary cell file name is not
                            used, so results survive a kernel restart
==========================  =====================================================

The code version hashes the code that actually runs: the function's bytecode,
constants, names and flags (recursively through nested code objects), plus the
Python version that compiled it. Comments and formatting do not change it; an
edit of the source file under a running process does not either (the running
code did not change), and ``%autoreload`` swapping ``__code__`` does. The same
function gives the same version in a notebook and in the worker it is shipped to.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

import xxhash

__all__ = [
    "call_state",
    "closure_digest",
    "code_version",
    "func_identity",
    "slug",
    "target_function",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_PY = f"py{sys.version_info[0]}.{sys.version_info[1]}".encode()
# code object -> digest: code objects are immutable and live as long as their function
_CODE_DIGESTS: dict[types.CodeType, str] = {}


def slug(name: str, *, max_len: int = 80) -> str:
    """A readable, safe folder name for ``name``: sanitised text plus a short hash.

    The result never contains a path separator or starts with a dot, so it can
    never leave the folder it is joined to.
    """
    clean = _UNSAFE.sub("_", name).strip(".-")[:max_len] or "x"
    return f"{clean}-{xxhash.xxh3_64_hexdigest(name.encode('utf-8', 'surrogatepass'))[:8]}"


def _is_notebook_file(filename: str) -> bool:
    base = os.path.basename(filename)
    return (
        filename.startswith("<")
        or "ipykernel_" in filename
        or base.startswith("ipython-input")
        or "/tmp/xpython_" in filename
    )


def target_function(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose code runs when ``func`` is called: the function of a bound
    method or a partial, the ``__call__`` of a callable object."""
    while True:
        if isinstance(func, types.MethodType):
            func = func.__func__
        elif isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, (types.FunctionType, types.BuiltinFunctionType, type)):
            return func
        elif callable(func):
            call = getattr(type(func), "__call__", None)  # noqa: B004
            return call if isinstance(call, types.FunctionType) else func
        else:
            return func


def func_identity(func: Callable[..., Any]) -> str:
    """The stable name under which ``func``'s results are stored."""
    func = target_function(func)
    module = getattr(func, "__module__", None) or "<unknown>"
    if module == "__mp_main__":  # the main script as multiprocessing's spawned children see it
        module = "__main__"
    qualname = str(getattr(func, "__qualname__", None) or getattr(type(func), "__qualname__", ""))
    code = getattr(func, "__code__", None)
    if (
        module == "__main__"
        and code is not None
        and not _is_notebook_file(code.co_filename)
        and code.co_filename != "<dynamic-code>"  # shipped by value (cloudpickle)
    ):
        stem = os.path.splitext(os.path.basename(code.co_filename))[0]
        module = f"__main__.{stem}"
    if "<lambda>" in qualname and code is not None:
        qualname = f"{qualname}-{code.co_firstlineno}"
        # two lambdas on one line differ by column: the first instruction of the body
        # (RESUME, COPY_FREE_VARS and MAKE_CELL are at column 0)
        columns = (c for _, _, c, _ in getattr(code, "co_positions", lambda: ())() if c)
        column = next(columns, None)
        if column is not None:
            qualname += f"-{column}"
    return f"{module}.{qualname}"


def _code_bytes(code: types.CodeType, h: xxhash.xxh3_128) -> None:
    h.update(code.co_code)
    # 3.11+: which instructions are inside a try; moving a line from a try body to
    # its else changes what runs but not co_code
    h.update(getattr(code, "co_exceptiontable", b""))
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode())
    counts = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    h.update(repr(counts).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(b"<code>")
            _code_bytes(const, h)
        elif isinstance(const, frozenset):  # its repr depends on the hash seed
            h.update(repr(sorted(map(repr, const))).encode("utf-8", "surrogatepass"))
        else:
            h.update(repr(const).encode("utf-8", "surrogatepass"))


def _code_digest(code: types.CodeType) -> str:
    digest = _CODE_DIGESTS.get(code)
    if digest is None:
        h = xxhash.xxh3_128(_PY)
        _code_bytes(code, h)
        digest = _CODE_DIGESTS[code] = h.hexdigest()
    return digest


def code_version(func: Callable[..., Any]) -> str:
    """Hex digest of the code that runs when ``func`` is called.

    Follows ``__wrapped__`` chains (a decorator's wrapper and the function it
    wraps both count). Builtins are identified by their package's version.
    """
    parts = []
    seen: set[int] = set()
    f: Any = func
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        target = target_function(f)
        code = getattr(target, "__code__", None)
        if code is not None:
            parts.append(_code_digest(code))
        elif isinstance(target, type) and target.__module__ not in sys.builtin_module_names:
            parts.append(_class_digest(target))
        else:
            module = getattr(target, "__module__", "") or ""
            top = sys.modules.get(module.split(".")[0])
            version = getattr(top, "__version__", "")
            name = getattr(target, "__qualname__", type(target).__qualname__)
            parts.append(f"builtin:{module}:{version}:{name}")
        f = getattr(target, "__wrapped__", None)
    return xxhash.xxh3_128_hexdigest("\0".join(parts).encode())


def _class_digest(cls: type) -> str:
    """A class used as the memoized callable: the code of the methods it defines and
    inherits from Python classes (its module's version for C types)."""
    parts = []
    for klass in cls.__mro__:
        for name, value in sorted(vars(klass).items()):
            func = getattr(value, "__func__", value)  # staticmethod, classmethod
            code = getattr(func, "__code__", None)
            if code is not None:
                parts.append(f"{klass.__qualname__}.{name}:{_code_digest(code)}")
    if not parts:
        top = sys.modules.get(cls.__module__.split(".")[0])
        parts.append(f"{cls.__module__}:{getattr(top, '__version__', '')}:{cls.__qualname__}")
    return xxhash.xxh3_128_hexdigest("\0".join(parts).encode())


def call_state(
    func: Callable[..., Any], ignore: frozenset[str] = frozenset()
) -> tuple[Any, ...] | None:
    """What a call of ``func`` depends on besides its arguments and code, read now:
    the object of a bound method, a partial's arguments, a callable object, the
    values in closures (of every level of a ``__wrapped__`` chain). ``None`` when
    there is nothing (a plain function without closure): the common, free case.
    Entries are ``(name, value)``; names in ``ignore`` (closure variables, or
    ``"self"`` for a bound object) are left out.
    """
    state: list[Any] = []
    seen: set[int] = set()
    f: Any = func
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        if isinstance(f, types.MethodType):
            if not isinstance(f.__self__, (type, types.ModuleType)):
                if "self" not in ignore:
                    state.append(("self", f.__self__))
            elif isinstance(f.__self__, type) and "cls" not in ignore:
                state.append(("cls", f.__self__))
            f = f.__func__
            continue
        if isinstance(f, functools.partial):
            state.append(("partial", f.args, f.keywords))
            f = f.func
            continue
        if isinstance(f, types.FunctionType):
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell: not assigned yet
                    value = None
                if name not in ignore:
                    state.append((name, value))
        elif hasattr(f, "__wrapped__") and not isinstance(f, type):
            pass  # a wrapper object (functools.lru_cache): what it wraps, below
        elif callable(f) and not isinstance(f, (type, types.BuiltinFunctionType)):
            state.append(("object", f))
            f = type(f).__call__
            continue
        f = getattr(f, "__wrapped__", None)
    return tuple(state) if state else None


def closure_digest(func: Callable[..., Any]) -> str:
    """Hex digest of :func:`call_state` now ("" when the function has no state).

    Raises ``TypeError`` when a captured value cannot be hashed.
    """
    from .hashing import hash_value

    state = call_state(func)
    return "" if state is None else hash_value(state)
