"""Whose code a module is: the user's own (walked for code versions) or a
library's (identified by the library's version, never walked).

*User code* is every module whose file is not in the standard library or in a
site-packages folder (and ``__main__``: scripts, notebook cells; and code made
by ``exec`` in a namespace without a ``__name__``). mlcache itself counts as a
library.

Both the hashing of functions and classes (:mod:`mlcache.keys.hashing`) and
code versions (:mod:`mlcache.keys.code_version`) decide with these functions,
so they always agree. The answers are cached per module name.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig

__all__ = ["NOT_USER", "is_user_code", "is_user_file", "is_user_module", "library_version"]

#: top-level names that are never user code
NOT_USER = frozenset(sys.stdlib_module_names) | {"builtins", "mlcache"}


@functools.lru_cache(maxsize=1024)
def library_version(module: str) -> str:
    """``"package==version"`` for a library module (``"python==3.11"`` for the
    standard library).

    Examples
    --------
    >>> library_version("os.path") == "python=={}.{}".format(*sys.version_info[:2])
    True
    """
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return f"python=={sys.version_info[0]}.{sys.version_info[1]}"
    found = sys.modules.get(top)
    version = getattr(found, "__version__", None)
    if not isinstance(version, str):
        version = _distribution_version(top)
    return f"{top}=={version}"


def _distribution_version(top: str) -> str:
    """The version of the distribution that installs the module ``top``: first
    the one of that name (one lookup, ~10 ms: ``pandas`` referenced by code that
    imports it later), else the one that names it among its top-level modules
    (``yaml`` of ``PyYAML``: the map of every distribution, built once, costs a
    second or more where many are installed)."""
    from importlib import metadata

    try:
        return metadata.version(top)
    except metadata.PackageNotFoundError:
        pass
    except Exception:  # metadata that cannot be read: unknown
        return "?"
    try:
        dists = _distributions().get(top) or [top]
        return metadata.version(dists[0])
    except Exception:  # no metadata, or metadata that cannot be read: unknown
        return "?"


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    try:
        return dict(metadata.packages_distributions())
    except Exception:  # a broken installed distribution must not break hashing
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


def is_user_module(name: str | None) -> bool:
    """Whether the module ``name`` is the user's own code (walked), not a library.
    An imported module is judged by its file, so that a user's package named as
    a standard module (a research repository's ``code/``) is the user's; one not
    imported by its name.

    Examples
    --------
    >>> is_user_module("__main__"), is_user_module("json"), is_user_module("mlcache.keys")
    (True, False, False)
    """
    return _is_user_module(name, name in sys.modules) if name else False


@functools.lru_cache(maxsize=4096)
def _is_user_module(name: str, imported: bool) -> bool:
    if name in ("__main__", "__mp_main__"):
        return True
    top = name.split(".")[0]
    if top == "mlcache" or top == "builtins":
        return False
    module = sys.modules.get(name)
    if module is None:
        # code made at run time (exec, a notebook's own namespace); the standard
        # library's modules by name until imported (a user's would be judged then)
        return top not in sys.stdlib_module_names
    # vars(): a module's own __getattr__ (PEP 562) may raise anything
    path = vars(module).get("__file__")
    if not path:
        # made at run time (types.ModuleType) when it has no import spec, but not
        # by the standard library (typing.io); else builtin, frozen, or a
        # namespace package without files
        return (
            vars(module).get("__spec__") is None
            and name not in sys.builtin_module_names
            and top not in sys.stdlib_module_names
        )
    return is_user_file(path)


def is_user_code(module: str | None) -> bool:
    """Whether code whose ``__module__`` is ``module`` is the user's: a user
    module (:func:`is_user_module`), or no module at all (``exec`` in a
    namespace without a ``__name__``)."""
    return not module or is_user_module(module)


def is_user_file(path: str) -> bool:
    """A module file of the user's (not in the standard library or site-packages)."""
    real = os.path.realpath(path)
    if os.sep + "site-packages" + os.sep in real or os.sep + "dist-packages" + os.sep in real:
        return False
    return not real.startswith(_library_roots())
