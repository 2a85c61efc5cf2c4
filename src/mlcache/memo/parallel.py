"""``cached_map``: a memoized function over many items, computing only what is
missing, on threads, processes or a Dask cluster.

With a shared store (``Memory("s3://...")``), every worker stores what it
computes where every other worker and every later run finds it; a second run of
the same map computes nothing.
"""

from __future__ import annotations

import concurrent.futures
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .._util import progress as progress_bar
from .func import MemorizedFunc

__all__ = ["EXECUTORS", "cached_map"]

T = TypeVar("T")
#: what ``cached_map(executor=...)`` accepts
EXECUTORS = ("threads", "processes", "dask")


def cached_map(
    func: MemorizedFunc[Any, T],
    items: Iterable[Any],
    *,
    executor: str | None = None,
    client: Any = None,
    workers: int | None = None,
    progress: bool = True,
    star: bool = False,
    backend: str | None = None,
) -> list[T]:
    """``[func(item) for item in items]``, with the items whose result is not cached
    yet computed in parallel first.

    Parameters
    ----------
    func:
        A memoized function (``mem.cache(f)``), called with one item each.
    executor:
        ``"threads"`` (the default: for functions that release the GIL, numpy
        and most I/O), ``"processes"`` (a local process pool) or ``"dask"`` (the
        ``client``'s cluster, or the current one).
    workers:
        Threads or processes (default: the executor's own choice).
    progress:
        A progress bar of the computations (tqdm, quiet off a terminal).
    star:
        Each item is a tuple of arguments: ``func(*item)``.
    backend:
        Deprecated name of ``executor`` (it clashed with ``Memory(backend=)``,
        the store); accepted with a ``DeprecationWarning`` for one release.

    Returns
    -------
    list
        The results in the order of ``items``: cached ones as a hit returns
        them, computed ones as the workers returned them; with ``mmap_mode="r"``
        those are loaded from the cache too, so that they carry their entry's name
        as hits do (passed on to the next memoized step, they are not hashed again).

    Examples
    --------
    >>> import tempfile
    >>> from mlcache import Memory, cached_map
    >>> square = Memory(tempfile.mkdtemp(), verbose=0).cache(lambda x: x * x)
    >>> cached_map(square, [1, 2, 3], progress=False)
    [1, 4, 9]
    """
    if backend is not None:
        if executor is not None:
            raise TypeError("cached_map takes executor= or its old name backend=, not both")
        warnings.warn(
            "cached_map(backend=) is deprecated: it is now cached_map(executor=) "
            "(backend= names the store in Memory(backend=))",
            DeprecationWarning,
            stacklevel=2,
        )
        executor = backend
    if executor is None:
        executor = "threads"
    if not isinstance(func, MemorizedFunc):
        raise TypeError(
            f"cached_map needs a memoized function (mem.cache(f)), got {type(func).__name__}"
        )
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {executor!r}")
    args = [tuple(x) if star else (x,) for x in items]
    # what is cached already: one lookup per item, on threads (a remote store's
    # lookups are round trips)
    with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(args)))) as pool:
        cached = list(pool.map(lambda a: func.check_call_in_cache(*a), args))
    missing = [i for i, hit in enumerate(cached) if not hit]
    computed: dict[int, Any] = {}
    if missing:
        todo = [args[i] for i in missing]
        done = _run(_Star(func), todo, executor, client, workers)
        shown = progress_bar(
            done, f"computing {func.func_id}", total=len(todo), unit="item", enabled=progress
        )
        # strict: the bar's iterator is run to its end, which closes the bar
        for i, value in zip(missing, shown, strict=True):
            computed[i] = value
    # with mmap_mode="r" a hit's result carries its entry's name (chaining): load
    # the computed ones too, so that every run returns the same kind of value
    reload = func.mmap_mode == "r"
    return [computed[i] if i in computed and not reload else func(*a) for i, a in enumerate(args)]


class _Star:
    """``func(*args)`` as a one-argument callable that pickles (for the workers)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __call__(self, args: tuple[Any, ...]) -> Any:
        return self.func(*args)


def _run(
    func: Callable[[Any], Any], todo: list[Any], executor: str, client: Any, workers: int | None
) -> Iterator[Any]:
    """The results of ``func`` over ``todo``, in order, as they can be had."""
    if executor == "dask":
        if client is None:
            from distributed import get_client

            client = get_client()
        futures = client.map(func, todo, pure=False)
        for future in futures:
            yield future.result()
        return
    pool: concurrent.futures.Executor
    if executor == "threads":
        pool = concurrent.futures.ThreadPoolExecutor(workers)
    else:
        pool = concurrent.futures.ProcessPoolExecutor(workers)
    with pool:
        yield from pool.map(func, todo)
