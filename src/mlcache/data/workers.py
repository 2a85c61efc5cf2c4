"""Building a :class:`~mlcache.data.CachedDataset` with ``num_workers``: its items
loaded in worker processes, in order, and how those are started.

On Linux the workers are forked, so nothing is run again (no script without a
main guard re-run, no import of the dataset's module while it is being
imported); the dataset reaches each worker once, then only chunks of items
travel. With other threads running (fork would be unsafe) the workers are
spawned when the main script has an ``if __name__ == "__main__":`` guard;
without one the build runs in this process with a warning. A spawned child that
re-runs a script and reaches a build raises a clear error
(:func:`refuse_in_bootstrap`); workers that die make the build finish in this
process: a build never hangs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import warn

__all__ = ["Counted", "load_in_workers", "refuse_in_bootstrap", "start_method"]

#: a parallel build first loads up to this many items (or this many seconds of
#: them) in the building process, and stays there when the rest would take less
#: than _SERIAL_BELOW seconds (2,000 tiny JSON files: 0.25 s serial, 0.37 s in 2
#: forked workers on a 2-core machine)
_PROBE_ITEMS = 32
_PROBE_SECONDS = 0.2
_SERIAL_BELOW = 1.0


def load_in_workers(dataset: Any, items: list[Any], workers: int) -> Iterator[Mapping[str, Any]]:
    """``dataset.load_item`` over ``items`` in ``workers`` processes, in order.

    The first items are loaded here, timed: when the rest would take less
    than :data:`_SERIAL_BELOW` seconds in this process, workers would cost
    more than they save (starting them, sending items and samples), and the
    build stays here. Otherwise the dataset reaches each worker once
    (inherited under fork, pickled once under spawn); then only chunks of
    items go out and lists of samples come back, a bounded number of chunks
    in flight. Workers that cannot start (a spawned child that fails while
    re-importing the main script) make the rest of the build run in this
    process, with a warning: it never waits for ever.
    """
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    spent, probe = 0.0, min(len(items), _PROBE_ITEMS)
    for i, item in enumerate(items[:probe]):
        t0 = time.perf_counter()
        sample = dataset.load_item(item)
        spent += time.perf_counter() - t0
        yield sample
        if spent > _PROBE_SECONDS:  # slow items: no need to time more of them
            probe = i + 1
            break
    items = items[probe:]
    if not items:
        return
    method = None
    if spent / probe * len(items) >= _SERIAL_BELOW:
        method = start_method(type(dataset).__qualname__)
    if method is None:
        yield from map(dataset.load_item, items)
        return
    size = _chunk_size(len(items), workers)
    chunks = deque(items[i : i + size] for i in range(0, len(items), size))
    done = 0  # items yielded so far
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_worker_start,
        initargs=(dataset,),
    )
    try:
        pending: deque[Future[list[Mapping[str, Any]]]] = deque()
        while chunks or pending:
            while chunks and len(pending) < 4 * workers:
                pending.append(pool.submit(_worker_load, chunks.popleft()))
            for sample in pending.popleft().result():
                yield sample
                done += 1
    except BrokenProcessPool as exc:
        warn(
            f"mlcache: the {workers} {method} workers building {type(dataset).__qualname__} "
            f"stopped ({exc}); loading the remaining {len(items) - done} items in this "
            "process",
            stacklevel=3,
        )
        yield from map(dataset.load_item, items[done:])
    finally:
        # a build stopped early (a sample that does not fit) does not wait for
        # the chunks still queued
        pool.shutdown(wait=True, cancel_futures=True)


#: the dataset a build's worker process loads items of (set once per worker)
_WORKER_DATASET: Any = None


def _worker_start(dataset: Any) -> None:
    global _WORKER_DATASET
    _WORKER_DATASET = dataset
    torch = sys.modules.get("torch")
    if torch is not None:
        # a forked child of a process whose OpenMP pool ran (any torch op) hangs
        # at its first parallel region; one thread per worker, as PyTorch's own
        # DataLoader workers do (the workers are the parallelism here)
        with contextlib.suppress(Exception):
            torch.set_num_threads(1)


def _worker_load(items: list[Any]) -> list[Mapping[str, Any]]:
    return [_WORKER_DATASET.load_item(item) for item in items]


def _chunk_size(n: int, workers: int) -> int:
    """Items per task: enough that a tiny item's sample is not outweighed by the
    round trip of a task (about 0.2 ms), small enough that every worker gets
    several tasks and the first samples come back early."""
    return max(1, min(256, n // (8 * workers)))


_GUARD = re.compile(
    r"""^if\s+(__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__)""", re.M
)


def _main_is_guarded() -> bool:
    """Whether a spawned child can import the main module without re-running the
    user's work: it has no file (an interactive session, ``python -c``, a
    notebook), or its source has an ``if __name__ == "__main__":`` guard."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return _GUARD.search(f.read()) is not None
    except OSError:
        return False


