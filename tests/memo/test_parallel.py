"""cached_map: the executor= option and its deprecated name backend=."""

from __future__ import annotations

import datetime
import warnings

import pytest

from mlcache import CacheWarning, Memory
from mlcache.memo.parallel import cached_map


def _square(x: int) -> int:
    return x * x


def _day(x: int) -> datetime.date:
    return datetime.date(2020, 1, x)


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


def test_values_that_need_pickle_come_back_unstored_with_one_warning(tmp_path):
    """allow_pickle=False: cached_map returns what needs pickle, stores none of it,
    and warns once for the function, not once per item."""
    f = Memory(tmp_path, verbose=0, allow_pickle=False).cache(_day)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cached_map(f, [1, 2, 3], executor="threads", workers=1, progress=False)
    assert out == [datetime.date(2020, 1, d) for d in (1, 2, 3)]
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "datetime.date" in str(ours[0].message)
    assert not any(f.check_call_in_cache(d) for d in (1, 2, 3))
