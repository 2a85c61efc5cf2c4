"""memo/eviction: what goes when a cache must shrink is what is worth least
(GreedyDual-Size: compute seconds per byte, aged by use), in one process and
across processes, in one budget with the dataset packs of the same folder (an
open one is never removed); and the figures ``mlcache ls`` shows are those the
usage log recorded."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

from mlcache import Memory
from mlcache.data import CachedDataset
from mlcache.data.holdings import record_build_time
from mlcache.memo.eviction import Inflation, evict, plan_eviction
from mlcache.memo.layout import entries
from mlcache.memo.usage import collect
from mlcache.store import EntryStat
from mlcache.store.holdings import held_under

KB = 1024


def _names(plan):
    return [w.name for w in plan.chosen]


# -- the policy's choices on hand-made traces ----------------------------------------
def test_an_expensive_small_result_outlives_a_cheap_large_one_used_later():
    now = 1000.0
    found = [
        EntryStat("expensive", 1 * KB, now - 50),  # older: LRU would take it first
        EntryStat("cheap", 1000 * KB, now - 10),
        EntryStat("middling", 10 * KB, now - 5),
    ]
    costs = {"expensive": 30.0, "cheap": 0.001, "middling": 0.5}
    plan = plan_eviction(found, costs=costs, bytes_limit=100 * KB, now=now)
    assert _names(plan) == ["cheap"]
    assert plan.chosen[0].reason == "worth"
    assert plan.inflation == plan.chosen[0].priority > 0
    lru = plan_eviction(found, costs=costs, bytes_limit=100 * KB, now=now, policy="lru")
    assert _names(lru) == ["expensive", "cheap"]


def test_an_expensive_result_unused_since_the_inflation_rose_goes_before_a_cheap_one_used():
    # the cache evicted at t=100 things worth up to 1e-3 s per byte; "old" was last
    # used before, "recent" after: recency outweighs a 10x difference in worth
    inflation = Inflation([(100.0, 1e-3)])
    found = [EntryStat("old", KB, 50.0), EntryStat("recent", KB, 150.0)]
    costs = {"old": 1.0, "recent": 0.1}  # 1e-3 and 1e-4 s per byte
    plan = plan_eviction(found, costs=costs, inflation=inflation, items_limit=1, now=200.0)
    assert _names(plan) == ["old"]
    assert plan.inflation == 1e-3  # it never goes down


def test_equal_costs_and_sizes_is_least_recently_used_even_with_noisy_timings():
    found = [EntryStat(f"e{i}", 4 * KB, 100.0 + i) for i in range(6)]
    # measured times of equal work differ by noise: a few percent apart
    costs = {f"e{i}": 0.020 * (1 + 0.02 * ((i * 7) % 5 - 2)) for i in range(6)}
    plan = plan_eviction(found, costs=costs, items_limit=3, now=200.0)
    assert _names(plan) == ["e0", "e1", "e2"]


def test_an_entry_without_a_recorded_cost_counts_as_the_median_and_age_comes_first():
    found = [
        EntryStat("unknown", KB, 100.0),
        EntryStat("cheap", KB, 100.0),
        EntryStat("dear", KB, 100.0),
        EntryStat("stale", KB, 10.0),
    ]
    costs = {"cheap": 0.01, "dear": 10.0, "stale": 100.0, "unknown": None}
    plan = plan_eviction(found, costs=costs, age_limit=50, items_limit=2, now=110.0)
    assert _names(plan) == ["stale", "cheap"]
    assert [w.reason for w in plan.chosen] == ["age", "worth"]
    unknown = plan_eviction(found, costs=costs, items_limit=0, now=110.0).chosen
    guess = next(w for w in unknown if w.name == "unknown")
    assert guess.estimated and guess.cost == 10.0  # the median of 0.01, 10 and 100


def test_the_inflation_is_kept_in_the_store_and_read_back(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(lambda x: np.full(1000, x))
    for i in range(4):
        f(i)
    found = list(entries(mem.store))
    removed = evict(mem.store, found, [], lambda names: dict.fromkeys(names, 0.5), items_limit=2)
    assert len(removed) == 2 and len(list(entries(mem.store))) == 2
    level = Inflation.load(mem.store)
    assert level.now > 0 and level.at(time.time() + 1) == level.now and level.at(0) == 0


# -- end to end: real Memory, real bytes_limit, real files --------------------------
def _slow_small(x):
    time.sleep(0.05)  # recorded as its cost: at least 50 ms
    return np.full(100, x, dtype=np.float64)  # 800 bytes


def _fast_large(x):
    return np.full(20_000, x, dtype=np.float64)  # 160 KB


def test_bytes_limit_keeps_the_result_that_saves_most_per_byte(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit=600 * KB)
    slow, fast = mem.cache(_slow_small), mem.cache(_fast_large)
    slow(1)  # the oldest: least recently used evicts it first
    for i in range(8):
        fast(i)
    assert sum(e.size for e in entries(mem.store)) <= 600 * KB
    assert slow.check_call_in_cache(1)
    assert not fast.check_call_in_cache(0)


WRITER = """
import sys, time
import numpy as np
from mlcache import Memory

