"""``cached_map``: a memoized function over many items, computing only what is
missing, on threads, processes or a Dask cluster.

With a shared store (``Memory("s3://...")``), every worker stores what it
computes where every other worker and every later run finds it; a second run of
the same map computes nothing.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .func import MemorizedFunc

__all__ = ["BACKENDS", "cached_map"]

T = TypeVar("T")
#: what ``cached_map(backend=...)`` accepts
BACKENDS = ("threads", "processes", "dask")


def cached_map(
    func: MemorizedFunc[Any, T],
    items: Iterable[Any],
    *,
    backend: str = "threads",
    client: Any = None,
    workers: int | None = None,
    progress: bool = True,
    star: bool = False,
) -> list[T]:
    """``[func(item) for item in items]``, with the items whose result is not cached
    yet computed in parallel first.

    Parameters
    ----------
    func:
        A memoized function (``mem.cache(f)``), called with one item each.
    backend:
        ``"threads"`` (the default: for functions that release the GIL, numpy
        and most I/O), ``"processes"`` (a local process pool) or ``"dask"`` (the
        ``client``'s cluster, or the current one).
    workers:
        Threads or processes (default: the executor's own choice).
    progress:
        A progress bar of the computations (tqdm, quiet off a terminal).
    star:
        Each item is a tuple of arguments: ``func(*item)``.

    Results come back in the order of ``items``: cached ones as a hit returns
    them, computed ones as the workers returned them; with ``mmap_mode="r"``
    those are loaded from the cache too, so that they carry their entry's name
    as hits do (passed on to the next memoized step, they are not hashed again).
    """
    if not isinstance(func, MemorizedFunc):
        raise TypeError(
            f"cached_map needs a memoized function (mem.cache(f)), got {type(func).__name__}"
        )
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    args = [tuple(x) if star else (x,) for x in items]
    # what is cached already: one lookup per item, on threads (a remote store's
    # lookups are round trips)
    with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(args)))) as pool:
        cached = list(pool.map(lambda a: func.check_call_in_cache(*a), args))
    missing = [i for i, hit in enumerate(cached) if not hit]
    computed: dict[int, Any] = {}
    if missing:
        todo = [args[i] for i in missing]
        done = _run(_Star(func), todo, backend, client, workers)
        for i, value in zip(missing, _progress(done, len(todo), progress, func)):
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
    func: Callable[[Any], Any], todo: list[Any], backend: str, client: Any, workers: int | None
) -> Iterator[Any]:
    """The results of ``func`` over ``todo``, in order, as they can be had."""
    if backend == "dask":
        if client is None:
            from distributed import get_client

            client = get_client()
        futures = client.map(func, todo, pure=False)
        for future in futures:
            yield future.result()
        return
    pool: concurrent.futures.Executor
    if backend == "threads":
        pool = concurrent.futures.ThreadPoolExecutor(workers)
    else:
        pool = concurrent.futures.ProcessPoolExecutor(workers)
    with pool:
        yield from pool.map(func, todo)


def _progress(results: Iterator[Any], total: int, show: bool, func: Any) -> Iterator[Any]:
    if not show:
        yield from results
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:
        yield from results
        return
    with tqdm(total=total, desc=f"computing {func.func_id}", unit="item", disable=None) as bar:
        for value in results:
            bar.update()
            yield value
