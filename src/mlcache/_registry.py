"""One generic name -> implementation registry, used for stores and codecs.

A registry maps a short lowercase name to either a class/object or a lazy
``"module:attr"`` string, so that optional extras are imported only when used;
a lazy entry can carry an install hint that the error shows.

Errors are those joblib raises for its store registry: a bad registration is
:class:`~mlcache.errors.InvalidRegistration` (a ``ValueError``); an unknown name
is the registry's ``unknown`` class (:class:`~mlcache.errors.UnknownBackend`, a
``TypeError``, for stores). Registering a class again under its name (a module
imported twice, a notebook cell run again) replaces it, as joblib does.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, NamedTuple, TypeVar

from .errors import InvalidRegistration, RegistryError

T = TypeVar("T")

_NAME = re.compile(r"^[a-z][a-z0-9_+.-]{0,63}$")


class Registry(Generic[T], Mapping[str, T]):
    """A read-only mapping of registered implementations plus ``register``.

    Parameters
    ----------
    kind:
        What is registered, for error messages ("store backend", "codec").
    check:
        Called on every implementation at registration and lazy import;
        raises ``TypeError`` when the object is not a valid implementation.
    unknown:
        The error a lookup of an unknown name raises (a subclass of
        :class:`~mlcache.errors.RegistryError`).
    names:
        The names accepted, and how to say so when one is not (default: short
        lowercase identifiers; a registry whose names are never written
        anywhere may accept more).
    """

    def __init__(
        self,
        kind: str,
        check: Callable[[object], None],
        unknown: type[RegistryError] = RegistryError,
        names: tuple[re.Pattern[str], str] | None = None,
    ) -> None:
        self._kind = kind
        self._check = check
        self._unknown = unknown
        self._names = names or (
            _NAME,
            "a short lowercase identifier such as 'local' or 's3' "
            "(letters, digits, '_', '-', '.', '+')",
        )
        # one ordered dict: iteration follows registration order (codec selection
        # relies on it); a lazy entry is a (target, install hint) tuple until used
        self._entries: dict[str, T | _Lazy] = {}

    def can_hold(self, name: object) -> bool:
        """Whether ``name`` is a name this registry accepts (registered or not)."""
        return isinstance(name, str) and self._names[0].fullmatch(name) is not None

    def register(self, name: str, impl: T | str, *, hint: str = "", replace: bool = False) -> None:
        """Register ``impl`` under ``name``; ``impl`` may be ``"package.module:attr"``.

        Raises :class:`~mlcache.errors.InvalidRegistration` for a bad name, an
        object that is not an implementation, or a name another implementation
        holds (unless ``replace``); the same class again (same module and name:
        a reload) replaces the old one.
        """
        pattern, expected = self._names
        if not isinstance(name, str) or not pattern.fullmatch(name):
            raise InvalidRegistration(f"invalid {self._kind} name {name!r}: expected {expected}")
        if isinstance(impl, str):
            self._refuse_taken(name, _Lazy(impl, hint), replace)
            self._entries[name] = _Lazy(impl, hint)
            return
        try:
            self._check(impl)
        except TypeError as exc:
            raise InvalidRegistration(f"cannot register {self._kind} {name!r}: {exc}") from None
        self._refuse_taken(name, impl, replace)
        self._entries[name] = impl

    def _refuse_taken(self, name: str, impl: object, replace: bool) -> None:
        old = self._entries.get(name, _ABSENT)
        if replace or old is _ABSENT or _same_impl(old, impl):
            return
        raise InvalidRegistration(
            f"{self._kind} {name!r} is already registered to {_describe(old)}; "
            "pass replace=True to replace it"
        )

    def __getitem__(self, name: str) -> T:
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):
            known = ", ".join(self) or "none"
            raise self._unknown(f"unknown {self._kind} {name!r}; known: {known}") from None
        if not isinstance(entry, _Lazy):
            return entry
        target, hint = entry
        module_name, _, attr = target.partition(":")
        try:
            impl = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            extra = f"; install it with: {hint}" if hint else ""
            raise RegistryError(f"{self._kind} {name!r} is not available ({exc}){extra}") from exc
        try:
            self._check(impl)
        except TypeError as exc:
            raise RegistryError(f"{self._kind} {name!r} is not valid: {exc}") from None
        self._entries[name] = impl
        return impl

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


class _Lazy(NamedTuple):
    target: str  # "package.module:attr"
    hint: str  # the pip install command to show when the import fails


_ABSENT = object()


def _where(impl: object) -> tuple[str, str] | None:
    """(module, qualified name) of a class or a lazy target; None for other objects."""
    if isinstance(impl, _Lazy):
        module, _, attr = impl.target.partition(":")
        return module, attr
    if isinstance(impl, type):
        return impl.__module__, impl.__qualname__
    return None


def _same_impl(old: object, new: object) -> bool:
    """``new`` is ``old`` again: the same object, or a class of the same module and
    name (its module reloaded, its notebook cell run again)."""
    return old is new or (_where(old) is not None and _where(old) == _where(new))


def _describe(impl: object) -> str:
    where = _where(impl)
    return ".".join(where) if where else repr(impl)
