"""Memory, MemorizedFunc, MemorizedResult: the joblib-compatible API."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import inspect
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import mlcache
from mlcache import (
    CacheWarning,
    ConfigError,
    MemorizedFunc,
    Memory,
    NotMemorizedFunc,
    NotMemorizedResult,
    RegistryError,
    StoreError,
    UnsupportedValue,
    expires_after,
)
from mlcache.codecs import select_codec
from mlcache.memo.layout import entries

CALLS: list[object] = []


def double(x, scale=2.0):
    """Double it."""
    CALLS.append(x)
    return x * scale


def make_pair(n):
    return {"a": np.arange(n, dtype=np.float32), "meta": (n, "x", None), "b": [np.ones((2, n))]}


@pytest.fixture
def mem(tmp_path):
    CALLS.clear()
    return Memory(tmp_path / "cache", verbose=0)


# -- decorator forms and wrapper ------------------------------------------------
def test_decorator_forms_and_wrapper_metadata(mem):
    plain = mem.cache(double)
    assert isinstance(plain, MemorizedFunc)
    assert plain.__name__ == "double" and plain.__doc__ == "Double it."
    assert str(inspect.signature(plain)) == "(x, scale=2.0)"

    @mem.cache
    def bare(x):
        return x + 1

    @mem.cache(ignore=["verbose"], verbose=0)
    def with_args(x, verbose=False):
        return x + 2

    assert (plain(1), bare(1), with_args(1)) == (2.0, 2, 3)
    assert mem.cache(plain).func is double  # re-wrapping unwraps


def test_hit_and_equivalent_calls_share_one_entry(mem):
    f = mem.cache(double)
    assert f(3) == 6.0
    assert f(x=3) == 6.0
    assert f(3, 2.0) == 6.0
    assert f(3, scale=2.0) == 6.0
    assert CALLS == [3]
    assert f(3, scale=3.0) == 9.0
    assert CALLS == [3, 3]


def test_ignore_drops_arguments(mem):
    calls = []

    # `calls` is captured state: it changes at every call, so it is ignored too
    @mem.cache(ignore=["verbose", "calls"])
    def f(x, verbose=0):
        calls.append(x)
        return x

    f(1, verbose=0)
    f(1, verbose=5)
    assert calls == [1]


def test_location_none_means_no_caching(tmp_path):
    mem = Memory(None)
    f = mem.cache(double)
    assert isinstance(f, NotMemorizedFunc)
    CALLS.clear()
    f(1)
    f(1)
    assert CALLS == [1, 1]
    assert f.check_call_in_cache(1) is False
    out, meta = f.call(2)
    assert out == 4.0 and meta == {}
    res = f.call_and_shelve(5)
    assert res.get() == 10.0
    res.clear()
    with pytest.raises(KeyError):
        res.get()
    assert mem.eval(double, 4) == 8.0
    mem.clear()
    mem.reduce_size(bytes_limit=1)


def test_location_accepts_str_and_path(tmp_path):
    a = Memory(str(tmp_path / "s"), verbose=0)
    b = Memory(tmp_path / "p", verbose=0)
    assert a.location == str(tmp_path / "s")
    assert b.location == str(tmp_path / "p")
    assert (tmp_path / "p").is_dir()


def test_cache_folder_is_private_and_gitignored(tmp_path):
    Memory(tmp_path / "c", verbose=0)
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "c" / ".gitignore").read_text().strip().endswith("*")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".gitignore").write_text("mine\n")
    Memory(tmp_path / "d", verbose=0)
    assert (tmp_path / "d" / ".gitignore").read_text() == "mine\n"


# -- arrays and mmap -----------------------------------------------------------
def test_arrays_round_trip_writable_without_mmap(mem):
    f = mem.cache(double)
    x = np.arange(12.0).reshape(3, 4)
    first = f(x)
    second = f(x)
    assert type(second) is np.ndarray and second.flags.writeable
    np.testing.assert_array_equal(first, second)
    second[0, 0] = 99  # a private copy: the cache is not changed
    np.testing.assert_array_equal(f(x), x * 2)


@pytest.mark.parametrize("mode", ["r", "c", "r+"])
def test_mmap_modes_return_memmaps(tmp_path, mode):
    mem = Memory(tmp_path, mmap_mode=mode, verbose=0)
    f = mem.cache(double)
    x = np.arange(1000.0)
    first = f(x)
    assert isinstance(first, np.memmap)  # consistent with later hits
    hit = f(x)
    assert isinstance(hit, np.memmap) and hit.mode == mode
    assert hit.flags.writeable == (mode != "r")
    np.testing.assert_array_equal(hit, x * 2)


def test_containers_of_arrays_stay_mappable(tmp_path):
    mem = Memory(tmp_path, mmap_mode="r", verbose=0)
    f = mem.cache(make_pair)
    f(5)
    out = f(5)
    assert isinstance(out["a"], np.memmap) and isinstance(out["b"][0], np.memmap)
    assert out["meta"] == (5, "x", None)
    np.testing.assert_array_equal(out["b"][0], np.ones((2, 5)))


def test_per_function_mmap_mode_overrides(tmp_path):
    mem = Memory(tmp_path, mmap_mode="r", verbose=0)
    f = mem.cache(double, mmap_mode=None)
    f(np.ones(3))
    assert type(f(np.ones(3))) is np.ndarray


# -- the other methods -----------------------------------------------------------
def test_call_check_and_clear(mem):
    f = mem.cache(double)
    assert not f.check_call_in_cache(2)
    out, meta = f.call(2)
    assert out == 4.0 and meta["duration"] >= 0 and "time" in meta and "input_args" in meta
    assert f.check_call_in_cache(2)
    f.call(2)  # always computes
    assert CALLS == [2, 2]
    f.clear()
    assert not f.check_call_in_cache(2)
    f(2)
    assert CALLS == [2, 2, 2]


def test_call_and_shelve(mem):
    f = mem.cache(double)
    ref = f.call_and_shelve(np.arange(3))
    np.testing.assert_array_equal(ref.get(), [0.0, 2.0, 4.0])
    f.call_and_shelve(np.arange(3))
    assert len(CALLS) == 1
    again = pickle.loads(pickle.dumps(ref))
    np.testing.assert_array_equal(again.get(), [0.0, 2.0, 4.0])
    ref.clear()
    with pytest.raises(KeyError):
        ref.get()


def test_memory_clear_and_eval(mem):
    assert mem.eval(double, 5) == 10.0
    assert mem.eval(double, 5) == 10.0
    assert CALLS == [5]
    mem.clear()
    assert sorted(os.listdir(mem.location)) == [".gitignore", "CACHEDIR.TAG"]
    assert mem.eval(double, 5) == 10.0
    assert CALLS == [5, 5]


def test_cache_validation_callback_and_expires_after(mem):
    f = mem.cache(double, cache_validation_callback=expires_after(seconds=0.2))
    f(1)
    f(1)
    assert CALLS == [1]
    time.sleep(0.3)
    assert not f.check_call_in_cache(1)
    f(1)
    assert CALLS == [1, 1]
    never = mem.cache(double, cache_validation_callback=lambda meta: False)
    never(7)
    never(7)
    assert CALLS.count(7) == 2
    assert pickle.loads(pickle.dumps(expires_after(days=1))).delta == datetime.timedelta(days=1)


def test_async_functions(mem):
    calls = []

    @mem.cache(ignore=["calls"])
    async def fetch(x):
        calls.append(x)
        await asyncio.sleep(0)
        return x * 10

    assert asyncio.run(fetch(2)) == 20
    assert asyncio.run(fetch(2)) == 20
    assert calls == [2]
    out, _meta = asyncio.run(fetch.call(2))
    assert out == 20 and calls == [2, 2]
    ref = asyncio.run(fetch.call_and_shelve(3))
    assert ref.get() == 30


def test_async_calls_of_one_new_key_compute_once_without_blocking_the_loop(mem):
    calls, ticks = [], []

    @mem.cache(ignore=["calls"])
    async def slow(x):
        calls.append(x)
        await asyncio.sleep(0.3)
        return x * 10

    async def ticker():
        for _ in range(10):
            ticks.append(1)
            await asyncio.sleep(0.02)

    async def main():
        return await asyncio.gather(*[slow(7) for _ in range(8)], ticker())

    results = asyncio.run(main())
    assert results[:8] == [70] * 8 and calls == [7]
    assert len(ticks) == 10  # the loop ran other tasks while calls waited


# -- keys: code, closures, methods, lambdas ----------------------------------------
def test_changed_source_is_never_a_hit(tmp_path, monkeypatch):
    mod = tmp_path / "userpkg_changing.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    mem = Memory(tmp_path / "c", verbose=0)
    results = []
    for body in ("return x + 1", "return x + 100", "return x + 1"):
        mod.write_text(f"def f(x):\n    {body}\n")
        ns: dict = {}
        exec(compile(mod.read_text(), str(mod), "exec"), ns)
        func = ns["f"]
        func.__module__ = "userpkg_changing"
        # linecache must see the new text, as after an edit and a restart
        import linecache

        linecache.checkcache(str(mod))
        results.append(mem.cache(func)(1))
    assert results == [2, 101, 2]


def test_closures_over_different_values_do_not_share(mem):
    def make(k):
        @mem.cache
        def scaled(x):
            CALLS.append(k)
            return x * k

        return scaled

    by2, by3 = make(2), make(3)
    assert (by2(10), by3(10)) == (20, 30)
    # one code version: the second closure must not discard the first one's results
    assert (by2(10), by3(10), make(2)(10)) == (20, 30, 20)
    assert CALLS == [2, 3]


def test_methods_are_keyed_by_instance_state(mem):
    class Scaler:
        def __init__(self, k):
            self.k = k

        @mem.cache
        def apply(self, x):
            CALLS.append(x)
            return x * self.k

    assert Scaler(2).apply(5) == 10
    assert Scaler(2).apply(5) == 10
    assert Scaler(3).apply(5) == 15
    assert CALLS == [5, 5]


def test_lambdas_on_one_line_do_not_collide(mem):
    f, g = mem.cache(lambda x: x + 1), mem.cache(lambda x: x * 10)
    assert (f(2), g(2), f(2), g(2)) == (3, 20, 3, 20)


def test_main_script_functions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from mlcache import Memory
            mem = Memory({str(tmp_path / "c")!r}, verbose=0)

            @mem.cache
            def prep(x):
                print("COMPUTE")
                return x * 2

            print(prep(21))
            """
        )
    )
    runs = [
        subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.split() == ["COMPUTE", "42"]
    assert runs[1].stdout.split() == ["42"]


# -- pickling and other processes ---------------------------------------------------
def test_memory_and_memorized_func_pickle(mem):
    f = mem.cache(double, ignore=["scale"])
    f(4)
    g = pickle.loads(pickle.dumps(f))
    assert g.ignore == ["scale"] and g.memory.location == mem.location
    assert g.check_call_in_cache(4)
    m2 = pickle.loads(pickle.dumps(Memory(mem.location, mmap_mode="r", bytes_limit="1M")))
    assert (m2.mmap_mode, m2.bytes_limit) == ("r", 1 << 20)


def _square_in_child(args):
    location, x = args
    f = Memory(location, verbose=0).cache(double)
    return f.check_call_in_cache(x), f(x)


def test_other_processes_share_results(mem):
    import multiprocessing

    f = mem.cache(double)
    f(6)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.map(_square_in_child, [(mem.location, 6), (mem.location, 7)])
    assert got == [(True, 12.0), (False, 14.0)]
    assert f.check_call_in_cache(7)


def test_joblib_parallel_with_a_memorized_function(mem):
    joblib = pytest.importorskip("joblib")
    f = mem.cache(double)
    out = joblib.Parallel(n_jobs=2)(joblib.delayed(f)(i) for i in range(4))
    assert out == [0.0, 2.0, 4.0, 6.0]
    assert all(f.check_call_in_cache(i) for i in range(4))


# -- sklearn ------------------------------------------------------------------------
FITS: list[int] = []


def _counting_transformer():
    from sklearn.base import BaseEstimator, TransformerMixin

    class CountingScaler(TransformerMixin, BaseEstimator):
        def fit(self, X, y=None):
            FITS.append(len(X))
            self.mean_ = X.mean(axis=0)
            return self

        def transform(self, X):
            return X - self.mean_

    return CountingScaler


CountingScaler = None


def test_sklearn_pipeline_does_not_refit_cached_steps(tmp_path):
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.utils.validation import check_memory

    global CountingScaler
    CountingScaler = _counting_transformer()
    CountingScaler.__module__ = __name__
    CountingScaler.__qualname__ = "CountingScaler"
    mem = Memory(tmp_path, verbose=0)
    assert check_memory(mem) is mem
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 4)), np.arange(60) % 2
    FITS.clear()
    for _ in range(2):
        pipe = Pipeline([("scale", CountingScaler()), ("clf", LogisticRegression())], memory=mem)
        pipe.fit(X, y)
    assert FITS == [60]
    np.testing.assert_allclose(pipe.named_steps["scale"].mean_, X.mean(axis=0))
    pipe2 = Pipeline([("scale", CountingScaler()), ("clf", LogisticRegression())], memory=mem)
    pipe2.fit(X[:30], y[:30])
    assert FITS == [60, 30]


