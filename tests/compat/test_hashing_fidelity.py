"""Drop-in fidelity, argument hashing: what a function can see of an argument is in
its key, nothing raised while hashing reaches the call, and functions and classes
passed as arguments or defaults bring their code version.

Each case failed before the changes of issue 12 to ``mlcache.keys.hashing``."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlcache import CacheWarning, Memory
from mlcache.keys.hashing import hash_value

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import Project  # the fresh-interpreter package helper


def distinct(*values: object) -> None:
    keys = [hash_value(v) for v in values]
    assert len(set(keys)) == len(keys), keys


def same(a: object, b: object) -> None:
    assert hash_value(a) == hash_value(b)


@pytest.fixture
def mem(tmp_path):
    return Memory(tmp_path / "cache", verbose=0)


# -- 1. what a function can see is in the key ----------------------------------------
def test_a_series_on_a_daily_index_differs_from_one_without_freq():
    pd = pytest.importorskip("pandas")
    daily = pd.date_range("2024-01-01", periods=4, freq="D")
    plain = pd.DatetimeIndex(list(daily))
    assert plain.freq is None and daily.equals(plain)  # equal, but .freq differs
    distinct(pd.Series([1.0, 2, 3, 4], index=daily), pd.Series([1.0, 2, 3, 4], index=plain))
    distinct(pd.DataFrame({"a": range(4)}, index=daily), pd.DataFrame({"a": range(4)}, index=plain))
    hourly = pd.timedelta_range(0, periods=3, freq="h")
    distinct(hourly, pd.TimedeltaIndex(list(hourly)))
    # freq objects with the same name but other parameters (holidays)
    distinct(
        pd.date_range("2024-01-01", periods=3, freq=pd.offsets.CustomBusinessDay()),
        pd.date_range(
            "2024-01-01", periods=3, freq=pd.offsets.CustomBusinessDay(holidays=["2024-01-02"])
        ),
    )
    same(pd.Series([1.0], index=daily[:1]), pd.Series([1.0], index=daily[:1].copy()))


def test_pandas_metadata_a_function_can_read_is_in_the_key():
    pd = pytest.importorskip("pandas")
    # a RangeIndex is its start, stop and step: range(0, 5, 2) and range(0, 6, 2)
    # hold the same values but are not the same index
    distinct(pd.RangeIndex(0, 5, 2), pd.RangeIndex(0, 6, 2), pd.Index([0, 2, 4]))
    # a MultiIndex's levels are visible (unused levels stay until removed)
    mi = pd.MultiIndex.from_arrays([[1, 2, 3], ["a", "b", "c"]], names=["x", "y"])
    distinct(mi[:2], mi[:2].remove_unused_levels(), mi[:2].set_names(["x", "z"]))
    same(mi, pd.MultiIndex.from_arrays([[1, 2, 3], ["a", "b", "c"]], names=["x", "y"]))
    frame = pd.DataFrame({"a": [1, 2]})
    distinct(frame, frame.set_flags(allows_duplicate_labels=False))
    distinct(pd.Series([1.0]), pd.Series([1.0]).set_flags(allows_duplicate_labels=False))


class Tagged(np.ndarray):
    """An ndarray subclass carrying metadata, as astropy-like unit arrays do."""

    def __array_finalize__(self, obj: object) -> None:
        if obj is not None:
            self.__dict__.update(getattr(obj, "__dict__", {}))


class NoPickle(np.ndarray):
    """A subclass whose pickling is refused: hashing must not need it."""

    def __reduce_ex__(self, protocol: object) -> object:
        raise TypeError("not picklable")


def test_ndarray_subclasses_that_differ_only_in_their_attributes_are_distinct():
    metres, seconds, bare = (np.arange(3.0).view(Tagged) for _ in range(3))
    metres.unit, seconds.unit = "m", "s"
    distinct(metres, seconds, bare, np.arange(3.0))
    other = np.arange(3.0).view(Tagged)
    other.unit = "m"
    same(metres, other)
    meta = np.arange(3.0).view(Tagged)
    meta.meta = {"source": "a", "n": 1}
    meta2 = np.arange(3.0).view(Tagged)
    meta2.meta = {"source": "b", "n": 1}
    distinct(meta, meta2)
    # hashed from the buffer, not through pickle
    x = np.arange(4.0).view(NoPickle)
    distinct(x, np.arange(5.0).view(NoPickle), np.arange(4.0))


def test_masked_arrays_dtype_metadata_and_structured_records_are_in_the_key():
    data = [1.0, 2.0, 3.0]
    soft = np.ma.array(data, mask=[False, True, False])
    hard = np.ma.array(data, mask=[False, True, False], hard_mask=True)
    distinct(soft, hard)  # a[1] = 5 unmasks soft, is ignored by hard
    same(soft, np.ma.array(data, mask=[False, True, False]))
    tagged = np.dtype("f8", metadata={"unit": "m"})
    distinct(np.zeros(2), np.zeros(2, dtype=tagged))
    # records of structured arrays: their fields, not only their size
    pairs = np.zeros(1, dtype=[("a", "<i4"), ("b", "<i4")])
    renamed = np.zeros(1, dtype=[("x", "<i4"), ("y", "<i4")])
    retyped = np.zeros(1, dtype=[("a", "<f4"), ("b", "<i4")])
    distinct(pairs[0], renamed[0], retyped[0])
    same(pairs[0], np.zeros(1, dtype=[("a", "<i4"), ("b", "<i4")])[0])


# -- 2. nothing raised while hashing reaches the call --------------------------------
class dotdict(dict):  # the common idiom, spelled as users spell it
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class LazyProxy:
    """A lazy object: an attribute it does not have raises (not AttributeError)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"working outside of a context ({name})")


