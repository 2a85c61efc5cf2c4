"""Memoized functions on a real dask.distributed cluster (worker processes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlcache import Memory

distributed = pytest.importorskip("distributed")


def _scaled(x, k, log):
    with open(log, "a") as f:  # workers are other processes: count calls in a file
        f.write("call\n")
    return x * k


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # a free port: runs in parallel never clash
        silence_logs=40,
    )
    with cluster, distributed.Client(cluster) as c:
        yield c


def test_memorized_function_runs_in_dask_workers(client, tmp_path):
    mem = Memory(tmp_path / "cache", verbose=0)
    f = mem.cache(_scaled, ignore=["log"])
    log = str(tmp_path / "calls.log")
    x = np.arange(10.0)
    first = client.gather(client.map(f, [x, x + 1, x + 2], k=3, log=log))
    for i, out in enumerate(first):
        np.testing.assert_array_equal(out, (x + i) * 3)
        assert f.check_call_in_cache(x + i, k=3, log=log)  # stored by the workers
    assert Path(log).read_text().count("call") == 3
    # a second run of the same graph computes nothing
    again = client.gather(client.map(f, [x, x + 1, x + 2], k=3, log=log, pure=False))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert Path(log).read_text().count("call") == 3


# -- a shared S3 store: workers on "other machines" --------------------------------------
def _logged_square(x, log):
    with open(log, "a") as f:
        f.write("call\n")
    return np.full(1000, x, dtype=np.float64) ** 2


def _s3_memory(s3_bucket, tmp_path, name):
    url, options = s3_bucket
    return Memory(
        f"{url}/shared",
        verbose=0,
        secret="cluster secret",
        backend_options={**options, "local_cache_dir": str(tmp_path / name)},
    )


def test_a_dask_graph_on_a_shared_store_computes_nothing_the_second_time(
    client, s3_bucket, tmp_path
):
    import dask

    log = str(tmp_path / "calls.log")
    f = _s3_memory(s3_bucket, tmp_path, "graph").cache(_logged_square, ignore=["log"])
    graph = [dask.delayed(f)(i, log) for i in range(6)]
    first = dask.compute(*graph, scheduler=client)
    assert Path(log).read_text().count("call") == 6
    again = dask.compute(*[dask.delayed(f)(i, log) for i in range(6)], scheduler=client)
    assert Path(log).read_text().count("call") == 6  # nothing computed
    for i, (a, b) in enumerate(zip(first, again)):
        np.testing.assert_array_equal(a, np.full(1000, i * i, dtype=np.float64))
        np.testing.assert_array_equal(a, b)
    # a teammate's Memory on the same store, elsewhere, finds everything
    other = _s3_memory(s3_bucket, tmp_path, "teammate").cache(_logged_square, ignore=["log"])
    assert all(other.check_call_in_cache(i, log) for i in range(6))


def test_cached_map_computes_only_what_is_missing(client, s3_bucket, tmp_path):
    from functools import partial

    from mlcache.memo.parallel import cached_map

    log = str(tmp_path / "calls.log")
    f = _s3_memory(s3_bucket, tmp_path, "map").cache(partial(_logged_square, log=log))
    out = cached_map(f, [1, 2, 3], executor="dask", client=client, progress=False)
    assert Path(log).read_text().count("call") == 3
    out2 = cached_map(f, [1, 2, 3, 4, 5], executor="dask", client=client, progress=False)
    assert Path(log).read_text().count("call") == 5  # only 4 and 5
    for i, arr in zip([1, 2, 3, 4, 5], out2):
        np.testing.assert_array_equal(arr, np.full(1000, i * i, dtype=np.float64))
    for a, b in zip(out, out2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_cached_map_on_local_executors(tmp_path, executor):
    from functools import partial

    from mlcache.memo.parallel import cached_map

    log = str(tmp_path / "calls.log")
    f = Memory(tmp_path / "c", verbose=0).cache(partial(_logged_square, log=log))
    f(0)
    out = cached_map(f, range(4), executor=executor, workers=2, progress=False)
    assert Path(log).read_text().count("call") == 4  # 0 was cached
    assert [float(a[0]) for a in out] == [0.0, 1.0, 4.0, 9.0]
    with pytest.raises(ValueError, match="executor"):
        cached_map(f, [1], executor="gpu")
    with pytest.raises(TypeError, match="memoized"):
        cached_map(len, [1])


def test_cached_map_results_chain_like_hits(tmp_path):
    """What cached_map returns is what a hit returns: a memory-mapped result keeps
    its entry's name, so the next step's key is the same on the first run and on
    the next."""
    from functools import partial

    from mlcache.entry import REF_ATTR
    from mlcache.memo.parallel import cached_map

    log = str(tmp_path / "calls.log")
    mem = Memory(tmp_path / "c", verbose=0, mmap_mode="r")
    f = mem.cache(partial(_logged_square, log=log))
    first = cached_map(f, [1, 2], executor="processes", workers=2, progress=False)
    assert all(REF_ATTR in a.__dict__ for a in first)
    again = cached_map(f, [1, 2], executor="processes", workers=2, progress=False)
    assert [getattr(a, REF_ATTR) for a in first] == [getattr(a, REF_ATTR) for a in again]