# -- limits --------------------------------------------------------------------------
def test_bytes_limit_is_enforced_on_write_lru(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit="300K")
    f = mem.cache(double)
    for i in range(3):
        f(np.full(10_000, i, dtype=np.float64))  # ~80 KB each
    f(np.full(10_000, 0, dtype=np.float64))  # a hit: 0 is now the most recent
    mem.flush_usage()
    for i in range(3, 8):
        f(np.full(10_000, i, dtype=np.float64))
        total = sum(e.size for e in mem.store.list())
        assert total <= 300 * 1024
    assert f.check_call_in_cache(np.full(10_000, 7, dtype=np.float64))
    assert not f.check_call_in_cache(np.full(10_000, 1, dtype=np.float64))


def floats(i):
    return [float(i) + k / 7 for k in range(3000)]  # kept in the layout, not in segments


def test_bytes_limit_counts_the_whole_entry_file(tmp_path):
    """A list of floats is stored in the entry's layout (JSON), not in segments:
    the limit must count the file's real size."""
    from mlcache.memo.layout import entries

    mem = Memory(tmp_path, verbose=0, bytes_limit="300K")
    f = mem.cache(floats)
    sizes = []
    for i in range(30):
        f(i)
        sizes.append(sum(e.size for e in entries(mem.store)))
    assert max(sizes) <= 300 * 1024, max(sizes)
    assert f.check_call_in_cache(29) and f(29) == floats(29)


