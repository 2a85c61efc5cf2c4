"""identity.py (which function: identity, slug, call state) and the code versions
that tell two functions apart."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlcache._util import slug
from mlcache.keys.code_version import code_version as _code_version
from mlcache.keys.identity import closure_digest, func_identity
from mlcache.store import check_name


def code_version(func):
    return _code_version(func).digest


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_module(tmp_path: Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return load_module(path, name)


def top_level(x):
    return x + 1


class Model:
    def predict(self, x):
        return x


def fingerprint(func) -> tuple[str, str]:
    """Everything that decides whether two functions may share results."""
    return code_version(func), closure_digest(func)


# -- identity ------------------------------------------------------------------------
def test_identity_of_module_level_functions_and_methods():
    assert func_identity(top_level) == f"{top_level.__module__}.top_level"
    assert func_identity(Model.predict) == f"{Model.__module__}.Model.predict"
    assert func_identity(len) == "builtins.len"


def test_identity_of_nested_functions_and_lambdas():
    def inner():
        return 1

    assert func_identity(inner).endswith(
        "test_identity_of_nested_functions_and_lambdas.<locals>.inner"
    )
    f = lambda: 1  # noqa: E731
    line = f.__code__.co_firstlineno
    assert func_identity(f).endswith(f"<lambda>-{line}-16")  # line and column
    g = lambda: 2  # noqa: E731
    assert func_identity(f) != func_identity(g)  # other line
    h, k = (lambda: 3), (lambda: 4)
    assert func_identity(h) != func_identity(k)  # one line, other columns


def test_identity_of_script_and_notebook_functions():
    script: dict[str, object] = {"__name__": "__main__"}
    exec(compile("def run():\n    return 1\n", "/somewhere/train_model.py", "exec"), script)
    assert func_identity(script["run"]) == "__main__.train_model.run@/somewhere/train_model.py"
    other: dict[str, object] = {"__name__": "__main__"}
    exec(compile("def run():\n    return 1\n", "/elsewhere/evaluate.py", "exec"), other)
    assert func_identity(other["run"]) != func_identity(script["run"])
    cell: dict[str, object] = {"__name__": "__main__"}
    exec(compile("def run():\n    return 1\n", "<ipython-input-3-abc>", "exec"), cell)
    assert func_identity(cell["run"]) == "__main__.run"


# -- code version ---------------------------------------------------------------------
def test_code_version_is_stable_and_hex():
    v = code_version(top_level)
    assert re.fullmatch(r"[0-9a-f]{32}", v)
    assert code_version(top_level) == v
    assert code_version(Model.predict) != v


def test_code_version_changes_when_the_source_changes(tmp_path):
    v1 = write_module(tmp_path, "fp_v1", "def f(x):\n    return x + 1\n")
    v2 = write_module(tmp_path, "fp_v2", "def f(x):\n    return x + 2\n")
    v3 = write_module(tmp_path, "fp_v3", "def f(x):\n    return x + 1\n")
    v4 = write_module(tmp_path, "fp_v4", "def f(y):\n    return y + 1\n")
    assert code_version(v1.f) != code_version(v2.f)
    assert code_version(v1.f) == code_version(v3.f)  # same source, another module
    assert code_version(v1.f) != code_version(v4.f)


def test_code_version_follows_edits_of_one_file(tmp_path):
    path = tmp_path / "fp_edit.py"
    path.write_text("def f(x):\n    return x + 1\n")
    before = code_version(load_module(path, "fp_edit").f)
    path.write_text("def f(x):\n    return x + 100  # changed\n")
    after = code_version(load_module(path, "fp_edit").f)
    assert before != after


def test_code_version_without_source_uses_the_bytecode():
    ns1: dict[str, object] = {}
    ns2: dict[str, object] = {}
    ns3: dict[str, object] = {}
    exec(compile("def f(x):\n    return x + 1\n", "<nosource-1>", "exec"), ns1)
    exec(compile("def f(x):\n    return x + 2\n", "<nosource-2>", "exec"), ns2)
    exec(compile("def f(x):\n    return x + 1\n", "<nosource-3>", "exec"), ns3)
    assert code_version(ns1["f"]) != code_version(ns2["f"])
    assert code_version(ns1["f"]) == code_version(ns3["f"])


def test_decorated_functions_are_versioned_by_the_wrapper_and_the_wrapped_code():
    def deco(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        return wrapper

    def other_deco(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return 2 * func(*args, **kwargs)

        return wrapper

    assert code_version(deco(top_level)) == code_version(deco(top_level))
    assert code_version(deco(top_level)) != code_version(top_level)
    assert code_version(deco(top_level)) != code_version(other_deco(top_level))
    assert code_version(deco(top_level)) != code_version(deco(Model.predict))


def test_builtins_have_a_version():
    assert code_version(len) == code_version(len)
    assert code_version(len) != code_version(abs)


def test_lambdas_on_the_same_line_differ():
    f, g = (lambda x: x + 1), (lambda x: x * 2)
    h, i = (lambda x: [x]), (lambda x: (x,))
    assert f.__code__.co_firstlineno == g.__code__.co_firstlineno
    assert len({code_version(f), code_version(g), code_version(h), code_version(i)}) == 4
    j = lambda x: x + 1  # noqa: E731
    assert code_version(j) == code_version(f)  # the same code on another line


def make_adder(k):
    def add(x):
        return x + k

    return add


def make_twice(g):
    def twice(x):
        return g(g(x))

    return twice


def test_closures_over_different_values_get_different_fingerprints():
    one, two = make_adder(1), make_adder(2)
    # one code, two closures: the code version is shared, the closure is not
    assert code_version(one) == code_version(two)
    assert closure_digest(one) != closure_digest(two)
    assert fingerprint(one) == fingerprint(make_adder(1))
    assert fingerprint(make_adder([1, 2])) != fingerprint(make_adder([1, 3]))
    assert closure_digest(top_level) == ""


def test_closures_over_closures_see_the_inner_values():
    a, b = make_twice(make_adder(1)), make_twice(make_adder(2))
    assert a(0) != b(0)
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) == fingerprint(make_twice(make_adder(1)))


def test_closures_over_other_functions():
    assert closure_digest(make_twice(top_level)) != closure_digest(make_twice(Model.predict))
    assert closure_digest(make_twice(top_level)) == closure_digest(make_twice(top_level))


def test_self_recursive_closure_terminates():
    def outer():
        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)

        return fact

    assert closure_digest(outer()) == closure_digest(outer())


def test_mutually_recursive_closures_terminate():
    def outer(base):
        def even(n):
            return base if n == 0 else odd(n - 1)

        def odd(n):
            return not base if n == 0 else even(n - 1)

        return even

    assert closure_digest(outer(True)) == closure_digest(outer(True))
    assert closure_digest(outer(True)) != closure_digest(outer(False))


def test_closure_over_an_unhashable_value_is_a_type_error():
    lock = threading.Lock()

    def uses_lock():
        return lock

    with pytest.raises(TypeError):
        closure_digest(uses_lock)


_VERSION_IN_CHILD = textwrap.dedent(
    """
    import importlib.util, json, sys
    from mlcache.keys.code_version import code_version as cv
    from mlcache.keys.identity import closure_digest
    code_version = lambda f: cv(f).digest
    spec = importlib.util.spec_from_file_location("fp_child", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print(json.dumps({
        name: [code_version(getattr(mod, name)), closure_digest(getattr(mod, name))]
        for name in ("plain", "with_set", "lam", "lam_set", "lam_fs", "closure")
    }))
    """
)

_CHILD_MODULE = textwrap.dedent(
    """
    def plain(x):
        return x in {"alpha", "beta", "gamma", "delta"}

    with_set = plain
    lam = lambda x: x + 1
    lam_set = lambda x: x in {"alpha", "beta", "gamma", "delta", "epsilon"}
    lam_fs = lambda x: x in frozenset({"a", "b"})

    def make(tags):
        def closure(x):
            return x in tags
        return closure

    closure = make({"red", "green", "blue", "cyan"})
    """
)


def test_fingerprints_do_not_depend_on_hash_randomisation(tmp_path):
    # a set literal in a lambda compiles to a frozenset constant, whose repr
    # follows the process's string hash seed
    path = tmp_path / "fp_child.py"
    path.write_text(_CHILD_MODULE)
    results = []
    for seed in ("1", "2", "3"):
        res = subprocess.run(
            [sys.executable, "-c", _VERSION_IN_CHILD, str(path)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=seed),
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        results.append(res.stdout)
    assert results[0] == results[1] == results[2]


# -- slug ------------------------------------------------------------------------------
SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*-[0-9a-f]{8}$")


def assert_safe(s: str, root: str = "/cache/root") -> None:
    assert SAFE.match(s), s
    assert "/" not in s and "\\" not in s and "\x00" not in s
    assert not s.startswith(".") and s not in (".", "..")
    assert check_name(s) == s  # a valid store name
    joined = os.path.normpath(os.path.join(root, s))
    assert os.path.dirname(joined) == root  # one level below the root, never outside


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../../etc/passwd",
        "/abs/path",
        "a/b",
        "a\\b",
        ".hidden",
        "-dash",
        "..-..",
        "\x00nul",
        "C:\\Windows",
        "名前.関数",
        "\ud800",
        "x" * 500,
        "pkg.mod.<locals>.f",
        "__main__.<lambda>-12",
    ],
)
def test_slug_is_safe_for_hostile_names(name):
    s = slug(name)
    assert_safe(s)
    assert len(s) <= 80 + 9
    assert slug(name) == s


def test_slug_is_readable_and_distinguishes_names_that_sanitise_alike():
    assert slug("pkg.mod.f").startswith("pkg.mod.f-")
    names = ["a/b", "a_b", "a?b", "a b", "a\\b", "a<b"]
    assert len({slug(n) for n in names}) == len(names)
    assert slug("x" * 200) != slug("x" * 201)
    assert len(slug("y" * 200, max_len=10)) == 10 + 9


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_property_slug_is_always_safe_and_stable(name):
    s = slug(name)
    assert_safe(s)
    assert slug(name) == s
