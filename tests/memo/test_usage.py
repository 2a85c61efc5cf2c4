"""Hits, misses and time saved per function; the function cache's own names."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from mlcache import Memory
from mlcache.memo.layout import cached_objects, is_entry, is_stats


def slow_square(x):
    time.sleep(0.05)
    return x * x


def test_hits_misses_and_time_saved(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    assert f(3) == 9
    assert f(3) == 9 and f(3) == 9
    assert f(4) == 16
    st = f.stats()
    assert (st.hits, st.misses, st.entries) == (2, 2, 2)
    assert st.func.endswith("slow_square") and st.size > 0
    assert 2 * 0.05 <= st.saved < 2 * 0.05 + 1.0  # two hits each saved one computation
    assert st.computed >= 2 * 0.05
    assert abs(st.last_used - time.time()) < 60
    everything = mem.stats()
    assert everything[st.func].hits == 2
    d = st.as_dict()
    assert {"func", "entries", "size", "last_used", "hits", "misses", "saved"} <= set(d)


def _hit_in_child(location):
    f = Memory(location, verbose=0).cache(slow_square)
    for _ in range(3):
        f(3)


def test_statistics_add_up_across_processes(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(3)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hit_in_child, args=(str(tmp_path),)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    st = f.stats()
    assert (st.hits, st.misses) == (6, 1)  # each child wrote its counts at exit
    names = [e.name for e in cached_objects(mem.store)]
    assert sum(map(is_stats, names)) == 3 and sum(map(is_entry, names)) == 1
    assert mem.verify() == []  # statistics entries are ordinary, checksummed entries


def test_the_function_cache_leaves_other_files_alone(tmp_path):
    """A dataset pack (or anything else) inside the cache folder is not an entry:
    verify skips it, eviction and clear leave it."""
    from mlcache.data import pack

    packed = pack(
        ({"x": np.arange(3) + i} for i in range(5)),
        tmp_path / "datasets" / "d.pack",
        progress=False,
    )
    other = tmp_path / "notes" / "readme.txt"
    other.parent.mkdir()
    other.write_text("mine")
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(2)
    assert mem.verify() == []
    mem.reduce_size(bytes_limit=1)
    assert os.path.exists(packed.path) and other.exists()
    assert not f.check_call_in_cache(2)
    f(2)
    mem.clear()
    assert os.path.exists(packed.path) and other.read_text() == "mine"
    assert not f.check_call_in_cache(2)


def test_a_hit_writes_nothing(tmp_path, monkeypatch):
    """Counting a hit is a dict update: no store write until the log flushes."""
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(5)
    mem.flush_usage()
    writes = []
    store = mem.store
    original = store.write
    monkeypatch.setattr(store, "write", lambda name: writes.append(name) or original(name))
    for _ in range(50):
        f(5)
    assert writes == []
    mem.flush_usage()
    assert len(writes) == 1 and is_stats(writes[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_counts_its_own_calls(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(7)
    f(7)  # one hit, not yet flushed, in the parent
    pid = os.fork()
    if pid == 0:  # the child must not write the parent's pending hit again
        f(7)
        mem.flush_usage()
        os._exit(0)
    os.waitpid(pid, 0)
    st = f.stats()
    assert (st.hits, st.misses) == (2, 1)  # the parent's hit and the child's


def test_a_memory_mapped_miss_is_not_also_a_hit(tmp_path):
    f = Memory(tmp_path, mmap_mode="r", verbose=0).cache(slow_square)
    f(np.arange(3.0))
    st = f.stats()
    assert (st.hits, st.misses, st.saved) == (0, 1, 0.0)


def test_clear_starts_the_counts_again(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(1)
    f(1)
    assert f.stats().hits == 1
    f.clear(warn=False)
    f(1)
    st = f.stats()
    assert (st.hits, st.misses, st.entries) == (0, 1, 1)
    mem.clear(warn=False)
    assert mem.stats() == {}


def test_pending_hits_are_forgotten_by_clear(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(1)
    f(1)
    f(1)  # two hits, not yet written
    f.clear(warn=False)
    st = f.stats()
    assert (st.hits, st.misses, st.entries) == (0, 0, 0)


# -- folding the entries of idle processes -----------------------------------------------
def _age_stats(store, folder, seconds):
    past = time.time() - seconds
    for e in store.list(f"{folder}/stats"):
        os.utime(store.local_path(e.name), (past, past))


def _stats_names(store, folder):
    return sorted(e.name.rpartition("/")[2] for e in store.list(f"{folder}/stats"))


def test_idle_processes_statistics_are_folded_into_one_archive(tmp_path):
    from mlcache.memo.usage import ARCHIVE, FOLD_AFTER_SECONDS, StatsLog

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(1)
    folder = f._folder
    for _ in range(10):  # ten finished runs, each with its own entry
        log = StatsLog(mem.store)
        log.add(folder, f.func_id, hits=3, saved=0.5)
        log.flush()
    mem.flush_usage()
    before = f.stats()
    assert before.hits == 30 and len(_stats_names(mem.store, folder)) == 11
    _age_stats(mem.store, folder, FOLD_AFTER_SECONDS + 60)
    now = StatsLog(mem.store)  # a new run counts a hit: it tidies the folder
    now.add(folder, f.func_id, hits=1)
    now.flush()
    names = _stats_names(mem.store, folder)
    assert ARCHIVE in names and len(names) == 2
    after = f.stats()
    assert (after.hits, after.misses) == (31, before.misses)
    assert abs(after.saved - before.saved) < 1e-9


def test_an_interrupted_fold_counts_nothing_twice(tmp_path):
    from mlcache.memo.usage import ARCHIVE, _read_stats, _write_stats

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(1)
    f(1)
    mem.flush_usage()
    folder = f._folder
    [own] = _stats_names(mem.store, folder)
    value = _read_stats(mem.store, f"{folder}/stats/{own}")
    # the archive was written, the entry it folded in not yet removed
    archive = {k: value[k] for k in ("hits", "misses", "saved", "computed")}
    _write_stats(mem.store, f"{folder}/stats/{ARCHIVE}", archive | {"merged": [own]})
    st = f.stats()
    assert (st.hits, st.misses) == (1, 1)


def test_a_live_process_whose_entry_was_folded_counts_on(tmp_path):
    from mlcache.memo.usage import FOLD_AFTER_SECONDS, FOLD_MIN, StatsLog

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(slow_square)
    f(1)
    mem.flush_usage()
    folder = f._folder
    live = StatsLog(mem.store)
    live.add(folder, f.func_id, hits=5)
    live.flush()
    for _ in range(FOLD_MIN):
        other = StatsLog(mem.store)
        other.add(folder, f.func_id, hits=1)
        other.flush()
    _age_stats(mem.store, folder, FOLD_AFTER_SECONDS + 60)
    tidy = StatsLog(mem.store)
    tidy.add(folder, f.func_id, hits=1)
    tidy.flush()  # folds the live one's entry too: it has been idle a day
    live.add(folder, f.func_id, hits=2)
    live.flush()  # notices, and writes only what came since
    assert f.stats().hits == 5 + FOLD_MIN + 1 + 2


def test_a_cache_folder_removed_before_exit_is_not_made_again_by_the_statistics(tmp_path):
    # a script whose cache lives in a folder it removes at its end (a temporary folder):
    # the statistics written at exit never bring the folder back
    script = tmp_path / "script.py"
    script.write_text(
        "import shutil, sys\n"
        "from mlcache import Memory\n"
        "mem = Memory(sys.argv[1], verbose=0)\n"
        "double = mem.cache(lambda x: 2 * x)\n"
        "double(1); double(1)\n"
        "shutil.rmtree(sys.argv[1])\n"
    )
    cache = tmp_path / "cache"
    subprocess.run([sys.executable, str(script), str(cache)], check=True, timeout=120)
    assert not cache.exists()
