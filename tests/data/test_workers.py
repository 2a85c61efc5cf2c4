"""mlcache.data.workers: items loaded in worker processes, in order, only when
workers pay, and never a hang or a wrong sample when one fails."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest

from mlcache.data import CachedDataset
from mlcache.data.workers import WorkerError, load_in_workers, load_many
from mlcache.errors import CacheWarning

PARENT = os.getpid()


@pytest.fixture(autouse=True)
def _no_start_measured_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test decides from the default start costs (a start an earlier test
    measured, a spawn on a loaded machine: seconds, would keep these builds
    serial), and as in a fresh process: idle threads earlier tests of the run left
    (Dask's offload pool) would make these builds spawn; how threads decide the
    start method is tested by test_a_build_after_s3_was_used_still_forks and
    tests/compat/test_dataset_cached.py."""
    from mlcache.data import workers

    monkeypatch.setattr(workers, "_started", {})
    monkeypatch.setattr(workers, "_other_threads", lambda: 0)


class Slow:
    """Items of 5 ms each (a sleep: they pay for workers even on a busy machine)."""

    def __init__(self, seconds: float = 0.005) -> None:
        self.seconds = seconds

    def load_item(self, i: int) -> dict[str, Any]:
        time.sleep(self.seconds)
        return {"i": i, "pid": os.getpid(), "x": np.full(3, i, np.float32)}


class Quick:
    """Items of microseconds each: workers would cost more than they save."""

    def load_item(self, i: int) -> dict[str, Any]:
        return {"i": i, "pid": os.getpid()}


class Failing(Slow):
    """Raises on one item, in whichever process loads it."""

    def load_item(self, i: int) -> dict[str, Any]:
        if i == 150:
            raise LookupError(f"no item {i}")
        return super().load_item(i)


class Dying(Slow):
    """A worker that loads item 120 dies (this process loads it fine)."""

    def load_item(self, i: int) -> dict[str, Any]:
        if i == 120 and os.getpid() != PARENT:
            os._exit(3)
        return super().load_item(i)


def test_slow_items_are_loaded_in_workers_in_order() -> None:
    items = list(range(200, 400))
    got = list(load_many(Slow(), items, 2))
    assert [i for i, _ in got] == list(range(200))
    assert [s["i"] for _, s in got] == items
    np.testing.assert_array_equal(got[199][1]["x"], np.full(3, 399, np.float32))
    pids = {s["pid"] for _, s in got}
    assert len(pids - {os.getpid()}) == 2  # both workers loaded
    # the probe ran here, then only the workers loaded: the building process writes
    here = [i for i, s in got if s["pid"] == os.getpid()]
    assert here == list(range(len(here))) and 0 < len(here) <= 32


def test_one_slow_start_does_not_keep_later_builds_serial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start measured slow (a machine busy for a while) counts no more than the
    default: the next build of slow items still uses its workers."""
    from mlcache.data import workers

    monkeypatch.setattr(workers, "_started", {"fork": 30.0, "spawn": 30.0})
    got = list(load_many(Slow(), range(200), 2))
    assert {s["pid"] for _, s in got} - {os.getpid()}
    assert workers._started["fork"] < 30.0  # this start, measured


def _machine(idle: float) -> Any:
    """What the probe measures, given: CPU-bound loads that had a core, with
    ``idle`` cores left (the real figures depend on the machine the tests share)."""
    from mlcache.data.planning import Machine

    return Machine(cpus=2, cpu_share=1.0, run_share=1.0, idle_cores=idle)


def test_cpu_bound_items_stay_here_while_the_other_core_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the workers were started whatever the machine gave, and then
    loaded slower than this process alone (0.73-0.93x measured)."""
    from mlcache.data import workers

    looks: list[Any] = []
    monkeypatch.setattr(workers, "machine_since", lambda before: looks.append(1) or _machine(0))
    got = list(load_many(Slow(0.002), range(300), 2))
    assert [s["i"] for _, s in got] == list(range(300))
    assert {s["pid"] for _, s in got} == {os.getpid()}
    assert len(looks) >= 2  # looked again after the probe: a core might have come free


