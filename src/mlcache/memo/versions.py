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
import os
import threading
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

from .._log import logger_for
from .._util import slug
from ..errors import EntryNotFound
from ..keys.call import CallKeyer
from ..keys.code_version import CodeVersion, code_version
from ..keys.dependencies import Binding, rebound, rebound_names, without
from ..keys.identity import call_state, target_function
from ..keys.state import EPOCH, calls_in_flight, touched_since
from ..store import EntryStat
from .context import MemoContext
from .layout import CODE_MANIFEST, STATE, STATS
from .learning import Keyed, Learned, Snapshot, StateLearning
from .locking import MISS

__all__ = ["OLD_VERSIONS_KEPT_FOR", "FunctionCode", "Keyed", "Snapshot"]

logger = logging.getLogger("mlcache")

#: (location, function folder, version) whose other versions this process looked at
_CLEANED: set[tuple[str, str, str]] = set()
_CLEANED_LOCK = threading.Lock()
#: a function's other code versions are kept side by side (two processes may run
#: two versions: a spawn worker, a notebook and its workers); one whose results
#: were not used for this long (seconds) is removed when another version of the
#: function is first used in a process. Size limits and ``prune`` remove them too.
OLD_VERSIONS_KEPT_FOR = 30 * 86400


class FunctionCode(StateLearning):
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

    The hit path reads :attr:`keyer`, :attr:`code_dir`, :attr:`code_prefix`,
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
        #: the same with a separator after it: an entry's path is it and the key
        self.code_prefix = ""
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
        #: what the walked code reads other than to raise it (CodeVersion.attr_reads)
        self._attr_reads: frozenset[str] | None = None
        #: the module-level names the code reads, and what they named when it was
        #: walked (namespace, name, value): checked at every call, a name rebound
        #: since by other code (``SIZE = 3`` in a notebook cell) walks again
        self.bindings: tuple[Binding, ...] = ()
        #: (namespace id, name) of the names this function's own computed calls
        #: rebind and its code only raises (``global CALLS; CALLS += 1``): its
        #: state, not checked (as before)
        self._own_bindings: set[tuple[int, str]] = set()
        #: the globals the code loads other than to raise them (CodeVersion.global_reads)
        self._global_reads: frozenset[str] = frozenset()
        #: how it uses containers' keys (CodeVersion.subscripts)
        self._subscripts: frozenset[tuple[str, Any, Any]] | None = None
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
            fresh = rebound(self.bindings)  # other code rebound a name it reads
            if self.keyer is not None and not fresh and (self.target is None or self.same_code()):
                now = EPOCH[0]  # some value changed: one this code reads?
                if not touched_since(self.epoch, self._watched_objs):
                    self.epoch = now
                    return self.keyer
                if calls_in_flight():  # read again once no call is halfway through
                    return self.keyer
            return self.prepare(fresh)

    def note_rebound(self) -> None:
        """After a computed call: a name the code reads that names another value now
        was rebound by the call itself. One the code only raises (``global CALLS;
        CALLS += 1``) is this function's own state, never checked again (its
        version stays the one the call was keyed under, as the value was before
        calls changed it); one it reads otherwise (a cursor, ``data[LEVEL:]``) is
        input: the next call walks again and is keyed by it."""
        if rebound(self.bindings):
            with self._lock:
                # read otherwise: a global (global_reads), or an attribute (attr_reads:
                # a class attribute, Tally.calls; None, not walked: every name read)
                reads, attrs = self._global_reads, self._attr_reads
                own = {
                    (ns, name)
                    for ns, name in rebound_names(self.bindings)
                    if name not in reads and attrs is not None and name not in attrs
                }
                self._own_bindings |= own
                self.bindings = without(self.bindings, self._own_bindings)

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

    def prepare(self, fresh: bool = False) -> CallKeyer | None:
        """Fingerprint the code (once per process, again if it is replaced, and when
        a call turns out to change a value the code reads; ``fresh``: walked again,
        not the walk kept, when other code rebound a name it reads), note the
        function's other versions; None (warned once) when the code cannot be
        walked."""
        seen = self._code_ids()
        if self.keyer is not None and not self.same_code():  # new code: learn anew
            self._set_state({}, {})
            self._state_base = None
            self._own_bindings = set()
        self.epoch = EPOCH[0]  # before the walk: a change during it walks again
        try:
            code = self._code_version(fresh)
            self._attr_reads, self._subscripts = code.attr_reads, code.subscripts
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

    def _code_version(self, fresh: bool = False) -> CodeVersion:
        return code_version(
            self.func, self._ctx.code, self.version, self._global_state, fresh=fresh
        )

    def _use_version(self, code: CodeVersion) -> None:
        version = code.digest[:16]
        self.code_dir = f"{self.folder}/{version}"
        if self._ctx.local is not None:
            # hits join keys to this path: names built here need no re-validation
            self.code_path = self._ctx.local.local_path(self.code_dir)
            self.code_prefix = os.path.join(self.code_path, "")
        self._watched = code.watched
        self._watched_objs = tuple(v for _, v in code.watched)
        self.bindings = without(code.bindings, self._own_bindings)
        self._global_reads = code.global_reads
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
            for e in self._other_entries(version):
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

    def _other_entries(self, version: str) -> Iterable[EntryStat]:
        """The entries of the function's folder outside code version ``version``'s
        folder and the statistics: on a local store the folders are named first,
        so that the first call of a function does not list (and stat) every entry
        of its version (2 ms for 200 entries, 10x that at 2,000); a remote store
        lists the whole folder in one request."""
        local = self._ctx.local
        if local is None:
            yield from self._store.list(self.folder)
            return
        try:
            with os.scandir(local.local_path(self.folder)) as found:
                others = [
                    e.name
                    for e in found
                    if e.name not in (version, STATS)
                    and not e.name.startswith(".")  # temporaries, removed folders
                    and e.is_dir(follow_symlinks=False)
                ]
        except (FileNotFoundError, NotADirectoryError):
            return
        for other in others:
            yield from self._store.list(f"{self.folder}/{other}")

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

    def reloading(
        self,
        name: str,
        generation: int,
        load: Callable[[str], Any],
        key: Callable[[], Keyed | None],
    ) -> Callable[[], Any]:
        """``load(name)`` for a call waiting on entry ``name``, made at
        ``generation``: once a call learned what calls change since, the result
        is under the key as it is now (``key()``)."""

        def reload() -> Any:
            value = load(name)
            if value is MISS and self.generation != generation:
                keyed = key()
                if keyed is not None and keyed[0] != name:
                    value = load(keyed[0])
            return value

        return reload

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
