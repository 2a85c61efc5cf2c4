"""One generic name -> implementation registry, used for stores and codecs.

A registry maps a short lowercase name to either a class/object or a lazy
``"module:attr"`` string, so that optional extras are imported only when used;
a lazy entry can carry an install hint that the error shows.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, NamedTuple, TypeVar

from .errors import RegistryError

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
    """

    def __init__(self, kind: str, check: Callable[[object], None]) -> None:
        self._kind = kind
        self._check = check
        # one ordered dict: iteration follows registration order (codec selection
        # relies on it); a lazy entry is a (target, install hint) tuple until used
        self._entries: dict[str, T | _Lazy] = {}

    def register(self, name: str, impl: T | str, *, hint: str = "", replace: bool = False) -> None:
        """Register ``impl`` under ``name``; ``impl`` may be ``"package.module:attr"``."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise RegistryError(
                f"invalid {self._kind} name {name!r}: expected a short lowercase identifier "
                "such as 'local' or 's3' (letters, digits, '_', '-', '.', '+')"
            )
        if not replace and name in self._entries:
            raise RegistryError(f"{self._kind} {name!r} is already registered")
        if isinstance(impl, str):
            self._entries[name] = _Lazy(impl, hint)
            return
        try:
            self._check(impl)
        except TypeError as exc:
            raise RegistryError(f"cannot register {self._kind} {name!r}: {exc}") from None
        self._entries[name] = impl

    def __getitem__(self, name: str) -> T:
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):
            known = ", ".join(self) or "none"
            raise RegistryError(f"unknown {self._kind} {name!r}; known: {known}") from None
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
