"""``Memory``: joblib's API, faster and safer (the functions it returns are in
:mod:`mlcache.memo.func`).

Layout in the store::

    <function slug>/<code version[:16]>/<call key>     one entry file per call

Changing the function's code changes the folder, so results of old code are
never returned; the folders of the function's other versions are kept side by
side, and go by age, size limits and ``prune`` (see :mod:`mlcache.memo.versions`).
``Memory`` builds one :class:`~mlcache.memo.context.MemoContext` and hands it to
every function it memoizes.
"""

from __future__ import annotations

import datetime as _dt
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar, overload

from .._audit import AuditPolicy
from .._log import logger_for
from .._util import parse_bytes, parse_duration
from ..entry import open_entry
from ..entry.signing import Signer, key_source, resolve_signer
from ..errors import (
    ConfigError,
    ConfigTypeError,
    EntryCorrupted,
    EntryNotFound,
    StoreError,
    UnknownFormat,
    warn,
    warn_at_user,
)
from ..store import Shared, Store
from ..store.local import default_location
from .config import MemoryConfig, check_callback, check_mmap_mode, open_store
from .context import MemoContext, WriteGate, store_powers
from .eviction import SizeGuard, enforce_limits
from .func import AsyncMemorizedFunc, MemorizedFunc
from .layout import cached_objects, entry_folder, is_stats
from .results import (
    AsyncNotMemorizedFunc,
    MemorizedResult,
    NotMemorizedFunc,
    NotMemorizedResult,
    expires_after,
)
from .usage import FunctionStats, UsageLog, collect

__all__ = [
    "MemorizedFunc",
    "MemorizedResult",
    "Memory",
    "NotMemorizedFunc",
    "NotMemorizedResult",
    "expires_after",
]

logger = logging.getLogger("mlcache")
P = ParamSpec("P")
R = TypeVar("R")