def slow_small(x):
    time.sleep(0.05)
    return np.full(100, x, dtype=np.float64)

def fast_large(x):
    return np.full(20_000, x, dtype=np.float64)

mem = Memory(sys.argv[1], verbose=0, bytes_limit=600 * 1024)
f = mem.cache(slow_small if sys.argv[2] == "slow" else fast_large)
for i in range(int(sys.argv[3]), int(sys.argv[4])):
    f(i)
"""


def test_limits_and_worth_hold_across_processes(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    cache = tmp_path / "cache"

    def run(*args):
        subprocess.run([sys.executable, str(script), str(cache), *args], check=True, timeout=120)

    run("slow", "0", "2")  # two costly small results, in one process
    run("fast", "0", "6")  # cheap large ones from others: the budget is passed
    run("fast", "6", "12")
    mem = Memory(cache, verbose=0)
    sizes = [e.size for e in entries(mem.store)]
    assert sum(sizes) <= 600 * KB
    names = {e.name.split("/")[0] for e in entries(mem.store)}
    assert any("slow_small" in n for n in names), names
    assert Inflation.load(mem.store).now > 0  # what the evictions left for the next


# -- one budget with the dataset packs -----------------------------------------------
class Rows(CachedDataset):
    """A pack of about 200 KB."""

    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def load_source(self):
        for i in range(self.n):
            yield {"x": np.full(250, i, dtype=np.float64)}


def test_a_dataset_pack_counts_in_the_budget_and_is_never_evicted_while_open(tmp_path):
    ds = Rows(100, cache_dir=tmp_path, progress=False)
    mem = Memory(tmp_path, verbose=0, bytes_limit=400 * KB)
    (pack,) = held_under(mem.store.local_root)
    assert pack.in_use and pack.cost is not None and pack.size > 150 * KB
    fast = mem.cache(_fast_large)
    for i in range(6):
        fast(i)
    results = sum(e.size for e in entries(mem.store))
    assert os.path.exists(ds.pack_path)  # open: kept
    assert results + pack.size <= 400 * KB  # and counted: the results made room
    path = ds.pack_path
    del ds
    gc.collect()
    record_build_time(path, 0.001)  # quick to build again: worth less than the results
    slow = mem.cache(_slow_small)
    for i in range(4):
        slow(i)
    for i in range(6, 9):
        fast(i)
    assert held_under(mem.store.local_root) == [] and not os.path.exists(path)
    assert all(slow.check_call_in_cache(i) for i in range(4))


# -- what the cache saved, as ls / info / --json say it -----------------------------
def test_ls_and_info_show_what_the_usage_log_recorded(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    slow = mem.cache(_slow_small)
    for i in range(3):
        slow(i)
    for _ in range(2):
        for i in range(3):
            slow(i)
    ds = Rows(10, cache_dir=tmp_path, progress=False)
    del ds
    gc.collect()
    Rows(10, cache_dir=tmp_path, progress=False)  # an open that finds it built: a hit
    mem.flush_usage()
    recorded = collect(mem.store)
    (st,) = recorded.values()
    assert (st.hits, st.misses) == (6, 3) and st.saved >= 6 * 0.05

    def cli(*args):
        out = subprocess.run(
            [sys.executable, "-m", "mlcache", "--location", str(tmp_path), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout

    listed = json.loads(cli("ls", "--json"))
    (func,) = listed["functions"]
    for k in ("hits", "misses", "saved", "computed", "size", "entries"):
        assert func[k] == getattr(st, k), k
    (pack,) = listed["datasets"]
    assert (pack["hits"], pack["misses"]) == (1, 1)
    assert pack["computed"] > 0 and pack["saved"] == pack["computed"]
    info = json.loads(cli("info", "_slow_small", "--json"))["function"]
    assert info["saved"] == st.saved and info["computed"] == st.computed
    text = cli("ls")
    assert "saved " in text.splitlines()[-1] and "computing" in text
