"""What a watched computation changed, and what that teaches: the rules the
function cache (a computed call, :mod:`mlcache.memo.learning`) and the dataset
cache (a build, :mod:`mlcache.data.building`) share.

:class:`Watch` snapshots the values a computation could change before it and
judges them after it (:func:`~mlcache.keys.state.observe`,
:func:`~mlcache.keys.state.judge`): a part it only raised (an int) or grew (a
container keeping what it held) is bookkeeping; anything else it changed stays
input. :func:`merge` adds what a computation showed to what was learned before,
and takes out, for good, a part once learned that a computation changed
otherwise. :func:`keyed_digest` is the digest of module-level values as a key
counts them once something is learned: a learned part by its baseline (what it
held before cached computations changed it), the rest by value.

What is learned belongs to one function (one dataset class) and one code
version; whoever learns keeps it so. Nothing here is process-wide but the
baselines, which are facts about objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .bytecode import COMPUTED, EVERY_ATTRIBUTE, RAISED, WHOLE
from .state import (
    COUNTER,
    GROWN,
    Node,
    _key_digest,  # how a part names a dict's key
    ancestors,
    calls_in_flight,
    judge,
    keyed_parts,
    note_after,
    note_before,
    observe,
    touch,
    value_digest,
)

__all__ = ["Watch", "checked_kinds", "keyed_digest", "merge", "read_counters", "roots_of"]


def merge(
    learned: Mapping[str, str], kept: Mapping[str, str], changed: set[str], revoked: set[str]
) -> dict[str, str]:
    """``learned`` (name -> kind) with what a computation was now seen changing
    as bookkeeping (``kept``) added and what it changed otherwise (``changed``)
    taken out; a name taken out joins ``revoked`` (updated in place) and is never
    learned again."""
    merged = {n: k for n, k in learned.items() if n not in changed}
    revoked |= learned.keys() & changed
    for name, kind in kept.items():
        if name in revoked or merged.get(name) == kind:
            continue
        if any(name.startswith((f"{n}.", f"{n}[")) for n, k in merged.items() if k == GROWN):
            continue  # inside a container that counts by its baseline as a whole
        merged[name] = kind
    return merged


def read_counters(
    kept: Mapping[str, str],
    reads: frozenset[str] | None,
    subscripts: frozenset[tuple[str, Any, Any]] | None = None,
) -> set[str]:
    """The names in ``kept`` (name -> kind) of ints calls raise that the code also
    reads otherwise, or may: the result may depend on such a counter (a cursor, a
    seed), so it is input, never bookkeeping.

    - an attribute the code reads other than to raise it (``reads``:
      :attr:`~mlcache.keys.code_version.CodeVersion.attr_reads`, None when the code
      was not walked): ``self.pos += n`` beside ``data[self.pos:]``, a seed
      ``self.epoch += 1`` beside ``default_rng(self.epoch)``, and any attribute
      when the code reads an object's attributes whole (``vars(self)``);
    - a dict's key unless the code is seen raising it in place and never reading it
      nor using its container otherwise (``subscripts``:
      :attr:`~mlcache.keys.code_version.CodeVersion.subscripts`):
      ``STATE["epoch"] += 1`` beside ``default_rng(STATE["epoch"])`` is input, and
      so is a key of a dict passed whole to a helper; ``STATS["calls"] += 1``
      alone is a counter."""
    if not kept:
        return set()
    keys = _key_uses(subscripts or frozenset())
    found: set[str] = set()
    for name, kind in kept.items():
        if kind == GROWN:  # a list or dict whose items the code raises in place, and reads
            label = _label(name)
            uses = [h for (lb, _), h in keys.items() if lb == label]
            if any(RAISED in h for h in uses) and any(h != {RAISED} for h in uses):
                found.add(name)
        elif kind != COUNTER:
            continue
        elif name.endswith("]"):  # a dict's key: a counter only when proven one
            container, _, key = name[:-1].rpartition("[")
            label = _label(container)
            if keys.get((label, key)) != {RAISED} or (label, None) in keys:
                found.add(name)
        elif reads and (name.rpartition(".")[2] in reads or EVERY_ATTRIBUTE in reads):
            found.add(name)
    return found


def _label(container: str) -> str:
    """The label :func:`~mlcache.keys.bytecode.subscript_uses` gives the container
    of a part named ``container``: the key digest of the value under a key
    (``[<digest>]``), a closure variable's name, else the last name
    (``STATE`` of ``mod.STATE``, ``state`` of ``self.state``)."""
    if container.endswith("]"):
        return container[container.rfind("[") :]
    last = container.rpartition(".")[2]
    if last.startswith("<closure ") and last.endswith(">"):
        return last[len("<closure ") : -1]
    return last


def _key_uses(
    subscripts: frozenset[tuple[str, Any, Any]],
) -> dict[tuple[str, str | None], set[str]]:
    """(label, key digest) -> how the code uses that key; (label, None) for a
    container used whole. A label or key is named as parts of state are."""
    uses: dict[tuple[str, str | None], set[str]] = {}
    for how, label, key in subscripts:
        name = label if isinstance(label, str) else f"[{_key_digest(label[0])}]"
        digest = None if how == WHOLE else "*" if key == COMPUTED else _key_digest(key)
        uses.setdefault((name, digest), set()).add(how)
    return uses


def checked_kinds(found: Any) -> dict[str, str]:
    """A record's ``{name: kind}`` of bookkeeping, checked (``ValueError``: not
    one, or one of an older mlcache, which learned by other rules)."""
    if not isinstance(found, dict) or not all(
        isinstance(n, str) and k in (COUNTER, GROWN) for n, k in found.items()
    ):
        raise ValueError("not a record of bookkeeping (written by another mlcache?)")
    return found


def roots_of(watched: Iterable[tuple[str, Any]], names: Iterable[str]) -> list[Any]:
    """The values among ``watched`` (name, value) that the parts ``names`` belong to."""
    names = set(names)
    return [
        value
        for root, value in watched
        if any(n == root or n.startswith((f"{root}.", f"{root}[")) for n in names)
    ]


def keyed_digest(watched: Iterable[tuple[str, Any]], learned: Mapping[str, str]) -> str:
    """The digest of ``watched`` (name, value) as they are now, each part learned
    as bookkeeping (``learned``) by its baseline, the rest by value."""
    split_at = ancestors(learned)
    # part by part: one that cannot be hashed (an ABC's cache) counts by its type
    # alone, not the whole digest with it
    digests = [
        (part, value_digest(value))
        for name, obj in watched
        for part, value in keyed_parts(name, obj, learned, split_at)
    ]
    return value_digest(digests)


class Watch:
    """A computation watched for what it changes of ``watched`` (name, value):
    made before it runs (a snapshot), judged after, as often as asked (each
    :meth:`verdict` from the same snapshot).

    ``counted``: the computation counts as one in flight until the first
    verdict (or :meth:`abandon`), so that a change seen meanwhile is taken for
    its own, not other code's. A computation that runs in pieces between the
    user's code (a pack filled as it is read) is not counted: it may never end.
    """

    def __init__(self, watched: tuple[tuple[str, Any], ...], *, counted: bool = True) -> None:
        self.watched = watched
        self._open = counted
        if counted:
            calls_in_flight(1)
        try:
            self.before: dict[str, Node] = observe(watched)
            # a part other code changed since the last cached computation: what it
            # holds now is its baseline, and versions that counted it read it again
            reset = note_before(self.before)
            if reset:
                touch(roots_of(watched, reset))
        except BaseException:
            self.abandon()
            raise

    def verdict(self) -> tuple[dict[str, str], set[str]]:
        """(name -> kind of what the computation changed as bookkeeping, names of
        what it changed otherwise) since the snapshot; what remains is what cached
        computations left."""
        try:
            after = observe(self.watched)
            note_after(after)
            kept, changed = judge(self.before, after, [n for n, _ in self.watched])
            if changed:  # changed as input: the versions that count it read it again
                touch(roots_of(self.watched, changed))
            return kept, changed
        finally:
            self.abandon()

    def abandon(self) -> None:
        """The computation is no longer in flight (it raised, or was judged)."""
        if self._open:
            self._open = False
            calls_in_flight(-1)
