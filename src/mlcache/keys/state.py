"""What a call changes is state, not input: the helpers that tell which of the
values a function captures, or a code walk met
(:attr:`~mlcache.keys.code_version.CodeVersion.watched`), a computed call changed
only as bookkeeping, and how such values count in later keys.

A value the code reads counts by value. What a computed call changed is judged
by its shape, part by part (:func:`split`: a dict by key, a plain object by
attribute, a user function by its closure cells and defaults, down to
:data:`DEPTH` levels), comparing a snapshot taken before the call
(:func:`observe`) with one taken after (:func:`judge`). Only two shapes are
bookkeeping:

- :data:`COUNTER`: an ``int`` the call raised (``self.calls += 1``,
  ``STATS["calls"] += 1``, ``stats.n += 1``), but not one the code also reads
  (:func:`mlcache.keys.learned.read_counters`): an attribute, a dict's key;
- :data:`GROWN`: a list, deque, bytearray, set or dict the call only grew (items
  appended, new keys) while what it held stays as it was (``seen.append(x)``, a
  memo dict the call fills); and a short list of ints (at most
  :data:`INT_LIST_MAX`) whose ints the call only raised: the counter of a
  decorator's closure or a module, ``calls[0] += 1``.

Anything else that changed stays input, whatever it is: an object that changed
inside (``self.model`` after ``model.eval()``), a value set or replaced
(``self.mean_ = X.mean()``, ``CFG["scale"] = fitted``), a float, a flag, an
attribute added to an object, a key removed. A miss is cheap; a wrong value is
not.

A part learned as bookkeeping is not left out of the key: it counts by its
*baseline* (:func:`baseline`), what it held before cached calls of this
process changed it (at import, or when first seen), so that what a container
held before (``LABELS = ["cat", "dog"]`` edited to ``["dog", "cat"]``) or got from
code outside a cached call stays in the key, and only what cached calls
themselves added or counted is left out. The baselines are facts about
objects, shared by the process; what is learned (which names are bookkeeping)
belongs to one function and one code version (:mod:`mlcache.memo.versions`).
"""

from __future__ import annotations

import collections
import itertools
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import xxhash

from .hashing import hash_value
from .origin import is_user_code
from .walking import code_walk

__all__ = [
    "COUNTER",
    "DEPTH",
    "EPOCH",
    "GROWN",
    "INT_LIST_MAX",
    "MAX_ITEMS",
    "STATE_PARTS_MAX",
    "FunctionShell",
    "Node",
    "ancestors",
    "baseline",
    "calls_in_flight",
    "epoch",
    "judge",
    "keyed_parts",
    "note_after",
    "note_before",
    "observe",
    "plain_object",
    "split",
    "state_parts",
    "touch",
    "touched_since",
    "value_digest",
    "watchable",
]

#: a container with more items than this is not watched for changes (comparing
#: it before and after every computed call would cost more than the rare memo
#: that big is worth); it counts by value, hashed once per process (see
#: :func:`value_digest`)
MAX_ITEMS = 100_000
#: a dict with more keys (an object with more attributes) than this counts whole:
#: comparing it key by key before and after every computed call would cost more
#: than telling a memo's keys from the ones a function reads is worth
STATE_PARTS_MAX = 1000
#: how many levels of parts are followed (``REG[<key>].stats.n`` is three)
DEPTH = 4
#: a dict of more keys is not compared key by key (a memo): grown or changed
_SPLIT_DICT_MAX = 64
#: the kinds of bookkeeping: an int calls raise, a container calls grow
COUNTER, GROWN = "counter", "grown"
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, np.generic, type)
#: a module-level array larger than this (bytes) is not watched for in-place
#: changes: hashing it before and after every computed call would cost more than
#: the rare accumulator array is worth
_WATCH_ARRAY_MAX = 1 << 20
_SEQUENCES = (list, collections.deque, bytearray)
#: a list of at most this many ints is probed by its values: a call that raises
#: one (``calls[0] += 1``) is told from one that sets it (see :func:`_sequence_kind`)
INT_LIST_MAX = 16
_GROWABLE = (*_SEQUENCES, set, dict)


