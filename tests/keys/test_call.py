"""keys/call.py: one key per call, bound the way Python binds arguments."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlcache import ConfigError
from mlcache.keys.call import CallKeyer


def keyer(func, ignore=None, prefix=b"f"):
    return CallKeyer(func, ignore, prefix)


def simple(x=1, y="a"):
    return x, y


def required(a, b, c=3):
    return a, b, c


def variadic(a, *args, **kwargs):
    return a, args, kwargs


def kwonly(a, *, b=2, c):
    return a, b, c


def posonly(a, b=2, /, c=3):
    return a, b, c


def everything(a, /, b, *args, c, d=4, **kwargs):
    return a, b, args, c, d, kwargs


def test_equivalent_calls_make_one_key():
    k = keyer(simple)
    one = k.key((1,), {})[0]
    assert k.key((), {"x": 1})[0] == one
    assert k.key((), {})[0] == one
    assert k.key((1, "a"), {})[0] == one
    assert k.key((), {"y": "a", "x": 1})[0] == one
    assert k.key((1,), {"y": "a"})[0] == one
    assert len(one) == 32


def test_different_arguments_make_different_keys():
    k = keyer(simple)
    keys = {
        k.key((), {})[0],
        k.key((2,), {})[0],
        k.key((1.0,), {})[0],
        k.key((True,), {})[0],
        k.key((1, "b"), {})[0],
        k.key(("a", 1), {})[0],
        k.key((np.arange(3),), {})[0],
        k.key((np.arange(3.0),), {})[0],
    }
    assert len(keys) == 8


def test_the_prefix_and_the_scheme_are_part_of_the_key():
    assert keyer(simple, prefix=b"f").key((), {}) != keyer(simple, prefix=b"g").key((), {})
    # same parameters, same prefix: the function object itself is not in the key
    assert keyer(simple).key((), {}) == keyer(lambda x=1, y="a": None).key((), {})


def test_arrays_are_bound_without_comparing_them():
    # binding must not evaluate `array == default` (ambiguous truth value)
    k = keyer(required)
    a = np.arange(4)
    assert k.key((a, a), {})[0] == k.key((), {"a": a, "b": a, "c": 3})[0]


def test_ignore_drops_names():
    k = keyer(required, ignore=["b"])
    assert k.key((1, 2), {})[0] == k.key((1, "anything"), {})[0]
    assert k.key((1, 2), {})[0] != k.key((5, 2), {})[0]
    assert k.key((1, 2), {})[0] != k.key((1, 2, 4), {})[0]
    k2 = keyer(required, ignore=("a", "c"))
    assert k2.key((1, 2, 3), {}) == k2.key((9, 2, 9), {})
    assert keyer(required, ignore=[]).key((1, 2), {}) == keyer(required).key((1, 2), {})


def test_ignore_still_requires_a_valid_call():
    k = keyer(required, ignore=["b"])
    with pytest.raises(TypeError):
        k.key((1,), {})[0]


def test_ignore_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="nope") as info:
        keyer(required, ignore=["a", "nope"])
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "'a'" in msg and "'b'" in msg and "'c'" in msg  # lists the real parameters
    assert "ignore=['nope']" in msg  # only nope is unknown


@pytest.mark.parametrize("bad", ["b", "ab", [1], [None]])
def test_ignore_must_be_a_list_of_names(bad):
    # a bare string is a classic mistake: ignore="ab" must not mean ["a", "b"]
    def f(a, b, ab=0):
        return a

    with pytest.raises(ConfigError, match="ignore"):
        keyer(f, ignore=bad)


def test_ignore_names_varargs_parameters():
    k = keyer(variadic, ignore=["kwargs"])
    assert k.key((1, 2), {"v": 1})[0] == k.key((1, 2), {"v": 2, "w": 3})[0]
    assert k.key((1, 2), {})[0] != k.key((1, 3), {})[0]


def test_var_positional_and_var_keyword():
    k = keyer(variadic)
    assert k.key((1, 2, 3), {})[0] != k.key((1, 2), {})[0]
    assert k.key((1, 2), {})[0] != k.key((1, (2,)), {})
    assert k.key((1,), {"u": 1, "v": 2})[0] == k.key((1,), {"v": 2, "u": 1})[0]
    assert k.key((1,), {"u": 1})[0] != k.key((1,), {"u": 2})[0]
    assert k.key((1,), {"u": 1})[0] != k.key((1, 1), {})[0]
    assert k.key((), {"a": 1})[0] == k.key((1,), {})[0]
    assert k.key((1,), {"args": 2})[0] != k.key((1, 2), {})[0]  # a keyword named "args"


def test_keyword_only_parameters():
    k = keyer(kwonly)
    assert k.key((1,), {"c": 3})[0] == k.key((), {"a": 1, "b": 2, "c": 3})[0]
    assert k.key((1,), {"c": 3})[0] != k.key((1,), {"c": 3, "b": 5})[0]
    with pytest.raises(TypeError):
        k.key((1, 2), {"c": 3})[0]
    with pytest.raises(TypeError):
        k.key((1,), {})[0]


def test_positional_only_parameters():
    k = keyer(posonly)
    assert (
        k.key((1,), {})[0]
        == k.key((1, 2), {})[0]
        == k.key((1, 2, 3), {})[0]
        == k.key((1,), {"c": 3})[0]
    )
    assert k.key((1,), {})[0] != k.key((1, 5), {})[0]
    with pytest.raises(TypeError):
        k.key((), {"a": 1})[0]


def test_every_kind_of_parameter_together():
    k = keyer(everything)
    base = k.key((1, 2), {"c": 3})[0]
    assert k.key((1,), {"b": 2, "c": 3, "d": 4})[0] == base
    assert k.key((1, 2, 5), {"c": 3})[0] != base
    assert k.key((1, 2), {"c": 3, "z": 0})[0] != base


def test_builtins_without_a_signature_fall_back_to_args_and_kwargs():
    k = keyer(max)
    assert k.key((1, 2), {})[0] != k.key((2, 1), {})[0]
    assert k.key((1, 2), {"default": 0})[0] == k.key((1, 2), {"default": 0})[0]


BAD_CALLS = [
    (required, (), {}),
    (required, (1,), {}),
    (required, (1, 2, 3, 4), {}),
    (required, (1, 2), {"a": 1}),
    (required, (1, 2), {"zz": 1}),
    (simple, (1, 2, 3), {}),
    (simple, (), {"q": 1}),
    (kwonly, (1, 2), {"c": 1}),
    (kwonly, (1,), {}),
    (posonly, (), {"a": 1}),
    (variadic, (), {}),
    (everything, (1, 2), {}),
]


def _call_error(func, args, kwargs) -> TypeError:
    try:
        func(*args, **kwargs)
    except TypeError as exc:
        return exc
    raise AssertionError(f"{func.__name__}{args}{kwargs} did not fail")


@pytest.mark.parametrize(
    ("func", "args", "kwargs"), BAD_CALLS, ids=[f"{f.__name__}{a}{k}" for f, a, k in BAD_CALLS]
)
def test_a_wrong_call_raises_type_error_before_hashing(func, args, kwargs):
    expected = _call_error(func, args, kwargs)
    with pytest.raises(type(expected)):
        keyer(func).key(args, kwargs)


def test_a_wrong_call_raises_the_message_of_the_call_itself():
    # the user called f wrongly: they should see what calling f would say
    # ("f() missing 1 required positional argument: 'a'"), not inspect's wording,
    # after joblib's ("Wrong number of arguments for f(a): ...", which code
    # written for joblib may match on; see tests/compat/test_joblib_api.py)
    mismatches = []
    for func, args, kwargs in BAD_CALLS:
        expected = str(_call_error(func, args, kwargs))
        try:
            keyer(func).key(args, kwargs)
        except TypeError as exc:
            if not str(exc).endswith(f"): {expected}"):
                mismatches.append((expected, str(exc)))
    assert not mismatches


def test_unhashable_argument_names_the_argument_and_its_type():
    k = keyer(required)
    with pytest.raises(TypeError) as info:
        k.key((1, threading.Lock()), {})
    msg = str(info.value)
    assert "'b'" in msg and "_thread.lock" in msg
    with pytest.raises(TypeError, match=r"'c'.*builtins\.list"):
        k.key((1, 2, [threading.Lock()]), {})


def test_ignored_unhashable_argument_is_fine():
    k = keyer(required, ignore=["b"])
    assert k.key((1, threading.Lock()), {})[0] == k.key((1, None), {})[0]


def test_a_very_deep_argument_is_a_type_error_not_a_crash():
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TypeError, match="'a'"):
        keyer(required).key((deep, 1), {})


def test_describe_gives_short_reprs_without_ignored_names():
    k = keyer(required, ignore=["c"])
    d = k.describe((np.zeros((3, 4), dtype=np.float32), "x" * 1000), {})
    assert set(d) == {"a", "b"}
    assert d["a"] == "ndarray(shape=(3, 4), dtype=float32)"
    assert len(d["b"]) < 100
    assert k.describe((), {}) == {}  # a wrong call describes nothing

    class BrokenRepr:
        def __repr__(self):
            raise RuntimeError("no")

    assert keyer(required).describe((BrokenRepr(), 1), {})["a"].startswith("<BrokenRepr")


def canonical(a, b=2, *, c=3):
    return {"a": a, "b": b, "c": c}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 3), max_size=4),
)
def test_property_key_depends_on_the_bound_arguments_only(args, kwargs):
    k = keyer(canonical)
    try:
        bound = canonical(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            k.key(tuple(args), kwargs)
        return
    assert k.key(tuple(args), kwargs) == k.key((), bound)
    assert k.key(tuple(args), kwargs) == k.key((bound["a"], bound["b"]), {"c": bound["c"]})


def test_the_digests_say_which_argument_changed():
    k = keyer(canonical)
    _, digests = k.key((np.arange(4), 2), {"c": "x"})
    old = k.digest_map(digests)
    assert set(old) == {"a", "b", "c"} and all(len(v) == 32 for v in old.values())
    assert k.changed(old, k.key((np.arange(4), 2), {"c": "x"})[1]) == []
    assert k.changed(old, k.key((np.arange(4), 3), {"c": "x"})[1]) == ["b"]
    assert k.changed(old, k.key((np.arange(5), 2), {"c": "y"})[1]) == ["a", "c"]
    # the same value in two arguments is digested on its own in each
    a = [1, 2]
    assert k.key((a, a), {})[1][0] == k.key((a, [1, 2]), {})[1][1]


def test_a_reused_hasher_keeps_no_argument_alive_and_threads_never_share_one():
    """CallKeyer reuses its hashers (making one was a quarter of a small key): the
    object an argument held is freed after the call, and keys made by 8 threads
    at once are those made one at a time."""
    import gc
    import weakref

    class Box:  # hashed by its state: the hasher's back-references hold it
        def __init__(self, n: int) -> None:
            self.n = n

    def f(a, b):
        return a

    keyer = CallKeyer(f, None, b"p")
    box = Box(1)
    ref = weakref.ref(box)
    keyer.key((box, [box]), {})
    del box
    gc.collect()
    assert ref() is None

    expected = {i: keyer.key((i, [i, "x" * (i % 7)]), {})[0] for i in range(400)}
    got: dict[int, str] = {}
    barrier = threading.Barrier(8)

    def work(part: int) -> None:
        barrier.wait()
        for i in range(part, 400, 8):
            got[i] = keyer.key((i, [i, "x" * (i % 7)]), {})[0]

    threads = [threading.Thread(target=work, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected
