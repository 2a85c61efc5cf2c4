"""Building a :class:`~mlcache.data.CachedDataset` with ``num_workers``: its items
loaded in worker processes, in order, and how those are started.

Two entry points: :func:`load_many` yields ``(index, sample)`` for every item of
a list (``index`` its position in the list), in that order, and
:func:`load_in_workers` the samples alone (the up-front build's
``load_source()``). Either one can be given any list of items (the ones that
still need loading, for a pack that fills as it is read); each starts its
workers at most once per call, and stays in this process when workers would
not pay (``workers`` below 2, fewer than 2 items, a daemonic process such as a
DataLoader worker, which cannot have children, or items too quick to load).

How a call goes:

1. **Probe.** The first items are loaded here for :data:`_PROBE_SECONDS`,
   timed, with the cost of sending their samples back (a pickle round trip)
   and what the machine gave this process meanwhile (its CPU time, its wait
   for a CPU, the CPUs left idle: :class:`~mlcache.data.planning.Machine`).
   The first item is loaded before the probe: it often pays for imports
   (pandas on first use) that forked workers inherit.
2. **Decide** (:func:`~mlcache.data.planning.plan_workers`, a pure function of
   those figures). Workers are as fast as the CPUs left to them: CPU-bound
   items on a machine whose other cores are busy load no faster in two
   processes than in one (measured: slower), while items that wait on files
   or a network go faster whatever the CPUs do. They are used (as many as the
   free CPUs round to) when the rest is predicted to take at most
   :data:`~mlcache.data.planning.WORTH` of its time here. With ``S`` the time
   the workers take to start (:data:`_START_SECONDS`, or the last start
   measured in this process when it was quicker: a fork is cheap; a spawned
   child imports the main module and the dataset's again), during which this
   process goes on loading, the rest takes ``S + (here - S) / speed-up``, plus
   sending every sample back. 2,000 tiny JSON items (tens of microseconds
   each) stay here; 8,000 small CSV files parsed by pandas (about a
   millisecond each) go to workers when a core is free. When none is, this
   process goes on loading and looks again after every :data:`_RECHECK_SECONDS`
   (a build started while another job held the CPUs uses its workers once it
   ends).
3. **Load in workers, write here.** The workers are started once, the
   dataset reaching each of them once (inherited under fork, pickled once
   under spawn). This process goes on loading, in order, until one is ready;
   then only chunks of items go out and lists of samples come back. A
   chunk is about :data:`_CHUNK_SECONDS` of loading by the probe's timing
   (so that a round trip, about 0.2 ms, is noise, and the last chunks leave
   no core idle for long), with at least four chunks per worker and
   :data:`_IN_FLIGHT` per worker queued, so that a worker never waits for the
   building process, which only writes.

On Linux the workers are forked, so nothing is run again (no script without a
main guard re-run, no import of the dataset's module while it is being
imported). With other threads running (fork would be unsafe) the workers are
spawned when the main script has an ``if __name__ == "__main__":`` guard;
without one the build runs in this process with a warning. A spawned child that
re-runs a script and reaches a build raises a clear error
(:func:`refuse_in_bootstrap`); workers that die make the build finish in this
process, with one warning: a build never hangs; and a building process that
is killed takes its workers with it (on Linux). An error raised by
``load_item`` in a worker is raised here, as it would be in a serial build, and
a caller that stops early (closes the iterator) stops the workers without
waiting for the chunks still queued.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import warn_at_user
from .planning import Machine, Snapshot, cpus, machine_since, plan_workers

#: (a child of mlcache's logger: its decisions can be followed alone)
logger = logging.getLogger("mlcache.workers")

__all__ = [
    "Counted",
    "WorkerError",
    "load_in_workers",
    "load_many",
    "refuse_in_bootstrap",
    "start_method",
]

#: the probe loads items here for this many seconds (at 10 ms a tick of
#: /proc/stat's idle time, a tenth of a core is what it can tell apart on 2 CPUs)
_PROBE_SECONDS = 0.1
#: the samples whose round trip (pickle + unpickle) the probe times, after which
#: it tells whether the items are too quick for workers: a few tell their cost
#: (timing each of 2,000 tiny JSON items made their loading 2x slower; the round
#: trips of 32 samples holding an array were 2.5% of a build of 500)
_TRANSFER_ITEMS = 8
#: while the CPUs are taken, the loading here is looked at again after this many
#: seconds (a build that started on a busy machine uses workers once a core is free)
_RECHECK_SECONDS = 0.5
#: the seconds from starting the workers to the first one ready, by start
#: method, at most (on a 2-core VM: 15-50 ms to fork two; 0.5-2 s to spawn two,
#: each a new interpreter importing numpy, mlcache, the main module and the
#: dataset's). A start measured slower (a machine busy for a while) does not
#: raise it: this process goes on loading while workers start, so a slow start
#: costs little, and one slow start must not keep every later build serial
_START_SECONDS = {"fork": 0.05, "spawn": 0.5}
#: the last start measured in this process, by start method
_started: dict[str, float] = {}
#: the loading time a chunk of items is sized to, by the probe's timing
_CHUNK_SECONDS = 0.05
#: chunks queued or running per worker
_IN_FLIGHT = 3


def load_in_workers(
    dataset: Any, items: Sequence[Any], workers: int
) -> Iterator[Mapping[str, Any]]:
    """``dataset.load_item`` over ``items``, in ``workers`` processes when they
    pay, in order: the samples of :func:`load_many`."""
    for _, sample in load_many(dataset, items, workers):
        yield sample


def load_many(
    dataset: Any, items: Sequence[Any], workers: int
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(i, dataset.load_item(items[i]))`` for every item, in order, loaded in
    ``workers`` processes when they pay (see the module's docstring).

    Parameters
    ----------
    dataset:
        The object whose ``load_item(item)`` makes a sample (a
        :class:`~mlcache.data.CachedDataset`); under spawn it is pickled once
        per worker.
    items:
        The items to load (a list: its length and slices are used).
    workers:
        The most worker processes to use; 0 or 1 loads here.

    Yields
    ------
    tuple
        The index of the item in ``items`` and its sample, for every item,
        in the order of ``items``.

    >>> class Squares:
    ...     def load_item(self, i):
    ...         return {"sq": i * i}
    >>> [(i, s["sq"]) for i, s in load_many(Squares(), [3, 4], workers=2)]
    [(0, 9), (1, 16)]
    """
    items = list(items)
    n = len(items)
    if workers <= 1 or n < 2 or multiprocessing.current_process().daemon:
        for i, item in enumerate(items):
            yield i, dataset.load_item(item)
        return
    # the first item often pays for imports the others (and forked workers) do
    # not: it is loaded before the probe, which times the items after it
    yield 0, dataset.load_item(items[0])
    done = 1  # items yielded so far
    per_transfer: float | None = None  # pickle + unpickle of a sample, by the first window
    method = ""  # the start method, chosen when workers first pay
    window = _PROBE_SECONDS
    quick = False
    while True:
        # a window of loading here, timed; then the decision, with what it measured
        times: list[float] = []
        transfer = 0.0
        before = Snapshot.now()
        while done < n:
            t0 = time.perf_counter()
            sample = dataset.load_item(items[done])
            t1 = time.perf_counter()
            times.append(t1 - t0)
            if per_transfer is None and len(times) <= _TRANSFER_ITEMS:
                transfer += _round_trip(sample)
            yield done, sample
            done += 1
            if per_transfer is None and len(times) == _TRANSFER_ITEMS:
                quick = _too_quick(n - done, times, transfer, workers)
            if t1 - before.wall > window or quick:
                break
        if done == n:
            return
        if quick:  # too quick for workers on any machine: no more clocks read
            break
        machine = machine_since(before)
        if per_transfer is None:
            per_transfer = transfer / min(len(times), _TRANSFER_ITEMS)
        per_item = sum(times) / len(times)
        plan = _plan_if_worth(dataset, n - done, per_item, per_transfer, workers, machine, method)
        if isinstance(plan, tuple):
            yield from _in_pool(dataset, items, done, plan[1], plan[0], per_item)
            return
        if plan is None:  # workers cannot be started: every item here
            break
        # not now (the CPUs are taken): look again after the next window
        method, window = plan, _RECHECK_SECONDS
    for i in range(done, n):
        yield i, dataset.load_item(items[i])