# -- digests ------------------------------------------------------------------------------
def value_digest(obj: Any, met: list[Any] | None = None) -> str:
    """A value's short digest, as code versions count it (16 hex digits; its type
    when it cannot be hashed). Functions in it count by their own code
    (:func:`~mlcache.keys.walking.code_walk`); the user functions and classes in
    it are appended to ``met``, for the walk to follow. A container of more than
    :data:`MAX_ITEMS` items is hashed by value once per process (again when its
    length changes): a table that big is data the code reads (nothing is met)."""
    try:
        big = isinstance(obj, (list, tuple, dict, set, frozenset)) and len(obj) > MAX_ITEMS
        if big:
            met = None
            found = _BIG.get(id(obj))
            if found is not None and found[0] is obj and found[1] == len(obj):
                return found[2]
        with code_walk(met):  # functions in it by their own code: no walk inside the walk
            digest = hash_value(obj)[:16]
        if big:
            with _LOCK:
                while len(_BIG) >= _BIG_MAX:
                    del _BIG[next(iter(_BIG))]
                _BIG[id(obj)] = (obj, len(obj), digest)
        return digest
    except Exception:  # an open file, a lock, a logger: what it is, not what it holds
        return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


#: id -> (the big container, its length, its digest): hashed once per process
_BIG: dict[int, tuple[Any, int, str]] = {}
_BIG_MAX = 64
_LOCK = threading.Lock()


def watchable(obj: Any) -> bool:
    """Whether a call may change ``obj`` in place and it is small enough to be
    compared before and after calls (an array over 1 MiB, a container of more
    than :data:`MAX_ITEMS` items are not)."""
    if _immutable(obj):
        return False
    if isinstance(obj, np.ndarray):
        return obj.nbytes <= _WATCH_ARRAY_MAX
    try:  # by type: a proxy's __len__ may raise anything
        return not (issubclass(type(obj), (*_GROWABLE, tuple)) and len(obj) > MAX_ITEMS)
    except Exception:
        return True


# -- parts ----------------------------------------------------------------------------------
class FunctionShell:
    """A user function without its closure values and defaults (those count as
    parts of their own, :func:`split`): hashed as its identity and code
    (the handler is registered by :mod:`mlcache.keys.code_version`)."""

    __slots__ = ("func",)

    def __init__(self, func: types.FunctionType) -> None:
        self.func = func


def split(name: str, obj: Any) -> tuple[Any, list[tuple[str, Any]]] | None:
    """``obj``, met under ``name``, as a shell and the parts a call may change one
    by one: a dict by key (``name[<key digest>]``), an object whose state is its
    ``__dict__`` by attribute (``name.attr``), a user function by its closure
    cells (``name.<closure var>``), defaults and what it wraps; None: ``obj``
    counts whole (a list, a set, a big dict, an object with its own pickling)."""
    try:  # by type: a proxy's __class__ or __getattr__ may raise anything
        t = type(obj)
        if issubclass(t, dict):
            if len(obj) > STATE_PARTS_MAX:
                return None
            items = [(f"{name}[{_key_digest(k)}]", v) for k, v in dict.items(obj)]
            return t, sorted(items, key=_first)
        if t is types.FunctionType:
            return _function_parts(name, obj)
        if plain_object(obj) and len(vars(obj)) <= STATE_PARTS_MAX:
            return t, sorted(((f"{name}.{k}", v) for k, v in vars(obj).items()), key=_first)
    except Exception:
        return None
    return None


def _function_parts(name: str, f: types.FunctionType) -> tuple[Any, list[tuple[str, Any]]] | None:
    if not (f.__closure__ or f.__defaults__ or f.__kwdefaults__) or not is_user_code(f.__module__):
        return None
    parts: list[tuple[str, Any]] = []
    for var, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        try:
            parts.append((f"{name}.<closure {var}>", cell.cell_contents))
        except ValueError:  # an empty cell
            parts.append((f"{name}.<closure {var}>", None))
    if f.__defaults__:
        parts.append((f"{name}.<defaults>", f.__defaults__))
    if f.__kwdefaults__:
        parts.append((f"{name}.<kwdefaults>", f.__kwdefaults__))
    wrapped = vars(f).get("__wrapped__")
    if wrapped is not None:
        parts.append((f"{name}.<wrapped>", wrapped))
    return FunctionShell(f), parts


def state_parts(name: str, obj: Any) -> list[tuple[str, Any]] | None:
    """The parts of a dict or plain object (:func:`split`, without functions), or
    None: what the code walk counts a module-level value by."""
    if type(obj) is types.FunctionType:
        return None
    found = split(name, obj)
    return None if found is None else found[1]


