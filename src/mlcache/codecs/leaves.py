"""Leaves: typed values (a DataFrame, a tensor, a sparse matrix) inside the npy tree.

The ``npy`` codec stores trees of arrays and plain data. A value of another
type becomes a *leaf node* ``{"x": leaf.name, ...}`` when a registered
:class:`Leaf` handles its exact type: the leaf turns it into a JSON-able node
plus raw segments (added through ``add``), and back. So a dict of DataFrames and
arrays keeps every part typed, and a new type is one module with one leaf.

Dispatch is by the ``"module.QualName"`` of ``type(value)`` (:func:`leaf_for`),
looked up once per type and cached, so that mlcache never imports pandas, torch
or scipy before such a value is met, and a plain tree costs nothing more.
Exact types only: a subclass is another type (pickle, or unstored).

A leaf may also say what identifies a value for its key: an optional method
``token(value)`` returning any value mlcache hashes (a tuple of its settings,
its arrays). Then the type is *one module*: the leaf both stores it and keys it
(:mod:`mlcache.keys.hashing` consults the leaf of an exact type, after the
hashers of :func:`mlcache.register_hasher`, before its own rules for a
library's types). The built-in leaves have no ``token``: how mlcache keys
pandas, torch or scipy values is its own (:mod:`mlcache.keys`).

Decoding an entry whose leaf name this process has not registered is
:class:`~mlcache.errors.UnknownFormat`: a miss that leaves the entry in place
(another process may read it), as for an unregistered codec. So a leaf whose
nodes gain a layout that an older reader would misread stores those nodes under
another name (``register_leaf(leaf, also=(name,))``; ``encode`` returns
``{"x": name, ...}``): older readers do not know the name and miss, keeping the
entry, while nodes of the first layout keep the first name and still read.

Leaves of one tree may share what they store (tensors that are views of one
storage): :func:`tree_scope` is the state of the ``npy`` tree being encoded or
decoded (its root value, and one dict per leaf), so that a leaf can find what
else the tree holds and what it has already added.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._registry import Registry
from ..errors import InvalidRegistration, RegistryError, UnknownFormat

if TYPE_CHECKING:  # codecs/__init__ imports this module: no import back at run time
    from . import Segments

__all__ = [
    "LISTENERS",
    "Leaf",
    "TreeScope",
    "get_leaf",
    "leaf_for",
    "leaves",
    "register_leaf",
    "stores_as",
    "tree",
    "tree_scope",
    "unknown_leaf",
]

#: called after each registration (the key's dispatch, above this layer, caches
#: what it decided per type: :mod:`mlcache.keys.hashing` clears it)
LISTENERS: list[Callable[[], None]] = []


@runtime_checkable
class Leaf(Protocol):
    """One typed value family stored as a node of the ``npy`` tree.

    ``name`` is unique and stored in entries ("pandas.DataFrame");
    ``types`` are the exact types handled, by the ``"module.QualName"`` of
    ``type(value)`` ("pandas.core.frame.DataFrame"). A leaf never runs code
    from the entry when decoding (the ``npy`` codec is a safe codec).
    """

    name: str
    types: tuple[str, ...]

    def can_encode(self, value: Any) -> bool:
        """Whether the leaf *fully* represents ``value`` (a strict check: a value
        it would store approximately is refused, and goes to pickle)."""
        ...

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        """A JSON-able node for ``value`` (without the key ``"x"``, which the tree
        uses); ``add(segment)`` appends a raw segment (a bytes-like object or a
        contiguous numpy array) and returns its index."""
        ...

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        """The value of ``node``; ``segments.array(i, dtype, shape, order)`` is a
        view of the mapped file when the entry is read with ``mmap_mode``."""
        ...


def _check_leaf(obj: object) -> None:
    if isinstance(obj, type) or not isinstance(obj, Leaf):
        raise TypeError(
            f"{obj!r} is not a leaf instance: it needs name, types, can_encode, encode and decode"
        )
    types = getattr(obj, "types", None)
    if not isinstance(types, tuple) or not all(isinstance(t, str) and t for t in types):
        raise TypeError(f"{obj!r}: types must be a tuple of 'module.QualName' strings")


#: leaf names are stored in entries: "pandas.DataFrame", "torch.Tensor"
_LEAF_NAME = (
    re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{0,127}$"),
    "a dotted name such as 'pandas.DataFrame' (letters, digits, '_', '-', '.', '+')",
)

leaves: Registry[Leaf] = Registry("leaf", _check_leaf, names=_LEAF_NAME)

#: "module.QualName" -> the leaf for that exact type
_BY_TYPENAME: dict[str, Leaf] = {}
#: another name a leaf's nodes are stored under (``also``) -> that leaf
_ALSO: dict[str, Leaf] = {}
#: type -> its leaf (None: no leaf), decided once per type
_RESOLVED: dict[type, Leaf | None] = {}


def register_leaf(leaf: Leaf, *, replace: bool = False, also: tuple[str, ...] = ()) -> None:
    """Register a leaf instance under ``leaf.name`` for the types ``leaf.types``.

    ``also`` are other names its nodes may be stored under (its ``encode``
    returns ``{"x": name, ...}``): a later layout of its nodes that readers
    before it must not misread (to them an unknown leaf: a miss, the entry kept).

    Raises :class:`~mlcache.errors.InvalidRegistration` for an object that is not
    a leaf, a name another leaf holds, or a type another leaf handles (unless
    ``replace``).

    Examples
    --------
    >>> import fractions
    >>> from mlcache.codecs.leaves import register_leaf
    >>> class FractionLeaf:
    ...     name = "example.Fraction"
    ...     types = ("fractions.Fraction",)
    ...     def can_encode(self, value):
    ...         return True
    ...     def encode(self, value, add):
    ...         return {"n": str(value.numerator), "d": str(value.denominator)}
    ...     def decode(self, node, segments):
    ...         return fractions.Fraction(int(node["n"]), int(node["d"]))
    >>> register_leaf(FractionLeaf(), replace=True)
    """
    try:
        _check_leaf(leaf)
    except TypeError as exc:
        raise InvalidRegistration(f"cannot register leaf: {exc}") from None
    for name in (leaf.name, *also):
        if not leaves.can_hold(name):
            raise InvalidRegistration(f"invalid leaf name {name!r}: expected {_LEAF_NAME[1]}")
    for name in also:
        other = leaves.get(name) if name in leaves else _ALSO.get(name)
        if name == leaf.name or (other is not None and other.name != leaf.name):
            raise InvalidRegistration(f"leaf {leaf.name!r}: the name {name!r} is taken")
    if not replace:
        for t in leaf.types:
            old = _BY_TYPENAME.get(t)
            if old is not None and old.name != leaf.name:
                raise InvalidRegistration(
                    f"leaf {leaf.name!r}: the type {t} is handled by the leaf {old.name!r}; "
                    "pass replace=True to replace it"
                )
    leaves.register(leaf.name, leaf, replace=replace)
    for t, old in list(_BY_TYPENAME.items()):
        if old.name == leaf.name:  # a leaf registered again: its old types go
            del _BY_TYPENAME[t]
    for t in leaf.types:
        _BY_TYPENAME[t] = leaf
    for name, old_leaf in list(_ALSO.items()):
        if old_leaf.name == leaf.name:
            del _ALSO[name]
    for name in also:
        _ALSO[name] = leaf
    _RESOLVED.clear()
    for listener in LISTENERS:
        listener()


def leaf_for(t: type) -> Leaf | None:
    """The leaf that handles values of exactly type ``t``, or None."""
    try:
        return _RESOLVED[t]
    except KeyError:
        pass
    leaf = _BY_TYPENAME.get(f"{t.__module__}.{t.__qualname__}")
    _RESOLVED[t] = leaf
    return leaf


def unknown_leaf(name: object) -> UnknownFormat:
    """The error for a stored leaf name this process has not registered."""
    known = ", ".join(leaves) or "none"
    return UnknownFormat(
        f"written with the leaf {name!r}, which this process has not registered "
        f"(mlcache.codecs.leaves.register_leaf; known: {known})"
    )


def get_leaf(name: object) -> Leaf:
    """The registered leaf ``name``; :class:`~mlcache.errors.UnknownFormat` if none
    (``ValueError``, damage, for a name that is not a leaf name at all)."""
    if not isinstance(name, str) or not leaves.can_hold(name):
        raise ValueError(f"bad leaf name {name!r}")
    if name in _ALSO:
        return _ALSO[name]
    if name not in leaves:
        raise unknown_leaf(name)
    try:
        return leaves[name]
    except RegistryError:
        raise unknown_leaf(name) from None


def stores_as(leaf: Leaf, name: object) -> bool:
    """Whether ``leaf``'s nodes may be stored under ``name`` (its own or an ``also``)."""
    return name == leaf.name or (isinstance(name, str) and _ALSO.get(name) is leaf)


