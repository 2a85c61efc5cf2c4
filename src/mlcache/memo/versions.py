"""Code versions of a memoized function, side by side, and what its calls change.

:class:`FunctionCode` works out which code version a function's calls are keyed
under (:func:`mlcache.keys.code_version.code_version`, once per process and
again when the code is replaced), notes the function's other versions (kept
side by side; one unused for :data:`OLD_VERSIONS_KEPT_FOR` is removed), and
learns what calls change: a part of a captured variable, of a bound object or
of a module-level value that the function's calls change only as bookkeeping
(an int they raise, a container they grow: :mod:`mlcache.keys.state`) counts
by its baseline, what cached calls did not add, in later keys; anything else
they change stays input. What is learned belongs to this function and its code
version only: it is recorded, signed, in ``<function folder>/<code
shape>.state`` (see :mod:`mlcache.memo.layout`), written when it changes, so
that the next process starts with it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from .._log import logger_for
from .._util import slug
from ..codecs import select_codec
from ..entry import EntryPlan, decode, open_entry
from ..errors import EntryNotFound, warn
from ..keys.call import CallKeyer
from ..keys.code_version import CodeVersion, code_version
from ..keys.hashing import Hasher
from ..keys.identity import call_state, target_function
from ..keys.state import (
    COUNTER,
    EPOCH,
    GROWN,
    Node,
    ancestors,
    calls_in_flight,
    judge,
    keyed_parts,
    note_after,
    note_before,
    observe,
    touch,
    touched_since,
)
from .context import MemoContext
from .layout import CODE_MANIFEST, STATE, STATS

__all__ = ["OLD_VERSIONS_KEPT_FOR", "FunctionCode", "Keyed"]

logger = logging.getLogger("mlcache")
#: a call's entry name and its kept arguments' digests (see CallKeyer.key)
Keyed = tuple[str, list[bytes]]
#: what is learned of what a function captures: name -> kind, and their ancestors
Learned = tuple[dict[str, str], frozenset[str]]

#: (location, function folder, version) whose other versions this process looked at
_CLEANED: set[tuple[str, str, str]] = set()
_CLEANED_LOCK = threading.Lock()
#: a function's other code versions are kept side by side (two processes may run
#: two versions: a spawn worker, a notebook and its workers); one whose results
#: were not used for this long (seconds) is removed when another version of the
#: function is first used in a process. Size limits and ``prune`` remove them too.
OLD_VERSIONS_KEPT_FOR = 30 * 86400


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


class FunctionCode:
    """The code version one memoized function's calls are keyed under, and what
    its calls were learned to change.

    Parameters
    ----------
    func, func_id:
        The function and its identity (:func:`mlcache.keys.identity.func_identity`).
    context:
        The owning Memory's :class:`~mlcache.memo.context.MemoContext`.
    version:
        A version set by hand (``cache(version=)``), or None.
    params:
        The parameters left out of the key (``ignore=``, the parameter names).
    state_ignore:
        Names of captured state left out (``ignore=``, the other names).
    verbose:
        The function's verbosity.
    on_unkeyable:
        Called ``(why, hint)`` when the code cannot be walked (the function is
        then called uncached until its code changes).

    The hit path reads :attr:`keyer`, :attr:`code_dir`, :attr:`code_path`,
    :attr:`target` and :attr:`stateful`, and calls :meth:`same_code` and
    :meth:`captured_key`; everything else runs on misses.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        func_id: str,
        context: MemoContext,
        *,
        version: str | None,
        params: list[str],
        state_ignore: frozenset[str],
        verbose: int,
        on_unkeyable: Callable[..., None],
    ) -> None:
        self.func, self.func_id, self.folder = func, func_id, slug(func_id)
        self._ctx = context
        self._store = context.store
        self.version = version
        self._params, self._state_ignore = params, state_ignore
        self._verbose = verbose
        self._on_unkeyable = on_unkeyable
        target = target_function(func)
        #: a plain Python function can have its code or defaults replaced at run
        #: time (%autoreload does): such a change re-fingerprints it
        self.target = target if isinstance(target, types.FunctionType) else None
        #: the function captures something (closure, bound object, partial)
        self.stateful = call_state(func, state_ignore) is not None
        self.keyer: CallKeyer | None = None
        #: (keyer, code folder, what is learned of what the function captures),
        #: swapped as one value: a call keyed while another thread learns uses
        #: one version whole
        self.keyed_by: tuple[CallKeyer, str, Learned] | None = None
        self._seen_code: tuple[Any, ...] = (None, None, None)
        self.code_dir = ""  #: ``<function folder>/<code version>``
        self.code_path = ""  #: the code folder's local path (stores with local paths)
        self.walk_failed = False  #: the code walk raised: uncached until the code changes
        self._unhashable_warned: set[str] = set()  # captured variables left out of keys
        #: what calls of this function change as bookkeeping (name -> kind, see
        #: mlcache.keys.state): parts of what it captures (closure variables, the
        #: bound object) and of module-level values (code walk names); read from
        #: and written to the function's folder
        self._captured_state: dict[str, str] = {}
        #: the same and their ancestors, as one value (read at every call)
        self._captured_learned: Learned = ({}, frozenset())
        self._global_state: dict[str, str] = {}
        #: names once learned and then seen changed otherwise: never learned again
        self._revoked: set[str] = set()
        self._lock = threading.RLock()
        #: bumped when what keys are made of changes (learned state, the code)
        self.generation = 0
        #: the record of what was learned (``<folder>/<shape>.state``): named by
        #: the code version's shape (CodeVersion.shape), the same in every process
        self._state_base: str | None = None
        self._watched: tuple[tuple[str, Any], ...] = ()  # mutable values the code reads
        self._watched_objs: tuple[Any, ...] = ()
        #: the epoch (mlcache.keys.state.EPOCH) the version was worked out at: a
        #: value a cached call changed as input since is read again
        self.epoch = -1
        self.code_changed = False  #: other code versions were found
        self.code_changes: list[str] = []  #: what differed from the newest of them
        self._manifest: dict[str, str] | None = None  # to write with the first result

    def current(self) -> CallKeyer | None:
        """The keyer of the code as it is now (worked out again when the code was
        replaced), or None when the code cannot be walked (warned once)."""
        with self._lock:  # one walk at a time: a thread arriving meanwhile uses it
            if self.walk_failed and (self.target is None or self.same_code()):
                return None  # warned: the code walk fails until the code changes
            if self.keyer is not None and (self.target is None or self.same_code()):
                now = EPOCH[0]  # some value changed: one this code reads?
                if not touched_since(self.epoch, self._watched_objs):
                    self.epoch = now
                    return self.keyer
                if calls_in_flight():  # read again once no call is halfway through
                    return self.keyer
            return self.prepare()

    # -- the code version -------------------------------------------------------------------
    def _code_ids(self) -> tuple[Any, ...]:
        t = self.target
        return () if t is None else (t.__code__, t.__defaults__, t.__kwdefaults__)

    def same_code(self) -> bool:
        # identity, not ==: defaults may be arrays. On every call: keep it cheap
        t, (code, defaults, kwdefaults) = self.target, self._seen_code
        return (
            t.__code__ is code and t.__defaults__ is defaults and t.__kwdefaults__ is kwdefaults  # type: ignore[union-attr]
        )

    def prepare(self) -> CallKeyer | None:
        """Fingerprint the code (once per process, again if it is replaced, and when
        a call turns out to change a value the code reads), note the function's
        other versions; None (warned once) when the code cannot be walked."""
        seen = self._code_ids()
        if self.keyer is not None and not self.same_code():  # new code: learn anew
            self._set_state({}, {})
            self._state_base = None
        self.epoch = EPOCH[0]  # before the walk: a change during it walks again
        try:
            code = self._code_version()
            if self._state_base is None:
                # by the code's shape: every process finds it, whatever the
                # values calls change held when it started
                shape = (code.shape or code.digest)[:16]
                self._state_base = f"{self.folder}/{shape}.{STATE}"
                if self._load_state():
                    code = self._code_version()
        except Exception as exc:  # a global whose attribute access raises, a bug of ours
            self.walk_failed, self._seen_code = True, seen
            self._on_unkeyable(
                f"its code version cannot be worked out ({exc})",
                hint="it is cached again once that can be read (or pass version= to cache())",
            )
            return None
        self.walk_failed = False
        self._use_version(code)
        keyer = CallKeyer(self.func, self._params, f"{self.func_id}\0{code.digest[:16]}".encode())
        self.keyer, self._seen_code = keyer, seen
        self.keyed_by = (keyer, self.code_dir, self._captured_learned)
        self.generation += 1
        return keyer

    def _code_version(self) -> CodeVersion:
        return code_version(self.func, self._ctx.code, self.version, self._global_state)

    def _use_version(self, code: CodeVersion) -> None:
        version = code.digest[:16]
        self.code_dir = f"{self.folder}/{version}"
        if self._ctx.local is not None:
            # hits join keys to this path: names built here need no re-validation
            self.code_path = self._ctx.local.local_path(self.code_dir)
        self._watched = code.watched
        self._watched_objs = tuple(v for _, v in code.watched)
        self._note_other_versions(version, code.parts)
        self._manifest = code.parts

    def _note_other_versions(self, version: str, parts: dict[str, str]) -> None:
        """Once per process and version: say what changed since the function's
        other code versions (from their code manifests); they are kept, except
        those not used for :data:`OLD_VERSIONS_KEPT_FOR`."""
        token = (str(self._store.location), self.folder, version)
        with _CLEANED_LOCK:
            if token in _CLEANED:
                return
            _CLEANED.add(token)
        try:
            last_used: dict[str, float] = {}
            for e in self._store.list(self.folder):
                bits = e.name.split("/")
                if len(bits) == 3 and bits[1] not in (version, STATS):
                    last_used[bits[1]] = max(last_used.get(bits[1], 0.0), e.last_used)
            self.code_changed = bool(last_used)
            if not last_used:
                return
            changed = self._changed_code(set(last_used), parts)
            self.code_changes = changed
            if self._verbose:
                logger_for(self._verbose).info(
                    "[Memory] %s: code changed%s; the results of other versions are kept",
                    self.func_id,
                    f" ({', '.join(changed)})" if changed else "",
                )
            too_old = time.time() - OLD_VERSIONS_KEPT_FOR
            for folder, when in last_used.items():
                if when < too_old:
                    self._store.delete(f"{self.folder}/{folder}")
        except Exception as exc:  # housekeeping: never fail the call for it
            logger.debug("could not look at the other versions of %s: %s", self.func_id, exc)

    def write_manifest(self) -> None:
        """With the first result this process stores: this code version's manifest,
        if it has none yet (what the next version's miss will be compared with)."""
        parts, self._manifest = self._manifest, None
        if not parts:
            return
        name = f"{self.code_dir}/{CODE_MANIFEST}"
        try:
            if not self._store.exists(name):
                with self._store.write(name) as f:
                    f.write(json.dumps(parts, sort_keys=True).encode())
        except (OSError, ValueError) as exc:  # an explanation only
            logger.debug("could not write the code manifest of %s: %s", self.func_id, exc)

    def _changed_code(self, others: set[str], parts: dict[str, str]) -> list[str]:
        """What differs between ``parts`` and the newest manifest among the code
        versions ``others`` (names, at most eight; empty if there is none)."""
        newest: tuple[float, dict[str, str]] = (-1.0, {})
        for folder in others:
            name = f"{self.folder}/{folder}/{CODE_MANIFEST}"
            try:
                when = max(e.last_used for e in self._store.list(f"{self.folder}/{folder}"))
                with self._store.open(name) as f:
                    old = json.loads(f.read())
            except (OSError, ValueError, EntryNotFound):
                continue
            if isinstance(old, dict) and when > newest[0]:
                newest = (when, old)
        old = newest[1]
        if not old:
            return []
        changed = [k for k in sorted(parts.keys() | old.keys()) if parts.get(k) != old.get(k)]
        return changed[:8] + (["..."] if len(changed) > 8 else [])

    # -- state: what calls change as bookkeeping is not input ---------------------------------
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
        return [
            value
            for root, value in self._watched
            if any(n == root or n.startswith((f"{root}.", f"{root}[")) for n in names)
        ]

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
        if changed_g:  # changed as input: the versions that count it read it again
            touch(self._roots_of(changed_g))
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
                    self._save_state()
                self.prepare()

        if keep:
            return keyed, commit
        code = code_version(self.func, self._ctx.code, self.version, learned_g)
        version = code.digest[:16]
        keyer = CallKeyer(self.func, self._params, f"{self.func_id}\0{version}".encode())
        learned = (learned_c, ancestors(learned_c))
        return self._rekey(keyed, keyer, f"{self.folder}/{version}", learned), commit

    def _rekey(self, keyed: Keyed, keyer: CallKeyer, code_dir: str, learned: Learned) -> Keyed:
        """The entry of the call ``keyed`` under ``keyer`` with ``learned``."""
        extra = self.captured_key(learned) if self.stateful else b""
        return f"{code_dir}/{keyer.combine(keyed[1], extra)}", keyed[1]

    def _merge(
        self, learned: dict[str, str], kept: dict[str, str], changed: set[str]
    ) -> dict[str, str]:
        """``learned`` with what a call was now seen changing as bookkeeping
        (``kept``) added and what it changed otherwise (``changed``) taken out."""
        merged = {n: k for n, k in learned.items() if n not in changed}
        self._revoked |= learned.keys() & changed
        for name, kind in kept.items():
            if name in self._revoked or merged.get(name) == kind:
                continue
            if any(name.startswith((f"{n}.", f"{n}[")) for n, k in merged.items() if k == GROWN):
                continue  # inside a container that counts by its baseline as a whole
            merged[name] = kind
        return merged

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
        try:
            reader = open_entry(self._store, self._state_base, signer=self._ctx.signer)
            data = decode(reader, allow_pickle=False)
            captured, globals_ = _kinds(data["captured"]), _kinds(data["globals"])
        except EntryNotFound:
            return False
        except Exception as exc:  # unreadable, unsigned, another key: learned again
            logger.debug("could not read what %s changes: %s", self.func_id, exc)
            return False
        captured = {n: k for n, k in captured.items() if n not in self._revoked}
        globals_ = {n: k for n, k in globals_.items() if n not in self._revoked}
        new = bool(globals_.items() - self._global_state.items())
        self._set_state({**captured, **self._captured_state}, {**globals_, **self._global_state})
        return new

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


def _kinds(found: Any) -> dict[str, str]:
    """A record's ``{name: kind}`` of bookkeeping, checked."""
    if not isinstance(found, dict) or not all(
        isinstance(n, str) and k in (COUNTER, GROWN) for n, k in found.items()
    ):
        raise ValueError("not a record of bookkeeping (written by another mlcache?)")
    return found