def test_result_larger_than_the_limit_is_returned_not_stored(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit=1000)
    f = mem.cache(double)
    with pytest.warns(CacheWarning, match="larger than bytes_limit"):
        out = f(np.ones(1000))
    np.testing.assert_array_equal(out, 2 * np.ones(1000))
    assert not f.check_call_in_cache(np.ones(1000))


def test_reduce_size_limits(mem):
    f = mem.cache(double)
    for i in range(5):
        f(np.full(1000, i, dtype=np.float64))
        time.sleep(0.01)
    mem.reduce_size(items_limit=3)
    assert len(list(entries(mem.store))) == 3
    assert f.check_call_in_cache(np.full(1000, 4, dtype=np.float64))
    size_one = max(e.size for e in entries(mem.store))
    mem.reduce_size(bytes_limit=size_one)
    assert len(list(entries(mem.store))) == 1
    mem.reduce_size(age_limit=datetime.timedelta(seconds=0))
    assert list(entries(mem.store)) == []  # statistics entries are not results
    with pytest.raises(ValueError):
        mem.reduce_size(items_limit=-1)


# -- failures never lose the result ---------------------------------------------------
def test_store_failure_returns_the_value_with_one_warning(mem):
    f = mem.cache(double)
    f(1)  # creates the function folder
    code_dir = os.path.join(mem.location, f._code.code_dir)
    # a real failure: the entry name is taken by a folder the store cannot replace
    name = f._name((2,), {})
    os.makedirs(os.path.join(mem.location, name, "blocker"))
    with pytest.warns(CacheWarning, match="could not be stored"):
        assert f(2) == 4.0
    assert os.path.isdir(code_dir)


