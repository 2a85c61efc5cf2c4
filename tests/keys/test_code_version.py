"""Transitive code versions: real modules in a temporary package, edited between
runs of a fresh interpreter, as a user edits files between runs of a pipeline."""

from __future__ import annotations

import functools
import os
import sys
import textwrap

import numpy as np
import pytest

from mlcache import ConfigError, Memory
from mlcache.keys.code_version import code_version
from mlcache.keys.origin import is_user_module, library_version
from scripts import ALL, Project, ScriptFolder  # the fresh-interpreter package


@pytest.fixture
def project(tmp_path):
    return Project(tmp_path)


def test_what_changes_recomputes_exactly_what_depends_on_it(project):
    assert project.run() == ALL
    assert project.run() == set()
    # comments, docstrings and formatting: nothing
    project.edit("helpers", "# comment v1", "# comment v2, and more words")
    project.edit("helpers", "(docstring v1)", "(docstring v2)")
    project.edit("helpers", "    return x / 10", "\n\n    return (x\n            / 10)")
    project.edit("helpers", '"""Helpers of the pipeline."""', '"""The helpers."""')
    assert project.run() == set()
    # a function nobody calls
    project.edit("helpers", "return x - 1", "return x - 2")
    assert project.run() == set()
    # a helper's body: its callers (through an attribute chain and a local import)
    project.edit("helpers", "/ 10)", "/ 100)")
    assert project.run() == {"f_normalize", "f_local_import"}
    # a module-level constant a helper reads
    project.edit("helpers", "SCALE = 2", "SCALE = 3")
    assert project.run() == {"f_scaled"}
    # a method of a class, then a class attribute
    project.edit("helpers", "return x + self.offset", "return self.offset + x + 0")
    assert project.run() == {"f_shift"}
    project.edit("helpers", "offset = 1", "offset = 5")
    assert project.run() == {"f_shift"}
    # a lambda
    project.edit("helpers", "lambda x: x * x", "lambda x: x**2 + 0")
    assert project.run() == {"f_square"}
    # the value a closure holds
    project.edit("helpers", "make_adder(3)", "make_adder(4)")
    assert project.run() == {"f_add"}
    # one of two mutually recursive functions
    project.edit("helpers", "return n != 0 and is_even(n - 1)", "return n > 0 and is_even(n - 1)")
    assert project.run() == {"f_even"}
    assert project.run() == set()


def test_a_miss_says_which_dependency_changed(project):
    project.run()
    project.edit("helpers", "/ 10", "/ 100")
    assert project.run(TPKG_VERBOSE="1") == {"f_normalize", "f_local_import"}
    assert "code changed (tpkg.helpers.normalize)" in project.stderr
    assert "its code changed (tpkg.helpers.normalize)" in project.stderr


def test_source_mode_is_jobllibs_and_misses_helper_changes(project):
    assert project.run(TPKG_CODE="source") == ALL
    project.edit("helpers", "/ 10", "/ 100")
    assert project.run(TPKG_CODE="source") == set()  # stale: what joblib does
    project.edit("pipeline", '    _log("f_scaled")', '    _log("f_scaled")  # a comment')
    assert project.run(TPKG_CODE="source") == {"f_scaled"}  # comments count there


def test_off_mode_never_looks_at_the_code(project):
    assert project.run(TPKG_CODE="off") == ALL
    project.edit("pipeline", "return scaled(x)", "return scaled(x) + 1")
    assert project.run(TPKG_CODE="off") == set()


def test_libraries_are_identified_by_their_version(project):
    sys.path.insert(0, str(project.root))
    try:
        os.environ.setdefault("TPKG_CACHE", str(project.root / "c"))
        os.environ.setdefault("TPKG_LOG", str(project.log))
        from tpkg import pipeline

        parts = code_version(pipeline.f_mean.func).parts
    finally:
        sys.path.remove(str(project.root))
        for name in [m for m in sys.modules if m == "tpkg" or m.startswith("tpkg.")]:
            del sys.modules[name]
    assert parts["tpkg.helpers.mean"]
    assert parts["tpkg.helpers.np"] == f"numpy=={np.__version__}"
    assert not any(k.startswith("numpy.") for k in parts)  # numpy's source is not walked
    assert library_version("os.path") == f"python=={sys.version_info[0]}.{sys.version_info[1]}"
    assert not is_user_module("numpy") and not is_user_module("mlcache.memo.memory")
    assert is_user_module("__main__")


