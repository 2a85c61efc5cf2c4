"""``MemorizedFunc``: a function whose results are cached by a :class:`~mlcache.Memory`.

A call is keyed (see :mod:`mlcache.keys.call` and :mod:`mlcache.keys.identity`),
looked up, and computed and stored on a miss. Every cache problem degrades to a
miss or an unstored result with one :class:`~mlcache.CacheWarning`; the user's
call never fails because of the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .._log import logger_for, logging_configured
from ..codecs import select_codec
from ..entry import EntryPlan, decode, open_entry, read_entry_info
from ..errors import (
    ConfigError,
    EntryNotFound,
    EntrySignatureError,
    UnhashableArgument,
    UnsupportedValue,
    warn,
)
from ..keys.call import CallKeyer
from ..keys.code_version import CodeVersion, code_version, learnable, state_parts, watched_digests
from ..keys.hashing import Hasher
from ..keys.identity import call_state, func_identity, slug, target_function
from ..store import LocalPaths, Store
from .layout import CODE_MANIFEST, STATE, STATS, is_entry
from .results import MemorizedResult, NotMemorizedResult
from .usage import FunctionStats, collect

if TYPE_CHECKING:
    from .memory import Memory

__all__ = ["AsyncMemorizedFunc", "MemorizedFunc"]

logger = logging.getLogger("mlcache")
P = ParamSpec("P")
R = TypeVar("R")
_MISS = object()
#: a call's entry name and its kept arguments' digests (see CallKeyer.key)
Keyed = tuple[str, list[bytes]]


#: (location, function folder, version) whose other versions this process looked at
_CLEANED: set[tuple[str, str, str]] = set()
_CLEANED_LOCK = threading.Lock()
#: a function's other code versions are kept side by side (two processes may run
#: two versions: a spawn worker, a notebook and its workers); one whose results
#: were not used for this long (seconds) is removed when another version of the
#: function is first used in a process. Size limits and ``prune`` remove them too.
OLD_VERSIONS_KEPT_FOR = 30 * 86400
#: module-level values (names of their parts, see deps.state_parts) that calls of
#: any memoized function of this process were seen changing: state for all of them
_PROCESS_STATE: set[str] = set()


def _split_ignore(func: Callable[..., Any], ignore: Any) -> tuple[list[str], frozenset[str]]:
    """``ignore`` as (parameter names, names of captured state: closure variables or
    ``"self"`` of a bound method). Raises ``ConfigError`` for any other name."""
    names = CallKeyer(func, None, b"").names
    if ignore is not None and (
        isinstance(ignore, str) or not all(isinstance(n, str) for n in ignore)
    ):
        raise ConfigError(f"ignore must be a list of parameter names, got {ignore!r}")
    ignore = list(ignore or ())
    captured = {entry[0] for entry in call_state(func) or ()}
    captured.discard("partial")
    captured.discard("object")
    unknown = [n for n in ignore if n not in names and n not in captured]
    if unknown:
        raise ConfigError(
            f"ignore={unknown!r}: not parameters of {getattr(func, '__qualname__', func)}; "
            f"its parameters are {names}"
            + (f" and it captures {sorted(captured)}" if captured else "")
        )
    return [n for n in ignore if n in names], frozenset(n for n in ignore if n not in names)


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Names whose digest differs, or that are in only one of the two."""
    return {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}


def _nbytes(segment: Any) -> int:
    return int(segment.nbytes) if hasattr(segment, "nbytes") else len(memoryview(segment))