class _FailingFile:
    """A file whose writes fail with ``err`` once ``budget`` bytes are written."""

    def __init__(self, f, err, budget):
        self._f, self._err, self._budget = f, err, budget

    def write(self, data):
        n = len(memoryview(data).cast("B"))
        if n > self._budget:
            raise OSError(self._err, os.strerror(self._err))
        self._budget -= n
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.mark.parametrize(
    "err, where",
    [
        ("ENOSPC", "mid-write"),  # the disk fills up while the entry is written
        ("EDQUOT", "mid-write"),
        ("EIO", "mid-write"),
        ("EACCES", "open"),  # the folder became read-only for us
        ("EROFS", "open"),  # the file system was remounted read-only
    ],
)
def test_a_failing_store_returns_the_value_and_leaves_nothing(mem, monkeypatch, err, where):
    """The function's result is returned with one warning naming the cause; no
    partial entry or temporary is left; once the store works again, so does the
    cache."""
    import contextlib
    import errno

    code = getattr(errno, err)
    real_write = mem.store.write

    @contextlib.contextmanager
    def failing_write(name):
        if where == "open":
            raise OSError(code, os.strerror(code), name)
        with real_write(name) as f:
            yield _FailingFile(f, code, 100_000)

    f = mem.cache(double)
    x = np.arange(100_000, dtype=np.float64)  # 800 KB: fails part-way through
    monkeypatch.setattr(mem.store, "write", failing_write)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x)
    np.testing.assert_array_equal(out, x * 2)
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and os.strerror(code) in str(ours[0].message)
    left = [n for _, ds, fs in os.walk(mem.location) for n in ds + fs if ".tmp-" in n]
    assert left == [] and not f.check_call_in_cache(x)
    monkeypatch.setattr(mem.store, "write", real_write)  # the disk has room again
    np.testing.assert_array_equal(f(x), x * 2)
    assert f.check_call_in_cache(x)


def test_a_new_cache_folder_on_a_full_disk_opens_and_computes(mount_tmpfs):
    """``Memory("cache")`` on a disk with no room left (its marker cannot be
    written) is not an error at import: each call computes and returns, with one
    warning naming the cause; once there is room the cache stores and hits.
    Before, ``Memory(...)`` raised StoreError and the user's script stopped."""
    disk = mount_tmpfs("2m")
    with open(disk / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while filler.write(b"\0" * 4096):  # fill the disk to the last block
            pass
    CALLS.clear()
    mem = Memory(disk / "cache", verbose=0)
    f = mem.cache(double)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(3) == 6.0
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and os.strerror(errno.ENOSPC) in str(ours[0].message)
    os.unlink(disk / "filler")  # room again: stored, then a hit
    assert f(3) == 6.0 and f(3) == 6.0 and len(CALLS) == 2
    assert f.check_call_in_cache(3) and (disk / "cache" / "CACHEDIR.TAG").is_file()


@pytest.mark.parametrize("err", ["EROFS", "EACCES"])
def test_clear_on_a_cache_that_became_read_only_warns_and_keeps_its_results(mem, monkeypatch, err):
    """The file system remounted read-only while the process runs (or a team's
    folder whose entries are another user's): ``f.clear()`` and ``mem.clear()``
    say so once each, naming the cause, and the results stay valid, as with a
    cache read-only from the start (joblib ignores such errors). Before, both
    raised OSError out of the user's call."""
    code = getattr(errno, err)
    f = mem.cache(double)
    assert f(1) == 2.0

    def refused(name):
        raise OSError(code, os.strerror(code), name)

    monkeypatch.setattr(mem.store, "delete", refused)
    for clear in (f.clear, mem.clear):
        with pytest.warns(CacheWarning, match=f"not cleared.*{os.strerror(code)}") as got:
            clear()
        assert len(got) == 1
    monkeypatch.undo()
    assert f.check_call_in_cache(1) and f(1) == 2.0


def test_a_cache_remounted_read_only_with_a_size_limit_says_one_warning(tmpfs):
    """A cache with ``bytes_limit`` whose file system is remounted read-only while
    the process runs: a miss is returned with ONE warning naming the cause (the
    write's), not a second one for the size counter the same cause refused.
    Before: "could not enforce bytes_limit (Read-only file system)" as well."""
    CALLS.clear()
    mem = Memory(tmpfs / "cache", verbose=0, bytes_limit="1M")
    f = mem.cache(double)
    assert f(1) == 2.0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(2) == 4.0 and f(1) == 2.0
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and os.strerror(errno.EROFS) in ours[0], ours
    assert len(CALLS) == 2  # f(1) still hits


def test_a_cache_folder_removed_while_its_memory_lives_is_made_again(tmp_path):
    """``rm -rf cache/`` beside a notebook kernel holding the Memory: the next call
    computes, stores (no warning: warnings are errors here) and the one after hits,
    as with joblib. With a size limit too (its counter lives in the folder)."""
    import shutil

    for limit in (None, "1M"):
        CALLS.clear()
        location = tmp_path / f"cache-{limit}"
        mem = Memory(location, verbose=0, bytes_limit=limit)
        f = mem.cache(double)
        assert f(1) == 2.0 and f(1) == 2.0 and len(CALLS) == 1
        shutil.rmtree(location)
        assert f(1) == 2.0 and len(CALLS) == 2  # computed: the result is gone
        assert f(1) == 2.0 and f(2) == 4.0 and f(2) == 4.0 and len(CALLS) == 3
        assert f.check_call_in_cache(1) and f.check_call_in_cache(2)
        assert (location / "CACHEDIR.TAG").is_file() and (location / ".gitignore").is_file()
        mem.clear(warn=False)  # and it stays a cache: clear knows it as one
        assert f(1) == 2.0 and len(CALLS) == 4


def test_damaged_entry_is_a_miss_with_a_warning_then_overwritten(mem):
    f = mem.cache(double)
    f(np.arange(100.0))
    path = mem.store.local_path(f._name((np.arange(100.0),), {}))
    data = bytearray(Path(path).read_bytes())
    data[-5] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="damaged"):
        np.testing.assert_array_equal(f(np.arange(100.0)), np.arange(100.0) * 2)
    assert len(CALLS) == 2
    np.testing.assert_array_equal(f(np.arange(100.0)), np.arange(100.0) * 2)
    assert len(CALLS) == 2
    assert mem.verify() == []


def test_unstorable_result_is_returned_with_a_warning(mem):
    import threading

    f = mem.cache(lambda: threading.Lock())
    with pytest.warns(CacheWarning, match="cannot be stored"):
        lock = f()
    assert hasattr(lock, "acquire")