def ancestors(names: Iterable[str]) -> frozenset[str]:
    """Every name some of ``names`` are parts of (``REG`` and ``REG[k]`` for
    ``REG[k].calls``): where a key is split to reach them."""
    found: set[str] = set()
    for name in names:
        for i, c in enumerate(name):
            if c in ".[" and i:
                found.add(name[:i])
    return frozenset(found)


# -- snapshots and the verdict -----------------------------------------------------------------
class Node(NamedTuple):
    """One part in a snapshot: its digest, the object, a cheap probe of it (a
    container's length, an int's value), a set's items, its parts' names."""

    digest: str
    obj: Any
    probe: Any
    items: frozenset[Any] | None
    parts: tuple[str, ...] | None
    shell: str
    #: where its baseline is kept: (the object, "") for a container, (the object
    #: holding it, its name there) for an int, None for anything else
    where: tuple[Any, str] | None


def observe(entries: Iterable[tuple[str, Any]], holder: Any = None) -> dict[str, Node]:
    """A snapshot of ``entries`` (name, value) and of their parts, :data:`DEPTH`
    levels down; ``holder`` holds the entries (for the baseline of an int)."""
    out: dict[str, Node] = {}
    for name, value in entries:
        _observe(name, value, holder, name, DEPTH, out)
    return out


def _observe(name: str, obj: Any, holder: Any, rel: str, depth: int, out: dict[str, Node]) -> None:
    t = type(obj)
    # a dict of many keys (a memo) is judged whole: grown, or changed
    whole = issubclass(t, dict) and len(obj) > _SPLIT_DICT_MAX
    parts = split(name, obj) if depth > 0 and not whole else None
    names: tuple[str, ...] | None = None
    shell = ""
    if parts is not None:
        shell = value_digest(parts[0])
        names = tuple(sub for sub, _ in parts[1])
        for sub, value in parts[1]:
            _observe(sub, value, obj, sub[len(name) :], depth - 1, out)
    items = None
    if t is set or issubclass(t, dict):  # what it held: to tell it only grew
        try:
            items = frozenset(obj)
        except Exception:
            items = None
    out[name] = Node(
        _node_digest(obj), obj, _probe(obj), items, names, shell, _where(obj, holder, rel)
    )


def _probe(obj: Any) -> Any:
    t = type(obj)
    if t is int:
        return obj
    if t is list and len(obj) <= INT_LIST_MAX and all(type(v) is int for v in obj):
        return tuple(obj)  # its counters: raising one keeps its length
    if issubclass(t, _GROWABLE):
        try:
            return len(obj)
        except Exception:
            return None
    return None


def _where(obj: Any, holder: Any, rel: str) -> tuple[Any, str] | None:
    t = type(obj)
    if t is int:
        return (holder, rel)
    if issubclass(t, _GROWABLE):
        return (obj, "")
    return None


def judge(
    before: Mapping[str, Node], after: Mapping[str, Node], roots: Iterable[str]
) -> tuple[dict[str, str], set[str]]:
    """What a call changed, from snapshots taken before and after it: (name ->
    :data:`COUNTER` or :data:`GROWN` of what it changed as bookkeeping, names of
    what it changed otherwise: input)."""
    kept: dict[str, str] = {}
    changed: set[str] = set()
    for name in roots:
        _judge(name, before, after, kept, changed)
    return kept, changed


def _judge(
    name: str,
    before: Mapping[str, Node],
    after: Mapping[str, Node],
    kept: dict[str, str],
    changed: set[str],
) -> bool:
    """True if ``name`` is unchanged or changed as bookkeeping only."""
    b, a = before.get(name), after.get(name)
    if b is None or a is None:
        changed.add(name)
        return False
    if b.digest == a.digest and b.shell == a.shell:
        return True
    kind = _bookkeeping(b, a)
    if kind is not None:
        kept[name] = kind
        return True
    if b.parts is not None and a.parts is not None and a.obj is b.obj and b.shell == a.shell:
        ok = True
        for sub in b.parts:  # what was there: unchanged, or bookkeeping itself
            ok = _judge(sub, before, after, kept, changed) and ok
        new = set(a.parts) - set(b.parts)
        if ok and not new:
            return True  # changed only in parts that are bookkeeping
        if ok and issubclass(type(a.obj), dict) and set(b.parts) <= set(a.parts):
            for sub in list(kept):  # the dict counts by its baseline, as a whole
                if sub.startswith((f"{name}[", f"{name}.")):
                    del kept[sub]
            kept[name] = GROWN
            return True
    changed.add(name)
    return False