# -- in-process properties ---------------------------------------------------------------
def _define(source: str, name: str = "f", module: str = "depsmod"):
    ns: dict = {"__name__": module}
    exec(textwrap.dedent(source), ns)
    return ns[name], ns


def test_docstrings_comments_and_lines_do_not_count():
    a, _ = _define("def f(x):\n    return x + 1\n")
    b, _ = _define('def f(x):\n    """Doc."""\n    # note\n\n    return x + 1\n')
    c, _ = _define("def f(x):\n    return x + 2\n")
    assert code_version(a).digest == code_version(b).digest != code_version(c).digest


def test_a_debug_print_counts():
    a, _ = _define("def f(x):\n    return x + 1\n")
    b, _ = _define("def f(x):\n    print(x)\n    return x + 1\n")
    assert code_version(a).digest != code_version(b).digest


def test_constants_arrays_by_content_and_helpers_defaults():
    src = (
        "import numpy as np\nW = np.arange(5.0)\n"
        "def h(x, k=2):\n    return x * k\n"
        "def f(x):\n    return h(x) @ W\n"
    )
    f1, _ = _define(src, module="constmod1")
    f2, _ = _define(src.replace("k=2", "k=3"), module="constmod2")
    f3, ns3 = _define(src, module="constmod3")
    ns3["W"] = np.arange(5.0) + 1
    v1, v2, v3 = (code_version(f).parts for f in (f1, f2, f3))
    assert v1["constmod1.h.<defaults>"] != v2["constmod2.h.<defaults>"]
    assert v1["constmod1.W"] != v3["constmod3.W"]


def test_cycles_and_self_recursion_terminate():
    f, _ = _define("def f(n):\n    return 1 if n < 2 else n * f(n - 1)\n")
    assert code_version(f).digest
    g, _ = _define("def f(n):\n    return g(n)\ndef g(n):\n    return f(n - 1) if n else 0\n")
    assert "depsmod.g" in code_version(g).parts


def test_unhashable_globals_count_by_type():
    f, _ = _define(
        "import threading\nLOCK = threading.Lock()\ndef f(x):\n    with LOCK:\n        return x\n"
    )
    assert code_version(f).parts["depsmod.LOCK"].startswith("<_thread.lock")


PINNED: list[int] = []


def pinned(x):
    PINNED.append(x)
    return x


