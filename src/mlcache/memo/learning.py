"""What a memoized function's calls change: learned by the function's
:class:`~mlcache.memo.versions.FunctionCode` (this module is its half that
learns; :mod:`mlcache.memo.versions` works out the code version).

Before a computed call, what the function captures and the module-level values
its code reads are observed part by part (:func:`~mlcache.keys.state.observe`);
after it, what changed is judged (:func:`~mlcache.keys.state.judge`). A part it
changed only as bookkeeping (an int it raised, a container it grew keeping
what it held) is learned for this function and code version, and counts by
its baseline from then on; anything else it changed stays input. What is
learned is recorded, signed, in ``<function folder>/<code shape>.state``
(written when it changes, never at every miss), so that the next process
starts with it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from .._log import logger_for
from ..codecs import select_codec
from ..entry import EntryPlan, decode, open_entry
from ..errors import EntryNotFound, warn
from ..keys.call import CallKeyer
from ..keys.code_version import code_version
from ..keys.hashing import Hasher
from ..keys.identity import call_state
from ..keys.learned import checked_kinds, merge, read_counters, roots_of
from ..keys.state import (
    Node,
    ancestors,
    calls_in_flight,
    judge,
    keyed_parts,
    note_after,
    note_before,
    observe,
    touch,
)
from .context import MemoContext

__all__ = ["Keyed", "Learned", "Snapshot", "StateLearning"]

logger = logging.getLogger("mlcache")
#: a call's entry name and its kept arguments' digests (see CallKeyer.key)
Keyed = tuple[str, list[bytes]]
#: what is learned of what a function captures: name -> kind, and their ancestors
Learned = tuple[dict[str, str], frozenset[str]]


#: what this process learned, by store and record: another wrapper of the same
#: function and code (``Memory.eval``, a second ``cache()`` of it) starts from it,
#: even when the record was removed meanwhile (``clear()``, a removed folder)
_LEARNED: dict[tuple[str, str], tuple[dict[str, str], dict[str, str]]] = {}


class Snapshot(NamedTuple):
    """What a computed call could change, as it was before the call."""

    captured: dict[str, Node]
    watched: dict[str, Node]
    roots: list[str]  #: the names of what the function captures
    #: parts other code changed since the last cached call (their baseline was
    #: reset), of what the function captures and of what the code reads
    reset: frozenset[str]
    reset_globals: frozenset[str]
    generation: int


class StateLearning:
    """The learning half of :class:`~mlcache.memo.versions.FunctionCode`, which
    sets the attributes below and provides :meth:`prepare`."""

    func: Callable[..., Any]
    func_id: str
    folder: str
    version: str | None
    stateful: bool
    generation: int
    keyed_by: tuple[CallKeyer, str, Learned] | None
    _ctx: MemoContext
    _store: Any
    _params: list[str]
    _state_ignore: frozenset[str]
    _verbose: int
    _lock: threading.RLock
    _watched: tuple[tuple[str, Any], ...]
    _watched_objs: tuple[Any, ...]
    _attr_reads: frozenset[str] | None
    _subscripts: frozenset[tuple[str, Any, Any]] | None
    epoch: int
    _unhashable_warned: set[str]
    _captured_state: dict[str, str]
    _captured_learned: Learned
    _global_state: dict[str, str]
    _revoked: set[str]
    _state_base: str | None

    def prepare(self) -> CallKeyer | None:  # FunctionCode's
        raise NotImplementedError

    def _set_state(self, captured: dict[str, str], globals_: dict[str, str]) -> None:
        self._captured_state, self._global_state = captured, globals_
        self._captured_learned = (captured, ancestors(captured))
        self.generation += 1

    def state_names(self) -> list[str]:
        """What calls of this function were learned to change as bookkeeping, each
        as ``name (kind)``: said by verbose and the miss explanation."""
        learned = {**self._global_state, **self._captured_state}
        return [f"{n} ({learned[n]})" for n in sorted(learned)]

    def _captured_entries(self) -> list[tuple[str, Any]]:
        """What the function captures, by name (closure variables, the bound
        object, a partial's arguments), whole."""
        return [
            (e[0], e[1:] if e[0] == "partial" else e[1])
            for e in call_state(self.func, self._state_ignore) or ()
        ]

    def _captured(self, learned: Learned | None = None) -> list[tuple[str, Any]]:
        """What the function captures, as its key counts it: a value some part
        of which is learned as bookkeeping (``learned``; default: what is) is
        split down to that part, which counts by its baseline
        (:func:`~mlcache.keys.state.keyed_parts`); the rest whole (hashing a
        value whole is cheaper; this runs at every call)."""
        names, split_at = self._captured_learned if learned is None else learned
        if not names:
            return self._captured_entries()
        found: list[tuple[str, Any]] = []
        for name, value in self._captured_entries():
            if name in names or name in split_at:
                found.extend(keyed_parts(name, value, names, split_at, self.func, name))
            else:
                found.append((name, value))
        return found

    def captured_key(self, learned: Learned | None = None) -> bytes:
        """The digest of what the function captures, for the key: one hash of the
        (name, value) pairs (this runs at every call); a value that cannot be
        hashed is left out, with one warning (see :meth:`_digests`)."""
        entries = self._captured(learned)
        try:
            return Hasher().digest_of(entries)
        except TypeError:
            hashable = self._digests(entries)
            return Hasher().digest_of([(n, v) for n, v in entries if n in hashable])

    def _digests(self, entries: list[tuple[str, Any]]) -> dict[str, bytes]:
        """Name -> digest of each entry; a value that cannot be hashed is left out
        (of the key too), with one warning (joblib ignores them all)."""
        digests: dict[str, bytes] = {}
        hasher = Hasher()
        for name, value in entries:
            try:
                digests[name] = hasher.digest_of(value)
            except Exception as exc:
                if name not in self._unhashable_warned:
                    self._unhashable_warned.add(name)
                    warn(
                        f"mlcache: {self.func_id} captures {name!r} "
                        f"({type(value).__module__}.{type(value).__qualname__}), which cannot "
                        f"be hashed ({exc}); it is left out of the key (pass it as an "
                        f"argument to make it count, or name it in ignore=)",
                        stacklevel=6,
                    )
        return digests

    def _observe(self) -> tuple[dict[str, Node], dict[str, Node], list[str]]:
        """Snapshots of what the function captures and of the values the code
        reads, and the names of the former."""
        entries = self._captured_entries() if self.stateful else []
        return observe(entries, self.func), observe(self._watched), [n for n, _ in entries]

    def snapshot(self) -> Snapshot | None:
        """What a call could change, taken before a computed call (None when there
        is nothing to watch, or it cannot be read: nothing is learned). Each
        snapshot is followed by :meth:`learn` or :meth:`abandon`."""
        if not self.stateful and not self._watched:
            return None
        generation = self.generation
        calls_in_flight(1)
        try:
            captured, watched, roots = self._observe()
            reset = note_before(captured)
            reset_g = note_before(watched)
            if reset_g:  # other code changed a value the code reads: read it again
                touch(self._roots_of(reset_g))
        except Exception as exc:
            calls_in_flight(-1)
            logger.debug("mlcache: %s: cannot watch what calls change: %s", self.func_id, exc)
            return None
        return Snapshot(captured, watched, roots, frozenset(reset), frozenset(reset_g), generation)

    def _roots_of(self, names: set[str]) -> list[Any]:
        """The module-level values the parts ``names`` belong to."""
        return roots_of(self._watched, names)

    @contextlib.contextmanager
    def watching(self) -> Iterator[Snapshot | None]:
        """:meth:`snapshot` around a computed call; the call raising abandons it
        (else :meth:`learn` follows)."""
        before = self.snapshot()
        try:
            yield before
        except BaseException:
            self.abandon(before)
            raise

    def watched(self, keyed: tuple[str, list[bytes]], call: Callable[[], Any]) -> Any:
        """``call()``, an audit's computation of ``keyed``, watched as a computed
        call is: what it changes is learned as a miss's would be (an unwatched
        call that grows a learned container would move its baseline, and the
        keys made after it), and nothing is stored."""
        with self.watching() as before:
            out = call()
        try:
            learned = self.learn(before, keyed)[1]
        except Exception:  # learning is an optimisation: never fail the call
            learned = self.abandon
        learned(before)
        return out

    def abandon(self, before: Snapshot | None) -> None:
        """The call :meth:`snapshot` was taken for is over (it raised, or what it
        changed is settled)."""
        if before is not None:
            calls_in_flight(-1)

    def learn(
        self, before: Snapshot | None, keyed: Keyed
    ) -> tuple[Keyed, Callable[[Snapshot | None], None]]:
        """After a computed call: the parts of what the function captures or the
        code reads that it changed only as bookkeeping (an int it raised, a
        container it grew) are learned, for this function and code version, and
        count by their baseline from now on; a learned part it changed otherwise
        is input again. Returns the entry to store the result under (the key as
        it is with what is learned, when only bookkeeping changed; else the key
        it was asked under), and what to call, with ``before``, once the result
        is stored: it makes the learned the function's then, so that a call
        keyed with it finds the result (one keyed before waits on the lock of
        the key asked under, and then finds it under the new key)."""
        if before is None:
            return keyed, self.abandon
        keyed, commit = self._learn(before, keyed)  # raising: the caller abandons
        if commit is None:
            return keyed, self.abandon

        def done(before: Snapshot | None) -> None:
            try:
                commit()
            except Exception as exc:  # learned again by a later call
                logger.debug("mlcache: %s: could not learn: %s", self.func_id, exc)
            finally:
                self.abandon(before)

        return keyed, done

    def _learn(self, before: Snapshot, keyed: Keyed) -> tuple[Keyed, Callable[[], None] | None]:
        captured, watched, _ = self._observe()
        note_after(captured)
        note_after(watched)
        kept_c, changed_c = judge(before.captured, captured, before.roots)
        kept_g, changed_g = judge(before.watched, watched, [n for n, _ in self._watched])
        for kept, changed in ((kept_c, changed_c), (kept_g, changed_g)):
            for name in read_counters(
                kept, self._attr_reads, self._subscripts
            ):  # a cursor, a seed: input
                del kept[name]
                changed.add(name)
        if changed_g:  # changed as input: the versions that count it read it again
            touch(self._roots_of(changed_g))
        if kept_g:  # this function's bookkeeping is input to the others that read it
            self._touch_kept(
                self._roots_of(set(kept_g)), kept_g.keys() <= self._global_state.keys()
            )
        with self._lock:
            learned_c = self._merge(self._captured_state, kept_c, changed_c)
            learned_g = self._merge(self._global_state, kept_g, changed_g)
            new = learned_c != self._captured_state or learned_g != self._global_state
        # other code changed what the key was made of: the key asked under is stale
        stale_c = bool(before.reset & learned_c.keys())
        stale_g = bool(before.reset_globals)
        # something changed that stays input: what remains is not as it was
        # before the call, so the result keeps the key it was asked under
        keep = bool(changed_c or changed_g)
        if not new and not stale_g:
            if (
                keep
                or self.keyed_by is None
                or (self.generation == before.generation and not stale_c)
            ):
                return keyed, None
            return self._rekey(keyed, *self.keyed_by), None

        def commit() -> None:
            with self._lock:
                if new:
                    old = self._captured_state.items() | self._global_state.items()
                    self._set_state(learned_c, learned_g)
                    self._say_learned(sorted((learned_c.items() | learned_g.items()) - old))
                    if self._state_base is not None:
                        _LEARNED[self._learned_at()] = (dict(learned_c), dict(learned_g))
                    self._save_state()
                self.prepare()

        if keep:
            return keyed, commit
        code = code_version(self.func, self._ctx.code, self.version, learned_g)
        version = code.digest[:16]
        keyer = CallKeyer(self.func, self._params, f"{self.func_id}\0{version}".encode())
        learned = (learned_c, ancestors(learned_c))
        return self._rekey(keyed, keyer, f"{self.folder}/{version}", learned), commit

    def _touch_kept(self, roots: list[Any], learned: bool) -> None:
        """The module-level values ``roots`` changed as this function's bookkeeping
        (a label list it grows): the versions of other functions that count them
        by value read them again (they served results keyed by what they held
        before). This version, when it counts them by baseline (``learned``),
        stays current, unless something else it reads changed meanwhile."""
        if not learned:
            touch(roots)  # read again by this version too (or learned: walked again)
            return
        with self._lock:
            now = touch(roots, since=self.epoch, watched=self._watched_objs)
            if now is not None:
                self.epoch = now

    def _rekey(self, keyed: Keyed, keyer: CallKeyer, code_dir: str, learned: Learned) -> Keyed:
        """The entry of the call ``keyed`` under ``keyer`` with ``learned``."""
        extra = self.captured_key(learned) if self.stateful else b""
        return f"{code_dir}/{keyer.combine(keyed[1], extra)}", keyed[1]

    def _merge(
        self, learned: dict[str, str], kept: dict[str, str], changed: set[str]
    ) -> dict[str, str]:
        """``learned`` with what a call was now seen changing as bookkeeping
        (``kept``) added and what it changed otherwise (``changed``) taken out
        (:func:`~mlcache.keys.learned.merge`)."""
        return merge(learned, kept, changed, self._revoked)

    def _say_learned(self, said: list[tuple[str, str]]) -> None:
        if self._verbose:
            logger_for(self._verbose).info(
                "[Memory] %s: treated as state (bookkeeping its calls do, not input): %s; "
                "they count as they were before cached calls changed them",
                self.func_id,
                ", ".join(f"{n} ({k})" for n, k in said[:8]) + (" ..." if len(said) > 8 else ""),
            )

    def _load_state(self) -> bool:
        """Add what earlier processes learned calls of code of this shape change
        as bookkeeping (a signed record: a planted one cannot take anything out
        of a key; one of an older mlcache, which learned by other rules, is not
        read). True if module-level values were learned (the version is worked
        out again)."""
        if self._state_base is None:
            return False
        captured, globals_ = _LEARNED.get(self._learned_at(), ({}, {}))
        try:
            reader = open_entry(self._store, self._state_base, signer=self._ctx.signer)
            data = decode(reader, allow_pickle=False)
            captured = {**checked_kinds(data["captured"]), **captured}
            globals_ = {**checked_kinds(data["globals"]), **globals_}
        except EntryNotFound:
            pass
        except Exception as exc:  # unreadable, unsigned, another key: learned again
            logger.debug("could not read what %s changes: %s", self.func_id, exc)
        if not captured and not globals_:
            return False
        # a counter the code reads otherwise is input (learned by an older mlcache)
        found = {**captured, **globals_}
        dropped = self._revoked | read_counters(found, self._attr_reads, self._subscripts)
        captured = {n: k for n, k in captured.items() if n not in dropped}
        globals_ = {n: k for n, k in globals_.items() if n not in dropped}
        new = bool(globals_.items() - self._global_state.items())
        self._set_state({**captured, **self._captured_state}, {**globals_, **self._global_state})
        return new

    def _learned_at(self) -> tuple[str, str]:
        """Where this function's learning is recorded: its store and record."""
        return (str(getattr(self._store, "location", id(self._store))), str(self._state_base))

    def _save_state(self) -> None:
        """Record what was learned (when it changed: never at every miss)."""
        if self._state_base is None:
            return
        name = self._state_base
        value = {"captured": dict(self._captured_state), "globals": dict(self._global_state)}
        try:
            codec = select_codec(value, allow_pickle=False)
            info = {"func": self.func_id, "time": time.time()}
            plan = EntryPlan(codec.name, codec.encode(value), info, None, self._ctx.signer, name)
            with self._store.write(name) as f:
                plan.write(f)
        except Exception as exc:  # learned again by the next process
            logger.debug("could not record what %s changes: %s", self.func_id, exc)
