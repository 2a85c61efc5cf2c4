"""``Memory``, ``MemorizedFunc`` and ``MemorizedResult``: joblib's API, faster and safer.

Layout in the store::

    <function slug>/<code version[:16]>/<call key>     one entry file per call

Changing the function's code changes the folder, so results of old code are
never returned; the first call in a process that sees a new version removes
the folders of older versions (as joblib clears a changed function's cache).
"""

from __future__ import annotations

import datetime as _dt
import functools
import inspect
import logging
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from .callkey import CallKeyer
from .codecs import codecs, select_codec
from .config import MemoryConfig, check_mmap_mode, parse_bytes, parse_duration
from .entry import EntryReader, read_info, verify_file, write_entry
from .errors import CacheWarning, EntryCorrupted, EntryNotFound, UnsupportedValue
from .fingerprint import closure_digest, code_version, func_identity, slug
from .limits import SizeGuard, UsageLog, enforce_limits
from .store import LocalPaths, Store, stores

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
_MISS = object()


class Memory:
    """A context for caching function results on disk: a drop-in for ``joblib.Memory``.

    Parameters
    ----------
    location:
        Cache folder (``str`` or ``pathlib.Path``) or a location the backend
        understands. ``None`` disables caching: functions are simply called.
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
        Upper bound of the cache's size (``int`` or ``"10GB"``), enforced after
        every write by removing the least recently used entries.
    backend_options:
        Keyword arguments for the store backend (e.g. ``{"durable": False}``).
    allow_pickle:
        ``False`` stores only arrays and plain data and never unpickles anything.

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
        )
        self.compress = compress
        if self._config.compress is not None and mmap_mode is not None:
            warnings.warn(
                "compressed results cannot be memory-mapped; they will be read into memory",
                CacheWarning,
                stacklevel=2,
            )
        self.store: Store | None = None
        if self._config.location is not None:
            factory = stores[backend]
            try:
                self.store = factory(self._config.location, **self._config.backend_options)
            except TypeError as exc:
                raise TypeError(f"backend {backend!r} rejected backend_options: {exc}") from None
        self._usage = UsageLog(self.store) if self.store is not None else None
        self._guard = (
            SizeGuard(self.store, self.bytes_limit, self._usage)
            if self.store is not None and self._usage is not None and self.bytes_limit is not None
            else None
        )

    # joblib-compatible attributes
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
    def _verbose(self) -> int:
        return self._config.verbose

    def __repr__(self) -> str:
        return f"Memory(location={self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        c = self._config
        args = (
            c.location,
            c.backend,
            c.mmap_mode,
            self.compress,
            c.verbose,
            c.bytes_limit,
            c.backend_options,
        )
        return (_rebuild_memory, (args, c.allow_pickle))

    @overload
    def cache(
        self,
        func: Callable[P, R],
        ignore: Iterable[str] | None = ...,
        verbose: int | None = ...,
        mmap_mode: str | bool | None = ...,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = ...,
    ) -> MemorizedFunc[P, R]: ...

    @overload
    def cache(
        self,
        func: None = ...,
        ignore: Iterable[str] | None = ...,
        verbose: int | None = ...,
        mmap_mode: str | bool | None = ...,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = ...,
    ) -> Callable[[Callable[P, R]], MemorizedFunc[P, R]]: ...

    def cache(
        self,
        func: Callable[P, R] | None = None,
        ignore: Iterable[str] | None = None,
        verbose: int | None = None,
        mmap_mode: str | bool | None = False,
        cache_validation_callback: Callable[[dict[str, Any]], bool] | None = None,
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
        """
        if cache_validation_callback is not None and not callable(cache_validation_callback):
            raise TypeError(
                f"cache_validation_callback must be callable, got {cache_validation_callback!r}"
            )
        if mmap_mode is not False:
            check_mmap_mode(mmap_mode)
        if func is None:
            return functools.partial(
                self.cache,
                ignore=ignore,
                verbose=verbose,
                mmap_mode=mmap_mode,
                cache_validation_callback=cache_validation_callback,
            )
        if isinstance(func, (MemorizedFunc, NotMemorizedFunc)):
            func = func.func
        if not callable(func):
            raise TypeError(f"Memory.cache expects a callable, got {type(func).__name__}: {func!r}")
        is_async = inspect.iscoroutinefunction(func)
        if self.store is None:
            return (AsyncNotMemorizedFunc if is_async else NotMemorizedFunc)(func)
        cls = AsyncMemorizedFunc if is_async else MemorizedFunc
        return cls(
            func,
            self,
            ignore=ignore,
            verbose=self._verbose if verbose is None else verbose,
            mmap_mode=self.mmap_mode if mmap_mode is False else mmap_mode,  # type: ignore[arg-type]
            cache_validation_callback=cache_validation_callback,
        )

    def clear(self, warn: bool = True) -> None:
        """Remove every cached result of this location."""
        if self.store is None:
            return
        if warn and self._verbose:
            logger.info("[Memory] clearing the whole cache at %s", self.location)
        for top in {e.name.split("/", 1)[0] for e in self.store.list()}:
            self.store.delete(top)

    def reduce_size(
        self,
        bytes_limit: int | str | None = None,
        items_limit: int | None = None,
        age_limit: _dt.timedelta | float | str | None = None,
    ) -> None:
        """Remove least recently used entries until the cache fits the limits.

        ``bytes_limit`` defaults to the Memory's own; ``age_limit`` removes
        entries not used for that long (a ``timedelta``, seconds, or ``"7d"``).
        """
        if self.store is None:
            return
        limit = parse_bytes(bytes_limit) if bytes_limit is not None else self.bytes_limit
        if items_limit is not None and (not isinstance(items_limit, int) or items_limit < 0):
            raise ValueError(f"items_limit must be a non-negative int, got {items_limit!r}")
        age = parse_duration(age_limit)
        if limit is None and items_limit is None and age is None:
            return
        assert self._usage is not None
        self._usage.flush()
        removed = enforce_limits(
            self.store, bytes_limit=limit, items_limit=items_limit, age_limit=age
        )
        if removed and self._verbose:
            logger.info(
                "[Memory] removed %d entries (%d bytes)", len(removed), sum(e.size for e in removed)
            )

    def eval(self, func: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``func(*args, **kwargs)``, computed only if not already cached."""
        if self.store is None:
            return func(*args, **kwargs)
        return self.cache(func)(*args, **kwargs)

    def verify(self, *, fix: bool = False) -> list[str]:
        """Check every entry's checksums; return the names of damaged ones
        (removing them when ``fix`` is true)."""
        if self.store is None:
            return []
        damaged = []
        store = self.store
        for e in store.list():
            try:
                if isinstance(store, LocalPaths):
                    verify_file(store.local_path(e.name))
                else:
                    with store.open(e.name) as f:
                        EntryReader(f)
            except EntryCorrupted:
                damaged.append(e.name)
                if fix:
                    store.delete(e.name)
            except (EntryNotFound, FileNotFoundError):
                continue  # removed meanwhile
        return damaged


def _rebuild_memory(args: tuple[Any, ...], allow_pickle: bool) -> Memory:
    return Memory(*args, allow_pickle=allow_pickle)


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
    ) -> None:
        self.func = func
        self.memory = memory
        self.ignore = list(ignore or ())
        self.mmap_mode = mmap_mode
        self._verbose = verbose
        self.cache_validation_callback = cache_validation_callback
        self.func_id = func_identity(func)
        self._folder = slug(self.func_id)
        assert memory.store is not None
        self._store: Store = memory.store
        self._local = isinstance(self._store, LocalPaths)
        self._keyer: CallKeyer | None = None
        self._code_dir = ""
        self._code_path = ""  # the code folder's local path (local stores only)
        # fail now, not at the first call, on a bad ignore list
        CallKeyer(func, self.ignore, b"")
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        return f"MemorizedFunc(func={self.func!r}, location={self.memory.location!r})"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        # decorating a method in a class body: bind like a function would
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self) -> Any:
        module = sys.modules.get(getattr(self, "__module__", ""), None)
        target: Any = module
        for part in getattr(self, "__qualname__", "").split("."):
            target = getattr(target, part, None)
        if target is self:  # decorated at module level: pickle by reference
            return self.__qualname__
        return (
            _rebuild_func,
            (
                type(self),
                self.func,
                self.memory,
                self.ignore,
                self._verbose,
                self.mmap_mode,
                self.cache_validation_callback,
            ),
        )

    # -- keys ---------------------------------------------------------------
    def _prepare(self) -> CallKeyer:
        """Fingerprint the code (once per process) and drop older versions' results."""
        version = code_version(self.func)[:16]
        self._code_dir = f"{self._folder}/{version}"
        if self._local:
            # hits join keys to this path: names built here need no re-validation
            self._code_path = self._store.local_path(self._code_dir)  # type: ignore[attr-defined]
        old = {
            e.name.split("/")[1] for e in self._store.list(self._folder) if e.name.count("/") >= 2
        } - {version}
        for folder in old:
            if self._verbose:
                logger.info(
                    "[Memory] %s: code changed, removing results of the old version", self.func_id
                )
            try:
                self._store.delete(f"{self._folder}/{folder}")
            except OSError:
                pass
        prefix = "\0".join((self.func_id, version, closure_digest(self.func)))
        keyer = CallKeyer(self.func, self.ignore, prefix.encode())
        self._keyer = keyer
        return keyer

    def _name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        keyer = self._keyer or self._prepare()
        return f"{self._code_dir}/{keyer.key(args, kwargs)}"

    # -- load and store -------------------------------------------------------
    def _load(self, name: str, mmap_mode: str | None, *, validate: bool = True) -> Any:
        """The cached value of ``name`` (an entry of the current code folder), or ``_MISS``.
        Damaged entries are a miss with one warning."""
        store = self._store
        try:
            if self._local:
                key = name.rpartition("/")[2]
                reader = EntryReader(os.path.join(self._code_path, key), mmap_mode)
            else:
                with store.open(name) as f:
                    reader = EntryReader(f, mmap_mode)
            callback = self.cache_validation_callback
            if validate and callback is not None and not callback(reader.info):
                store.delete(name)
                return _MISS
            codec = codecs[reader.codec]
            if not codec.safe and not self.memory.allow_pickle:
                return _MISS  # written when pickle was allowed: never unpickle it now
            value = codec.decode(reader.codec_layout, reader)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, EntryNotFound):
            return _MISS
        except OSError as exc:  # unreadable (permissions, I/O error): leave it in place
            warnings.warn(
                f"mlcache: cannot read the cache entry of {self.func_id} ({exc}); recomputing",
                CacheWarning,
                stacklevel=4,
            )
            return _MISS
        except Exception as exc:  # damaged entry, or a codec that cannot read it
            warnings.warn(
                f"mlcache: discarding damaged cache entry of {self.func_id} "
                f"({type(exc).__name__}: {exc}); recomputing",
                CacheWarning,
                stacklevel=4,
            )
            try:
                store.delete(name)
            except OSError:
                pass
            return _MISS
        assert self.memory._usage is not None
        self.memory._usage.note(name)
        return value

    def _store_result(
        self, name: str, value: Any, duration: float, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Write ``value``; on failure warn and return None (the value is never lost)."""
        assert self._keyer is not None
        codec = select_codec(value, allow_pickle=self.memory.allow_pickle)
        info = {
            "func": self.func_id,
            "time": time.time(),
            "duration": duration,
            "input_args": self._keyer.describe(args, kwargs),
            "codec": codec.name,
        }
        try:
            encoded = codec.encode(value)
        except Exception as exc:  # e.g. a result holding a lambda or a lock
            warnings.warn(
                f"mlcache: the result of {self.func_id} cannot be stored "
                f"({type(exc).__name__}: {exc}); it is returned uncached",
                CacheWarning,
                stacklevel=4,
            )
            return None
        limit = self.memory.bytes_limit
        if limit is not None:
            size = sum(memoryview(s).nbytes for s in encoded.segments)
            if size > limit:
                warnings.warn(
                    f"mlcache: the result of {self.func_id} ({size} bytes) is larger "
                    f"than bytes_limit ({limit}); it is returned uncached",
                    CacheWarning,
                    stacklevel=4,
                )
                return None
        try:
            with self._store.write(name) as f:
                size = write_entry(f, codec.name, encoded, info, self.memory._config.compress)
        except OSError as exc:
            warnings.warn(
                f"mlcache: could not store the result of {self.func_id} in "
                f"{self.memory.location} ({exc}); it is returned uncached",
                CacheWarning,
                stacklevel=4,
            )
            return None
        info["size"] = size
        if self.memory._guard is not None:
            self.memory._guard.after_write(name, size)
        return info

    def _log_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._verbose > 0:
            assert self._keyer is not None
            shown = ", ".join(f"{k}={v}" for k, v in self._keyer.describe(args, kwargs).items())
            logger.info("[Memory] calling %s(%s)", self.func_id, shown)

    def _finish(
        self, name: str, out: Any, t0: float, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        duration = time.perf_counter() - t0
        if self._verbose > 0:
            logger.info("[Memory] %s computed in %.3fs", self.func_id, duration)
        meta = self._store_result(name, out, duration, args, kwargs)
        if meta is not None and self.mmap_mode is not None:
            # consistent with later hits: return the memory-mapped copy
            loaded = self._load(name, self.mmap_mode, validate=False)
            if loaded is not _MISS:
                out = loaded
        return out, meta or {}

    def _call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        self._log_call(args, kwargs)
        t0 = time.perf_counter()
        out = self.func(*args, **kwargs)
        return self._finish(name, out, t0, args, kwargs)

    # -- the public interface ---------------------------------------------------
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        name = self._name(args, kwargs)
        value = self._load(name, self.mmap_mode)
        if value is not _MISS:
            if self._verbose >= 10:
                logger.info("[Memory] %s: loaded from cache", self.func_id)
            return value
        return self._call(name, args, kwargs)[0]

    def call(self, *args: P.args, **kwargs: P.kwargs) -> tuple[R, dict[str, Any]]:
        """Always compute and store; return ``(output, metadata)`` as joblib does."""
        return self._call(self._name(args, kwargs), args, kwargs)

    def call_and_shelve(self, *args: P.args, **kwargs: P.kwargs) -> MemorizedResult:
        """Compute (or find) the result and return a small, picklable reference to it."""
        name = self._name(args, kwargs)
        if not self._in_cache(name):
            self._call(name, args, kwargs)
        return MemorizedResult(self.memory, name, self.func_id, mmap_mode=self.mmap_mode)

    def check_call_in_cache(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """True if a valid result for these arguments is cached (nothing is computed)."""
        return self._in_cache(self._name(args, kwargs))

    def _in_cache(self, name: str) -> bool:
        if not self._store.exists(name):
            return False
        if self.cache_validation_callback is None:
            return True
        try:
            if self._local:
                info = read_info(self._store.local_path(name))  # type: ignore[attr-defined]
            else:
                with self._store.open(name) as f:
                    info = EntryReader(f).info
        except (OSError, EntryCorrupted, EntryNotFound):
            return False
        return bool(self.cache_validation_callback(info))

    def clear(self, warn: bool = True) -> None:
        """Remove every cached result of this function (all code versions)."""
        if warn and self._verbose:
            logger.info("[Memory] clearing the cache of %s", self.func_id)
        self._store.delete(self._folder)


class AsyncMemorizedFunc(MemorizedFunc[P, R]):
    """A memoized ``async def`` function: awaiting it computes or loads."""

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:  # type: ignore[override]
        name = self._name(args, kwargs)
        value = self._load(name, self.mmap_mode)
        if value is not _MISS:
            return value
        return (await self._acall(name, args, kwargs))[0]

    async def _acall(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        self._log_call(args, kwargs)
        t0 = time.perf_counter()
        out = await self.func(*args, **kwargs)  # type: ignore[misc]
        return self._finish(name, out, t0, args, kwargs)

    async def call(self, *args: P.args, **kwargs: P.kwargs) -> tuple[R, dict[str, Any]]:  # type: ignore[override]
        return await self._acall(self._name(args, kwargs), args, kwargs)

    async def call_and_shelve(self, *args: P.args, **kwargs: P.kwargs) -> MemorizedResult:  # type: ignore[override]
        name = self._name(args, kwargs)
        if not self._in_cache(name):
            await self._acall(name, args, kwargs)
        return MemorizedResult(self.memory, name, self.func_id, mmap_mode=self.mmap_mode)


def _rebuild_func(
    cls: type[MemorizedFunc[Any, Any]],
    func: Callable[..., Any],
    memory: Memory,
    ignore: list[str],
    verbose: int,
    mmap_mode: str | None,
    callback: Callable[[dict[str, Any]], bool] | None,
) -> MemorizedFunc[Any, Any]:
    return cls(
        func,
        memory,
        ignore=ignore,
        verbose=verbose,
        mmap_mode=mmap_mode,
        cache_validation_callback=callback,
    )


class MemorizedResult:
    """A reference to one cached result: small, picklable; ``.get()`` loads it."""

    def __init__(
        self, memory: Memory, name: str, func_id: str, *, mmap_mode: str | None = None
    ) -> None:
        self.memory = memory
        self.name = name
        self.func_id = func_id
        self.mmap_mode = mmap_mode

    @property
    def args_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    def __repr__(self) -> str:
        return f"MemorizedResult(func={self.func_id!r}, args_id={self.args_id!r})"

    def get(self) -> Any:
        """The value; ``KeyError`` if it has been cleared (or is damaged)."""
        store = self.memory.store
        assert store is not None
        try:
            if isinstance(store, LocalPaths):
                reader = EntryReader(store.local_path(self.name), self.mmap_mode)
            else:
                with store.open(self.name) as f:
                    reader = EntryReader(f, self.mmap_mode)
        except (FileNotFoundError, EntryNotFound):
            raise EntryNotFound(
                f"no cached result {self.name!r} (it may have been cleared)"
            ) from None
        codec = codecs[reader.codec]
        if not codec.safe and not self.memory.allow_pickle:
            raise UnsupportedValue(f"{self.name!r} needs pickle, and pickle is disabled")
        return codec.decode(reader.codec_layout, reader)

    def clear(self) -> None:
        """Remove this result from the cache."""
        assert self.memory.store is not None
        self.memory.store.delete(self.name)


class NotMemorizedResult:
    """What ``call_and_shelve`` returns when caching is off (``location=None``)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._valid = True

    def get(self) -> Any:
        if not self._valid:
            raise KeyError("no value: this result was cleared")
        return self.value

    def clear(self) -> None:
        self._valid = False
        self.value = None


class NotMemorizedFunc(Generic[P, R]):
    """What ``Memory(None).cache`` returns: the function, called every time."""

    def __init__(self, func: Callable[P, R]) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> tuple[R, dict[str, Any]]:
        return self.func(*args, **kwargs), {}

    def call_and_shelve(self, *args: P.args, **kwargs: P.kwargs) -> NotMemorizedResult:
        return NotMemorizedResult(self.func(*args, **kwargs))

    def check_call_in_cache(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        return False

    def clear(self, warn: bool = True) -> None:
        pass


class AsyncNotMemorizedFunc(NotMemorizedFunc[P, R]):
    async def call_and_shelve(  # type: ignore[override]
        self,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> NotMemorizedResult:
        return NotMemorizedResult(await self.func(*args, **kwargs))  # type: ignore[misc]

    async def call(  # type: ignore[override]
        self,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> tuple[R, dict[str, Any]]:
        return await self.func(*args, **kwargs), {}  # type: ignore[misc]


class ExpiresAfter:
    """A picklable ``cache_validation_callback``: results older than ``delta`` are stale."""

    def __init__(self, delta: _dt.timedelta) -> None:
        self.delta = delta

    def __call__(self, metadata: dict[str, Any]) -> bool:
        created = metadata.get("time")
        if not isinstance(created, (int, float)):
            return False
        return time.time() - created < self.delta.total_seconds()

    def __repr__(self) -> str:
        return f"expires_after({self.delta})"


def expires_after(
    days: float = 0,
    seconds: float = 0,
    microseconds: float = 0,
    milliseconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    weeks: float = 0,
) -> ExpiresAfter:
    """A ``cache_validation_callback`` that recomputes results older than the duration.

    >>> from mlcache import Memory, expires_after
    >>> mem = Memory(None)
    >>> f = mem.cache(lambda x: x, cache_validation_callback=expires_after(hours=1))
    """
    return ExpiresAfter(
        _dt.timedelta(
            days=days,
            seconds=seconds,
            microseconds=microseconds,
            milliseconds=milliseconds,
            minutes=minutes,
            hours=hours,
            weeks=weeks,
        )
    )