def test_version_pins_and_code_modes(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    mem.cache(pinned, version="1")(3)
    mem.cache(pinned, version="1")(3)
    mem.cache(pinned, version="2")(3)
    assert PINNED == [3, 3]
    f = pinned
    with pytest.raises(ConfigError, match="version"):
        mem.cache(f, version="")
    with pytest.raises(ConfigError, match="code must be one of"):
        Memory(tmp_path, code="everything")


def test_the_walk_is_paid_once_per_process(tmp_path, monkeypatch):
    import mlcache.keys.code_version as deps

    walks = []
    real = deps._walk_version
    monkeypatch.setattr(deps, "_walk_version", lambda f, *a: walks.append(f) or real(f, *a))

    def g(x):
        return x + 1

    f = Memory(tmp_path, verbose=0).cache(g)
    for i in range(5):
        f(i)
    Memory(tmp_path, verbose=0).cache(g)(1)  # another Memory, same function
    assert len(walks) == 1


def test_modules_and_helpers_a_closure_holds_are_walked():
    """A memoized function made in a function, reading a module it captured: the
    module's helpers count (the data it captures goes into each call's key)."""
    import types as _types

    mod = _types.ModuleType("closmod")
    exec("def h(x):\n    return x * 3\n", mod.__dict__)
    sys.modules["closmod"] = mod
    try:
        scale = 2

        def make():
            def f(x):
                return mod.h(x) * scale

            return f

        parts = code_version(make()).parts
    finally:
        del sys.modules["closmod"]
    assert "closmod.h" in parts
    assert not any("scale" in k for k in parts)


def test_more_ways_of_reaching_code():
    """Factory closures, same-named lambdas, modules imported in the body and bound
    to a local name, methods reaching their class through self, wrapped helpers,
    dispatch tables, and memo dicts (by type once known to fill up at run time)."""
    import types as _types

    mod = _types.ModuleType("depsbody")
    exec("def g(x):\n    return x + 1\n", mod.__dict__)
    sys.modules["depsbody"] = mod
    try:
        src = textwrap.dedent(
            """
            import functools

            def inner(x):
                return x * 3

            @functools.lru_cache
            def cached_helper(x):
                return inner(x)

            def fa(x):
                return x - 1

            TABLE = {"a": fa}
            memo = {}
            first = lambda x: x + 1
            second = lambda x: x + 2

            def uses_all(x):
                import depsbody as h
                memo[x] = x
                return h.g(x) + cached_helper(x) + TABLE["a"](x) + first(x) + second(x)

            class Model:
                def helper(self, x):
                    return x * 2

                def predict(self, x):
                    return self.helper(x)

            def make(helper):
                def f(x):
                    return helper(x)
                return f
            """
        )
        f, ns = _define(src, "uses_all", module="depsmore")
        parts = code_version(f).parts
        assert "depsbody.g" in parts
        assert "depsmore.inner" in parts  # through the lru_cache wrapper
        assert "depsmore.fa" in parts  # through the dispatch table
        assert parts["depsmore.<lambda>"].count("+") == 1  # both lambdas, order-free
        # a module-level dict counts by content and is watched for changes calls
        # make; once learned as bookkeeping (a memo calls grow), by its baseline
        version = code_version(f)
        assert ("depsmore.memo", ns["memo"]) in version.watched
        from mlcache.keys.code_version import _walk_version
        from mlcache.keys.learned import Watch
        from mlcache.keys.state import GROWN

        state = {"depsmore.memo": GROWN}
        learned = code_version(f, state=state)
        assert ("depsmore.memo", ns["memo"]) in learned.watched
        watch = Watch((("depsmore.memo", ns["memo"]),))  # a cached call fills the memo
        ns["memo"][1] = 2
        assert watch.verdict() == ({"depsmore.memo": GROWN}, set())
        assert _walk_version(f, state).digest == learned.digest  # (walked again)
        assert _walk_version(f).digest != version.digest
        ns["memo"][3] = 4  # other code fills it: what it added counts
        assert _walk_version(f, state).digest != learned.digest
        assert "depsmore.Model.helper" in code_version(ns["Model"].predict).parts
        one, two = ns["make"](ns["fa"]), ns["make"](ns["inner"])
        assert code_version(one).digest != code_version(two).digest
    finally:
        del sys.modules["depsbody"]


HELD = """
import numpy as np

class Model:
    def __init__(self, w):
        self.w = w

    def predict(self, x):
        return x * self.w

def inner(x):
    return x + 1

def h(x):
    return inner(x)

class Config:
    def __init__(self, loss):
        self.loss = loss

REG = {"clf": Model(2)}
MODELS = [Model(3)]
VH = np.vectorize(h)
CFG = Config(h)

def f(x):
    return REG["clf"].predict(x) + MODELS[0].predict(x) + VH(x) + CFG.loss(x)
"""


def test_the_code_a_module_level_value_holds_counts():
    """A registry of models (a dict, a list: not callable), np.vectorize(h), a
    config object holding a function: editing the method or a helper the held function
    reaches is a new version (they were hashed by the held code alone: served stale)."""
    base = code_version(_define(HELD, module="heldmod")[0]).digest
    assert code_version(_define(HELD, module="heldmod")[0]).digest == base
    for old, new in [("x * self.w", "x * self.w + 1"), ("x + 1", "x + 2")]:
        edited, _ = _define(HELD.replace(old, new), module="heldmod")
        assert code_version(edited).digest != base, new


CARRIED = """
import functools

class Meta(type):
    def __call__(cls, *args):
        return super().__call__(*args) if args else 1

class Made(metaclass=Meta):
    def __init__(self, x):
        self.x = x

class Lazy:
    @functools.cached_property
    def value(self):
        return 1

    def scale(self, k, x):
        return k * x

    double = functools.partialmethod(scale, 2)

def h(x):
    "one"
    return x + h.k

h.k = 1

def f(x):
    return Made() + Lazy().value + Lazy().double(x) + h(x) + len(h.__doc__)
"""


def test_what_a_class_or_a_function_carries_counts():
    """A cached_property's body, a metaclass's __call__, an attribute set on a
    helper (h.k) and a docstring the code reads (h.__doc__): each edit is a new
    version (each served the old result; the cached_property's until 271cede, by
    luck of the order its lock was hashed in). A partialmethod's arguments: a
    guard. A docstring nothing reads still never counts."""
    base = code_version(_define(CARRIED)[0]).digest
    edits = [
        ("if args else 1", "if args else 2"),
        ("return 1", "return 2"),
        ("partialmethod(scale, 2)", "partialmethod(scale, 3)"),
        ("h.k = 1", "h.k = 2"),
        ('"one"', '"two"'),
    ]
    for old, new in edits:
        assert old in CARRIED, old
        assert code_version(_define(CARRIED.replace(old, new))[0]).digest != base, new
    quiet = CARRIED.replace(" + len(h.__doc__)", "")
    assert (
        code_version(_define(quiet)[0]).digest
        == code_version(_define(quiet.replace('"one"', '"two"'))[0]).digest
    )


WRAPPED = """
import functools
import wrapt

class Twice:
    def __init__(self, fn, k=2):
        self.fn, self.k = fn, k
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        return self.fn(*args) * self.k

@wrapt.decorator
def plus(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1

@Twice
def h(x):
    return x + 1

@plus
def g(x):
    return x - 1

@Twice
def f(x):
    return h(x) + g(x)
"""


def test_the_code_of_class_based_and_wrapt_decorators_counts():
    """A class-based decorator (functools.update_wrapper) and a wrapt decorator:
    the decorator's code, the decorated helper's and, memoized itself, the
    decorated function's body are each part of the version (each edit served the
    old result: the function under a class-based decorator joblib computes again)."""
    base = code_version(_define(WRAPPED)[0]).digest
    for old, new in [
        ("* self.k", "* self.k * 2"),  # the decorator's __call__
        ("x + 1", "x + 2"),  # a helper it decorates
        ("+ 1\n", "+ 3\n"),  # wrapt's decorator
        ("x - 1", "x - 2"),  # a helper wrapt decorates
        ("h(x) + g(x)", "h(x) - g(x)"),  # the memoized function's own body
    ]:
        assert old in WRAPPED, old
        assert code_version(_define(WRAPPED.replace(old, new))[0]).digest != base, new


class Scaled:
    """A class-based decorator with a setting of its own."""

    def __init__(self, fn, k):
        self.fn, self.k = fn, k
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        return self.fn(*args) * self.k


def _plus_one(x):
    return x + 1


def test_a_class_based_decorators_state_is_in_the_key(tmp_path):
    """Two instances of a class-based decorator over one function, set apart by
    their own state: each call has its own key (the second served the first's 8),
    and passed as arguments they have two keys."""
    from mlcache.keys.hashing import hash_value

    assert hash_value(Scaled(_plus_one, 2)) != hash_value(Scaled(_plus_one, 5))
    mem = Memory(tmp_path, verbose=0)
    assert mem.cache(Scaled(_plus_one, 2))(3) == 8
    assert mem.cache(Scaled(_plus_one, 5))(3) == 20


def test_the_implementations_a_singledispatch_helper_registered_count():
    """Editing an implementation registered on a functools.singledispatch helper is
    a new version (it served the old result)."""
    src = (
        "import functools\n@functools.singledispatch\ndef h(x):\n    return 0\n"
        "@h.register\ndef _(x: int):\n    return x + 1\ndef f(x):\n    return h(x)\n"
    )
    edited = src.replace("x + 1", "x + 2")
    assert code_version(_define(src)[0]).digest != code_version(_define(edited)[0]).digest


REG_MODELS = """
class Model:
    def __init__(self, w):
        self.w = w

    def predict(self, x):
        return x * self.w
"""

REG_SCRIPT = """
import os
from mlcache import Memory
from models import Model

mem = Memory(os.environ["CACHE"], verbose=0)
REG = {"clf": Model(2)}

@mem.cache
def predict(x):
    with open(os.environ["LOG"], "a") as f:
        f.write("predict\\n")
    return REG["clf"].predict(x)

print(predict(3))
"""


def test_a_registered_model_whose_method_is_edited_is_computed_again(tmp_path):
    """The next run after an edit of the class of a model held in a module-level
    registry computes again (it printed the old result: 6 for 7)."""
    runner = ScriptFolder(tmp_path)
    runner.write("models.py", REG_MODELS)
    runner.write("reg.py", REG_SCRIPT)
    assert runner.execute("reg.py").stdout.split() == ["6"]
    assert runner.execute("reg.py").stdout.split() == ["6"] and runner.logged() == []
    runner.edit("models.py", "return x * self.w", "return x * self.w + 1")
    assert runner.execute("reg.py").stdout.split() == ["7"]
    assert runner.logged() == ["predict"]


SHADOW_SCRIPT = """
import os
from mlcache import Memory
from code import features  # a project's package named as a standard module

mem = Memory(os.environ["CACHE"], verbose=0)

def _log(name):
    with open(os.environ["LOG"], "a") as f:
        f.write(name + "\\n")

@mem.cache
def top(x):
    _log("top")
    return features.scale(x)

@mem.cache
def body(x):
    from code.other import shift  # not imported yet: read from its file
    _log("body")
    return shift(x)

print(top(3), body(3))
"""


def test_a_users_package_named_as_a_standard_module_is_walked(tmp_path):
    """A project's own code/ package (the standard library has a code module) is
    user code: editing its helpers is a new version, imported or read from its
    file (it counted as Python's own code: 6 and 4 served after the edits)."""
    runner = ScriptFolder(tmp_path)
    runner.write("code/__init__.py", "")
    runner.write("code/features.py", "def scale(x):\n    return x * 2\n")
    runner.write("code/other.py", "def shift(x):\n    return x + 1\n")
    runner.write("run.py", SHADOW_SCRIPT)
    assert runner.execute("run.py").stdout.split() == ["6", "4"]
    assert runner.execute("run.py").stdout.split() == ["6", "4"] and runner.logged() == []
    runner.edit("code/features.py", "x * 2", "x * 3")
    runner.edit("code/other.py", "x + 1", "x + 2")
    assert runner.execute("run.py").stdout.split() == ["9", "5"]
    assert sorted(runner.logged()) == ["body", "top"]


def test_the_constants_a_code_loads_are_those_dis_finds():
    """bytecode._loaded_consts reads co_code itself (dis builds an object per
    instruction): the same indices, EXTENDED_ARG prefixes and 3.11's caches included."""
    import dis
    import email.message
    import inspect
    import json.decoder
    import types

    from mlcache.keys.bytecode import _loaded_consts

    ops = frozenset(dis.hasconst)

    def by_dis(code: types.CodeType) -> set[int]:
        return {
            ins.arg
            for ins in dis.get_instructions(code)
            if (ins.opcode in ops or ins.opname == "KW_NAMES") and ins.arg is not None
        }

    def walk(code: types.CodeType) -> int:
        assert _loaded_consts(code) == by_dis(code), code
        return 1 + sum(walk(c) for c in code.co_consts if isinstance(c, types.CodeType))

    sources = [inspect.getsource(m) for m in (json.decoder, email.message, inspect)]
    # 1,000 constants loaded one by one: an EXTENDED_ARG prefix
    sources.append("x = [y, " + ", ".join(f"'{i}'" for i in range(1_000)) + "]")
    assert sum(walk(compile(src, "<test>", "exec")) for src in sources) > 200


def test_the_instructions_references_reads_are_those_dis_gives():
    """On CPython 3.11 bytecode._instructions reads co_code itself: the same names
    in the same order as dis, and the same values for what references() reads."""
    import dis
    import email.message
    import inspect
    import json.decoder
    import types

    from mlcache.keys import bytecode

    read = bytecode._NAMES_311 | bytecode._LOCALS_311 | {"LOAD_GLOBAL", "LOAD_CONST"}

    def walk(code: types.CodeType) -> int:
        mine = list(bytecode._instructions(code))
        theirs = [(i.opname, i.argval) for i in dis.get_instructions(code)]
        assert [n for n, _ in mine] == [n for n, _ in theirs], code
        for (name, value), (_, expected) in zip(mine, theirs):
            if name in read:
                assert value is expected or value == expected, (code, name)
        return 1 + sum(walk(c) for c in code.co_consts if isinstance(c, types.CodeType))

    sources = [inspect.getsource(m) for m in (json.decoder, email.message, inspect)]
    sources.append(
        "import os.path as p\nfrom a.b import c as d\n"
        "def f(x):\n    import numpy as np\n    y = [x, " + ", ".join(map(str, range(300)))
        + "]\n    def g():\n        return x.real + np.linalg.norm(y) + p.sep\n    return g\n"
    )  # fmt: skip
    assert sum(walk(compile(src, "<test>", "exec")) for src in sources) > 200


#: read by ``_scaled``; rebound by the test below
_FACTOR = 2


def _scaled(x):
    return x * _FACTOR


def test_a_fresh_walk_sees_a_value_rebound_since_the_walk_kept(monkeypatch):
    """The walk is kept for the process (a hit never pays for it); ``fresh=True``
    (a dataset's open) walks again and reads the value as it is now."""
    before = code_version(_scaled).digest
    monkeypatch.setattr(sys.modules[__name__], "_FACTOR", 3)
    assert code_version(_scaled).digest == before  # kept: the documented limit
    assert code_version(_scaled, fresh=True).digest != before
    assert code_version(_scaled).digest != before  # the fresh walk replaced it