def test_allow_pickle_false_returns_what_needs_pickle_unstored(tmp_path):
    """A result that needs pickle with allow_pickle=False is returned, not stored, with
    ONE warning per function naming its type and the way out; later calls compute."""
    mem = Memory(tmp_path, verbose=0, allow_pickle=False)
    f = mem.cache(lambda n: {"ok": np.arange(n), "t": (1, 2.5)})
    assert f(3)["t"] == (1, 2.5)
    calls = []

    def when(day):
        calls.append(day)
        return datetime.date(2020, 1, day)

    g = mem.cache(when)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert g(1) == datetime.date(2020, 1, 1)
        assert g(1) == datetime.date(2020, 1, 1)  # a miss: computed again
        assert g(2) == datetime.date(2020, 1, 2)
        out, meta = g.call(3)
        shelved = g.call_and_shelve(4)
    assert out == datetime.date(2020, 1, 3) and meta == {}
    assert isinstance(shelved, NotMemorizedResult)
    assert shelved.get() == datetime.date(2020, 1, 4)
    assert calls == [1, 1, 2, 3, 4]
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1, ours
    assert "datetime.date" in ours[0] and "allow_pickle" in ours[0]
    assert "not stored" in ours[0] and "returned uncached" in ours[0]
    assert not g.check_call_in_cache(1)
    assert f.check_call_in_cache(3)  # the other function stored its plain result
    with pytest.raises(UnsupportedValue, match="datetime.date"):  # the codecs still raise
        select_codec(datetime.date(2020, 1, 1), allow_pickle=False)


def test_allow_pickle_false_async_returns_what_needs_pickle_unstored(tmp_path):
    mem = Memory(tmp_path, verbose=0, allow_pickle=False)
    calls = []

    @mem.cache
    async def when(day):
        calls.append(day)
        return datetime.date(2020, 1, day)

    async def main():
        first = await when(1)
        again = await when(1)
        out, meta = await when.call(2)
        shelved = await when.call_and_shelve(3)
        return first, again, out, meta, shelved

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, again, out, meta, shelved = asyncio.run(main())
    assert first == again == datetime.date(2020, 1, 1)
    assert out == datetime.date(2020, 1, 2) and meta == {}
    assert isinstance(shelved, NotMemorizedResult) and shelved.get().day == 3
    assert calls == [1, 1, 2, 3]
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "datetime.date" in str(ours[0].message)


def test_compressed_results(tmp_path):
    mem = Memory(tmp_path, compress=("zlib", 6), verbose=0)
    f = mem.cache(double)
    x = np.zeros(100_000)
    f(x)
    np.testing.assert_array_equal(f(x), x)
    assert sum(e.size for e in mem.store.list()) < x.nbytes / 10


# -- bad input ------------------------------------------------------------------------
def test_clear_errors_for_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="mmap_mode"):
        Memory(tmp_path, mmap_mode="w+")
    with pytest.raises(RegistryError, match="unknown store backend 'nope'"):
        Memory(tmp_path, backend="nope")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create the cache folder"):
        Memory(blocker / "sub")
    mem = Memory(tmp_path / "ok", verbose=0)
    with pytest.raises(TypeError, match="expects a callable"):
        mem.cache(42)
    with pytest.raises(ConfigError, match="not parameters"):
        mem.cache(double, ignore=["y"])
    with pytest.raises(ConfigError, match="mmap_mode"):
        mem.cache(double, mmap_mode="x")
    with pytest.raises(TypeError, match="location"):
        Memory(42)
    f = mem.cache(double)
    import threading

    # an argument that cannot be hashed: the function runs uncached (and here fails
    # on its own, as it would without the cache)
    with (
        pytest.warns(CacheWarning, match="argument 'x' of type _thread.lock"),
        pytest.raises(TypeError, match="unsupported operand"),
    ):
        f(threading.Lock())
    with pytest.raises(TypeError):
        f()  # missing argument, as the plain call would say


