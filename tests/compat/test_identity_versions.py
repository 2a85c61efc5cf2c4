"""Drop-in fidelity, identity and code versions: each case is what a user does
(two scripts, a spawn pool, a package edited between runs), run in fresh
interpreters, and each failed before the identity, version and state rules of
DESIGN.md held."""

from __future__ import annotations

import os
import sys

import pytest

from scripts import ScriptFolder

HEADER = """
import os, sys
from mlcache import Memory
mem = Memory(os.environ["CACHE"], verbose=0)
LOG = os.environ["LOG"]

def _log(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")
"""


class Runner(ScriptFolder):
    def run(self, rel: str, *args: str) -> tuple[list[str], str]:
        """(what computed, stdout) of one run of the script ``rel``."""
        res = self.execute(rel, *args)
        self.stderr = res.stderr
        return self.logged(), res.stdout.strip()


@pytest.fixture
def runner(tmp_path):
    return Runner(tmp_path)


TRAIN = (
    HEADER
    + """
cfg = {"scale": SCALE}

@mem.cache
def fit(x):
    _log("fit")
    return x * cfg["scale"]

print(fit(10))
"""
)


def test_copies_of_a_script_in_two_folders_keep_their_own_results(runner):
    runner.write("exp1/train.py", TRAIN.replace("SCALE", "2"))
    runner.write("exp2/train.py", TRAIN.replace("SCALE", "3"))
    assert runner.run("exp1/train.py") == (["fit"], "20")
    assert runner.run("exp2/train.py") == (["fit"], "30")
    assert runner.run("exp1/train.py") == ([], "20")
    assert runner.run("exp2/train.py") == ([], "30")


def test_a_module_level_dict_the_function_reads_is_input(runner):
    runner.write("exp/train.py", TRAIN.replace("SCALE", "2"))
    assert runner.run("exp/train.py") == (["fit"], "20")
    runner.edit("exp/train.py", '{"scale": 2}', '{"scale": 5}')
    assert runner.run("exp/train.py") == (["fit"], "50")
    runner.edit("exp/train.py", '{"scale": 5}', '{"scale": 2}')
    assert runner.run("exp/train.py") == ([], "20")  # the first version is still there


def test_a_helper_imported_in_the_body_counts_even_when_not_imported_yet(runner):
    runner.write("proj/__init__.py", "")
    runner.write(
        "proj/features.py",
        """
        from .scaling import factor

        def normalize(x):
            # a comment
            return x * factor()

        def unrelated():
            return 0
        """,
    )
    runner.write("proj/scaling.py", "def factor():\n    return 2\n")
    runner.write(
        "proj/pipeline.py",
        HEADER
        + """
@mem.cache
def features(x):
    from .features import normalize
    _log("features")
    return normalize(x)
""",
    )
    runner.write("main.py", "from proj.pipeline import features\nprint(features(10))\n")
    assert runner.run("main.py") == (["features"], "20")
    assert runner.run("main.py") == ([], "20")
    runner.edit("proj/features.py", "# a comment", "# another comment")
    assert runner.run("main.py") == ([], "20")
    runner.edit("proj/features.py", "return x * factor()", "return x * factor() + 1")
    assert runner.run("main.py") == (["features"], "21")
    # one level further: a module the imported one imports
    runner.edit("proj/scaling.py", "return 2", "return 3")
    assert runner.run("main.py") == (["features"], "31")
    assert runner.run("main.py") == ([], "31")


