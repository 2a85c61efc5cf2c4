"""The small objects around a memoized function: ``MemorizedResult``, the
no-cache stand-ins, ``expires_after``. Reading entries is :mod:`mlcache.entry`'s."""

from __future__ import annotations

import datetime as _dt
import functools
import time
import types
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from ..entry import decode, open_entry, read_entry_info
from ..errors import EntryNotFound
from .context import MemoContext

__all__ = [
    "ExpiresAfter",
    "MemorizedResult",
    "NotMemorizedFunc",
    "NotMemorizedResult",
    "expires_after",
]

P = ParamSpec("P")
R = TypeVar("R")


class MemorizedResult:
    """A reference to one cached result: small, picklable; ``.get()`` loads it.

    ``context`` is the :class:`~mlcache.memo.context.MemoContext` of the Memory
    that stored it (it pickles as that Memory, rebuilt where it is unpickled)."""

    def __init__(
        self, context: MemoContext, name: str, func_id: str, *, mmap_mode: str | None = None
    ) -> None:
        self.context = context
        self.name = name
        self.func_id = func_id
        self.mmap_mode = mmap_mode

    @property
    def args_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def memory(self) -> Any:
        """The :class:`~mlcache.Memory` that stored the result."""
        return self.context.owner

    @property
    def func(self) -> str:
        """The identity of the function that computed it (joblib's name for it)."""
        return self.func_id

    @property
    def store_backend(self) -> Any:
        """The store holding it (joblib's attribute; ``.location`` is the cache's)."""
        return self.context.store

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "memory" in state and "context" not in state:  # pickled by mlcache 0.1
            state["context"] = state.pop("memory").context
        self.__dict__.update(state)

    @property
    def metadata(self) -> dict[str, Any]:
        """The stored metadata: ``time``, ``duration``, ``input_args``, ``size``..."""
        return read_entry_info(self.context.store, self.name)

    def __repr__(self) -> str:
        return f"MemorizedResult(func={self.func_id!r}, args_id={self.args_id!r})"

    def get(self) -> Any:
        """The value. ``KeyError`` if it has been cleared, ``EntryCorrupted`` (a
        ``ValueError``) if it is damaged."""
        ctx = self.context
        try:
            reader = open_entry(ctx.store, self.name, self.mmap_mode, signer=ctx.signer)
        except EntryNotFound:
            raise EntryNotFound(
                f"no cached result {self.name!r} (it may have been cleared)"
            ) from None
        return decode(reader, allow_pickle=ctx.allow_pickle)

    def clear(self) -> None:
        """Remove this result from the cache."""
        self.context.store.delete(self.name)


class NotMemorizedResult:
    """A result that is not in the cache: caching is off (``location=None``), or the
    value could not be stored. ``get()`` returns the value it holds."""

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
        self, *args: P.args, **kwargs: P.kwargs
    ) -> NotMemorizedResult:
        return NotMemorizedResult(await self.func(*args, **kwargs))  # type: ignore[misc]

    async def call(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
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
    delta = _dt.timedelta(
        days=days,
        seconds=seconds,
        microseconds=microseconds,
        milliseconds=milliseconds,
        minutes=minutes,
        hours=hours,
        weeks=weeks,
    )
    return ExpiresAfter(delta)