def test_default_cache_decorator(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCACHE_DIR", str(tmp_path / "default"))
    calls = []

    @mlcache.cache(ignore=["calls"])
    def f(x):
        calls.append(x)
        return -x

    assert f(1) == -1 and f(1) == -1 and calls == [1]
    assert (tmp_path / "default").is_dir()
    monkeypatch.delenv("MLCACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert mlcache.default_location() == str(tmp_path / "xdg" / "mlcache")


@pytest.mark.parametrize("where", ["MLCACHE_DIR", "HOME"])
def test_default_cache_in_a_folder_that_cannot_be_made_runs_uncached(tmp_path, monkeypatch, where):
    """``@mlcache.cache`` where the default folder cannot be made (``$MLCACHE_DIR``
    naming a file; a container's home that does not exist) decorates, and its
    calls compute, with one warning naming the folder and the cause. Before, the
    decorator raised StoreError and the script stopped at import."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    if where == "MLCACHE_DIR":
        monkeypatch.setenv("MLCACHE_DIR", str(blocker))
    else:
        monkeypatch.delenv("MLCACHE_DIR")
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.setenv("HOME", str(blocker / "home"))
    calls = []

    def f(x):
        calls.append(x)
        return -x

    with pytest.warns(CacheWarning, match=f"{blocker}.*(not a folder|Not a directory)") as got:
        g = mlcache.cache(ignore=["calls"])(f)
    assert len(got) == 1 and (where != "MLCACHE_DIR" or "MLCACHE_DIR" in str(got[0].message))
    assert g(1) == -1 and g(1) == -1 and calls == [1, 1]
    assert blocker.read_text() == "not a folder"


def test_verbose_logs_through_the_mlcache_logger(tmp_path, caplog):
    mem = Memory(tmp_path, verbose=10)
    f = mem.cache(double)
    with caplog.at_level("INFO", logger="mlcache"):
        f(1)
        f(1)
    text = caplog.text
    assert "calling" in text and "loaded from cache" in text


def _notebook_cell(source: str, cell: str) -> dict:
    """Run ``source`` as IPython runs a cell: a fake file name known to linecache."""
    import linecache

    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    ns: dict = {"__name__": "__main__"}
    exec(compile(source, cell, "exec"), ns)
    return ns


def test_notebook_functions_are_fingerprinted_from_the_cell(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    src = "def feat(x):\n    return x + 1\n"
    f1 = mem.cache(_notebook_cell(src, "/tmp/ipykernel_1/111.py")["feat"])
    assert f1.func_id == "__main__.feat"  # the temporary cell file is not part of it
    assert f1(1) == 2
    # the same cell re-run after a kernel restart lands in another temp file: a hit
    f2 = mem.cache(_notebook_cell(src, "/tmp/ipykernel_2/222.py")["feat"])
    assert f2.check_call_in_cache(1)
    # an edited cell is new code: a miss
    f3 = mem.cache(_notebook_cell(src.replace("+ 1", "+ 2"), "/tmp/ipykernel_2/333.py")["feat"])
    assert not f3.check_call_in_cache(1)
    assert f3(1) == 3


def test_module_level_memorized_function_pickles_by_reference(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "userpkg_ref.py").write_text(
        "from mlcache import Memory\n"
        f"mem = Memory({str(tmp_path / 'c')!r}, verbose=0)\n"
        "@mem.cache\n"
        "def f(x):\n"
        "    return x * 3\n"
    )
    import importlib

    mod = importlib.import_module("userpkg_ref")
    data = pickle.dumps(mod.f)
    assert b"userpkg_ref" in data and len(data) < 100  # a reference, not the whole object
    assert pickle.loads(data) is mod.f


def test_size_guard_scans_only_when_needed(tmp_path, monkeypatch):
    import mlcache.memo.eviction as limits

    mem = Memory(tmp_path, verbose=0, bytes_limit="1M")
    scans = []
    real_list = mem.store.list

    def counting_list(prefix=""):
        scans.append(prefix)
        return real_list(prefix)

    monkeypatch.setattr(mem.store, "list", counting_list)
    f = mem.cache(double)
    for i in range(20):
        f(np.full(1000, i, dtype=np.float64))  # ~8 KB each: far under the limit
    # the first write learns the store's size; the others only add to it
    assert scans.count("") == 1
    # another process writing into the same cache is seen at the next rescan
    other = Memory(tmp_path, verbose=0).cache(double)
    for i in range(20, 160):
        other(np.full(1000, i, dtype=np.float64))
    assert sum(e.size for e in real_list()) > 1 << 20
    monkeypatch.setattr(limits, "RESCAN_SECONDS", 0.0)
    f(np.full(1000, -1, dtype=np.float64))
    assert sum(e.size for e in real_list()) <= 1 << 20
    assert f.check_call_in_cache(np.full(1000, -1, dtype=np.float64))


# -- what a call depends on besides its arguments ---------------------------------------
class Model:
    def __init__(self, k):
        self.k = k

    def predict(self, x):
        return x * self.k

    def __call__(self, x):
        return x + self.k


def test_bound_methods_partials_and_callable_objects_key_their_state(mem):
    import functools

    assert (mem.cache(Model(2).predict)(10), mem.cache(Model(3).predict)(10)) == (20, 30)
    assert (mem.cache(Model(2))(10), mem.cache(Model(3))(10)) == (12, 13)
    p2, p3 = functools.partial(double, scale=2.0), functools.partial(double, scale=3.0)
    assert (mem.cache(p2)(10), mem.cache(p3)(10)) == (20.0, 30.0)
    m = Model(2)
    f = mem.cache(m.predict)
    assert f(10) == 20
    m.k = 5  # the object changed: a new key, not the old result
    assert f(10) == 50
    # ignore=["self"] keys a bound method by its arguments only
    g = mem.cache(Model(7).predict, ignore=["self"])
    assert g(1) == 7 and mem.cache(Model(8).predict, ignore=["self"])(1) == 7


def test_closure_values_are_read_at_each_call(mem):
    k = 1
    w = np.ones(3)

    @mem.cache
    def f(x):
        return x * k + w.sum()

    assert f(10) == 13.0
    k = 100
    assert f(10) == 1003.0
    w[:] = 5
    assert f(10) == 1015.0


def test_replaced_code_is_detected(mem):
    def feat(x):
        return x + 1

    def feat_v2(x):
        return x * 100

    f = mem.cache(feat)
    assert f(2) == 3
    feat.__code__ = feat_v2.__code__  # what %autoreload does
    assert f(2) == 200
    feat.__defaults__ = None
    assert f(3) == 300


def test_ignore_is_part_of_the_key(mem):
    def f(a, b):
        return f"a={a} b={b}"

    assert mem.cache(f, ignore=["b"])(1, 2) == "a=1 b=2"
    assert mem.cache(f, ignore=["a"])(2, 1) == "a=2 b=1"


def test_local_classes_and_helpers_passed_as_arguments_are_keyed_by_code(mem):
    def make_op(k):
        class Op:
            def apply(self, x):
                return x * k

        return Op

    @mem.cache
    def run(op_cls, x):
        return op_cls().apply(x)

    assert (run(make_op(2), 10), run(make_op(3), 10)) == (20, 30)


def test_unhashable_captured_state_is_left_out_of_the_key_with_one_warning(mem):
    """As joblib (which ignores what a function captures): a captured lock never
    disables the cache."""
    import threading

    lock = threading.Lock()

    @mem.cache
    def f(x):
        with lock:
            return x * 2

    with pytest.warns(CacheWarning, match="captures 'lock'.*left out of the key"):
        assert f(2) == 4
    assert f(3) == 6  # warned once
    assert f.check_call_in_cache(2)


LOCKED_CALLS: list[int] = []


def with_lock(x, lock):
    LOCKED_CALLS.append(x)
    return x * 2


def test_unhashable_arguments_call_uncached_with_one_warning(mem):
    import threading

    LOCKED_CALLS.clear()
    f = mem.cache(with_lock)
    with pytest.warns(CacheWarning, match="called uncached: cannot hash argument 'lock'"):
        assert f(2, threading.Lock()) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per function
        assert f(2, threading.Lock()) == 4
    assert LOCKED_CALLS == [2, 2]
    assert not list(mem.store.list(f._folder))  # nothing stored
    g = mem.cache(with_lock, ignore=["lock"])  # what ignore= is for
    g(5, threading.Lock())
    assert g(5, threading.Lock()) == 10 and LOCKED_CALLS[2:] == [5]


def test_generator_functions_run_uncached_with_one_warning(mem):
    """A generator cannot be stored (it is consumed once): a decorated generator
    function runs uncached, with one warning where it is decorated, as joblib
    runs it (before: a TypeError broke the user's code at the decoration)."""
    calls = []

    def gen(n):
        calls.append(n)
        yield from range(n)

    async def agen(n):
        yield n

    with pytest.warns(CacheWarning, match="generator function .*gen: .* runs uncached") as got:
        f = mem.cache(gen)
    assert len(got) == 1 and got[0].filename == __file__
    assert list(f(3)) == [0, 1, 2] and list(f(3)) == [0, 1, 2] and calls == [3, 3]
    assert not f.check_call_in_cache(3)
    with pytest.warns(CacheWarning, match="generator function .*agen"):
        a = mem.cache(agen)

    async def drain():
        return [x async for x in a(4)]

    assert asyncio.run(drain()) == [4]
    assert list(Memory(None).cache(gen)(2)) == [0, 1]  # nothing cached there: no warning


def test_callback_errors_propagate_and_the_entry_is_kept(mem):
    def broken(meta):
        raise RuntimeError("bug in my callback")

    f = mem.cache(double)
    f(1)
    g = mem.cache(double, cache_validation_callback=broken)
    with pytest.raises(RuntimeError, match="bug in my callback"):
        g(1)
    assert f.check_call_in_cache(1)


def test_call_and_shelve_keeps_a_value_that_was_not_stored(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit=100)
    f = mem.cache(double)
    with pytest.warns(CacheWarning, match="larger than bytes_limit"):
        ref = f.call_and_shelve(np.ones(100))
    np.testing.assert_array_equal(ref.get(), 2 * np.ones(100))


def test_datetime_results_with_a_size_limit(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit="1M")
    f = mem.cache(lambda n: np.arange(n).astype("datetime64[s]"))
    assert f(3)[2] == np.datetime64(2, "s")
    assert f(3)[2] == np.datetime64(2, "s")


def test_foreign_files_in_the_cache_folder_are_left_alone(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit="1M")
    f = mem.cache(double)
    f(1)
    (tmp_path / "notes (1).txt").write_text("mine")
    (Path(mem.store.local_path(f._code.code_dir)) / ".DS_Store").write_text("finder")
    for i in range(3):
        f(np.full(1000, i, dtype=np.float64))
    assert mem.verify() == []
    mem.clear()
    assert f(1) == 2.0


def test_clear_while_another_thread_writes(mem):
    import threading

    f = mem.cache(double)
    stop = threading.Event()
    errors = []

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                f(i)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

    t = threading.Thread(target=writer)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # a write racing a clear may fail
        t.start()
        try:
            for _ in range(50):
                f.clear()
        finally:
            stop.set()
            t.join()
    assert errors == []


def test_pickled_memory_keeps_an_absolute_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mem = Memory("relative_cache", verbose=0)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = pickle.loads(pickle.dumps(mem))
    assert again.location == str(tmp_path / "relative_cache")


try:
    from joblib import Memory as _JoblibMemory
except ImportError:  # a test dependency; the test below then skips
    _JoblibMemory = object  # type: ignore[assignment,misc]


class JoblibMemory(Memory, _JoblibMemory):  # type: ignore[misc]
    """What docs/functions.md gives nilearn: a Memory that is also a joblib.Memory."""


def test_a_subclass_of_memory_pickles_and_copies_as_itself(tmp_path):
    import copy

    joblib = pytest.importorskip("joblib")
    mem = JoblibMemory(tmp_path / "cache", verbose=0)
    for again in (pickle.loads(pickle.dumps(mem)), copy.deepcopy(mem), copy.copy(mem)):
        assert type(again) is JoblibMemory and isinstance(again, joblib.Memory)
        assert again.location == mem.location
        assert again.cache(double)(np.ones(2)).tolist() == [2.0, 2.0]


def test_stored_metadata_has_the_size(mem):
    ref = mem.cache(double).call_and_shelve(np.ones(10))
    meta = ref.metadata
    assert meta["size"] == 80 and meta["func"] == "test_memory.double"


def test_large_layouts_are_not_kept_after_the_hit(mem):
    from mlcache.entry import format as entry_format

    f = mem.cache(lambda n: [i / 7 for i in range(n)])
    f(20_000)
    before = entry_format._parse_small_layout.cache_info().currsize
    assert len(f(20_000)) == 20_000
    assert entry_format._parse_small_layout.cache_info().currsize == before


def test_mapped_results_are_shareable_by_joblib_parallel(tmp_path):
    memmapping = pytest.importorskip("joblib._memmapping_reducer")
    mem = Memory(tmp_path, mmap_mode="r", verbose=0)
    f = mem.cache(double)
    f(np.arange(10.0))
    assert memmapping.has_shareable_memory(f(np.arange(10.0)))


# -- second review: callables without code, arguments that are functions ---------------
def test_builtins_ufuncs_and_classes_can_be_memoized(mem):
    import math
    import operator

    assert mem.cache(math.factorial)(5) == 120
    assert mem.cache(np.sqrt)(4.0) == 2.0
    assert mem.cache(len)([1, 2]) == 2 and mem.eval(len, "abc") == 3
    assert mem.cache(operator.itemgetter(1))([5, 6]) == 6
    assert mem.cache(Model)(3).k == 3
    assert mem.cache(dict)(a=1) == {"a": 1}


def test_a_class_as_the_callable_is_versioned_by_its_methods(tmp_path):
    from mlcache.keys.code_version import code_version as cv

    def code_version(f):
        return cv(f).digest

    ns1: dict = {"__name__": "userns"}
    ns2: dict = {"__name__": "userns"}
    exec("class Op:\n    def __init__(self, x):\n        self.y = x * 2\n", ns1)
    exec("class Op:\n    def __init__(self, x):\n        self.y = x * 3\n", ns2)
    assert code_version(ns1["Op"]) != code_version(ns2["Op"])


def test_moving_a_line_out_of_a_try_changes_the_version():
    from mlcache.keys.code_version import code_version as cv

    def code_version(f):
        return cv(f).digest

    v1 = (
        "def lookup(d):\n    try:\n        x = d['k']\n        y = d['j']\n"
        "    except KeyError:\n        return -1\n    return x\n"
    )
    v2 = (
        "def lookup(d):\n    try:\n        x = d['k']\n    except KeyError:\n"
        "        return -1\n    else:\n        y = d['j']\n    return x\n"
    )
    ns1: dict = {}
    ns2: dict = {}
    exec(v1, ns1)
    exec(v2, ns2)
    assert code_version(ns1["lookup"]) != code_version(ns2["lookup"])


def test_functions_as_arguments_are_keyed_by_defaults_and_wrapped_code(mem):
    import functools

    @mem.cache
    def apply(fn, x):
        return fn(x)

    by2, by3 = [lambda x, k=k: x * k for k in (2, 3)]
    assert (apply(by2, 10), apply(by3, 10)) == (20, 30)

    def make(k):
        @functools.lru_cache
        def scale(x):
            return x * k

        return scale

    assert (apply(make(2), 10), apply(make(3), 10)) == (20, 30)


def test_replacing_an_array_default_re_keys(mem):
    def f(x, w=np.ones(3)):  # noqa: B008 - the point of the test
        return float((x * w).sum())

    g = mem.cache(f)
    assert g(1) == 3.0
    f.__defaults__ = (np.full(3, 2.0),)
    assert g(1) == 6.0


def test_static_and_class_methods_under_the_decorator(tmp_path):
    mem = Memory(tmp_path, verbose=0)

    class A:
        base = 10

        @mem.cache
        @staticmethod
        def twice(x):
            return 2 * x

        @mem.cache
        @classmethod
        def plus(cls, x):
            return cls.base + x

    assert (A().twice(2), A.twice(3), A.plus(1), A().plus(2)) == (4, 6, 11, 12)


def test_copy_on_write_maps_are_private(tmp_path):
    memmapping = pytest.importorskip("joblib._memmapping_reducer")
    mem = Memory(tmp_path, mmap_mode="c", verbose=0)
    f = mem.cache(double)
    f(np.arange(10.0))
    out = f(np.arange(10.0))
    assert isinstance(out, np.memmap) and out.mode == "c" and out.flags.writeable
    assert not memmapping.has_shareable_memory(out)  # workers must get our edits


def test_closure_lambdas_on_one_line_do_not_share_a_folder():
    from mlcache.keys.identity import func_identity

    k = 3
    a, b = (lambda x: x * k), (lambda x: x + k)
    assert func_identity(a) != func_identity(b)


def test_script_functions_hit_in_joblib_workers(tmp_path):
    script = tmp_path / "xproc.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from joblib import Parallel, delayed
            from mlcache import Memory
            mem = Memory({str(tmp_path / "c")!r}, verbose=0)

            @mem.cache
            def g(x):
                with open({str(tmp_path / "calls")!r}, "a") as f:
                    f.write("c")
                return x * 2

            if __name__ == "__main__":
                print([g(i) for i in range(4)])
                print(Parallel(n_jobs=2)(delayed(g)(i) for i in range(4)))
            """
        )
    )
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["[0, 2, 4, 6]", "[0, 2, 4, 6]"]
    assert (tmp_path / "calls").read_text() == "cccc"  # the workers hit the parent's entries


def test_a_logged_miss_says_why(tmp_path, caplog):
    mem = Memory(tmp_path, verbose=1)

    def scaled(x, scale=2.0):
        return x * scale

    f = mem.cache(scaled)
    x = np.arange(5.0)
    with caplog.at_level(logging.INFO, logger="mlcache"):
        f(x)
        f(x)  # a hit says nothing at verbose=1
        f(x, scale=3.0)
        f(x + 1, scale=4.0)
    calls = [r.getMessage() for r in caplog.records if "calling" in r.getMessage()]
    assert len(calls) == 3
    assert calls[0].endswith("no entry yet")
    assert calls[1].endswith("argument 'scale' changed since the last entry")
    assert calls[2].endswith("arguments 'x', 'scale' changed since the last entry")

    def scaled(x, scale=2.0):  # new code, same function
        return x * scale + 0

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mlcache"):
        mem.cache(scaled)(x)
    assert any(
        r.getMessage().endswith("its code changed (test_a_logged_miss_says_why.<locals>.scaled)")
        for r in caplog.records
    )


def test_a_cache_warning_is_also_a_log_record(tmp_path, caplog):
    """Everything mlcache says goes through the "mlcache" logger; problems it works
    around are CacheWarnings too."""
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(double)
    f(np.arange(10.0))
    entry = next(e for e in entries(mem.store))
    path = mem.store.local_path(entry.name)
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="damaged cache entry"),
    ):
        f(np.arange(10.0))
    [record] = [r for r in caplog.records if r.name == "mlcache"]
    assert record.levelno == logging.WARNING and "damaged cache entry" in record.getMessage()
