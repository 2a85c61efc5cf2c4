"""One computation per key: processes and threads asking for the same new call at
once, a holder killed by SIGKILL, a holder slower than the lock timeout."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest

from mlcache import CacheWarning, Memory
from mlcache.store.keylocks import KEYS_FILE


def counted(x, log):
    """Appends one line per real computation to ``log`` (O_APPEND: atomic)."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {x}\n")
    time.sleep(0.5)
    return np.arange(x) * 2.0


def _call_after(barrier_at, location, log, x=1000):
    while time.time() < barrier_at:  # start together
        time.sleep(0.001)
    out = Memory(location, verbose=0).cache(counted)(x, log)
    return float(out.sum())


def test_eight_processes_compute_a_new_call_once(tmp_path):
    log = str(tmp_path / "runs.log")
    start = time.time() + 2.0
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        results = pool.starmap(_call_after, [(start, str(tmp_path / "c"), log)] * 8)
    assert len(set(results)) == 1 and results[0] == float((np.arange(1000) * 2.0).sum())
    with open(log) as f:
        assert len(f.read().splitlines()) == 1  # the body ran exactly once


@pytest.mark.slow
def test_contested_keys_are_computed_once_many_rounds(tmp_path):
    """25 rounds of 8 processes asking for one new key at the same moment."""
    log = str(tmp_path / "runs.log")
    rounds = 25
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(8) as pool:
        for r in range(rounds):
            start = time.time() + 0.5
            args = [(start, str(tmp_path / "c"), log, 2000 + r)] * 8
            results = pool.starmap(_call_after, args)
            assert len(set(results)) == 1
    with open(log) as f:
        runs = Counter(line.split()[1] for line in f.read().splitlines())
    print(
        f"\ncontested keys: {rounds} rounds x 8 processes, computations per key: "
        f"{sorted(set(runs.values()))}"
    )
    assert len(runs) == rounds and set(runs.values()) == {1}


def test_threads_compute_a_new_call_once(tmp_path):
    log = str(tmp_path / "runs.log")
    f = Memory(tmp_path / "c", verbose=0).cache(counted)
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(f(500, log))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(np.array_equal(r, results[0]) for r in results)
    with open(log) as fh:
        assert len(fh.read().splitlines()) == 1


def slow(x, log, pause=30.0):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(pause)
    return x


def _hold_the_lock(location, log):
    Memory(location, verbose=0).cache(slow, ignore=["pause"])(7, log)


def _holding(tmp_path, log):
    """A process inside slow(7): it holds the key's lock."""
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_the_lock, args=(str(tmp_path / "c"), log)
    )
    holder.start()
    deadline = time.time() + 20
    while time.time() < deadline:
        if os.path.exists(log):
            with open(log) as f:
                if f.read():
                    break
        time.sleep(0.01)
    return holder


def _key_lock_files(root):
    """The lock files of single keys (a folder's shared file of record locks,
    ``.keys.lock``, is not one: it is made once and kept)."""
    return [
        n for _, _, files in os.walk(root) for n in files if n.endswith(".lock") and n != KEYS_FILE
    ]


def test_a_stale_lock_after_sigkill_is_taken_at_once(tmp_path):
    """The kernel releases a killed holder's key lock: the next caller of the same
    key takes it immediately and computes, and no lock file of that key is left
    behind for anyone to clean."""
    log = str(tmp_path / "runs.log")
    holder = _holding(tmp_path, log)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    mem = Memory(tmp_path / "c", verbose=0)
    mem.lock_timeout = 5.0
    f = mem.cache(slow, ignore=["pause"])
    t0 = time.time()
    assert f(7, log, pause=0.0) == 7  # the same key, computed at once
    assert time.time() - t0 < 2.0  # no wait for a timeout
    assert _key_lock_files(tmp_path / "c") == []
    assert f(7, log, pause=0.0) == 7
    with open(log) as fh:
        assert len(fh.read().splitlines()) == 2  # the killed run and ours; then a hit


def test_a_holder_slower_than_the_timeout_is_not_waited_for(tmp_path):
    log = str(tmp_path / "runs.log")
    holder = _holding(tmp_path, log)
    try:
        mem = Memory(tmp_path / "c", verbose=0)
        mem.lock_timeout = 0.3
        f = mem.cache(slow, ignore=["pause"])
        with pytest.warns(CacheWarning, match="lock_timeout"):
            assert f(7, log, pause=0.0) == 7
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()


def big(n):
    return np.arange(n, dtype=np.float64) * 3.0


def _read_mapped_while_cleared(location, ready, go, out):
    f = Memory(location, mmap_mode="r", verbose=0).cache(big)
    arr = f(200_000)
    assert isinstance(arr, np.memmap)
    ready.set()
    go.wait(30)  # the parent clears the cache and evicts meanwhile
    out.put(float(arr.sum()))