class TreeScope:
    """What the leaves of one ``npy`` tree share while it is encoded or decoded:
    the tree's ``root`` value (None when decoding) and one dict per leaf name."""

    __slots__ = ("_memos", "root")

    def __init__(self, root: Any = None) -> None:
        self.root = root
        self._memos: dict[str, dict[Any, Any]] = {}

    def memo(self, name: str) -> dict[Any, Any]:
        """The leaf ``name``'s own dict for this tree (empty at first)."""
        return self._memos.setdefault(name, {})


#: this thread's scopes, innermost last (a tree is encoded and decoded in one go,
#: in one thread: nothing else runs in between)
_SCOPES = threading.local()


class tree:
    """Make a new :class:`TreeScope` the current one while a tree is encoded
    (``root``: the value) or decoded: a tree inside a leaf (an ordered dict's
    items) is a scope of its own, as its segments are numbered on their own.

    A class, not a generator context manager: every hit of an ``npy`` entry
    enters one, and a generator's costs ~1 µs more."""

    __slots__ = ("_scope", "_stack")

    def __init__(self, root: Any = None) -> None:
        self._stack: list[TreeScope] = _SCOPES.__dict__.setdefault("stack", [])
        self._scope = TreeScope(root)

    def __enter__(self) -> TreeScope:
        self._stack.append(self._scope)
        return self._scope

    def __exit__(self, *exc: object) -> None:
        stack, scope = self._stack, self._scope
        while stack and stack.pop() is not scope:  # (what a failed inner tree left)
            pass


def tree_scope() -> TreeScope:
    """The current tree's scope; a fresh one (shared with nothing) when a leaf is
    used outside a tree."""
    stack = _SCOPES.__dict__.get("stack")
    return stack[-1] if stack else TreeScope()
