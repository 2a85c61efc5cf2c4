"""``MemorizedFunc``: a function whose results are cached by a :class:`~mlcache.Memory`.

A call is keyed (see :mod:`mlcache.keys.call` and :mod:`mlcache.keys.identity`),
looked up, and computed and stored on a miss. Every cache problem degrades to a
miss or an unstored result with one :class:`~mlcache.CacheWarning`; the user's
call never fails because of the cache.

This module is the calling: the hit path and the exception-to-miss policy.
Which code version a call is keyed under, and what calls change, is
:mod:`mlcache.memo.versions`; one computation per key, :mod:`mlcache.memo.locking`;
what the functions of one Memory share, :mod:`mlcache.memo.context`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
import types
from collections.abc import Callable, Iterable
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, TypeVar

from .._log import logger_for
from ..codecs import select_codec
from ..entry import EntryPlan, decode, open_entry, read_entry_info
from ..errors import (
    EntryNotFound,
    EntrySignatureError,
    UnhashableArgument,
    UnknownFormat,
    UnsupportedValue,
    warn,
)
from ..keys.call import CallKeyer
from ..keys.dependencies import rebound
from ..keys.identity import call_state, func_identity
from ..keys.state import EPOCH as _EPOCH
from .audit import auditor
from .config import check_callback
from .context import MemoContext
from .explain import log_call
from .locking import MISS as _MISS
from .locking import KeyLocks
from .results import MemorizedResult, NotMemorizedResult
from .tier import tier
from .usage import FunctionStats, collect
from .versions import FunctionCode, Keyed, Snapshot

if TYPE_CHECKING:
    from .memory import Memory

__all__ = ["AsyncMemorizedFunc", "MemorizedFunc"]

logger = logging.getLogger("mlcache")
P = ParamSpec("P")
R = TypeVar("R")


def _split_ignore(func: Callable[..., Any], ignore: Any) -> tuple[list[str], frozenset[str]]:
    """``ignore`` as (parameter names, names of captured state: closure variables or
    ``"self"`` of a bound method). Raises ``ConfigError`` for any other name (the
    one check of ``ignore``: :class:`~mlcache.keys.call.CallKeyer`'s)."""
    captured = {entry[0] for entry in call_state(func) or ()} - {"partial", "object"}
    names = CallKeyer(func, ignore, b"", captured=captured).names
    ignore = list(ignore or ())
    return [n for n in ignore if n in names], frozenset(n for n in ignore if n not in names)


def _nbytes(segment: Any) -> int:
    return int(segment.nbytes) if hasattr(segment, "nbytes") else len(memoryview(segment))


class MemorizedFunc(Generic[P, R]):
    """A memoized function: call it as the original. See :meth:`Memory.cache`."""

    memory_at: ClassVar[Callable[..., Memory]]  # joblib's form's Memory: set by memory.py

    def __init__(
        self,
        func: Callable[P, R],
        memory: Memory | str | os.PathLike[str],
        backend: str = "local",
        ignore: Iterable[str] | None = None,
        mmap_mode: str | None = None,
        compress: bool | int | tuple[str, int] | None = None,
        verbose: int = 1,
        timestamp: float | None = None,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None,
        *,
        version: str | None = None,
        audit: Any = None,
    ) -> None:
        memory = MemorizedFunc.memory_at(memory, backend, mmap_mode, compress, verbose)
        self.timestamp = memory.timestamp if timestamp is None else timestamp  # joblib's
        self.func = func
        self.version = version
        self.memory = memory
        self.ignore = list(ignore) if ignore is not None and not isinstance(ignore, str) else ignore
        self.mmap_mode = mmap_mode
        self.compress = memory.compress
        self._verbose = verbose
        self.cache_validation_callback = check_callback(cache_validation_callback)
        context = memory.context
        assert context is not None  # Memory.cache makes a MemorizedFunc only with a store
        #: what this function shares with the other functions of its Memory
        self._ctx: MemoContext = context
        self._store = context.store
        self._local = context.local is not None
        self._params, self._state_ignore = _split_ignore(func, self.ignore)
        self._unkeyable_warned = False
        self._pickle_warned = False  # a result that needs pickle with allow_pickle=False
        self._foreign_warned: set[str] = set()  # entries seen unsigned or with another key
        self._unreadable: set[str] = set()  # others' entries (newer): never replaced
        self.audit = audit  #: ``audit=`` (None: the Memory's; see mlcache.memo.audit)
        self._rename(func_identity(func))
        functools.update_wrapper(self, func)

    def _rename(self, func_id: str) -> None:
        """Key this function's calls under identity ``func_id`` (a function received
        by value keeps the identity it had where it was pickled)."""
        self.func_id = func_id
        #: which code version calls are keyed under, and what calls change
        self._code = FunctionCode(
            self.func,
            func_id,
            self._ctx,
            version=self.version,
            params=self._params,
            state_ignore=self._state_ignore,
            verbose=self._verbose,
            on_unkeyable=self._warn_unkeyable,
        )
        self._folder = self._code.folder
        self._locks = KeyLocks(self._ctx.locking, func_id)
        self._audit = auditor(self.audit, self._ctx, func_id)

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
            (type(self), self.func, self.memory, *options, self.func_id, self.version, self.audit),
        )

    # -- keys ------------------------------------------------------------------
    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Keyed | None:
        """The entry name of this call and its arguments' digests, or None when it
        cannot be cached (an argument, or state its function holds, cannot be
        hashed: warned once per function, then called uncached)."""
        code = self._code
        keyed_by = code.keyed_by  # one read: another thread may learn meanwhile
        if (
            keyed_by is None
            or code.epoch != _EPOCH[0]  # a value the code reads was changed by a call
            or (code.target is not None and not code.same_code())
            or rebound(code.bindings)  # a name it reads was rebound (SIZE = 3)
        ):
            if code.current() is None:
                return None
            keyed_by = code.keyed_by
            assert keyed_by is not None
        keyer, code_dir, learned = keyed_by
        extra = code.captured_key(learned) if code.stateful else b""
        try:
            key, digests = keyer.key(args, kwargs, extra)
        except UnhashableArgument as exc:
            self._warn_unkeyable(str(exc))
            return None
        return f"{code_dir}/{key}", digests

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
    def _read(self, name: str, read: Callable[..., Any], *args: Any) -> Any:
        """``read(*args)``, or ``_MISS`` (missing, unreadable; damaged: removed, one
        warning)."""
        try:
            return read(*args)
        except EntryNotFound:
            return _MISS
        except UnsupportedValue:
            return _MISS  # written with pickle, which is refused now: never unpickle it
        except UnknownFormat as exc:  # not damage: another process (a newer one) reads it
            self._unreadable.add(name)  # so it is never removed nor overwritten here
            if "unknown-format" not in self._foreign_warned:
                self._foreign_warned.add("unknown-format")
                warn(f"mlcache: {self.func_id}: {exc}; kept, computed here", stacklevel=5)
            return _MISS
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
                if self._ctx.writes.refuses_writes():
                    return _MISS  # a shared cache of another key: the gate said why, once
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
        if not self._local:
            return None
        # the code folder's path with its separator, and the key: os.path.join
        # cost ~0.5 µs of a ~10 µs hit
        return self._code.code_prefix + name[name.rfind("/") + 1 :]

    def _valid(self, name: str, path: str | None) -> bool:
        """The validation callback's verdict on the entry's header: False removes it."""
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
        if validate and self.cache_validation_callback is not None and not self._valid(name, path):
            return _MISS
        ctx = self._ctx
        if path is not None and mmap_mode is None and tier.enabled:  # one stat per hit
            got = self._read(name, tier.read, path, name, ctx.signer, ctx.allow_pickle)
        else:
            got = self._read(name, self._open, name, mmap_mode, path)
        if got is _MISS:
            return _MISS
        if hit:
            ctx.usage.note(name, got[1])
        return got[0]

    def _open(self, name: str, mmap_mode: str | None, path: str | None) -> tuple[Any, bytes]:
        ctx = self._ctx
        reader = open_entry(self._store, name, mmap_mode, path=path, signer=ctx.signer)
        return decode(reader, allow_pickle=ctx.allow_pickle), reader.info_bytes

    def _store_result(
        self,
        keyed: Keyed,
        value: Any,
        duration: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> dict[str, Any] | None:
        """Write ``value``; on failure warn and return None (the value is never lost).

        A value that needs pickle while pickle is disabled is not stored either: one
        warning per function (it is called in loops), a miss on every later call."""
        keyer, ctx = self._code.keyer, self._ctx
        assert keyer is not None
        name, digests = keyed
        try:
            codec = select_codec(value, allow_pickle=ctx.allow_pickle)
        except UnsupportedValue as exc:  # said once per function: it may run in a loop
            if not self._pickle_warned:
                self._pickle_warned = True
                self._warn_unstored(f"is not stored: {exc}")
            return None
        if ctx.writes.refuses_writes() or name in self._unreadable:  # read-only (said
            return None  # once per Memory), or another version's entry (said in _read)
        info = {
            "func": self.func_id,
            "time": time.time(),
            "duration": duration,
            "input_args": keyer.describe(args, kwargs),
            "arg_digests": keyer.digest_map(digests),
            "codec": codec.name,
        }
        try:
            encoded = codec.encode(value)
            info["size"] = sum(_nbytes(s) for s in encoded.segments)
            plan = EntryPlan(codec.name, encoded, info, ctx.compress, ctx.signer, name)
        except Exception as exc:  # e.g. a result holding a lambda or a lock
            self._warn_unstored(f"cannot be stored ({type(exc).__name__}: {exc})")
            return None
        limit = ctx.bytes_limit
        if limit is not None and plan.size > limit:
            self._warn_unstored(f"({plan.size} bytes) is larger than bytes_limit ({limit})")
            return None
        guard, unenforced = ctx.guard, None
        if guard is not None:
            try:
                # room first: with many writers the cache never passes the limit
                guard.reserve(name, plan.size)
            except Exception as exc:  # eviction failed: store anyway, say so once stored
                unenforced = exc
        try:
            with self._store.write(name) as f:
                plan.write(f)
        except Exception as exc:  # disk full, permissions, a folder in the way...
            # one warning: what refused the write (a read-only remount) refused the limit
            self._warn_unstored(f"could not be stored in {self.memory.location} ({exc})")
            return None
        if unenforced is not None:
            warn(f"mlcache: could not enforce bytes_limit ({unenforced})", stacklevel=4)
        self._code.write_manifest()
        return info

    def _warn_unstored(self, why: str) -> None:
        warn(f"mlcache: the result of {self.func_id} {why}; it is returned uncached", stacklevel=5)

    def _log_call(self, keyed: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._verbose > 0:
            log_call(self._verbose, self.func_id, self._code, self._store, keyed, args, kwargs)

    def _finish(
        self,
        keyed: Keyed,
        out: Any,
        t0: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        before: Snapshot | None = None,
    ) -> tuple[Any, dict[str, Any] | None, str]:
        """Store the result of a computed call; (value, metadata or None when not
        stored, the entry's name)."""
        duration = time.perf_counter() - t0
        self._code.note_rebound()  # a name the call itself rebound: its own state
        try:
            keyed, learned = self._code.learn(before, keyed)
        except Exception as exc:  # learning is an optimisation: never fail the call
            logger.debug("mlcache: %s: could not learn what calls change: %s", self.func_id, exc)
            learned = self._code.abandon
        try:
            if self._verbose > 0:
                logger_for(self._verbose).info(
                    "[Memory] %s computed in %.3fs", self.func_id, duration
                )
            self._ctx.usage.miss(keyed[0], self.func_id, duration)
            meta = self._store_result(keyed, out, duration, args, kwargs)
        finally:  # once stored: a call keyed with what was learned finds it
            learned(before)
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
        with self._code.watching() as before:  # what the call changes
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
        return MemorizedResult(self._ctx, stored or name, self.func_id, mmap_mode=self.mmap_mode)

    # -- the public interface ---------------------------------------------------------
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        began = time.perf_counter()  # what a hit costs, for the audits' budget
        generation = self._code.generation  # what the key is made with (see _loader)
        keyed, value = self._lookup(args, kwargs)
        if value is not _MISS:
            if self._audit is None or not self._audit.due(keyed, began):
                return value
            again = lambda *a, **k: self._code.watched(keyed, lambda: self.func(*a, **k))  # noqa: E731
            return self._audit.check(keyed, value, again, args, kwargs, self._finish)
        if keyed is None:
            return self.func(*args, **kwargs)
        # one computation per key at a time, across processes and threads (stores
        # that can lock; the others compute concurrently, as joblib does)
        wait = self._loader(keyed[0], args, kwargs, generation)
        claim = self._locks.claim(keyed[0], self.memory.lock_timeout, wait)
        if claim.value is not _MISS:
            return claim.value
        with claim:
            return self._run(keyed, args, kwargs)[0]

    def _loader(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], generation: int
    ) -> Callable[[], Any]:
        """Loads entry ``name`` (``_MISS`` while there is none): what a call waiting
        for another one's result looks for (see :meth:`FunctionCode.reloading`)."""
        load, rekey = (lambda n: self._load(n, self.mmap_mode)), (lambda: self._key(args, kwargs))
        return self._code.reloading(name, generation, load, rekey)

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
        return exists and name not in self._unreadable and self._valid(name, self._path(name))

    def stats(self) -> FunctionStats:
        """This function's entries, bytes, last use, hits, misses and the seconds of
        computing its hits saved (see :meth:`Memory.stats`)."""
        self._ctx.usage.flush()
        found = collect(self._store, self._folder).get(self._folder)
        return found or FunctionStats(self._folder, self.func_id)

    def clear(self, warn: bool = True) -> None:
        """Remove every cached result of this function (all code versions)."""
        if self._ctx.writes.cannot_clear():
            return
        if warn and self._verbose:
            logger_for(self._verbose).info("[Memory] clearing the cache of %s", self.func_id)
        with self._ctx.writes.clearing():
            self._store.delete(self._folder)
            self._ctx.usage.forget(self._folder)


class AsyncMemorizedFunc(MemorizedFunc[P, R]):
    """A memoized ``async def`` function: awaiting it computes or loads."""

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:  # type: ignore[override]
        generation = self._code.generation
        keyed, value = self._lookup(args, kwargs)
        if value is not _MISS:
            return value
        if keyed is None:
            return await self.func(*args, **kwargs)  # type: ignore[misc]
        # the lock loop of plain functions, waiting without blocking the event loop
        name = keyed[0]
        wait = self._loader(name, args, kwargs, generation)
        claim = await self._locks.aclaim(name, self.memory.lock_timeout, wait)
        if claim.value is not _MISS:
            return claim.value
        with claim:
            return (await self._arun(keyed, args, kwargs))[0]

    async def _arun(
        self, keyed: Keyed, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any] | None, str]:
        self._log_call(keyed, args, kwargs)
        with self._code.watching() as before:
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
    audit: Any = None,
) -> MemorizedFunc[Any, Any]:
    kwargs = {"cache_validation_callback": callback, "version": version, "audit": audit}
    memorized = cls(func, memory, ignore=ignore, mmap_mode=mmap_mode, verbose=verbose, **kwargs)
    if func_id is not None and func_id != memorized.func_id:
        memorized._rename(func_id)
    return memorized