SPAWN = (
    HEADER
    + """
import multiprocessing as mp

import logging
logger = logging.getLogger(__name__)

def helper(x):
    return x * 2

@mem.cache
def work(x):
    logger.debug("work %s in %s", x, __name__)  # __mp_main__ in spawn workers
    _log(f"work{x}-{mp.current_process().name}")
    return helper(x)

if __name__ == "__main__":
    first = [work(i) for i in range(3)]
    with mp.get_context(sys.argv[1]).Pool(2) as pool:
        second = pool.map(work, range(5))
    third = [work(i) for i in range(5)]
    print(first, second, third)
"""
)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_workers_reuse_and_keep_the_parents_results(runner, method):
    runner.write("job.py", SPAWN)
    computed, out = runner.run("job.py", method)
    assert out == "[0, 2, 4] [0, 2, 4, 6, 8] [0, 2, 4, 6, 8]"
    # the parent computed 0..2, the workers only 3 and 4; the parent recomputed nothing
    assert sorted(c.partition("-")[0] for c in computed) == [f"work{i}" for i in range(5)]
    assert all(c.startswith(("work0-Main", "work1-Main", "work2-Main")) for c in computed[:3])
    assert runner.run("job.py", method)[0] == []


def test_a_helper_that_memoizes_into_a_module_level_dict_hits_next_run(runner):
    runner.write(
        "vocab.py",
        HEADER
        + """
_VOCAB_CACHE = {}

def vocab(word):
    if word not in _VOCAB_CACHE:
        _VOCAB_CACHE[word] = len(_VOCAB_CACHE)
    return _VOCAB_CACHE[word]

@mem.cache
def encode(words):
    _log("encode")
    return [vocab(w) for w in words]

@mem.cache
def count(words):
    _log("count")
    return len({vocab(w) for w in words})

print(encode(("a", "b", "a")), count(("a", "c")))
""",
    )
    assert runner.run("vocab.py") == (["encode", "count"], "[0, 1, 0] 2")
    # the second run hits encode, so the dict is empty when count is first called
    assert runner.run("vocab.py") == ([], "[0, 1, 0] 2")
    assert runner.run("vocab.py") == ([], "[0, 1, 0] 2")


def test_two_functions_under_a_plain_decorator_keep_their_own_results(runner):
    runner.write(
        "deco.py",
        HEADER
        + """
def logged(func):
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper

@mem.cache
@logged
def double(x):
    _log("double")
    return 2 * x

@mem.cache
@logged
def triple(x):
    _log("triple")
    return 3 * x

print(double(5), triple(5))
""",
    )
    assert runner.run("deco.py") == (["double", "triple"], "10 15")
    assert runner.run("deco.py") == ([], "10 15")


def test_plain_decorators_that_count_calls_in_a_list_hit_at_the_next_run(runner):
    """Issue 23, case 10, the forms that failed: a plain decorator whose wrapper
    counts calls in a list, in its closure (``calls[0] += 1``) or at module level
    (``TOTAL[0] += 1``, shared by every function it decorates), on two functions,
    on a method of two objects and applied in a loop in another module under
    ``@retry(2)``. A hit does not raise the counters, so the second run met them
    lower than the first run had, and recomputed the functions called after a
    hit (before: the second ``double`` and ``triple``, ``g_triple``, ``predict``
    of the second object, both ``scale``). A short list whose ints calls only raise is now
    bookkeeping, counted by its baseline, as an int in a dict is. The other forms
    tried (``nonlocal n``, a counter object as the decorator, ``@retry(3)``
    appending to its closure, a dict in the closure, ``mem.cache(deco(f))`` and
    ``@mem.cache @deco``) hit before and still do."""
    runner.write(
        "decos.py",
        """
TOTAL = [0]  # calls of every function totalled() decorates

def counted(func):
    calls = [0]  # this function's calls
    def wrapper(*args, **kwargs):
        calls[0] += 1
        return func(*args, **kwargs)
    return wrapper

def totalled(func):
    def wrapper(*args, **kwargs):
        TOTAL[0] += 1
        return func(*args, **kwargs)
    return wrapper

def retry(times):
    def deco(func):
        tries = []
        def wrapper(*args, **kwargs):
            for i in range(times):
                tries.append(i)
                try:
                    return func(*args, **kwargs)
                except ValueError:
                    pass
            raise RuntimeError(func)
        return wrapper
    return deco
""",
    )
    runner.write(
        "other.py",
        HEADER
        + """
from decos import counted, retry

def make(k):  # one decorator applied in a loop, in another module
    def scale(x):
        _log(f"scale{k}")
        return k * x
    return mem.cache(retry(2)(counted(scale)))

SCALES = [make(k) for k in (4, 5)]
""",
    )
    runner.write(
        "deco.py",
        HEADER
        + """
from decos import counted, totalled
from other import SCALES

@mem.cache
@counted
def double(x):
    _log("double")
    return 2 * x

@mem.cache
@counted
def triple(x):
    _log("triple")
    return 3 * x

@mem.cache
@totalled
def g_double(x):
    _log("g_double")
    return 2 * x

g_triple = mem.cache(totalled(lambda x: _log("g_triple") or 3 * x))

class Model:
    def __init__(self, k):
        self.k = k

    @counted
    def predict(self, x):
        _log(f"predict{self.k}")
        return self.k * x

out = [double(5), triple(5), double(6), triple(6), g_double(5), g_triple(5)]
out += [mem.cache(Model(2).predict)(5), mem.cache(Model(3).predict)(5)]
out += [SCALES[0](1), SCALES[1](1), SCALES[0](2)]
print(*out)
""",
    )
    printed = "10 15 12 18 10 15 10 15 4 5 8"
    computed = ["double", "triple", "double", "triple", "g_double", "g_triple"]
    computed += ["predict2", "predict3", "scale4", "scale5", "scale4"]
    assert runner.run("deco.py") == (computed, printed)
    assert runner.run("deco.py") == ([], printed)