class Memory:
    """A context for caching function results on disk: a drop-in for ``joblib.Memory``.

    Parameters
    ----------
    location:
        Cache folder (``str`` or ``pathlib.Path``) or a location the backend
        understands. ``None`` disables caching: functions are simply called;
        ``""`` is refused (``ValueError``). A folder holding files mlcache did
        not write (``Memory(".")`` in a project) keeps the cache in its
        ``mlcache`` subfolder, as joblib uses ``<location>/joblib``; a new or
        empty folder, or one mlcache marked as its cache, is the cache itself
        (see :func:`mlcache.store.local.cache_folder`). :attr:`location` stays
        what was given (as joblib's); ``store.location`` is the folder used.
        A folder that cannot be written (a read-only mount) serves its hits,
        and what misses is computed and returned unstored, with one warning.
        A URL (``"s3://bucket/cache"``) is a cache shared between machines
        (:mod:`mlcache.store.fsspec`): a clear on one machine reaches the
        others' local copies within ``backend_options={"revalidate_after":
        30}`` seconds, and a server that cannot be reached (down, a wrong
        endpoint) never fails a call: they compute and return their results
        uncached, with one warning, and caching resumes when it answers.
    backend:
        Store backend name (``"local"``, or one registered with
        :func:`mlcache.register_store_backend`).
    mmap_mode:
        ``None``, ``"r"``, ``"r+"`` or ``"c"``: cached arrays come back as
        :class:`numpy.memmap` of the cache file instead of being read.
    compress:
        joblib-style compression (``True``, a level, or ``("zlib", 3)``).
        Compressed results cannot be memory-mapped.
    verbose:
        0 is silent; 1 logs calls that compute; 10 logs hits too. Messages go to
        the ``logging`` logger ``"mlcache"``.
    bytes_limit:
        Upper bound of the cache's size (``int`` or ``"10GB"``), enforced as
        entries are written by removing those worth least: the least compute
        time saved per byte, aged by use (GreedyDual-Size; see
        :mod:`mlcache.memo.eviction`). One budget with the dataset packs built
        in the same folder, which count as entries whose cost is their build
        time (an open one is never removed); see
        :class:`mlcache.memo.eviction.SizeGuard` for when the store is rescanned.
    backend_options:
        Keyword arguments for the store backend (e.g. ``{"durable": False}``).
    allow_pickle:
        ``False`` stores only arrays and plain data and never unpickles anything.
    secret:
        The key that signs entries (HMAC-SHA256) so that an entry planted,
        altered or moved by someone without it is refused before it is decoded
        (raw array bytes are bound to the signature by their checksum only:
        see ``docs/format.md``). ``None`` (the default)
        uses ``$MLCACHE_SECRET``, else a per-user key file created on first use
        (see :mod:`mlcache.entry.signing`); a ``str`` or ``bytes`` is the secret itself
        (give every process sharing the cache the same one); ``False`` turns
        signing off. A cache shared between machines (``s3://...``) needs the
        same secret on every machine (``$MLCACHE_SECRET``): one with another
        key computes its results and does not store them, with one warning
        (see :mod:`mlcache.entry.signing`).
    code:
        Which code changes make results stale: ``"transitive"`` (the default:
        the function's code and the user code it reaches, helpers and constants
        included; comments, docstrings and formatting never count),
        ``"source"`` (the function's own source text, as joblib does) or
        ``"off"`` (never: results stay until cleared). See :mod:`mlcache.keys.code_version`;
        ``mem.cache(version="2")`` pins one function's version by hand.
    audit:
        How the cache checks itself: now and then a hit is computed again and
        compared, within 2% of the time the cache saved (see :mod:`mlcache.memo.audit`).
        ``False`` turns it off (so does ``MLCACHE_AUDIT=0``); a number sets the
        share, a dict or an :class:`mlcache.AuditPolicy` the options (``rtol=``).

    Examples
    --------
    >>> import tempfile
    >>> mem = Memory(tempfile.mkdtemp(), verbose=0)
    >>> @mem.cache
    ... def square(x):
    ...     return x * x
    >>> square(3), square(3)
    (9, 9)
    >>> square.check_call_in_cache(3)
    True
    """

    #: seconds a call waits for another process (or thread) computing the same key
    #: before computing it too, with a warning; set it on an instance to change it
    lock_timeout: float = 600.0

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        backend: str = "local",
        mmap_mode: str | None = None,
        compress: bool | int | tuple[str, int] = False,
        verbose: int = 1,
        bytes_limit: int | str | None = None,
        backend_options: dict[str, Any] | None = None,
        *,
        allow_pickle: bool = True,
        secret: str | bytes | bool | None = None,
        code: str = "transitive",
        audit: bool | float | dict[str, Any] | AuditPolicy = True,
    ) -> None:
        self._config = MemoryConfig.make(
            location,
            backend,
            mmap_mode,
            compress,
            verbose,
            bytes_limit,
            backend_options,
            allow_pickle,
            code,
            audit,
        )
        self.compress = compress
        if self._config.compress is not None and mmap_mode is not None:
            warn("compressed results cannot be memory-mapped; they will be read into memory")
        self.store: Store | None = None
        if self._config.location is not None:
            self.store = open_store(self._config)
        self._secret = secret
        self.timestamp = time.time()  # joblib's attribute
        #: what the functions this Memory memoizes share (None without a store)
        self.context: MemoContext | None = None
        if self.store is not None:
            self.context = self._make_context(self.store)
        # the Memory's own shortcuts to its context's parts
        self._signer: Signer | None = self.context.signer if self.context else None
        self._usage: UsageLog | None = self.context.usage if self.context else None

    def _make_context(self, store: Store) -> MemoContext:
        """Resolve, once, what every memoized function of this Memory uses."""
        local, locking, counters, read_only = store_powers(store)
        signer = resolve_signer(self._secret, str(store.location) if local else None)
        shared = store if isinstance(store, Shared) else None
        # a read-only store (the local store on a read-only mount) serves its
        # hits; what is computed is returned unstored
        usage = UsageLog(store, read_only=read_only, local=local)
        c = self._config
        guard = (
            SizeGuard(store, c.bytes_limit, usage, counters=counters)
            if c.bytes_limit is not None
            else None
        )
        writes = WriteGate(
            str(store.location),
            read_only,
            shared=shared,
            key_id=signer.key_id.hex() if signer is not None else None,
            key_source=key_source(self._secret),
        )
        usage.refuses = writes.refuses_writes
        return MemoContext(
            store=store,
            location=c.location,
            signer=signer,
            allow_pickle=c.allow_pickle,
            compress=c.compress,
            mmap_mode=c.mmap_mode,
            code=c.code,
            verbose=c.verbose,
            bytes_limit=c.bytes_limit,
            usage=usage,
            guard=guard,
            writes=writes,
            local=local,
            locking=locking,
            counters=counters,
            shared=shared,
            audit=c.audit,
            owner=self,
        )

    def flush_usage(self) -> None:
        """Write this process's pending last-use times and statistics now (they are
        batched off the hot path; :meth:`stats` and eviction flush them first)."""
        if self._usage is not None:
            self._usage.flush()

    def remove_function(self, folder: str) -> None:
        """Remove everything cached under a function's ``folder`` (every code
        version, see :class:`~mlcache.memo.usage.FunctionStats`), and this
        process's statistics of it."""
        if self.store is None or self._usage is None:
            return
        self.store.delete(folder)
        self._usage.forget(folder)

    # joblib-compatible attributes
    @property
    def store_backend(self) -> Store | None:
        return self.store

    @property
    def location(self) -> str | None:
        return self._config.location

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def mmap_mode(self) -> str | None:
        return self._config.mmap_mode

    @property
    def bytes_limit(self) -> int | None:
        return self._config.bytes_limit

    @property
    def backend_options(self) -> dict[str, Any]:
        return dict(self._config.backend_options)

    @property
    def allow_pickle(self) -> bool:
        return self._config.allow_pickle

    @property
    def code(self) -> str:
        return self._config.code

    @property
    def _verbose(self) -> int:
        return self._config.verbose

    def __repr__(self) -> str:
        return f"Memory(location={self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        c = self._config
        # the store's resolved location: a relative path must not be re-read
        # against the receiving process's working directory
        location = self.store.location if self.store is not None else None
        args = (
            location,
            c.backend,
            c.mmap_mode,
            self.compress,
            c.verbose,
            c.bytes_limit,
            c.backend_options,
        )
        # the signing secret travels only when it was given (not the key file's)
        secret = self._secret if self._secret is not None and self._secret is not True else None
        # a subclass comes back as itself (one that also subclasses joblib.Memory
        # passes the isinstance checks of libraries such as nilearn in workers, and
        # after sklearn's clone, which deep-copies)
        return (_rebuild_memory, (args, c.allow_pickle, secret, c.code, type(self), c.audit))

    @overload
    def cache(
        self,
        func: Callable[P, R],
        ignore: Iterable[str] | None = ...,
        verbose: int | None = ...,
        mmap_mode: str | bool | None = ...,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = ...,
        version: str | None = ...,
        audit: Any = ...,
    ) -> MemorizedFunc[P, R]: ...

    @overload
    def cache(
        self,
        func: None = ...,
        ignore: Iterable[str] | None = ...,
        verbose: int | None = ...,
        mmap_mode: str | bool | None = ...,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = ...,
        version: str | None = ...,
        audit: Any = ...,
    ) -> Callable[[Callable[P, R]], MemorizedFunc[P, R]]: ...

    def cache(
        self,
        func: Callable[P, R] | None = None,
        ignore: Iterable[str] | None = None,
        verbose: int | None = None,
        mmap_mode: str | bool | None = False,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None,
        version: str | None = None,
        audit: Any = None,
    ) -> Any:
        """Memoize ``func``: compute once per distinct arguments, then load.

        Usable as ``mem.cache(f)``, ``@mem.cache`` and ``@mem.cache(ignore=[...])``.

        Parameters
        ----------
        ignore:
            Parameter names that do not take part in the key (e.g. ``verbose``).
        verbose:
            Overrides the Memory's verbosity for this function.
        mmap_mode:
            Overrides the Memory's ``mmap_mode`` (``False`` keeps it).
        cache_validation_callback:
            Called with a hit's metadata (``time``, ``duration``, ``input_args``);
            returning False discards the entry and recomputes. See
            :func:`expires_after`.
        version:
            A version you set by hand (``"2"``): the code is then not checked,
            and changing this string is what makes the results stale.
        audit:
            Overrides the Memory's ``audit=`` for this function (``False``: a
            function with side effects that must not run again for a check).
        """
        check_callback(cache_validation_callback)
        if mmap_mode is not False:
            check_mmap_mode(mmap_mode)
        if version is not None and (not isinstance(version, str) or not version):
            raise ConfigError(f"version must be a non-empty str, got {version!r}")
        if func is None:
            return functools.partial(
                self.cache,
                ignore=ignore,
                verbose=verbose,
                mmap_mode=mmap_mode,
                cache_validation_callback=cache_validation_callback,
                version=version,
                audit=audit,
            )
        if isinstance(func, (staticmethod, classmethod)):
            # @mem.cache above @staticmethod/@classmethod: memoize the function inside
            inner = self.cache(
                func.__func__, ignore, verbose, mmap_mode, cache_validation_callback, version, audit
            )
            return type(func)(inner)
        if isinstance(func, (MemorizedFunc, NotMemorizedFunc)):
            func = func.func
        if not callable(func):
            raise TypeError(f"Memory.cache expects a callable, got {type(func).__name__}: {func!r}")
        is_async = inspect.iscoroutinefunction(func)
        generates = inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func)
        if generates and self.store is not None:  # uncached, as joblib (never a crash)
            name = getattr(func, "__qualname__", func)
            warn_at_user(
                f"mlcache: cannot memoize the generator function {name}: a generator is "
                "consumed once and cannot be stored, so it runs uncached; return a list "
                "instead (e.g. a helper that returns list(generator(...)))"
            )
        if self.store is None or generates:
            return (AsyncNotMemorizedFunc if is_async else NotMemorizedFunc)(func)
        cls = AsyncMemorizedFunc if is_async else MemorizedFunc
        return cls(
            func,
            self,
            ignore=ignore,
            verbose=self._verbose if verbose is None else verbose,
            mmap_mode=self.mmap_mode if mmap_mode is False else mmap_mode,  # type: ignore[arg-type]
            cache_validation_callback=cache_validation_callback,
            version=version,
            audit=audit,
        )

    def clear(self, warn: bool = True) -> None:
        """Remove every cached result of this location (dataset packs stay; a cache that
        became read-only warns and keeps them). On a shared cache, the other machines stop
        serving their local copies (:mod:`mlcache.store.fsspec`) and the key that signs its
        entries is forgotten; one that cannot be reached raises :class:`StoreError`."""
        ctx = self.context
        if ctx is None or ctx.writes.cannot_clear():
            return
        if warn and self._verbose:
            logger_for(self._verbose).info("[Memory] clearing the whole cache at %s", self.location)
        with ctx.writes.clearing():
            for folder in {entry_folder(e.name) for e in cached_objects(ctx.store)}:
                ctx.store.delete(folder)
            ctx.usage.forget()
            if ctx.shared is not None:
                ctx.shared.new_generation(forget_signer=True)
                ctx.writes.forget_signer()

    def reduce_size(
        self,
        bytes_limit: int | str | None = None,
        items_limit: int | None = None,
        age_limit: _dt.timedelta | float | str | None = None,
    ) -> None:
        """Remove the entries worth least until the cache fits the limits.

        Worth is compute time saved per byte, aged by use (GreedyDual-Size, see
        :mod:`mlcache.memo.eviction`); the dataset packs a CachedDataset built in
        the same folder count as entries (their cost is their build time; one a
        process has open is kept). ``bytes_limit`` defaults to the Memory's own;
        ``age_limit`` removes entries not used for that long (a ``timedelta``,
        seconds, or ``"7d"``).
        """
        if self.store is None:
            return
        limit = parse_bytes(bytes_limit) if bytes_limit is not None else self.bytes_limit
        if items_limit is not None and (
            not isinstance(items_limit, int) or isinstance(items_limit, bool)
        ):
            raise ConfigTypeError(f"items_limit must be a non-negative int, got {items_limit!r}")
        if items_limit is not None and items_limit < 0:
            raise ConfigError(f"items_limit must be a non-negative int, got {items_limit!r}")
        age = parse_duration(age_limit)
        if limit is None and items_limit is None and age is None:
            return
        self.flush_usage()
        removed = enforce_limits(
            self.store, bytes_limit=limit, items_limit=items_limit, age_limit=age
        )
        if removed and self._verbose:
            logger_for(self._verbose).info(
                "[Memory] removed %d entries (%d bytes)", len(removed), sum(e.size for e in removed)
            )

    def eval(self, func: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``func(*args, **kwargs)``, computed only if not already cached."""
        if self.store is None:
            return func(*args, **kwargs)
        return self.cache(func)(*args, **kwargs)

    def stats(self) -> dict[str, FunctionStats]:
        """What each function has in this cache and what the cache did for it, by
        function identity: entries, bytes, last use, hits, misses, and the seconds
        of computing the hits saved (counted by every process using the cache;
        this process's latest counts are written first)."""
        if self.store is None:
            return {}
        self.flush_usage()
        return {st.func: st for st in collect(self.store).values()}

    def verify(self, *, fix: bool = False) -> list[str]:
        """Check every entry's checksums (and signature, when signing is on); return
        the names of damaged ones (removing them when ``fix`` is true)."""
        if self.store is None:
            return []
        damaged = []
        store = self.store
        for e in cached_objects(store):
            # statistics are numbers, never unpickled, and not signed
            signer = None if is_stats(e.name) else self._signer
            try:
                open_entry(store, e.name, signer=signer)  # reads and checks every byte
            except EntryCorrupted:
                damaged.append(e.name)
                if fix:
                    store.delete(e.name)
            except EntryNotFound:
                continue  # removed meanwhile
            except UnknownFormat:
                continue  # a codec or compression not registered here: not damaged
        return damaged


def memory_at(
    memory: Memory | str | os.PathLike[str] | None,
    backend: str = "local",
    mmap_mode: str | None = None,
    compress: bool | int | tuple[str, int] | None = None,
    verbose: int = 1,
) -> Memory:
    """The Memory of a :class:`MemorizedFunc` made directly: ``memory`` itself, or
    for joblib's form ``MemorizedFunc(func, location, backend, ...)`` a Memory of
    that location with those options."""
    if isinstance(memory, Memory):
        if backend != "local" or compress is not None:
            raise ConfigError(
                "MemorizedFunc(func, memory): backend and compress are the Memory's; "
                "give them to Memory(...), or give a location instead of a Memory"
            )
        return memory
    if memory is None:  # a MemorizedFunc needs a store; joblib fails at the first call
        raise ConfigError(
            "MemorizedFunc(func, None): no cache location; Memory(None).cache(func) "
            "gives a function that is simply called"
        )
    if not isinstance(memory, (str, os.PathLike)):
        raise ConfigTypeError(
            f"MemorizedFunc(func, memory): memory must be a Memory or a cache location "
            f"(str or pathlib.Path), got {type(memory).__name__}"
        )
    return Memory(memory, backend, mmap_mode, False if compress is None else compress, verbose)


# MemorizedFunc(func, location, ...) makes its Memory with it (func.py cannot import
# this module, which imports func.py)
MemorizedFunc.memory_at = staticmethod(memory_at)


def _rebuild_memory(
    args: tuple[Any, ...],
    allow_pickle: bool,
    secret: str | bytes | bool | None = None,
    code: str = "transitive",
    cls: type[Memory] | None = None,
    audit: AuditPolicy | None = None,
) -> Memory:
    # cls and audit are absent from what mlcache 0.3.0 and before pickled (audits on,
    # the default); a Memory whose audits were off pickles audit None
    checks: AuditPolicy | bool = (audit or False) if cls is not None else True
    return (cls or Memory)(*args, allow_pickle=allow_pickle, secret=secret, code=code, audit=checks)


_lock = threading.Lock()
_memory: Memory | None = None


def default_memory() -> Memory:
    """The process-wide default Memory, created on first use (quiet: ``verbose=0``);
    one that does not cache (warned) when its folder, from the environment, cannot be made."""
    global _memory
    with _lock:
        location = os.path.abspath(default_location())
        if _memory is None or _memory.location != location:
            try:
                _memory = Memory(location, verbose=0)
            except StoreError as exc:  # not the code's mistake: the script must still run
                warn_at_user(
                    f"mlcache: the default cache ($MLCACHE_DIR, else the user cache folder) "
                    f"cannot be used: {exc}; the functions of mlcache.cache run uncached"
                )
                return Memory(None, verbose=0)
        return _memory


def cache(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Memoize ``func`` in the default cache (``$MLCACHE_DIR`` or the user cache
    folder), with the options of :meth:`Memory.cache`.

    >>> import mlcache
    >>> @mlcache.cache  # doctest: +SKIP
    ... def features(x):
    ...     return x * 2
    """
    return default_memory().cache(func, **kwargs)
