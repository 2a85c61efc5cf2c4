"""cached_map: the executor= option and its deprecated name backend=."""

from __future__ import annotations

import pytest

from mlcache import Memory
from mlcache.memo.parallel import cached_map


def _square(x: int) -> int:
    return x * x


def test_executor_names_where_the_missing_items_are_computed(tmp_path):
    f = Memory(tmp_path, verbose=0).cache(_square)
    f(2)
    assert cached_map(f, [1, 2, 3], executor="threads", progress=False) == [1, 4, 9]
    assert f.stats().misses == 3  # 2 was cached: computed once


def test_an_unknown_executor_is_refused_with_the_choices(tmp_path):
    f = Memory(tmp_path, verbose=0).cache(_square)
    with pytest.raises(ValueError, match="executor must be one of threads, processes, dask"):
        cached_map(f, [1], executor="gpu")


def test_backend_is_still_accepted_with_a_deprecation_warning_naming_executor(tmp_path):
    f = Memory(tmp_path, verbose=0).cache(_square)
    with pytest.warns(DeprecationWarning, match=r"cached_map\(executor=\)"):
        assert cached_map(f, [1, 2], backend="threads", progress=False) == [1, 4]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="executor"):
        cached_map(f, [1], backend="gpu")


def test_executor_and_its_old_name_together_are_refused(tmp_path):
    f = Memory(tmp_path, verbose=0).cache(_square)
    with pytest.raises(TypeError, match="not both"):
        cached_map(f, [1], executor="threads", backend="processes")