class ForwardingProxy:
    """A proxy to an object that is not there (werkzeug's LocalProxy outside a
    request, django's SimpleLazyObject whose factory fails): everything, its
    ``__class__`` and pickling included, is forwarded and raises."""

    def _target(self) -> object:
        raise RuntimeError("working outside of a context")

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._target())

    def __getattr__(self, name: str) -> object:
        return getattr(self._target(), name)

    def __reduce_ex__(self, protocol: object) -> object:
        return self._target().__reduce_ex__(protocol)  # type: ignore[call-overload]


def test_a_dotdict_is_hashed_as_the_dict_it_is():
    distinct(dotdict(a=1), dotdict(a=2), {"a": 1})
    same(dotdict(a=1, b=2), dotdict(b=2, a=1))


#: what the functions below computed (module level: a closure over a list that a
#: call appends to is state, not input, which is another part of issue 12)
CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _no_calls():
    CALLS.clear()


def double_a(cfg):
    CALLS.append("double_a")
    return cfg["a"] * 2


def reader_of(cfg):
    def add(x):
        CALLS.append("add")
        return x + cfg["a"]

    return add


def test_a_dotdict_argument_and_captured_dotdict_are_cached(mem):
    g = mem.cache(double_a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(dotdict(a=2)) == 4 and g(dotdict(a=2)) == 4 and g(dotdict(a=3)) == 6
    assert CALLS == ["double_a"] * 2
    cfg = dotdict(a=5)
    k = mem.cache(reader_of(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert k(1) == 6 and k(1) == 6
        assert CALLS.count("add") == 1
        cfg["a"] = 6
        assert k(1) == 7  # what it reads is in the key
    assert CALLS.count("add") == 2


def shape_of(t):
    CALLS.append("shape_of")
    return tuple(t.shape)


def read_value(p):
    CALLS.append("read_value")
    return p.value


def second_plus_one(x, y):
    CALLS.append("second_plus_one")
    return y + 1


def test_torch_meta_and_nested_tensors_are_hashed_by_what_they_are(mem):
    torch = pytest.importorskip("torch")
    meta = torch.empty(2, 3, device="meta")
    same(meta, torch.empty(2, 3, device="meta"))
    distinct(
        meta,
        torch.empty(3, 2, device="meta"),
        torch.empty(2, 3, device="meta", dtype=torch.float64),
        torch.empty(2, 3, device="meta").t(),
        torch.empty(2, 3),
    )
    jagged = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)], layout=torch.jagged)
    same(
        jagged, torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)], layout=torch.jagged)
    )
    distinct(
        jagged,
        torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0) + 1], layout=torch.jagged),
        torch.nested.nested_tensor([torch.ones(3), torch.arange(2.0)], layout=torch.jagged),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: strided nested is a prototype
        strided = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
        strided2 = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0) + 1])
    distinct(strided, strided2, jagged)

    f = mem.cache(shape_of)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(meta) == (2, 3) and f(torch.empty(2, 3, device="meta")) == (2, 3)
        assert f(jagged) == f(jagged)
    assert CALLS == ["shape_of"] * 2