def _bookkeeping(b: Node, a: Node) -> str | None:
    """:data:`COUNTER`, :data:`GROWN` or None for a part that changed from ``b``
    to ``a`` (both snapshots)."""
    t = type(a.obj)
    if t is int and type(b.obj) is int:
        return COUNTER if a.obj > b.obj else None
    if a.obj is not b.obj or b.probe is None or a.probe is None:
        return None  # replaced, or not a container
    if issubclass(t, _SEQUENCES):
        return _sequence_kind(b, a)
    if a.probe <= b.probe:
        return None  # shrunk, or changed in place
    if t is set and b.items is not None:
        return GROWN if b.items <= a.obj else None
    if issubclass(t, dict) and b.items is not None and b.items <= a.obj.keys():
        # the keys it held, holding what they held
        held = {k: dict.__getitem__(a.obj, k) for k in b.items}
        return GROWN if _node_digest(held) == b.digest else None
    return None


def _sequence_kind(b: Node, a: Node) -> str | None:
    """:data:`GROWN` for a sequence a call only grew, keeping what it held, or
    whose ints it only raised (a short list of counters); else None."""
    before, now = _length(b.probe), _length(a.probe)
    if now < before:
        return None
    head: Any = (
        collections.deque(itertools.islice(a.obj, before), a.obj.maxlen)
        if isinstance(a.obj, collections.deque)
        else a.obj[:before]
    )
    if _node_digest(head) == b.digest:
        return GROWN if now > before else None
    raised = type(b.probe) is tuple and all(
        type(n) is int and n >= o for n, o in zip(head, b.probe, strict=True)
    )
    return GROWN if raised else None


def _length(probe: Any) -> int:
    """A sequence's length, from its probe (its ints, for a short list of them)."""
    return len(probe) if type(probe) is tuple else int(probe)


# -- baselines: what cached calls did not add --------------------------------------------------
class _Base:
    __slots__ = ("after", "base", "obj", "probe")

    def __init__(self, obj: Any, digest: str, probe: Any) -> None:
        self.obj, self.base, self.after, self.probe = obj, digest, digest, probe


#: (id of the container or of what holds the int, the int's name there) -> its
#: baseline; the object is held, so that its id stays its own
_BASES: dict[tuple[int, str], _Base] = {}
_BASES_MAX = 4096
#: computed calls running in this process (changes seen while another runs may be its)
_IN_FLIGHT = [0]
#: bumped when a watched value changed in a way the code versions that counted
#: it do not show (a cached call changed it as input; a baseline was reset):
#: part of a cached code version's key, and checked by every call
EPOCH = [0]
#: id of such a value -> the epoch it last changed at
_TOUCHED: dict[int, int] = {}


def epoch() -> int:
    """See :data:`EPOCH`."""
    return EPOCH[0]


def touch(
    objs: Iterable[Any], *, since: int | None = None, watched: Iterable[Any] = ()
) -> int | None:
    """``objs`` (values code versions count) changed: a new epoch. With ``since``:
    that epoch if none of ``watched`` changed after ``since`` before it (the
    caller, which counts ``objs`` by baseline, is still current), else None."""
    with _LOCK:
        current = since is not None and not _touched_since(since, watched)
        EPOCH[0] += 1
        for obj in objs:
            _TOUCHED.pop(id(obj), None)  # kept in the order they changed in
            _TOUCHED[id(obj)] = EPOCH[0]
        while len(_TOUCHED) > _BASES_MAX:
            _FORGOTTEN[0] = _TOUCHED.pop(next(iter(_TOUCHED)))
        return EPOCH[0] if current else None


#: the newest epoch of a change no longer in _TOUCHED
_FORGOTTEN = [0]


def touched_since(since: int, objs: Iterable[Any]) -> bool:
    """Whether one of ``objs`` changed after epoch ``since`` (a change forgotten
    meanwhile counts)."""
    with _LOCK:
        return _touched_since(since, objs)


def _touched_since(since: int, objs: Iterable[Any]) -> bool:
    if since < _FORGOTTEN[0]:
        return True
    return any(_TOUCHED.get(id(obj), 0) > since for obj in objs)