def test_a_new_code_version_keeps_the_old_versions_results(runner):
    runner.write(
        "v.py",
        HEADER
        + """
@mem.cache
def f(x):
    _log("f")
    return x + 1

print(f(1))
""",
    )
    assert runner.run("v.py") == (["f"], "2")
    runner.edit("v.py", "return x + 1", "return x + 100")
    assert runner.run("v.py") == (["f"], "101")
    runner.edit("v.py", "return x + 100", "return x + 1")
    assert runner.run("v.py") == ([], "2")


def _counted(calls: list[int]):
    def f(x):
        calls.append(x)
        return x * 2

    return f


def test_an_accumulator_closure_hits_as_with_joblib(tmp_path):
    from mlcache import Memory

    calls: list[int] = []
    f = Memory(tmp_path, verbose=0).cache(_counted(calls))
    assert [f(1), f(1), f(2), f(2), f(1)] == [2, 2, 4, 4, 2]
    assert calls == [1, 2]
    # another process (a new Memory, a new function object) knows the list is state
    again: list[int] = []
    g = Memory(tmp_path, verbose=0).cache(_counted(again))
    assert g(1) == 2 and g(2) == 4 and again == []


def test_a_bound_object_attribute_the_method_counts_into_is_state(tmp_path):
    from mlcache import Memory

    mem = Memory(tmp_path, verbose=0)

    class Model:
        def __init__(self, scale):
            self.scale = scale
            self.calls = 0

        def predict(self, x):
            self.calls += 1
            return x * self.scale

    m = Model(3)
    predict = mem.cache(m.predict)
    assert [predict(2), predict(2)] == [6, 6]
    assert m.calls == 1
    other = Model(4)  # what the method only reads stays part of the key
    assert mem.cache(other.predict)(2) == 8 and other.calls == 1


def test_a_captured_value_that_cannot_be_hashed_is_left_out_with_one_warning(tmp_path):
    import threading

    from mlcache import CacheWarning, Memory

    lock = threading.Lock()
    calls = []

    @Memory(tmp_path, verbose=0).cache
    def f(x):
        with lock:
            calls.append(x)
        return x + 1

    with pytest.warns(CacheWarning, match="lock"):
        assert f(1) == 2
    assert f(1) == 2 and calls == [1]