@pytest.mark.parametrize("how", ["clear", "reduce_size", "eviction"])
def test_readers_holding_maps_keep_correct_data(tmp_path, how):
    """Another process clears the cache, evicts, or reduces its size while a
    reader holds a memory-mapped result: the reader keeps working, with the right
    values (the file is unlinked, never rewritten in place)."""
    location = str(tmp_path / "c")
    Memory(location, verbose=0).cache(big)(200_000)
    ctx = multiprocessing.get_context("fork")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_read_mapped_while_cleared, args=(location, ready, go, out))
    reader.start()
    assert ready.wait(30)
    mem = Memory(location, verbose=0)
    if how == "clear":
        mem.clear(warn=False)
    elif how == "reduce_size":
        mem.reduce_size(bytes_limit=1)
    else:  # a bytes_limit Memory writing new entries evicts the old one
        small = Memory(location, verbose=0, bytes_limit=2_000_000).cache(big)
        for n in (200_001, 200_002, 200_003):
            small(n)
    assert not Memory(location, verbose=0).cache(big).check_call_in_cache(200_000)
    go.set()
    assert out.get(timeout=30) == float((np.arange(200_000) * 3.0).sum())
    reader.join(30)
    assert reader.exitcode == 0


# -- a storm of writes under bytes_limit ------------------------------------------------
STORM_LIMIT = 2_000_000
STORM_ENTRY = 25_000 * 8  # bytes of each result


def block(i):
    return np.full(25_000, i, dtype=np.float64)


def _storm(location, worker, n):
    mem = Memory(location, verbose=0, bytes_limit=STORM_LIMIT)
    f = mem.cache(block)
    for i in range(n):
        f(worker * 10_000 + i)


def _entries_size(store):
    from mlcache.memo.layout import entries

    return sum(e.size for e in entries(store))


def storm(location, workers, writes):
    """``workers`` processes write ``writes`` new entries each; a monitor measures
    the cache under the size counter's lock (where no eviction is half done);
    returns the largest size it saw and the number of samples."""
    store = Memory(location, verbose=0).store
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_storm, args=(location, w, writes)) for w in range(workers)]
    for p in procs:
        p.start()
    peak, samples = 0, 0
    while any(p.is_alive() for p in procs):
        with store.shared_counter("size"):
            peak = max(peak, _entries_size(store))
        samples += 1
        time.sleep(0.002)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    return max(peak, _entries_size(store)), samples


def test_a_storm_of_writes_from_several_processes_stays_within_the_limit(tmp_path):
    """4 processes each write 30 entries of 200 KB (6x the 2 MB limit in all): the
    cache never holds more than the limit plus one entry."""
    peak, samples = storm(str(tmp_path), 4, 30)
    print(f"\nstorm: 4 processes x 30 writes, peak {peak} bytes, limit {STORM_LIMIT}")
    assert samples > 10
    assert peak <= STORM_LIMIT + STORM_ENTRY + 4096, peak
    assert peak > STORM_LIMIT // 2  # the storm did fill it


@pytest.mark.slow
def test_a_long_storm_of_writes_stays_within_the_limit(tmp_path):
    peak, samples = storm(str(tmp_path), 8, 150)
    print(
        f"\nstorm: 8 processes x 150 writes, {samples} samples, peak {peak} bytes, "
        f"limit {STORM_LIMIT}, one entry {STORM_ENTRY}"
    )
    assert peak <= STORM_LIMIT + STORM_ENTRY + 4096, peak


def test_a_key_lock_that_cannot_be_made_never_fails_the_call(tmp_path, monkeypatch):
    """A read-only cache folder: no lock file can be created. Sync and async calls
    go on unlocked (no exception, no misleading timeout warning)."""
    import asyncio
    import errno
    import warnings

    mem = Memory(tmp_path, verbose=0)

    def no_lock(name, timeout):
        raise OSError(errno.EROFS, "Read-only file system", name)

    monkeypatch.setattr(mem.store, "lock", no_lock)
    f = mem.cache(block)

    async def ablock(i):
        return block(i)

    g = mem.cache(ablock)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(3)[0] == 3 and f(3)[0] == 3
        assert asyncio.run(g(4))[0] == 4
    assert f.check_call_in_cache(3) and g.check_call_in_cache(4)


def _hold_the_size_total(location, seconds):
    store = Memory(location, verbose=0).store
    with store.shared_counter("size"):
        time.sleep(seconds)


def test_a_stuck_size_total_does_not_block_writers(tmp_path, monkeypatch):
    """A process that holds the shared size total and stops (here: sleeps) makes
    writers wait at most counter_timeout, then keep the limit on their own."""
    from mlcache.memo.eviction import SizeGuard

    monkeypatch.setattr(SizeGuard, "counter_timeout", 0.2)
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_the_size_total, args=(str(tmp_path), 30)
    )
    holder.start()
    try:
        time.sleep(0.5)
        f = Memory(tmp_path, verbose=0, bytes_limit=STORM_LIMIT).cache(block)
        with pytest.warns(CacheWarning, match="locked for too long"):
            assert f(1)[0] == 1
        assert f(2)[0] == 2 and f.check_call_in_cache(2)  # warned once
    finally:
        holder.kill()
        holder.join()
