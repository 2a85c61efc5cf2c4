"""Code written for joblib keeps working: the exceptions joblib raises, and what
``verbose`` shows.

Each exception case asserts mlcache's own class *and* the builtin joblib raises
for the same mistake (checked against joblib 1.6: ``joblib.register_store_backend``,
``joblib.Memory``, ``joblib.func_inspect.filter_args``), and joblib's wording
where code may match on it. The ``verbose`` cases run fresh processes, as a
user's script does: logging configuration is per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mlcache import (
    CacheError,
    ConfigError,
    MemorizedFunc,
    Memory,
    RegistryError,
    errors,
    register_store_backend,
)
from mlcache.store import stores
from mlcache.store.local import LocalStore


@pytest.fixture
def mem(tmp_path):
    return Memory(tmp_path / "cache", verbose=0)


@pytest.fixture
def backend_name():
    name = "compat-test-backend"
    yield name
    stores._entries.pop(name, None)  # leave the process-wide registry as it was


# -- register_store_backend -------------------------------------------------------------
@pytest.mark.parametrize("name", [1, None, b"local"])
def test_registering_under_a_name_that_is_not_a_str_is_a_value_error(name):
    # joblib: ValueError("Store backend name should be a string, ...")
    with pytest.raises(errors.InvalidRegistration) as info:
        register_store_backend(name, LocalStore)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RegistryError)  # mlcache's class as before


@pytest.mark.parametrize("impl", [dict, int, None, object(), "not a class"])
def test_registering_what_is_not_a_store_class_is_a_value_error(impl, backend_name):
    # joblib: ValueError("Store backend should inherit StoreBackendBase, ...") for
    # a class and for None (a non-class object fails in issubclass: TypeError)
    with pytest.raises(errors.InvalidRegistration) as info:
        register_store_backend(backend_name, impl)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, RegistryError)
    assert backend_name not in stores


def test_registering_the_same_backend_again_works_as_in_joblib(backend_name):
    # joblib replaces silently: a module imported twice, a notebook cell run
    # again (a new class object with the same name) must not fail
    source = "from mlcache.store.local import LocalStore\nclass MyStore(LocalStore):\n    pass\n"
    first: dict = {"__name__": "user_stores"}
    again: dict = {"__name__": "user_stores"}
    exec(source, first)
    exec(source, again)
    register_store_backend(backend_name, first["MyStore"])
    register_store_backend(backend_name, first["MyStore"])
    register_store_backend(backend_name, again["MyStore"])
    assert stores[backend_name] is again["MyStore"]
    # another class under a taken name is still refused (ValueError, as joblib's
    # other registration errors): replace=True says it is meant
    with pytest.raises(errors.InvalidRegistration, match="replace=True") as info:
        register_store_backend(backend_name, LocalStore)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["GCS", "My Backend", "s3_v2"])
def test_any_str_joblib_accepts_is_a_backend_name(tmp_path, name):
    # joblib's only rule for a store backend's name is that it is a str
    register_store_backend(name, LocalStore)
    try:
        assert isinstance(Memory(tmp_path, backend=name).store, LocalStore)
    finally:
        stores._entries.pop(name, None)


@pytest.mark.parametrize("name", ["", "a\nb"])
def test_an_empty_or_multiline_backend_name_is_still_refused(name):
    with pytest.raises(errors.InvalidRegistration) as info:
        register_store_backend(name, LocalStore)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", [None, {}, [], 1])
def test_a_name_that_is_not_a_str_is_refused_in_joblibs_words(name):
    # joblib: ValueError("Store backend name should be a string, '...' given.")
    with pytest.raises(errors.InvalidRegistration, match=r"^Store backend name should be a string"):
        register_store_backend(name, LocalStore)  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", [None, dict, object()])
def test_what_is_not_a_store_is_refused_in_joblibs_words(impl, backend_name):
    # joblib: ValueError("Store backend should inherit StoreBackendBase, '...' given.")
    with pytest.raises(
        errors.InvalidRegistration, match="Store backend should inherit StoreBackendBase"
    ):
        register_store_backend(backend_name, impl)  # type: ignore[arg-type]


def test_the_new_error_classes_are_public():
    import mlcache

    for name in ("CallArgumentsError", "ConfigTypeError", "InvalidRegistration", "UnknownBackend"):
        assert getattr(mlcache, name) is getattr(errors, name) and name in mlcache.__all__


def test_an_unknown_backend_is_a_type_error(tmp_path):
    # joblib: TypeError("Unknown location ... or backend nope")
    with pytest.raises(errors.UnknownBackend, match="unknown store backend 'nope'") as info:
        Memory(tmp_path, backend="nope")
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, RegistryError)
    assert str(info.value).startswith(f"Unknown location {tmp_path} or backend nope")  # joblib's


def test_backend_options_the_backend_does_not_take_are_ignored_with_one_warning(tmp_path):
    # joblib passes every option to its backend, which ignores what it does not know
    with pytest.warns(errors.CacheWarning) as caught:
        mem = Memory(tmp_path, verbose=0, backend_options={"parameter": 1, "durable": False})
    assert len(caught) == 1
    assert "'parameter'" in str(caught[0].message) and "durable" not in str(caught[0].message)
    assert mem.store.durable is False  # type: ignore[union-attr]  # what it takes reaches it
    assert mem.backend_options == {"parameter": 1, "durable": False}  # as given, as joblib's
    assert mem.cache(g_plain)(3) == 6 and mem.cache(g_plain).check_call_in_cache(3)
    # only unknown names are ignored: a bad value for a known one is the user's to fix
    register_store_backend("compat-strict", _StrictStore)
    try:
        with pytest.raises(TypeError, match="rejected backend_options"):
            Memory(tmp_path / "2", backend="compat-strict", backend_options={"level": "high"})
    finally:
        stores._entries.pop("compat-strict", None)


class _StrictStore(LocalStore):
    def __init__(self, location, *, level: int = 1):
        if not isinstance(level, int):
            raise TypeError(f"level must be an int, got {level!r}")
        super().__init__(location)


# -- Memory.cache ---------------------------------------------------------------------
@pytest.mark.parametrize("callback", [3, "expires", [lambda meta: True]])
def test_a_callback_that_is_not_callable_is_a_value_error(mem, callback):
    # joblib: ValueError("cache_validation_callback needs to be callable. Got 3.")
    with pytest.raises(
        ConfigError, match=r"^cache_validation_callback needs to be callable"
    ) as info:
        mem.cache(lambda x: x, cache_validation_callback=callback)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TypeError)  # what mlcache raised before


def f_kwonly(a, *, b=1):
    return a + b


def g_plain(a, b=2):
    return a * b


# (function, args, kwargs, joblib's message prefix)
WRONG_CALLS = [
    (f_kwonly, (1, 2), {}, "Too many arguments for f_kwonly(a, *, b=1)"),
    (g_plain, (1, 2, 3), {}, "Too many arguments for g_plain(a, b=2)"),
    (g_plain, (1,), {"c": 2}, "Too many keyword arguments for g_plain(a, b=2)"),
    (g_plain, (), {}, "Wrong number of arguments for g_plain(a, b=2)"),
    (g_plain, (), {"b": 2}, "Wrong number of arguments for g_plain(a, b=2)"),
    (
        g_plain,
        (1,),
        {"a": 2},
        "Argument a was given both as positional and as keyword for g_plain(a, b=2)",
    ),
]


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "prefix"),
    WRONG_CALLS,
    ids=[f"{f.__name__}{a}{k}" for f, a, k, _ in WRONG_CALLS],
)
@pytest.mark.parametrize("method", ["__call__", "call", "check_call_in_cache", "call_and_shelve"])
def test_a_wrong_call_is_joblibs_value_error(mem, func, args, kwargs, prefix, method):
    # joblib's filter_args raises ValueError("Too many arguments for f(a, *, b=1): ...")
    # before calling; Python's own call raises TypeError: the error is both
    memorized = mem.cache(func)
    with pytest.raises(errors.CallArgumentsError) as info:
        getattr(memorized, method)(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, CacheError)
    assert str(info.value).startswith(prefix), str(info.value)
    try:  # and it still says what Python says about the call
        func(*args, **kwargs)
    except TypeError as exc:
        assert str(exc) in str(info.value)


# -- the constructor and the other methods ---------------------------------------------
@pytest.mark.parametrize("verbose", ["a", [1], object()])
def test_a_verbose_that_is_not_a_number_is_a_config_error(tmp_path, verbose):
    # joblib takes any value and compares it later; mlcache says so at once, with
    # a type that both a TypeError and a ValueError clause catch
    with pytest.raises(ConfigError, match="verbose must be an int") as info:
        Memory(tmp_path, verbose=verbose)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("options", [[1], "durable", 3])
def test_backend_options_that_are_not_a_mapping_say_so(tmp_path, options):
    # joblib: TypeError (from ** of a non-mapping)
    with pytest.raises(TypeError, match="backend_options must be a dict") as info:
        Memory(tmp_path, backend_options=options)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize("items", [-1, "a", 1.5])
def test_reduce_size_bad_items_limit_is_a_config_error(mem, items):
    with pytest.raises(ConfigError, match="items_limit") as info:
        mem.reduce_size(items_limit=items)
    assert isinstance(info.value, ValueError)


# -- MemorizedFunc made directly -------------------------------------------------------
def test_memorized_func_takes_joblibs_constructor_form(tmp_path):
    # joblib: MemorizedFunc(func, location, backend="local", ignore=None, mmap_mode=None,
    # compress=False, verbose=1, timestamp=None, cache_validation_callback=None)
    calls = []

    def double(x):
        calls.append(x)
        return 2 * x

    for location in (str(tmp_path / "a"), tmp_path / "b"):
        func = MemorizedFunc(double, location, verbose=0, timestamp=12.5)
        assert (func(3), func(3)) == (6, 6) and func.check_call_in_cache(3)
        assert func.timestamp == 12.5 and func.memory.location == str(location)
    assert calls == [3, 3]  # once per location
    positional = MemorizedFunc(double, str(tmp_path / "c"), "local", ["x"], None, 3, 0)
    assert positional(1) == positional(2) == 2  # x ignored: one entry for both calls
    assert positional.compress == 3 and positional.ignore == ["x"]
    refused = MemorizedFunc(
        double, str(tmp_path / "d"), verbose=0, cache_validation_callback=lambda meta: False
    )
    refused(4), refused(4)
    assert calls.count(4) == 2  # the callback refused the entry: recomputed
    assert MemorizedFunc(double, mem_at(tmp_path / "e")).memory.location == str(tmp_path / "e")


def mem_at(path):
    return Memory(path, verbose=0)


def test_memorized_func_says_what_is_wrong_with_its_memory(tmp_path):
    with pytest.raises(ConfigError, match="no cache location"):
        MemorizedFunc(g_plain, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="backend and compress are the Memory's"):
        MemorizedFunc(g_plain, mem_at(tmp_path), compress=3)
    with pytest.raises(TypeError, match="a Memory or a cache location"):
        MemorizedFunc(g_plain, 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cache_validation_callback needs to be callable"):
        MemorizedFunc(g_plain, str(tmp_path), cache_validation_callback=3)  # type: ignore[arg-type]


def test_async_memorized_func_takes_joblibs_constructor_form(tmp_path):
    import asyncio

    from mlcache.memo.func import AsyncMemorizedFunc

    calls = []

    async def triple(x):
        calls.append(x)
        return 3 * x

    func = AsyncMemorizedFunc(triple, str(tmp_path), verbose=0)
    assert asyncio.run(func(2)) == asyncio.run(func(2)) == 6 and calls == [2]


def test_a_shelved_result_has_joblibs_attributes(mem):
    result = mem.cache(g_plain).call_and_shelve(5)
    assert result.get() == 10
    assert result.store_backend is mem.store_backend  # joblib's attributes
    assert result.func == result.func_id


# -- verbose ------------------------------------------------------------------------------
SCRIPT = """
import logging, sys, time
{setup}
from mlcache import Memory
mem = Memory(sys.argv[1]{verbose})

