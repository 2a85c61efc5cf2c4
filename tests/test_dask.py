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