def test_exec_namespaces_without_a_name_are_user_code():
    from mlcache.keys.code_version import code_version

    def make(helper_body: str):
        ns: dict = {}
        exec(f"def helper(x):\n    return {helper_body}\n\ndef f(x):\n    return helper(x)\n", ns)
        return ns["f"]

    assert code_version(make("x + 1")).digest != code_version(make("x + 2")).digest
    assert code_version(make("x + 1")).digest == code_version(make("x + 1")).digest


def test_a_notebooks_functions_carry_the_notebook_they_come_from():
    from mlcache.keys.identity import func_identity

    def cell(notebook: str | None):
        ns: dict = {"__name__": "__main__"}
        if notebook:
            ns["__session__"] = notebook
        exec(compile("def run():\n    return 1\n", "/tmp/ipykernel_42/123.py", "exec"), ns)
        return func_identity(ns["run"])

    one, two = cell("/home/u/exp1/train.ipynb"), cell("/home/u/exp2/train.ipynb")
    assert one.startswith("__main__.train.run@") and one != two
    assert cell(None) == "__main__.run"  # a kernel that does not say: as before


class _DotDict(dict):
    __getattr__ = dict.__getitem__


class _Proxy:
    """A lazy object whose attribute access fails until it is set up."""

    def __getattr__(self, name):
        raise RuntimeError("not initialised")


def test_globals_whose_attribute_access_raises_never_fail_the_call(tmp_path):
    from mlcache import Memory

    mem = Memory(tmp_path, verbose=0)
    ns: dict = {"__name__": "cfgmod", "cfg": _DotDict(scale=3), "lazy": _Proxy()}
    src = (
        "def f(x):\n    return x * cfg.scale\n\n"
        "def g(x):\n    return x + 1 if x > 0 else lazy.offset\n"
    )
    exec(src, ns)
    f = mem.cache(ns["f"])
    assert f(2) == 6 and f.check_call_in_cache(2)  # a dotdict is hashed as the dict it is
    g = mem.cache(ns["g"])
    assert g(1) == 2 and g.check_call_in_cache(1)  # the proxy counts by its type
    with pytest.raises(RuntimeError, match="not initialised"):
        g(0)  # the call's own error, as it would be uncached


def test_versions_unused_for_a_month_go_when_another_version_runs(runner):
    import time

    runner.write(
        "old.py", HEADER + "\n@mem.cache\ndef f(x):\n    _log('f')\n    return x\n\nf(1)\n"
    )
    runner.run("old.py")
    folder = next(runner.cache.glob("**/__main__.old.f*"))
    (version,) = [p for p in folder.iterdir() if len(p.name) == 16]
    month_ago = time.time() - 31 * 86400
    for p in version.iterdir():
        os.utime(p, (month_ago, month_ago))
    runner.edit("old.py", "return x", "return x + 1")
    assert runner.run("old.py")[0] == ["f"]
    assert not version.exists()


def test_a_walk_that_raises_calls_uncached_with_one_warning_naming_the_global(tmp_path):
    import types

    from mlcache import CacheWarning, Memory

    lazy = types.ModuleType("lazymod")  # a module whose __getattr__ (PEP 562) fails
    exec("def __getattr__(name):\n    raise RuntimeError('backend not loaded')\n", lazy.__dict__)
    sys.modules["lazymod"] = lazy
    try:
        ns: dict = {"__name__": "walkmod", "lazymod": lazy}
        exec("def f(x):\n    return x + 1 if x > 0 else lazymod.thing\n", ns)
        calls = []
        f = Memory(tmp_path, verbose=0).cache(ns["f"])
        with pytest.warns(CacheWarning, match=r"uncached.*lazymod\.thing.*backend not loaded"):
            assert f(1) == 2
        calls.append(f(1))  # warned once; still right
        assert calls == [2] and not f.check_call_in_cache(1)
    finally:
        del sys.modules["lazymod"]