def test_a_build_uses_its_workers_once_a_core_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started while another job held the CPUs, the build loads here, looks
    again, and hands the rest to its workers when a core is free."""
    from mlcache.data import workers

    looks: list[Any] = []

    def measured(before: Any) -> Any:
        looks.append(before)
        return _machine(0.0 if len(looks) == 1 else 1.0)

    monkeypatch.setattr(workers, "machine_since", measured)
    got = list(load_many(Slow(0.002), range(600), 2))  # 1.2 s here; 0.1 + 0.5 s windows
    assert [s["i"] for _, s in got] == list(range(600))
    here = [i for i, s in got if s["pid"] == os.getpid()]
    assert len(looks) == 2
    assert here == list(range(len(here)))  # the first windows, then workers
    assert len({s["pid"] for _, s in got} - {os.getpid()}) == 2


class FirstImports(Slow):
    """The first load pays for an import (a clock read stands for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_done: list[float] = []

    def load_item(self, i: int) -> dict[str, Any]:
        sample = super().load_item(i)
        if i == 0:
            self.first_done.append(time.process_time())
        return sample


def test_the_first_item_is_not_in_the_probes_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its imports (pandas: CPU-bound, a third of a second) would make items that
    wait look CPU-bound to the rule; forked workers inherit them anyway."""
    from mlcache.data import workers

    ds, windows = FirstImports(), []

    def measured(before: Any) -> Any:
        windows.append(before)
        return _machine(1.0)

    monkeypatch.setattr(workers, "machine_since", measured)
    got = list(load_many(ds, range(100), 2))
    assert [s["i"] for _, s in got] == list(range(100))
    assert windows[0].cpu >= ds.first_done[0]  # the probe's clocks start after it


def test_load_in_workers_yields_the_samples_alone() -> None:
    samples = list(load_in_workers(Slow(), range(100), 2))
    assert [s["i"] for s in samples] == list(range(100))


def test_quick_items_stay_in_this_process() -> None:
    """2,000 items of microseconds: the probe keeps them here."""
    got = list(load_many(Quick(), range(2000), 2))
    assert [s["i"] for _, s in got] == list(range(2000))
    assert {s["pid"] for _, s in got} == {os.getpid()}


PICKLED: list[int] = []


class Counts:
    """Counts its pickles (the probe's round trips, here: no worker runs)."""

    def __reduce__(self) -> Any:
        PICKLED.append(1)
        return (Counts, ())


class QuickCounted:
    def load_item(self, i: int) -> dict[str, Any]:
        return {"i": i, "c": Counts()}


def test_the_probe_times_the_round_trip_of_a_few_samples_only() -> None:
    """Quick items are all loaded within the probe's 0.1 s: timing the pickle of
    each made 2,000 tiny JSON items load 2x slower than with no workers asked for."""
    PICKLED.clear()
    got = list(load_many(QuickCounted(), range(2000), 2))
    assert [s["i"] for _, s in got] == list(range(2000))
    assert 0 < len(PICKLED) <= 32


def test_quick_items_are_not_timed_once_they_are_known_quick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first 32, 2,000 items of microseconds would not pay for workers
    on any machine: the rest is loaded with no clock read (timing each made
    them 1.07x slower than with no workers asked for)."""
    import types

    from mlcache.data import workers

    reads: list[int] = []

    def perf_counter() -> float:
        reads.append(1)
        return time.perf_counter()

    clock = types.SimpleNamespace(perf_counter=perf_counter, process_time=time.process_time)
    monkeypatch.setattr(workers, "time", clock)
    got = list(load_many(Quick(), range(2000), 2))
    assert [s["i"] for _, s in got] == list(range(2000))
    assert len(reads) < 200


@pytest.mark.parametrize(("workers", "n"), [(0, 50), (1, 50), (2, 1), (4, 0)])
def test_no_workers_when_none_are_asked_for_or_one_item(workers: int, n: int) -> None:
    got = list(load_many(Slow(0.001), range(n), workers))
    assert [i for i, _ in got] == list(range(n))
    assert {s["pid"] for _, s in got} <= {os.getpid()}


def _in_a_daemon(queue: Any) -> None:
    queue.put(sorted({s["pid"] for _, s in load_many(Slow(), range(120), 2)} | {-os.getpid()}))


def test_a_daemonic_process_loads_by_itself() -> None:
    """A DataLoader worker is daemonic: it cannot have children, so it loads alone."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    p.start()
    pids = queue.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0
    assert len(pids) == 2 and pids[0] == -pids[1]  # only the daemon itself loaded


def test_an_error_in_a_worker_is_raised_here() -> None:
    seen = []
    with pytest.raises(LookupError, match="no item 150") as raised:
        for i, s in load_many(Failing(), range(300), 2):
            seen.append((i, s["i"]))
    assert seen == [(i, i) for i in range(150)]  # every sample before it, in order
    assert isinstance(raised.value.__cause__, WorkerError)
    assert "in load_item" in str(raised.value.__cause__)  # the worker's traceback


class Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("not this one")


class FailingOddly(Slow):
    def load_item(self, i: int) -> dict[str, Any]:
        if i == 100 and os.getpid() != PARENT:
            raise Unpicklable("odd")
        return super().load_item(i)


def test_an_error_that_does_not_pickle_is_named() -> None:
    seen = []
    with pytest.raises(RuntimeError, match="Unpicklable: odd") as raised:
        for i, _ in load_many(FailingOddly(), range(200), 2):
            seen.append(i)
    assert seen == list(range(100))
    assert "in load_item" in str(raised.value.__cause__)


def test_dead_workers_leave_the_rest_to_this_process() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = list(load_many(Dying(), range(300), 2))
    assert [s["i"] for _, s in got] == list(range(300))
    said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(said) == 1 and "loading the remaining" in said[0] and "Dying" in said[0]
    assert got[120][1]["pid"] == os.getpid()


def test_stopping_early_does_not_wait_for_the_queued_chunks() -> None:
    """A caller that stops (a sample that does not fit) closes the iterator: the
    workers stop; it does not wait for the hundreds of items still queued."""
    it = load_many(Slow(0.01), range(600), 2)  # 6 s of items in this process
    got = [next(it) for _ in range(60)]
    t0 = time.perf_counter()
    it.close()
    closed = time.perf_counter() - t0
    assert [i for i, _ in got] == list(range(60))
    assert closed < 3.0  # the chunks left are 2.4 s of work per worker at the least


def _build_and_tell(queue: Any) -> None:
    for _, s in load_many(Slow(0.01), range(2000), 2):  # 20 s of items
        if s["pid"] != os.getpid():
            queue.put(s["pid"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\tZ" not in next(line for line in f if line.startswith("State:"))
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG")
def test_workers_end_with_a_build_killed(tmp_path: Any) -> None:
    """A building process killed (SIGKILL) leaves no worker waiting for ever."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    builder = ctx.Process(target=_build_and_tell, args=(queue,))
    builder.start()
    pids = {queue.get(timeout=30) for _ in range(40)}
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    os.kill(builder.pid, signal.SIGKILL)
    builder.join(10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:  # this test's own orphans, should it fail
        os.kill(p, signal.SIGKILL)
    assert not left


class Numbers(CachedDataset):
    """A dataset over numbered items, built with num_workers."""

    def __init__(self, n: int, **kw: Any) -> None:
        self.n = n
        super().__init__(**kw)

    def source_items(self) -> range:
        return range(self.n)

    def load_item(self, i: int) -> dict[str, Any]:
        time.sleep(0.004)
        return {"i": i, "sq": np.arange(i % 7, dtype=np.int64) ** 2, "pid": os.getpid()}


def test_a_parallel_build_is_the_serial_build(tmp_path: Any) -> None:
    serial = Numbers(250, cache_dir=tmp_path / "a", progress=False)
    parallel = Numbers(250, cache_dir=tmp_path / "b", progress=False, num_workers=2)
    assert len(serial) == len(parallel) == 250
    for i in range(250):
        assert parallel[i]["i"] == serial[i]["i"] == i
        np.testing.assert_array_equal(parallel[i]["sq"], serial[i]["sq"])
    assert {parallel[i]["pid"] for i in range(250)} - {os.getpid()}  # workers built it


def test_a_build_after_s3_was_used_still_forks(
    s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec's event loop and its executor's idle threads (left by any S3 access
    before the build) do not make fork unsafe: fsspec makes a new loop in a forked
    child. Before, they kept the build serial (or spawned, at seconds a start)."""
    import fsspec

    from mlcache.data import workers

    monkeypatch.undo()  # the real count of threads (the fixture's is 0)
    monkeypatch.setattr(workers, "_started", {})
    before = workers._other_threads()
    url, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(f"{url}/x", b"1")
    assert fs.cat_file(f"{url}/x") == b"1"
    assert any(t.name == "fsspecIO" for t in threading.enumerate())
    assert workers._other_threads() == before  # S3's threads do not count
    if before == 0:  # nothing else left by earlier tests: the build forks
        got = list(load_many(Slow(), list(range(120)), 2))
        assert len({s["pid"] for _, s in got} - {os.getpid()}) == 2