def calls_in_flight(delta: int = 0) -> int:
    """Count a computed call in (1) or out (-1); how many run now."""
    with _LOCK:
        _IN_FLIGHT[0] += delta
        return _IN_FLIGHT[0]


def _entry(where: tuple[Any, str], digest: str, probe: Any) -> tuple[_Base, bool]:
    key = (id(where[0]), where[1])
    found = _BASES.get(key)
    if found is not None and found.obj is where[0]:
        return found, False
    while len(_BASES) >= _BASES_MAX:  # forgotten: the next sight is a new baseline
        del _BASES[next(iter(_BASES))]
    made = _BASES[key] = _Base(where[0], digest, probe)
    return made, True


def note_before(nodes: Mapping[str, Node]) -> set[str]:
    """Before a computed call: the baselines of the parts in a snapshot (first
    seen: what they hold now). A part that changed since the last cached call
    left it, while no other was running, was changed by other code: what it
    holds now is its baseline. Returns the names whose baseline was so reset."""
    reset: set[str] = set()
    with _LOCK:
        alone = _IN_FLIGHT[0] <= 1
        for name, node in nodes.items():
            if node.where is None:
                continue
            entry, made = _entry(node.where, node.digest, node.probe)
            if not made and entry.after != node.digest:
                if alone:
                    entry.base = node.digest
                    reset.add(name)
                entry.after, entry.probe = node.digest, node.probe
    return reset


def note_after(nodes: Mapping[str, Node]) -> None:
    """After a computed call: what the parts hold now is what cached calls left."""
    with _LOCK:
        for node in nodes.values():
            if node.where is not None:
                entry, _ = _entry(node.where, node.digest, node.probe)
                entry.after, entry.probe = node.digest, node.probe


def baseline(obj: Any, holder: Any, rel: str) -> str:
    """The digest ``obj`` (a container, or an int ``holder`` holds under ``rel``)
    counts by as bookkeeping: what it held before cached calls changed it. Its
    length (an int's value) is checked at each call: one that differs from what
    the last cached call left means other code changed it, and it counts as it
    is now."""
    where = (obj, "") if type(obj) is not int else (holder, rel)
    probe = _probe(obj)
    with _LOCK:
        found = _BASES.get((id(where[0]), where[1]))
        if found is not None and found.obj is where[0] and found.probe == probe:
            return found.base
    digest = _node_digest(obj)
    with _LOCK:
        entry, made = _entry(where, digest, probe)
        if not made and entry.after != digest and _IN_FLIGHT[0] == 0:
            entry.base = digest
            EPOCH[0] += 1
        entry.after, entry.probe = digest, probe
        return entry.base


def keyed_parts(
    name: str,
    obj: Any,
    learned: Mapping[str, str],
    split_at: frozenset[str],
    holder: Any = None,
    rel: str = "",
) -> list[tuple[str, Any]]:
    """``obj``, met under ``name``, as the (name, value) pairs a key counts: split
    down to what is learned (``learned``: name -> kind; ``split_at``: their
    :func:`ancestors`), a part learned as bookkeeping by its baseline, as long as
    it still has that shape (else by value)."""
    kind = learned.get(name)
    t = type(obj)
    if (kind == COUNTER and t is int) or (kind == GROWN and issubclass(t, _GROWABLE)):
        return [(name, (f"<{kind}>", baseline(obj, holder, rel or name)))]
    if name in split_at:
        parts = split(name, obj)
        if parts is not None:
            found: list[tuple[str, Any]] = [(name, parts[0])]
            for sub, value in parts[1]:
                found.extend(keyed_parts(sub, value, learned, split_at, obj, sub[len(name) :]))
            return found
    return [(name, obj)]


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


#: values whose text is what they are: digested by it (a memo's keys and values,
#: a counter; hashing each costs more than comparing a memo of them is worth)
_BY_TEXT = (int, str, float, bool, type(None))


def _node_digest(obj: Any) -> str:
    """A part's digest in a snapshot (and its baseline)."""
    t = type(obj)
    if t in _BY_TEXT:
        return xxhash.xxh3_64_hexdigest(f"{t.__name__}:{obj!r}".encode("utf-8", "surrogatepass"))
    return value_digest(obj)


def _key_digest(key: Any) -> str:
    if type(key) in _BY_TEXT:
        return _node_digest(key)
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