def _too_quick(rest: int, times: list[float], transfer: float, workers: int) -> bool:
    """Whether the ``rest`` items, at the pace of the first ones (their load
    ``times``, their samples' round trips ``transfer`` in all), would not pay
    for workers even on an idle machine: then they are loaded with no timing
    (timing each of 2,000 tiny JSON items made them 1.07x slower)."""
    idle = Machine(cpus=cpus(), cpu_share=1.0, run_share=1.0, idle_cores=cpus() - 1.0)
    per_item, per_transfer = sum(times) / len(times), transfer / len(times)
    return not plan_workers(
        rest, per_item, per_transfer, workers, idle, min(_START_SECONDS.values())
    )


def _round_trip(sample: Any) -> float:
    """Seconds to send ``sample`` back from a worker, as measured here: a pickle
    and an unpickle (a sample that cannot be pickled counts as free: it fails in
    the worker, and the error is raised here)."""
    t0 = time.perf_counter()
    try:
        pickle.loads(pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0.0
    return time.perf_counter() - t0


def _plan_if_worth(
    dataset: Any,
    rest: int,
    per_item: float,
    per_transfer: float,
    workers: int,
    machine: Machine,
    method: str,
) -> tuple[str, int] | str | None:
    """The start method and number of the workers when they pay for the ``rest``
    items now (see :func:`plan_workers`); else the start method to assume at the
    next look (``""``: not chosen yet), or None when workers cannot be started
    (:func:`start_method` said why, once).

    The start method is chosen only when workers would pay with the cheapest
    start (fork, on Linux): no warning about a spawn that would not pay."""

    def plan(method: str) -> int:
        start = min(_started.get(method, _START_SECONDS[method]), _START_SECONDS[method])
        return plan_workers(rest, per_item, per_transfer, workers, machine, start)

    n = plan(method or ("fork" if sys.platform.startswith("linux") else "spawn"))
    if n and not method:
        chosen = start_method(type(dataset).__qualname__)
        if chosen is None:
            return None
        method = chosen
        n = plan(method)
    logger.debug(
        "mlcache: %d items of %.3g ms each: %s (%s)",
        rest,
        per_item * 1e3,
        f"{n} {method} workers" if n else "loaded here for now",
        machine,
    )
    return (method, n) if n else method


def _in_pool(
    dataset: Any, items: list[Any], first: int, workers: int, method: str, per_item: float
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(i, sample)`` for the items from ``first`` on, loaded in a pool of
    ``workers`` processes started with ``method``.

    While the workers start (a fork: milliseconds; a spawn: a new interpreter
    importing the main module), this process goes on loading, in order; from
    the moment one is ready, it only writes, and the rest goes out in chunks
    sized by ``per_item``, the probe's time per item."""
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    n = len(items)
    done = first  # items yielded so far
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_worker_start,
        initargs=(dataset, os.getpid()),
    )
    _started.pop(method, None)  # this start's, from the first worker ready
    started = time.perf_counter()

    def measure_start(f: Future[None]) -> None:
        if not f.cancelled() and f.exception() is None:
            _started.setdefault(method, time.perf_counter() - started)

    try:
        ready = [pool.submit(_worker_ready) for _ in range(workers)]
        for f in ready:
            f.add_done_callback(measure_start)
        while done < n and not any(f.done() for f in ready):
            yield done, dataset.load_item(items[done])
            done += 1
        size = _chunk_size(n - done, per_item, workers)
        starts = deque(range(done, n, size))
        pending: deque[Future[_Loaded]] = deque()
        while starts or pending:
            while starts and len(pending) < _IN_FLIGHT * workers:
                at = starts.popleft()
                pending.append(pool.submit(_worker_load, items[at : at + size]))
            samples, error = pending.popleft().result()
            for sample in samples:
                yield done, sample
                done += 1
            if error is not None:  # as a serial build: every sample before it, then it
                raise error[0] from WorkerError(error[1])
    except BrokenProcessPool as exc:
        warn_at_user(
            f"mlcache: the {workers} {method} workers building {type(dataset).__qualname__} "
            f"stopped ({exc}); loading the remaining {n - done} items in this process",
        )
        for i in range(done, n):
            yield i, dataset.load_item(items[i])
    finally:
        # a build stopped early (a sample that does not fit) does not wait for
        # the chunks still queued
        pool.shutdown(wait=True, cancel_futures=True)


#: the dataset a build's worker process loads items of (set once per worker)
_WORKER_DATASET: Any = None


def _worker_start(dataset: Any, parent: int) -> None:
    global _WORKER_DATASET
    if getattr(dataset, "elsewhere", False):
        # a spawned worker whose copy reads other values than the building process
        # (a value set under the main guard: mlcache.data.copies said so): its
        # samples are not the pack's. It ends; the pool breaks, and the building
        # process, whose values name the pack, loads the rest itself
        os._exit(1)
    _WORKER_DATASET = dataset
    _exit_with(parent)
    torch = sys.modules.get("torch")
    if torch is not None:
        # a forked child of a process whose OpenMP pool ran (any torch op) hangs
        # at its first parallel region; one thread per worker, as PyTorch's own
        # DataLoader workers do (the workers are the parallelism here)
        with contextlib.suppress(Exception):
            torch.set_num_threads(1)


def _exit_with(parent: int) -> None:
    """End this worker when the building process ends (on Linux): a build killed
    (SIGKILL) leaves no worker waiting for ever for chunks that never come."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # SIGKILL, not SIGTERM: a handler the user set in the building process
        # (inherited by a fork) must not run here; a worker has nothing to clean up
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: the worker ends with its queue
        return
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(0)


#: a chunk's samples, and the error that stopped it (with its traceback's text)
_Loaded = tuple[list[Mapping[str, Any]], "tuple[Exception, str] | None"]


class WorkerError(Exception):
    """The traceback, in the worker, of an error ``load_item`` raised there (the
    ``__cause__`` of that error when it is raised in the building process)."""


def _worker_ready() -> None:
    """Nothing: its result says a worker has started."""


def _worker_load(items: list[Any]) -> _Loaded:
    """The samples of ``items`` up to the first error, and that error: the
    building process yields the samples before raising it, as a serial build."""
    samples = []
    try:
        for item in items:
            samples.append(_WORKER_DATASET.load_item(item))
    except Exception as exc:
        import traceback

        text = "".join(traceback.format_exception(exc))
        try:
            pickle.dumps(exc)
        except Exception:  # it would not reach the building process: its text does
            exc = RuntimeError(f"{type(exc).__qualname__}: {exc}")
        return samples, (exc, text)
    return samples, None


def _chunk_size(rest: int, per_item: float, workers: int) -> int:
    """Items per chunk: about :data:`_CHUNK_SECONDS` of loading (a round trip,
    about 0.2 ms, is then noise, and the last chunks leave no core idle for
    long), and at least four chunks per worker."""
    by_time = int(_CHUNK_SECONDS / max(per_item, 1e-7))
    return max(1, min(by_time, -(-rest // (4 * workers))))


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
    """Threads other than this one, except helpers that a forked child never
    inherits in use: mlcache's hashing threads (forgotten by a forked child: see
    mlcache.keys.hashing), tqdm's monitor (started by the first progress bar on a
    terminal, ours included; it wakes every 10 s), and fsspec's event loop
    (``fsspecIO``, started by the first async file system such as S3: fsspec makes
    a new loop in a forked child, ``os.register_at_fork``) with the idle threads of
    its loop's default executor (``asyncio_N``: DNS lookups)."""
    me = threading.current_thread()
    return sum(
        1
        for t in threading.enumerate()
        if t is not me
        and t.is_alive()
        and not t.name.startswith("mlcache-hash")
        and type(t).__name__ != "TMonitor"
        and t.name != "fsspecIO"
        and not t.name.startswith("asyncio_")
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
        warn_at_user(
            f"mlcache: building {what} in this process, not in workers: it is built "
            f"while the module {importing!r} is being imported, which spawn workers "
            "would import (and build) again; build it in a function, or under the "
            'main script\'s `if __name__ == "__main__":` guard, to use num_workers',
        )
        return None
    if _main_is_guarded():
        return "spawn"
    why = (
        f"{threads} other thread{'s are' if threads > 1 else ' is'} running (fork is unsafe)"
        if sys.platform.startswith("linux")
        else "fork is not available here"
    )
    warn_at_user(
        f"mlcache: building {what} in this process, not in workers: {why}, and spawn "
        'would re-run the main script, which has no `if __name__ == "__main__":` guard; '
        "add one to use num_workers (threads: "
        f"{', '.join(sorted(t.name for t in threading.enumerate()))})",
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
