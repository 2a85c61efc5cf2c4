"""Function identity (which function) and code version (which version of its code).

Identity is ``module.qualname``, made into a safe folder name by :func:`slug`.
What each kind of function gets:

==========================  =====================================================
module-level function       ``package.module.func``
method                      ``package.module.Class.method`` (``self`` is an argument)
nested function             ``package.module.outer.<locals>.inner``; the values in
                            its closure are part of the code version, so two
                            closures over different values never share results
lambda                      ``package.module.<lambda>`` plus its first line number
``__main__`` (a script)     ``__main__.<script stem>.func``, so two scripts with a
                            function of the same name do not collide
notebook cell / REPL        ``__main__.func``: the temporary cell file name is not
                            used, so results survive a kernel restart
==========================  =====================================================

The code version hashes the function's source text when it can be found
(``inspect.getsource``; notebooks included, their cells are in ``linecache``),
else its bytecode, constants and names. The values in its closure cells are
hashed separately (:func:`closure_digest`) and go into every call's key. A
changed version is always a miss.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

import xxhash

__all__ = ["closure_digest", "code_version", "func_identity", "slug"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(name: str, *, max_len: int = 80) -> str:
    """A readable, safe folder name for ``name``: sanitised text plus a short hash.

    The result never contains a path separator or starts with a dot, so it can
    never leave the folder it is joined to.

    >>> slug("pkg.mod.f")
    'pkg.mod.f-...'  # doctest: +SKIP
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


def func_identity(func: Callable[..., Any]) -> str:
    """The stable name under which ``func``'s results are stored."""
    module = getattr(func, "__module__", None) or "<unknown>"
    qualname = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    code = getattr(func, "__code__", None)
    if module == "__main__" and code is not None and not _is_notebook_file(code.co_filename):
        stem = os.path.splitext(os.path.basename(code.co_filename))[0]
        module = f"__main__.{stem}"
    if "<lambda>" in qualname and code is not None:
        qualname = f"{qualname}-{code.co_firstlineno}"
    return f"{module}.{qualname}"


def _code_bytes(code: types.CodeType, h: xxhash.xxh3_128) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    h.update(str(code.co_flags).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_bytes(const, h)
        elif isinstance(const, frozenset):
            h.update(repr(sorted(map(repr, const))).encode("utf-8", "surrogatepass"))
        else:
            h.update(repr(const).encode("utf-8", "surrogatepass"))


def _source(func: Callable[..., Any]) -> str | None:
    try:
        return inspect.getsource(func)
    except (OSError, TypeError):
        return None


def code_version(func: Callable[..., Any]) -> str:
    """Hex digest of ``func``'s code: its source text, else its bytecode.

    Closure contents are not included: see :func:`closure_digest`.
    """
    h = xxhash.xxh3_128()
    target = inspect.unwrap(func) if hasattr(func, "__wrapped__") else func
    source = _source(target)
    code = getattr(target, "__code__", None)
    if source is not None and not (code is not None and code.co_name == "<lambda>"):
        h.update(b"src:" + source.encode("utf-8", "surrogatepass"))
    elif code is not None:
        # lambdas: several can share one source line, so use what they compile to
        h.update(b"code:")
        _code_bytes(code, h)
    else:  # builtins and C extensions: their module and version
        module = getattr(func, "__module__", "") or ""
        top = sys.modules.get(module.split(".")[0])
        version = getattr(top, "__version__", "")
        h.update(f"builtin:{module}:{version}:{getattr(func, '__qualname__', '')}".encode())
    return h.hexdigest()


def closure_digest(func: Callable[..., Any], _seen: frozenset[int] = frozenset()) -> str:
    """Hex digest of the values ``func``'s closure captures ("" when it has none).

    Two closures made by one factory share their code but not their results.
    Raises ``TypeError`` when a captured value cannot be hashed.
    """
    target = inspect.unwrap(func) if hasattr(func, "__wrapped__") else func
    cells = getattr(target, "__closure__", None)
    if not cells:
        return ""
    if id(target) in _seen:
        return "<cycle>"
    _seen = _seen | {id(target)}
    from .hashing import Hasher

    sub = Hasher()
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        if value is target or getattr(value, "func", None) is target:
            sub.update("<self>")  # a recursive reference to itself
        elif isinstance(value, types.FunctionType):
            # by identity and code, not by walking its globals
            sub.update((func_identity(value), code_version(value), closure_digest(value, _seen)))
        else:
            sub.update(value)
    return sub.hexdigest()
