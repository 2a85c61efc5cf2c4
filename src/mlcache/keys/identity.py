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
``__main__`` (a script)     ``__main__.<script stem>.func@<script path>``: two
                            scripts, or two copies of one script in two folders,
                            never share results (joblib also keys by the path);
                            spawn workers (``__mp_main__``) see the same name
notebook cell               ``__main__.<notebook stem>.func@<notebook path>`` when
                            the kernel says which notebook it runs (Jupyter's
                            ``__session__``, VS Code's ``__vsc_ipynb_file__``),
                            else ``__main__.func``; the temporary cell file name
                            is never used, so results survive a kernel restart
a plain decorator's         ``package.module.deco.<locals>.wrapper[<identity of
wrapper (no functools.wraps) the function it wraps>]``: two functions under one
                            decorator never share an identity
==========================  =====================================================

The code version (which code the results came from) is :mod:`mlcache.keys.code_version`.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from typing import Any

from .hashing import hash_value

__all__ = [
    "call_state",
    "closure_digest",
    "func_identity",
    "module_name",
    "target_function",
]


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


def module_name(name: str | None) -> str:
    """A module's name as identities and versions use it: the main script is
    ``__main__`` also where multiprocessing's spawned children call it
    ``__mp_main__``; code made by ``exec`` without a ``__name__`` is ``<exec>``."""
    if not name:
        return "<exec>"
    return "__main__" if name == "__mp_main__" else name


def _main_file(func: Any, code: types.CodeType | None) -> str | None:
    """The file a ``__main__`` function comes from: the script, or the notebook
    the kernel names; None for a REPL, an unnamed notebook or shipped code."""
    if code is None or code.co_filename == "<dynamic-code>":  # shipped by value (cloudpickle)
        return None
    if not _is_notebook_file(code.co_filename):
        return os.path.realpath(code.co_filename)
    ns = getattr(func, "__globals__", None) or {}
    for var in ("__vsc_ipynb_file__", "__session__"):
        path = ns.get(var)
        if isinstance(path, str) and path.endswith(".ipynb"):
            return os.path.realpath(path)
    return None


def func_identity(func: Callable[..., Any], _seen: frozenset[int] = frozenset()) -> str:
    """The stable name under which ``func``'s results are stored."""
    wrapper = func
    func = target_function(func)
    module = module_name(getattr(func, "__module__", None))
    qualname = str(getattr(func, "__qualname__", None) or getattr(type(func), "__qualname__", ""))
    code = getattr(func, "__code__", None)
    where = _main_file(func, code) if module == "__main__" else None
    if where is not None:
        module = f"__main__.{os.path.splitext(os.path.basename(where))[0]}"
    if "<lambda>" in qualname and code is not None:
        qualname = f"{qualname}-{code.co_firstlineno}"
        # two lambdas on one line differ by column: the first instruction of the body
        # (RESUME, COPY_FREE_VARS and MAKE_CELL are at column 0)
        columns = (c for _, _, c, _ in getattr(code, "co_positions", lambda: ())() if c)
        column = next(columns, None)
        if column is not None:
            qualname += f"-{column}"
    if "<locals>" in qualname and getattr(wrapper, "__wrapped__", None) is None:
        # a decorator's wrapper that does not say what it wraps: the functions its
        # closure holds tell two decorated functions apart
        seen = _seen | {id(func)}
        held = sorted(func_identity(v, seen) for v in _closure_functions(func) if id(v) not in seen)
        if held:
            qualname += f"[{','.join(held)}]"
    return f"{module}.{qualname}" + (f"@{where}" if where else "")


def _closure_functions(func: Any) -> list[types.FunctionType]:
    found = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if issubclass(type(value), types.FunctionType) and value is not func:
            found.append(value)
    return found


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
            # a wrapper object: what it wraps, below; a class-based decorator's
            # instance (its __call__ is Python code) counts too, as an object does
            if isinstance(getattr(type(f), "__call__", None), types.FunctionType):  # noqa: B004
                state.append(("object", f))
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
    state = call_state(func)
    return "" if state is None else hash_value(state)