def test_a_proxy_whose_getattr_raises_is_hashed_by_its_state(mem):
    distinct(LazyProxy(1), LazyProxy(2))
    g = mem.cache(read_value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(LazyProxy(1)) == 1 and g(LazyProxy(1)) == 1 and g(LazyProxy(2)) == 2
    assert CALLS == ["read_value"] * 2


def test_an_argument_that_raises_while_hashed_is_one_warning_and_an_uncached_call(mem):
    g = mem.cache(second_plus_one)
    with pytest.warns(CacheWarning, match=r"called uncached: cannot hash argument 'x'") as rec:
        assert g(ForwardingProxy(), 1) == 2
    assert len(rec) == 1 and "RuntimeError: working outside" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per function
        assert g(ForwardingProxy(), 1) == 2
    assert len(CALLS) == 2  # uncached: computed each time
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(None, 1) == 2 and g(None, 1) == 2  # other calls are still cached
    assert len(CALLS) == 3
    assert not g.check_call_in_cache(ForwardingProxy(), 1)


def test_a_captured_value_that_raises_while_hashed_does_not_break_the_call(mem):
    captured = ForwardingProxy()

    def f(x):
        CALLS.append("f")
        return x + 1 if captured is not None else 0

    g = mem.cache(f)
    with pytest.warns(CacheWarning, match="working outside of a context") as rec:
        assert g(1) == 2
    assert len(rec) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(1) == 2 and g(2) == 3
    assert len(CALLS) >= 2


# -- 3. functions and classes passed as arguments or defaults ------------------------
HELPERS = '''
"""Helpers passed to the pipeline as values."""


def _inner(x):
    # comment v1
    return x * 2


def scale(x):
    return _inner(x) + 1


class Model:
    def predict(self, x):
        return self._core(x)

    def _core(self, x):
        return x + 10
'''

PIPELINE = """
import os

from mlcache import Memory

from tpkg import helpers

mem = Memory(os.environ["TPKG_CACHE"], verbose=0)
LOG = os.environ["TPKG_LOG"]


def _log(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")


@mem.cache
def apply(x, transform):
    _log("apply")
    return transform(x)


@mem.cache
def fit(x, model_cls):
    _log("fit")
    return model_cls().predict(x)


@mem.cache
def apply_default(x, fn=helpers.scale):
    _log("apply_default")
    return fn(x)


@mem.cache
def library(x, fn):
    _log("library")
    return float(fn(x))


def run_all():
    import numpy as np

    return [apply(3, transform=helpers.scale), fit(3, helpers.Model), apply_default(3),
            library([1.0, 2.0], np.mean)]
"""


@pytest.fixture
def passed(tmp_path):
    project = Project(tmp_path)
    (tmp_path / "tpkg" / "helpers.py").write_text(textwrap.dedent(HELPERS))
    (tmp_path / "tpkg" / "pipeline.py").write_text(textwrap.dedent(PIPELINE))
    return project


def test_functions_and_classes_passed_as_values_bring_their_code_version(passed):
    every = {"apply", "fit", "apply_default", "library"}
    assert passed.run() == every
    assert passed.run() == set()
    passed.edit("helpers", "# comment v1", "# comment v2")  # not code
    assert passed.run() == set()
    passed.edit("helpers", "return x * 2", "return x * 3")  # scale's helper
    assert passed.run() == {"apply", "apply_default"}
    assert passed.run() == set()
    passed.edit("helpers", "return x + 10", "return x + 20")  # a method predict calls
    assert passed.run() == {"fit"}
    assert passed.run() == set()


def test_library_functions_and_classes_are_keyed_by_name_and_library_version():
    from mlcache.keys.origin import library_version

    assert library_version("numpy") in repr_of_stream(np.mean)
    assert library_version("numpy") in repr_of_stream(np.add)
    distinct(np.mean, np.median, np.ndarray, np.float32)
    linear = pytest.importorskip("sklearn.linear_model")
    assert library_version("sklearn") in repr_of_stream(linear.LinearRegression)
    assert library_version("sklearn") in repr_of_stream(
        linear.LinearRegression(fit_intercept=False)
    )


def repr_of_stream(obj: object) -> str:
    """The canonical stream of ``obj``, as text (for what it contains)."""
    from mlcache.keys.hashing import Hasher

    h = Hasher()
    h.update(obj)
    return bytes(h.buf).decode("latin-1")


def test_a_function_passed_as_argument_is_keyed_by_its_helpers_in_process(tmp_path):
    """Two modules of the same name and function, differing in a helper only (as a
    module before and after an edit): their functions hash differently."""
    keys = []
    for body in ("x * 2", "x * 3"):
        folder = tmp_path / body.replace(" ", "").replace("*", "m")
        folder.mkdir()
        (folder / "hmod.py").write_text(
            textwrap.dedent(
                f"""
                def _inner(x):
                    return {body}


                def scale(x):
                    return _inner(x) + 1
                """
            )
        )
        sys.path.insert(0, str(folder))
        try:
            sys.modules.pop("hmod", None)
            import hmod  # type: ignore[import-not-found]

            keys.append(hash_value(hmod.scale))
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("hmod", None)
    assert keys[0] != keys[1]
    # a function that reaches itself through a default (a dispatch table): the code
    # walk hashes the table, which holds the function; it terminates, stably
    table: dict[str, object] = {}

    def step(x, table=table):
        return table["step"](x - 1) if x else 0

    table["step"] = step
    assert len(hash_value(step)) == 32 and hash_value(step) == hash_value(step)


def test_later_uncached_calls_are_logged_not_silent(mem, caplog):
    def f(x):
        return 1

    g = mem.cache(f)
    with pytest.warns(CacheWarning, match="argument 'x'"):
        assert g(ForwardingProxy()) == 1
    with caplog.at_level("DEBUG", logger="mlcache"), warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per function
        assert g(ForwardingProxy()) == 1
    assert any("cannot hash argument 'x'" in r.getMessage() for r in caplog.records)


def test_a_library_not_imported_yet_is_versioned_without_the_map_of_every_distribution():
    """Code that names a library it imports later (``pandas`` inside a function) is
    keyed by that library's version from its own distribution, one lookup; the map
    of every installed distribution (a second or more to build) is only for a
    module named otherwise than its distribution (``dateutil``: python-dateutil)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from importlib import metadata\n"
        "from mlcache.keys import origin\n"
        "assert 'pandas' not in sys.modules\n"
        "v = origin.library_version('pandas')\n"
        "assert v == 'pandas==' + metadata.version('pandas'), v\n"
        "assert origin._distributions.cache_info().currsize == 0\n"
        "d = origin.library_version('dateutil')\n"
        "assert d == 'dateutil==' + metadata.version('python-dateutil'), d\n"
        "print('ok')\n"
    )
    run = [sys.executable, "-c", script]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