class MemorizedFunc(Generic[P, R]):
    """A memoized function: call it as the original. See :meth:`Memory.cache`."""

    def __init__(
        self,
        func: Callable[P, R],
        memory: Memory,
        *,
        ignore: Iterable[str] | None = None,
        verbose: int = 1,
        mmap_mode: str | None = None,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None,
        version: str | None = None,
    ) -> None:
        self.func = func
        self.version = version
        self.memory = memory
        self.ignore = list(ignore) if ignore is not None and not isinstance(ignore, str) else ignore
        self.mmap_mode = mmap_mode
        self.compress = memory.compress
        self._verbose = verbose
        self.cache_validation_callback = cache_validation_callback
        self.func_id = func_identity(func)
        self._folder = slug(self.func_id)
        assert memory.store is not None
        self._store: Store = memory.store
        self._local = isinstance(self._store, LocalPaths)
        self._store_lock = getattr(self._store, "lock", None)  # a store that can lock keys
        target = target_function(func)
        # a plain Python function can have its code or defaults replaced at run time
        # (%autoreload does): such a change re-fingerprints it
        self._target = target if isinstance(target, types.FunctionType) else None
        self._params, self._state_ignore = _split_ignore(func, self.ignore)
        self._stateful = call_state(func, self._state_ignore) is not None
        self._keyer: CallKeyer | None = None
        self._seen_code: tuple[Any, ...] = (None, None, None)
        self._code_dir = ""
        self._code_path = ""  # the code folder's local path (local stores only)
        self._unkeyable_warned = False
        self._walk_failed = False  # the code walk raised: uncached until the code changes
        self._unhashable_warned: set[str] = set()  # captured variables left out of keys
        #: names of what calls of this function change (state, not input): captured
        #: variables and bound-object attributes, and module-level values (code
        #: walk names); read from and written to the function's folder
        self._captured_state: set[str] = set()
        self._global_state: frozenset[str] = frozenset()
        #: the record of what was learned (``<folder>/<shape>.state``): named by
        #: the code version's shape (CodeVersion.shape), the same in every process
        self._state_base: str | None = None
        self._watched: tuple[tuple[str, Any], ...] = ()  # mutable values the code reads
        self._foreign_warned: set[str] = set()  # entries seen unsigned or with another key
        self._code_changed = False  # other code versions were found
        self._code_changes: list[str] = []  # what differed from the newest of them
        self._manifest: dict[str, str] | None = None  # to write with the first result
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"MemorizedFunc(func={self.func!r}, location={self.memory.location!r})"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # decorating a method in a class body: bind like a function would
        return self if obj is None else types.MethodType(self, obj)

    def __mlcache_token__(self) -> Any:
        """Passed as an argument to another memoized function: keyed by what it wraps."""
        return self.func

    def _module_level(self) -> types.ModuleType | None:
        """The module this object is an attribute of (decorated at module level)."""
        module = sys.modules.get(getattr(self, "__module__", ""), None)
        found: Any = module
        for part in getattr(self, "__qualname__", "").split("."):
            found = getattr(found, part, None)
        return module if found is self else None

    def _reduce_for_workers(self) -> Any:
        """How multiprocessing ships this object to its workers: a script's
        function decorated at module level by reference too, since spawn and
        forkserver workers import the script (as ``__mp_main__``) and fork
        workers have it already; there it is the very same function."""
        module = self._module_level()
        if module is not None:
            name: str = getattr(self, "__qualname__", "")
            return (_module_attribute, (module.__name__, name))
        return self.__reduce__()

    def __reduce__(self) -> Any:
        module = self._module_level()
        if module is not None and module.__name__ != "__main__":
            return getattr(self, "__qualname__", "")  # module level: pickle by reference
        # by value; a script's function keeps the identity it has here (a worker
        # receiving it by value would see another file name)
        options = (self.ignore, self._verbose, self.mmap_mode, self.cache_validation_callback)
        return (
            _rebuild_func,
            (type(self), self.func, self.memory, *options, self.func_id, self.version),
        )

    # -- keys -------------------------------------------------------------------
    def _code_ids(self) -> tuple[Any, ...]:
        t = self._target
        return () if t is None else (t.__code__, t.__defaults__, t.__kwdefaults__)

    def _same_code(self) -> bool:
        # identity, not ==: defaults may be arrays. On every call: keep it cheap
        t, (code, defaults, kwdefaults) = self._target, self._seen_code
        return (
            t.__code__ is code and t.__defaults__ is defaults and t.__kwdefaults__ is kwdefaults  # type: ignore[union-attr]
        )

    def _prepare(self) -> CallKeyer | None:
        """Fingerprint the code (once per process, again if it is replaced, and when
        a call turns out to change a value the code reads), note the function's
        other versions; None (warned once) when the code cannot be walked."""
        seen = self._code_ids()
        if self._keyer is not None and not self._same_code():  # new code: learn anew
            self._captured_state, self._global_state, self._state_base = set(), frozenset(), None
        try:
            code = self._code_version()
            if self._state_base is None:
                # by the code's shape: every process finds it, whatever the
                # values calls change held when it started
                shape = (code.shape or code.digest)[:16]
                self._state_base = f"{self._folder}/{shape}.{STATE}"
                if self._load_state():
                    code = self._code_version()
            if code.state_used - self._global_state:
                # learned from another function of this process (a memo they share):
                # recorded for this one too, so that its next process starts with it
                self._global_state |= code.state_used
                self._save_state()
        except Exception as exc:  # a global whose attribute access raises, a bug of ours
            self._walk_failed, self._seen_code = True, seen
            self._warn_unkeyable(
                f"its code version cannot be worked out ({exc})",
                hint="it is cached again once that can be read (or pass version= to cache())",
            )
            return None
        self._walk_failed = False
        self._use_version(code)
        keyer = CallKeyer(self.func, self._params, f"{self.func_id}\0{code.digest[:16]}".encode())
        self._keyer, self._seen_code = keyer, seen
        return keyer

    def _code_version(self) -> CodeVersion:
        state = frozenset(self._global_state | _PROCESS_STATE)
        return code_version(self.func, self.memory.code, self.version, state)

    def _use_version(self, code: CodeVersion) -> None:
        version = code.digest[:16]
        self._code_dir = f"{self._folder}/{version}"
        if self._local:
            # hits join keys to this path: names built here need no re-validation
            self._code_path = self._store.local_path(self._code_dir)  # type: ignore[attr-defined]
        self._watched = code.watched
        self._note_other_versions(version, code.parts)
        self._manifest = code.parts

    def _note_other_versions(self, version: str, parts: dict[str, str]) -> None:
        """Once per process and version: say what changed since the function's
        other code versions (from their code manifests); they are kept, except
        those not used for :data:`OLD_VERSIONS_KEPT_FOR`."""
        token = (str(self._store.location), self._folder, version)
        with _CLEANED_LOCK:
            if token in _CLEANED:
                return
            _CLEANED.add(token)
        try:
            last_used: dict[str, float] = {}
            for e in self._store.list(self._folder):
                bits = e.name.split("/")
                if len(bits) == 3 and bits[1] not in (version, STATS):
                    last_used[bits[1]] = max(last_used.get(bits[1], 0.0), e.last_used)
            self._code_changed = bool(last_used)
            if not last_used:
                return
            changed = self._changed_code(set(last_used), parts)
            self._code_changes = changed
            if self._verbose:
                logger_for(self._verbose).info(
                    "[Memory] %s: code changed%s; the results of other versions are kept",
                    self.func_id,
                    f" ({', '.join(changed)})" if changed else "",
                )
            too_old = time.time() - OLD_VERSIONS_KEPT_FOR
            for folder, when in last_used.items():
                if when < too_old:
                    self._store.delete(f"{self._folder}/{folder}")
        except Exception as exc:  # housekeeping: never fail the call for it
            logger.debug("could not look at the other versions of %s: %s", self.func_id, exc)

    def _write_manifest(self) -> None:
        """With the first result this process stores: this code version's manifest,
        if it has none yet (what the next version's miss will be compared with)."""
        parts, self._manifest = self._manifest, None
        if not parts:
            return
        name = f"{self._code_dir}/{CODE_MANIFEST}"
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
            name = f"{self._folder}/{folder}/{CODE_MANIFEST}"
            try:
                when = max(e.last_used for e in self._store.list(f"{self._folder}/{folder}"))
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

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Keyed | None:
        """The entry name of this call and its arguments' digests, or None when it
        cannot be cached (an argument, or state its function holds, cannot be
        hashed: warned once per function, then called uncached)."""
        keyer = self._keyer
        if keyer is None or (self._target is not None and not self._same_code()):
            if self._walk_failed and (self._target is None or self._same_code()):
                return None  # warned: the code walk fails until the code changes
            keyer = self._prepare()
            if keyer is None:
                return None
        extra = self._captured_key() if self._stateful else b""
        try:
            key, digests = keyer.key(args, kwargs, extra)
        except UnhashableArgument as exc:
            self._warn_unkeyable(str(exc))
            return None
        return f"{self._code_dir}/{key}", digests

    # -- state: what calls change is not input ----------------------------------------
    def _captured(self, *, split: bool = True) -> list[tuple[str, Any]]:
        """What the function captures, by name: closure variables, the bound
        object, a partial's arguments; dicts key by key and plain objects
        attribute by attribute (:func:`~mlcache.keys.code_version.state_parts`), so that what
        calls change can be left out alone. What calls change is left out.
        ``split=False`` (the key, at every call) splits only a value some part of
        which is known to be state: hashing a value whole is cheaper."""
        found: list[tuple[str, Any]] = []
        learned = self._captured_state
        for entry in call_state(self.func, self._state_ignore) or ():
            name = entry[0]
            value = entry[1:] if name == "partial" else entry[1]
            whole = name == "partial" or (
                not split and not any(n.startswith((f"{name}.", f"{name}[")) for n in learned)
            )
            parts = None if whole else state_parts(name, value)
            if parts is None:
                found.append((name, value))
            else:
                found.append((name, type(value)))
                found.extend(parts)
        return [(n, v) for n, v in found if n not in self._captured_state]

    def _captured_key(self) -> bytes:
        """The digest of what the function captures, for the key: one hash of the
        (name, value) pairs (this runs at every call); a value that cannot be
        hashed is left out, with one warning (see :meth:`_captured_digests`)."""
        entries = self._captured(split=False)
        try:
            return Hasher().digest_of(entries)
        except TypeError:
            hashable = self._digests(entries)
            return Hasher().digest_of([(n, v) for n, v in entries if n in hashable])

    def _captured_digests(self) -> dict[str, bytes]:
        """Name -> digest of each part of what the function captures (on a miss)."""
        return self._digests(self._captured())

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

    def _watched_digests(self) -> dict[str, str]:
        """Digests of the mutable module-level values the code reads, part by part."""
        return watched_digests(self._watched)

    def _snapshot(self) -> tuple[dict[str, bytes], dict[str, str]] | None:
        """Digests of what a call could change, taken before a computed call (None
        when there is nothing to watch, or it cannot be read: nothing is learned)."""
        if not self._stateful and not self._watched:
            return None
        try:
            captured = self._captured_digests() if self._stateful else {}
            return captured, self._watched_digests()
        except Exception as exc:
            logger.debug("mlcache: %s: cannot watch what calls change: %s", self.func_id, exc)
            return None

    def _learn(
        self,
        before: tuple[dict[str, bytes], dict[str, str]] | None,
        keyed: Keyed,
    ) -> Keyed:
        """After a computed call: what it changed, added or removed of what the
        function captures or the code reads is state, remembered with the
        function's cache and left out of later keys (a dict's other keys, an
        object's other attributes still count). Returns the entry to store the
        result under (the same, unless something was learned)."""
        if before is None:
            return keyed
        captured, watched = before
        changed = _changed(captured, self._captured_digests() if self._stateful else {})
        changed_globals = _changed(watched, self._watched_digests())
        # only a part (a dict's key, an object's attribute) or an accumulator (a
        # list, a set) becomes state: an object that changes as a whole (a seeded
        # random generator) keeps counting, so that it never gives a wrong hit
        changed_captured = changed & learnable(self._captured(), expanded=True)
        changed_globals &= learnable(self._watched, expanded=False)
        if not changed_captured and not changed_globals:
            return keyed
        self._captured_state |= changed_captured
        self._global_state |= changed_globals
        _PROCESS_STATE.update(changed_globals)
        if self._verbose:
            logger_for(self._verbose).info(
                "[Memory] %s changes %s: state, not input; left out of its keys from now on",
                self.func_id,
                ", ".join(sorted(changed_captured | changed_globals)[:8]),
            )
        self._save_state()
        keyer = self._keyer if not changed_globals else self._prepare()
        if keyer is None or changed - changed_captured:
            # something captured changed that stays input: what remains is not as
            # it was before the call, so the result keeps the key it was asked under
            return keyed
        # what remains of what it captures is as it was before the call
        extra = self._captured_key() if self._stateful else b""
        return f"{self._code_dir}/{keyer.combine(keyed[1], extra)}", keyed[1]

    def _load_state(self) -> bool:
        """Add what earlier processes learned calls of code of this shape change
        (a signed record: a planted one cannot take anything out of a key). True
        if module-level values were learned (the version is worked out again)."""
        if self._state_base is None:
            return False
        try:
            reader = open_entry(self._store, self._state_base, signer=self.memory._signer)
            data = decode(reader, allow_pickle=False)
            captured, globals_ = data["captured"], data["globals"]
            if not all(isinstance(n, str) for n in [*captured, *globals_]):
                raise ValueError("names that are not strings")
        except EntryNotFound:
            return False
        except Exception as exc:  # unreadable, unsigned, another key: learned again
            logger.debug("could not read what %s changes: %s", self.func_id, exc)
            return False
        self._captured_state |= set(captured)
        new = frozenset(globals_) - self._global_state - _PROCESS_STATE
        self._global_state |= frozenset(globals_)
        return bool(new)

    def _save_state(self) -> None:
        if self._state_base is None:
            return
        name = self._state_base
        value = {"captured": sorted(self._captured_state), "globals": sorted(self._global_state)}
        try:
            codec = select_codec(value, allow_pickle=False)
            info = {"func": self.func_id, "time": time.time()}
            plan = EntryPlan(codec.name, codec.encode(value), info, None, self.memory._signer, name)
            with self._store.write(name) as f:
                plan.write(f)
        except Exception as exc:  # learned again by the next process
            logger.debug("could not record what %s changes: %s", self.func_id, exc)

    def _warn_unkeyable(
        self, why: str, hint: str = "name what should not count in ignore="
    ) -> None:
        if not self._unkeyable_warned:  # once per function: it may be called in a loop
            self._unkeyable_warned = True
            warn(f"mlcache: {self.func_id} is called uncached: {why}; {hint}", stacklevel=5)
        else:  # warned once; later causes (another argument) are still logged
            logger.debug("mlcache: %s is called uncached: %s", self.func_id, why)

    def _name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        keyed = self._key(args, kwargs)
        return None if keyed is None else keyed[0]

    # -- load and store -------------------------------------------------------------
    def _read(self, name: str, read: Callable[[], Any]) -> Any:
        """``read()``, or ``_MISS`` when the entry is missing, unreadable or damaged
        (a damaged entry is removed, with one warning)."""
        try:
            return read()
        except EntryNotFound:
            return _MISS
        except UnsupportedValue:
            return _MISS  # written with pickle, which is refused now: never unpickle it
        except OSError as exc:  # permissions, I/O errors: leave the entry in place
            warn(
                f"mlcache: cannot read the cache entry of {self.func_id} ({exc}); recomputing",
                stacklevel=5,
            )
            return _MISS
        except EntrySignatureError as exc:
            if exc.reason == "mismatch":
                self._discard(
                    name, f"refusing the cache entry of {self.func_id}, possible tampering ({exc})"
                )
            elif exc.reason not in self._foreign_warned:
                # written with signing off, by an older mlcache, or by someone with
                # another key: recomputed and overwritten; said once per function
                self._foreign_warned.add(exc.reason)
                how = "not signed" if exc.reason == "unsigned" else "signed with another key"
                warn(
                    f"mlcache: entries of {self.func_id} were {how}; they are recomputed "
                    "(every process sharing a cache needs the same key: set MLCACHE_SECRET, "
                    "or pass secret=)",
                    stacklevel=5,
                )
            return _MISS
        except Exception as exc:  # damaged, or a codec that cannot read it
            self._discard(
                name,
                f"discarding damaged cache entry of {self.func_id} ({type(exc).__name__}: {exc})",
            )
            return _MISS

    def _discard(self, name: str, why: str) -> None:
        """Say why the entry ``name`` cannot be used, and remove it."""
        warn(f"mlcache: {why}; recomputing", stacklevel=6)
        with contextlib.suppress(OSError, ValueError):
            self._store.delete(name)

    def _path(self, name: str) -> str | None:
        return os.path.join(self._code_path, name.rpartition("/")[2]) if self._local else None

    def _valid(self, name: str, path: str | None) -> bool:
        """The cache_validation_callback's verdict on the entry's metadata (read from
        its header only); an invalid entry is removed. Callback errors propagate."""
        callback = self.cache_validation_callback
        if callback is None:
            return True
        info = self._read(name, lambda: read_entry_info(self._store, name, path=path))
        if info is _MISS:
            return False
        if callback(info):
            return True
        with contextlib.suppress(OSError, ValueError):
            self._store.delete(name)
        return False

    def _load(
        self, name: str, mmap_mode: str | None, *, validate: bool = True, hit: bool = True
    ) -> Any:
        """The cached value of ``name`` (an entry of the current code folder), or ``_MISS``."""
        path = self._path(name)
        if validate and not self._valid(name, path):
            return _MISS
        allow, signer = self.memory.allow_pickle, self.memory._signer

        def read() -> tuple[Any, bytes]:
            reader = open_entry(self._store, name, mmap_mode, path=path, signer=signer)
            return decode(reader, allow_pickle=allow), reader.info_bytes

        got = self._read(name, read)
        if got is _MISS:
            return _MISS
        if hit:
            self.memory._usage.note(name, got[1])  # type: ignore[union-attr]
        return got[0]

    def _store_result(
        self,
        keyed: Keyed,
        value: Any,
        duration: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> dict[str, Any] | None:
        """Write ``value``; on failure warn and return None (the value is never lost).

        A value that needs pickle while pickle is disabled raises ``UnsupportedValue``:
        that is a configuration error, not a cache problem."""
        assert self._keyer is not None
        name, digests = keyed
        codec = select_codec(value, allow_pickle=self.memory.allow_pickle)
        if self.memory._refuses_writes():  # a read-only cache (said once, by the Memory)
            return None
        info = {
            "func": self.func_id,
            "time": time.time(),
            "duration": duration,
            "input_args": self._keyer.describe(args, kwargs),
            "arg_digests": self._keyer.digest_map(digests),
            "codec": codec.name,
        }
        try:
            encoded = codec.encode(value)
            info["size"] = sum(_nbytes(s) for s in encoded.segments)
            config = self.memory._config
            plan = EntryPlan(codec.name, encoded, info, config.compress, self.memory._signer, name)
        except Exception as exc:  # e.g. a result holding a lambda or a lock
            self._warn_unstored(f"cannot be stored ({type(exc).__name__}: {exc})")
            return None
        limit = self.memory.bytes_limit
        if limit is not None and plan.size > limit:
            self._warn_unstored(f"({plan.size} bytes) is larger than bytes_limit ({limit})")
            return None
        guard = self.memory._guard
        if guard is not None:
            try:
                # room first: with many writers the cache never passes the limit
                guard.reserve(name, plan.size)
            except Exception as exc:  # eviction failed: store anyway, say so
                warn(f"mlcache: could not enforce bytes_limit ({exc})", stacklevel=4)
        try:
            with self._store.write(name) as f:
                plan.write(f)
        except Exception as exc:  # disk full, permissions, a folder in the way...
            self._warn_unstored(f"could not be stored in {self.memory.location} ({exc})")
            return None
        if self._manifest is not None:
            self._write_manifest()
        return info

    def _warn_unstored(self, why: str) -> None:
        warn(f"mlcache: the result of {self.func_id} {why}; it is returned uncached", stacklevel=5)

    def _log_call(self, keyed: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._verbose > 0 and (log := logger_for(self._verbose)).isEnabledFor(logging.INFO):
            assert self._keyer is not None
            shown = ", ".join(f"{k}={v}" for k, v in self._keyer.describe(args, kwargs).items())
            if self._verbose < 2 and not logging_configured():
                # the default console output: why it missed costs a listing of the
                # function's folder (a LIST on S3), so it waits for verbose=2 or logging
                log.info("[Memory] calling %s(%s)", self.func_id, shown)
                return
            log.info(
                "[Memory] calling %s(%s): %s", self.func_id, shown, self._miss_reason(keyed[1])
            )

    def _miss_reason(self, digests: list[bytes]) -> str:
        """Why this call missed, against the most recently used entry of the function
        (a listing of its folder: paid on a logged miss only)."""
        assert self._keyer is not None
        try:
            entries = [e for e in self._store.list(self._code_dir) if is_entry(e.name)]
            latest = max(entries, key=lambda e: e.last_used, default=None)
            if latest is None:
                if not self._code_changed:
                    return "no entry yet"
                changes = self._code_changes
                return f"its code changed ({', '.join(changes)})" if changes else "its code changed"
            old = read_entry_info(self._store, latest.name).get("arg_digests")
        except Exception:  # an explanation must never fail the call
            return "new arguments"
        if not isinstance(old, dict):
            return "new arguments"
        changed = self._keyer.changed(old, digests)
        if not changed:  # the same arguments, but the function's state differs
            return "what the function captures (closure, bound object) changed"
        what = ", ".join(repr(c) for c in changed)
        return f"argument{'s' if len(changed) > 1 else ''} {what} changed since the last entry"

    def _finish(
        self,
        keyed: Keyed,
        out: Any,
        t0: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        before: tuple[dict[str, bytes], dict[str, str]] | None = None,
    ) -> tuple[Any, dict[str, Any] | None, str]:
        """Store the result of a computed call; (value, metadata or None when not
        stored, the entry's name)."""
        duration = time.perf_counter() - t0
        try:
            keyed = self._learn(before, keyed)
        except Exception as exc:  # learning is an optimisation: never fail the call
            logger.debug(
                "mlcache: %s: could not learn what the call changed: %s", self.func_id, exc
            )
        if self._verbose > 0:
            logger_for(self._verbose).info("[Memory] %s computed in %.3fs", self.func_id, duration)
        self.memory._usage.miss(keyed[0], self.func_id, duration)  # type: ignore[union-attr]
        meta = self._store_result(keyed, out, duration, args, kwargs)
        if meta is not None and self.mmap_mode is not None:
            # consistent with later hits: return the memory-mapped copy
            loaded = self._load(keyed[0], self.mmap_mode, validate=False, hit=False)
            if loaded is not _MISS:
                out = loaded
        return out, meta, keyed[0]

    def _run(
        self, keyed: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any] | None, str]:
        self._log_call(keyed, args, kwargs)
        before = self._snapshot()
        t0 = time.perf_counter()
        out = self.func(*args, **kwargs)
        return self._finish(keyed, out, t0, args, kwargs, before)

    def _lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Keyed | None, Any]:
        """(entry name and digests, or None if uncacheable; cached value or ``_MISS``)."""
        keyed = self._key(args, kwargs)
        if keyed is None:
            return None, _MISS
        value = self._load(keyed[0], self.mmap_mode)
        if value is not _MISS and self._verbose >= 10:
            logger_for(self._verbose).info("[Memory] %s: loaded from cache", self.func_id)
        return keyed, value

    def _shelved(self, name: str, out: Any, meta: dict[str, Any] | None, stored: str = "") -> Any:
        if meta is None:  # not stored: keep the value itself
            return NotMemorizedResult(out)
        return MemorizedResult(self.memory, stored or name, self.func_id, mmap_mode=self.mmap_mode)

    # -- the public interface ---------------------------------------------------------
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        keyed, value = self._lookup(args, kwargs)
        if value is not _MISS:
            return value
        if keyed is None:
            return self.func(*args, **kwargs)
        with self._key_lock(keyed[0]) as locked:
            if locked:  # another process or thread may have computed it while we waited
                value = self._load(keyed[0], self.mmap_mode)
                if value is not _MISS:
                    return value
            return self._run(keyed, args, kwargs)[0]

    def _key_lock(self, name: str) -> AbstractContextManager[bool]:
        """One computation per key at a time, across processes and threads (stores
        that can lock; the others compute concurrently, as joblib does)."""
        if self._store_lock is None:
            return contextlib.nullcontext(False)
        return _KeyLock(self._store_lock, name, self.func_id, self.memory.lock_timeout)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> tuple[R, dict[str, Any]]:
        """Always compute and store; return ``(output, metadata)`` as joblib does."""
        keyed = self._key(args, kwargs)
        if keyed is None:
            return self.func(*args, **kwargs), {}
        out, meta, _ = self._run(keyed, args, kwargs)
        return out, meta or {}

    def call_and_shelve(
        self, *args: P.args, **kwargs: P.kwargs
    ) -> MemorizedResult | NotMemorizedResult:
        """Compute (or find) the result and return a small, picklable reference to it
        (the value itself, in a ``NotMemorizedResult``, when it could not be stored)."""
        keyed = self._key(args, kwargs)
        if keyed is None:
            return NotMemorizedResult(self.func(*args, **kwargs))
        if self._in_cache(keyed[0]):
            return self._shelved(keyed[0], None, {})
        return self._shelved(keyed[0], *self._run(keyed, args, kwargs))

    def check_call_in_cache(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """True if a valid result for these arguments is cached (nothing is computed)."""
        name = self._name(args, kwargs)
        return name is not None and self._in_cache(name)

    def _in_cache(self, name: str) -> bool:
        try:
            exists = self._store.exists(name)
        except (OSError, ValueError):
            return False
        return exists and self._valid(name, self._path(name))

    def stats(self) -> FunctionStats:
        """This function's entries, bytes, last use, hits, misses and the seconds of
        computing its hits saved (see :meth:`Memory.stats`)."""
        self.memory._usage.flush()  # type: ignore[union-attr]
        found = collect(self._store, self._folder).get(self._folder)
        return found or FunctionStats(self._folder, self.func_id)

    def clear(self, warn: bool = True) -> None:
        """Remove every cached result of this function (all code versions)."""
        if self.memory._cannot_clear():
            return
        if warn and self._verbose:
            logger_for(self._verbose).info("[Memory] clearing the cache of %s", self.func_id)
        self._store.delete(self._folder)
        self.memory._usage.forget(self._folder)  # type: ignore[union-attr]


class AsyncMemorizedFunc(MemorizedFunc[P, R]):
    """A memoized ``async def`` function: awaiting it computes or loads."""

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:  # type: ignore[override]
        keyed, value = self._lookup(args, kwargs)
        if value is not _MISS:
            return value
        if keyed is None:
            return await self.func(*args, **kwargs)  # type: ignore[misc]
        if self._store_lock is None:
            return (await self._arun(keyed, args, kwargs))[0]
        # one computation per key, as for plain functions, without blocking the
        # event loop: try the lock, and sleep between tries (other tasks run)
        deadline = time.monotonic() + self.memory.lock_timeout
        delay = 0.002
        while True:
            lock = _KeyLock(self._store_lock, keyed[0], self.func_id, 0)
            with lock as held:
                if held:
                    value = self._load(keyed[0], self.mmap_mode)
                    if value is not _MISS:
                        return value
                if held or lock.unavailable:
                    return (await self._arun(keyed, args, kwargs))[0]
            if time.monotonic() >= deadline:
                _KeyLock.say(self.func_id, self.memory.lock_timeout)
                return (await self._arun(keyed, args, kwargs))[0]
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
            value = self._load(keyed[0], self.mmap_mode)
            if value is not _MISS:
                return value

    async def _arun(
        self, keyed: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any] | None, str]:
        self._log_call(keyed, args, kwargs)
        before = self._snapshot()
        t0 = time.perf_counter()
        out = await self.func(*args, **kwargs)  # type: ignore[misc]
        return self._finish(keyed, out, t0, args, kwargs, before)

    async def call(self, *args: P.args, **kwargs: P.kwargs) -> tuple[R, dict[str, Any]]:  # type: ignore[override]
        keyed = self._key(args, kwargs)
        if keyed is None:
            return await self.func(*args, **kwargs), {}  # type: ignore[misc]
        out, meta, _ = await self._arun(keyed, args, kwargs)
        return out, meta or {}

    async def call_and_shelve(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> MemorizedResult | NotMemorizedResult:
        keyed = self._key(args, kwargs)
        if keyed is None:
            return NotMemorizedResult(await self.func(*args, **kwargs))  # type: ignore[misc]
        if self._in_cache(keyed[0]):
            return self._shelved(keyed[0], None, {})
        return self._shelved(keyed[0], *(await self._arun(keyed, args, kwargs)))


class _KeyLock:
    """A store's lock on one key that says so when it could not be had in time
    (with a timeout), and that never fails the call: where no lock file can be
    made (a read-only cache folder) the call goes on unlocked."""

    def __init__(
        self,
        factory: Callable[[str, float], AbstractContextManager[bool]],
        name: str,
        func_id: str,
        timeout: float,
    ) -> None:
        self._factory, self._name, self._func_id, self._timeout = factory, name, func_id, timeout
        self._held: AbstractContextManager[bool] | None = None
        self.unavailable = False  #: no lock can be made here at all

    def __enter__(self) -> bool:
        try:
            held = self._factory(self._name, self._timeout)
            got = held.__enter__()
        except OSError as exc:
            self.unavailable = True
            logger.debug("mlcache: %s: cannot lock (%s); going on unlocked", self._func_id, exc)
            return False
        self._held = held
        if not got and self._timeout > 0:
            self.say(self._func_id, self._timeout, stacklevel=4)
        return got

    @staticmethod
    def say(func_id: str, timeout: float, stacklevel: int = 3) -> None:
        warn(
            f"mlcache: {func_id}: another process has computed this call for more "
            f"than {timeout:g} s (lock_timeout); computing it here too",
            stacklevel=stacklevel,
        )

    def __exit__(self, *exc: Any) -> Any:
        held, self._held = self._held, None
        return held.__exit__(*exc) if held is not None else None


def _module_attribute(module: str, qualname: str) -> Any:
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


for _cls in (MemorizedFunc, AsyncMemorizedFunc):
    ForkingPickler.register(_cls, _cls._reduce_for_workers)


def _rebuild_func(
    cls: type[MemorizedFunc[Any, Any]],
    func: Callable[..., Any],
    memory: Memory,
    ignore: list[str],
    verbose: int,
    mmap_mode: str | None,
    callback: Callable[[dict[str, Any]], bool] | None,
    func_id: str | None = None,
    version: str | None = None,
) -> MemorizedFunc[Any, Any]:
    memorized = cls(
        func,
        memory,
        ignore=ignore,
        verbose=verbose,
        mmap_mode=mmap_mode,
        cache_validation_callback=callback,
        version=version,
    )
    if func_id is not None and func_id != memorized.func_id:
        memorized.func_id, memorized._folder = func_id, slug(func_id)
    return memorized