@mem.cache
def slow_square(x):
    time.sleep(0.01)
    return x * x

print(slow_square(3), slow_square(3), slow_square(4))
"""


def run(tmp_path, verbose: str = "", setup: str = "") -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(setup=textwrap.dedent(setup), verbose=verbose)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "9 9 16\n"  # nothing of mlcache's on stdout
    return done


def computed_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "slow_square" in line]


def test_verbose_1_shows_each_computed_call_with_its_timing_on_stderr(tmp_path):
    done = run(tmp_path)  # verbose=1 is the default, as in joblib
    lines = computed_lines(done.stderr)
    calling = [line for line in lines if "calling" in line]
    timed = [line for line in lines if "computed in" in line]
    assert len(calling) == 2 and len(timed) == 2, done.stderr  # two misses, one hit
    assert "x=3" in calling[0] and "x=4" in calling[1]
    assert all(line.rstrip().endswith("s") for line in timed)  # "... computed in 0.010s"
    assert not any("loaded" in line for line in lines)  # hits are shown from verbose=10
    # a second run only hits: nothing to show
    again = run(tmp_path)
    assert computed_lines(again.stderr) == [], again.stderr


def test_verbose_10_shows_loads_too(tmp_path):
    done = run(tmp_path, verbose=", verbose=10")
    lines = computed_lines(done.stderr)
    assert sum("loaded" in line for line in lines) == 1, done.stderr
    assert sum("computed in" in line for line in lines) == 2, done.stderr


def test_verbose_0_is_silent(tmp_path):
    done = run(tmp_path, verbose=", verbose=0")
    assert done.stderr == ""


def test_configured_logging_gets_each_message_once(tmp_path):
    done = run(tmp_path, setup="logging.basicConfig(level=logging.INFO)")
    lines = computed_lines(done.stderr)
    timed = [line for line in lines if "computed in" in line]
    assert len(timed) == 2, done.stderr  # not printed a second time besides logging
    assert all(line.startswith("INFO:mlcache:") for line in lines), done.stderr


def test_configured_logging_is_left_alone(tmp_path):
    # the application asked for warnings only: INFO records are not shown
    done = run(tmp_path, setup="logging.basicConfig(level=logging.WARNING)")
    assert computed_lines(done.stderr) == [], done.stderr
    # a handler on the mlcache logger itself counts as configured too
    setup = """
    handler = logging.StreamHandler(sys.stdout)
    handler.setLevel(logging.WARNING)
    logging.getLogger("mlcache").addHandler(handler)
    """
    done = run(tmp_path / "2", setup=setup)
    assert computed_lines(done.stderr) == [], done.stderr


def test_a_level_set_on_the_mlcache_logger_is_respected(tmp_path):
    done = run(tmp_path, setup='logging.getLogger("mlcache").setLevel(logging.WARNING)')
    assert computed_lines(done.stderr) == [], done.stderr