REGISTRY = (
    HEADER
    + """
REG = {"scale": int(sys.argv[1])}

class Model:
    def __init__(self, w):
        self.w = w
        self.n_calls = 0

model = Model(int(sys.argv[1]))

def make(w):
    conf = {"w": w}
    def g(x):
        conf["last"] = x  # a record of the last call: state
        return x * conf["w"]  # what it reads: input
    return g

@mem.cache
def f(x):
    _log("f")
    REG.setdefault("seen", []).append(x)
    return x * REG["scale"]

@mem.cache
def predict(x):
    _log("predict")
    model.n_calls += 1
    return x * model.w

g = mem.cache(make(int(sys.argv[1])))
print(f(1), f(1), predict(1), predict(1), g(1), g(1))
"""
)


def test_what_a_call_changes_never_hides_what_it_reads(runner):
    """A registry the function writes one key of and reads another, an object
    whose counter it bumps and whose weight it reads, a closure dict: the part
    that changes is state, the rest stays input."""
    runner.write("reg.py", REGISTRY)
    assert runner.run("reg.py", "2") == (["f", "predict"], "2 2 2 2 2 2")
    assert runner.run("reg.py", "2") == ([], "2 2 2 2 2 2")  # what they change is state
    assert runner.run("reg.py", "3")[1] == "3 3 3 3 3 3"
    assert runner.run("reg.py", "2")[1] == "2 2 2 2 2 2"


def test_a_seeded_generator_is_input(runner):
    runner.write(
        "rng.py",
        HEADER
        + """
import numpy as np
rng = np.random.default_rng(int(sys.argv[1]))

@mem.cache
def sample(n):
    _log("sample")
    return rng.integers(0, 1000, n).tolist()

print(sample(3))
""",
    )
    import numpy as np

    for seed in (0, 1, 0):
        expected = str(np.random.default_rng(seed).integers(0, 1000, 3).tolist())
        assert runner.run("rng.py", str(seed))[1] == expected


def test_what_was_learned_belongs_to_its_code_version(runner):
    runner.write(
        "learn.py",
        HEADER
        + """
REG = {"scale": int(sys.argv[1])}

@mem.cache
def f(x):
    REG["last"] = x
    return x * REG["scale"]

print(f(2))
""",
    )
    assert runner.run("learn.py", "2")[1] == "4"
    runner.edit("learn.py", '    REG["last"] = x\n', "")
    assert runner.run("learn.py", "3")[1] == "6"


def test_a_planted_state_record_cannot_take_an_input_out_of_the_key(runner):
    runner.write(
        "planted.py",
        HEADER
        + """
REG = {"scale": int(sys.argv[1])}

@mem.cache
def f(x):
    REG["last"] = x  # learned: a record of what it learned is written
    return x * REG["scale"]

print(f(2))
""",
    )
    assert runner.run("planted.py", "2")[1] == "4"
    (record,) = next(runner.cache.glob("**/__main__.planted.f*")).glob("*.state")
    # someone who can write into the cache claims the whole registry is state
    record.write_text('{"captured": [], "globals": ["__main__.REG"]}')
    assert runner.run("planted.py", "2")[1] == "4"
    assert runner.run("planted.py", "3")[1] == "6"


SHARED_ACCUMULATOR = (
    HEADER
    + """
import multiprocessing as mp

CALLS = []

@mem.cache
def other(x):
    CALLS.append(x)
    return x

@mem.cache
def double(x):
    CALLS.append(x)
    _log(f"double{x}")
    return 2 * x

def in_child(x):
    return double.check_call_in_cache(x), double(x)

if __name__ == "__main__":
    other(1), other(2)  # the accumulator holds [1, 2] when double is first called
    double(6)
    with mp.get_context("spawn").Pool(2) as pool:
        print(pool.map(in_child, [6, 7]))
"""
)


def test_spawn_workers_find_what_the_parent_learned_from_another_function(runner):
    """The parent learned that an accumulator is state from one function before
    another's first call; a spawn worker (where the accumulator starts empty)
    must find the second function's results all the same."""
    runner.write("acc.py", SHARED_ACCUMULATOR)
    computed, out = runner.run("acc.py")
    assert out == "[(True, 12), (False, 14)]"
    assert sorted(computed) == ["double6", "double7"]