def _other_threads() -> int:
    """Threads other than this one, except two kinds of helpers that sleep and
    that a forked worker never needs: mlcache's hashing threads (forgotten by a
    forked child: see mlcache.keys.hashing) and tqdm's monitor (started by the first
    progress bar on a terminal, ours included; it wakes every 10 s)."""
    me = threading.current_thread()
    return sum(
        1
        for t in threading.enumerate()
        if t is not me
        and t.is_alive()
        and not t.name.startswith("mlcache-hash")
        and type(t).__name__ != "TMonitor"
    )


def start_method(what: str) -> str | None:
    """How to start a build's workers, or None to build in this process.

    fork (on Linux) runs nothing again: no script re-run, no import of the
    dataset's module, so no main guard is needed. With other threads running, a
    forked child may inherit a lock one of them held and hang, so then spawn,
    when the main module has a guard (spawn, like forkserver, imports it again
    in each worker); otherwise the build runs in this process, with a warning.
    """
    threads = _other_threads()
    if sys.platform.startswith("linux") and threads == 0:
        return "fork"
    importing = _module_being_imported()
    if importing is not None:
        # spawn workers would import that module again to unpickle the dataset,
        # and so build it again each: never workers then
        warn(
            f"mlcache: building {what} in this process, not in workers: it is built "
            f"while the module {importing!r} is being imported, which spawn workers "
            "would import (and build) again; build it in a function, or under the "
            'main script\'s `if __name__ == "__main__":` guard, to use num_workers',
            stacklevel=5,
        )
        return None
    if _main_is_guarded():
        return "spawn"
    why = (
        f"{threads} other thread{'s are' if threads > 1 else ' is'} running (fork is unsafe)"
        if sys.platform.startswith("linux")
        else "fork is not available here"
    )
    warn(
        f"mlcache: building {what} in this process, not in workers: {why}, and spawn "
        'would re-run the main script, which has no `if __name__ == "__main__":` guard; '
        "add one to use num_workers (threads: "
        f"{', '.join(sorted(t.name for t in threading.enumerate()))})",
        stacklevel=5,
    )
    return None


def _module_being_imported() -> str | None:
    """The name of a module (not the main script) whose import is running this
    code: a dataset built at the top level of a module, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name not in ("__main__", "__mp_main__"):
            module = sys.modules.get(name)
            spec = vars(module).get("__spec__") if module is not None else None
            if getattr(spec, "_initializing", False) and not name.startswith("mlcache"):
                return name
        frame = frame.f_back  # type: ignore[assignment]
    return None


def refuse_in_bootstrap(cls: type) -> None:
    """Raise when a build would start while this process is a spawned child still
    importing the main script (it re-runs the script's top level: the parent may
    hold the build's lock, and a child cannot start workers)."""
    # set by multiprocessing while a spawned child imports the main module and
    # unpickles its process object (parent_process() is not known yet then)
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    # while a spawned child prepares, __main__ may not have its __file__ yet; argv has
    # the parent's
    main = getattr(sys.modules.get("__main__"), "__file__", None) or (
        sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "the main module"
    )
    raise RuntimeError(
        f"mlcache: {cls.__qualname__} would be built in a child process that "
        f"multiprocessing spawned while it is re-running {main} (spawn imports the main "
        "script again in each child). Put the script's work under "
        '`if __name__ == "__main__":` (or build the dataset there) so that children '
        "only import it."
    )


class Counted(Iterable[Mapping[str, Any]]):
    """An iterator that knows its length, so that the progress bar shows a total."""

    def __init__(self, samples: Iterator[Mapping[str, Any]], n: int) -> None:
        self._samples, self._n = samples, n

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return self._samples

    def __len__(self) -> int:
        return self._n
