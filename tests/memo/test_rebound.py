"""A module-level name the cached code reads, rebound by other code while the
process runs (``SIZE = 3`` in a notebook cell or a script's loop, a helper
defined again): the next call is keyed by the value it will read, in this
process (no result of the old value served) and in the next run (no result of
the new value stored under the old value's key). A name the cached call rebinds
itself (``global CALLS; CALLS += 1``) is its own state, as before: its calls
keep hitting."""

from __future__ import annotations

import sys

from mlcache import Memory
from scripts import ScriptFolder

#: read by the cached functions below; rebound by the tests
SIZE = 2
#: rebound by ``_counted`` itself at each computed call
CALLS = 0
#: what the cached functions computed (appended by each computed call)
RAN: list[object] = []


def _times_size(x):
    RAN.append(("times", x))
    return x * SIZE


def _size():
    return SIZE


def _through_helper(x):
    RAN.append(("helper", x))
    return x * _size()


def _counted(x):
    global CALLS
    CALLS += 1
    RAN.append(("counted", x))
    return x + 1


def _module(monkeypatch, **values):
    for name, value in values.items():
        monkeypatch.setattr(sys.modules[__name__], name, value)


def test_a_value_rebound_between_calls_keys_the_next_call(tmp_path, monkeypatch):
    """Before: ``f(1)`` after ``SIZE = 3`` served 2, the result of ``SIZE = 2``."""
    RAN.clear()
    f = Memory(tmp_path, verbose=0).cache(_times_size)
    assert f(1) == 2
    _module(monkeypatch, SIZE=3)
    assert f(1) == 3
    _module(monkeypatch, SIZE=2)
    assert f(1) == 2  # the first result, found again: not computed
    assert RAN == [("times", 1), ("times", 1)]


def test_a_helper_or_its_value_rebound_keys_the_next_call(tmp_path, monkeypatch):
    RAN.clear()
    f = Memory(tmp_path, verbose=0).cache(_through_helper)
    assert f(2) == 4
    _module(monkeypatch, SIZE=5)  # a value the helper reads
    assert f(2) == 10
    _module(monkeypatch, _size=lambda: 7)  # the helper defined again
    assert f(2) == 14
    assert len(RAN) == 3


def test_a_name_the_cached_call_rebinds_itself_is_its_state(tmp_path, monkeypatch):
    """``global CALLS; CALLS += 1``: the call's own bookkeeping. It never made the
    next call miss, and does not now (the rebinding check leaves it out)."""
    RAN.clear()
    _module(monkeypatch, CALLS=0)
    f = Memory(tmp_path, verbose=0).cache(_counted)
    assert [f(1), f(1), f(1)] == [2, 2, 2]
    assert RAN == [("counted", 1)]
    assert CALLS == 1


SCRIPT = """
import os, sys
from mlcache import Memory

mem = Memory(os.environ["CACHE"], verbose=0)
SIZE = 2

@mem.cache
def scaled(x):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"computed{x} ")
    return x * SIZE

if __name__ == "__main__":
    if sys.argv[1] == "sweep":  # the value set again between calls, as a loop does
        print(scaled(1))
        SIZE = 3
        print(scaled(2))
    else:
        print(scaled(2))
"""


def test_a_result_computed_after_a_rebinding_is_not_served_to_the_old_value(tmp_path):
    """Before: the sweep stored ``scaled(2)`` at ``SIZE = 3`` (6) under the key of
    ``SIZE = 2``, and the next run, at ``SIZE = 2``, was served 6 for 4."""
    folder = ScriptFolder(tmp_path)
    folder.write("sweep.py", SCRIPT)
    assert folder.execute("sweep.py", "sweep").stdout.split() == ["2", "6"]
    res = folder.execute("sweep.py", "again")
    assert res.stdout.split() == ["4"]
    assert folder.logged() == ["computed2"]


CONFIG = """
SIZE = 2

def __getattr__(name):  # a lazy attribute: a new object at each access
    if name == "extra":
        return [1, 2]
    raise AttributeError(name)
"""

MAIN = """
import os
import config
from mlcache import Memory

mem = Memory(os.environ["CACHE"], verbose=0)

@mem.cache
def scaled(x):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"computed{x} ")
    return x * config.SIZE + len(config.extra)

print(scaled(1), scaled(1))
config.SIZE = 3
print(scaled(1))
"""


def test_a_module_attribute_rebound_keys_the_next_call(tmp_path):
    """``config.SIZE = 3``: the module's name, rebound. A lazy module attribute (a
    module ``__getattr__``, a new object at each access) is no rebinding: the
    second call hits."""
    folder = ScriptFolder(tmp_path)
    folder.write("config.py", CONFIG)
    folder.write("main.py", MAIN)
    assert folder.execute("main.py").stdout.split() == ["4", "4", "5"]
    assert folder.logged() == ["computed1", "computed1"]


class _Base:
    SCALE = 2


class _Model(_Base):
    pass


def _class_scaled(x):
    RAN.append(("class", x))
    return x * _Model.SCALE


def test_a_class_attribute_rebound_keys_the_next_call(tmp_path, monkeypatch):
    """``Model.SCALE = 3`` on the class that holds it, or on a subclass that
    inherited it (which then shadows the base's)."""
    RAN.clear()
    f = Memory(tmp_path, verbose=0).cache(_class_scaled)
    assert [f(1), f(1)] == [2, 2]
    monkeypatch.setattr(_Base, "SCALE", 3)
    assert f(1) == 3
    monkeypatch.setattr(_Model, "SCALE", 5, raising=False)
    assert f(1) == 5
    assert len(RAN) == 3


class Config:
    """Settings read as class attributes (``Config.scale``), set by other code."""

    scale = 2


class Base:
    offset = 10


class Sub(Base):
    def shifted(self, x):
        return x + self.offset  # a class attribute, read through the instance


class Tally:
    calls = 0


def _by_config(x):
    RAN.append(("config", x))
    return x * Config.scale


def _by_method(x):
    RAN.append(("method", x))
    return Sub().shifted(x)


def _tallied(x):
    Tally.calls += 1  # the call's own bookkeeping, on a class
    RAN.append(("tallied", x))
    return x - 1


def test_a_class_attribute_set_between_calls_keys_the_next_call(tmp_path, monkeypatch):
    """``Config.scale = 3`` in a notebook cell, as ``config.SCALE = 3`` on a
    module. Before: ``f(1)`` was served 2, the result of ``scale = 2``."""
    RAN.clear()
    f = Memory(tmp_path, verbose=0).cache(_by_config)
    assert f(1) == 2
    monkeypatch.setattr(Config, "scale", 3)
    assert f(1) == 3
    monkeypatch.setattr(Config, "scale", 2)
    assert f(1) == 2 and len(RAN) == 2  # the first result, found again


def test_a_class_attribute_a_method_reads_set_on_it_or_its_subclass(tmp_path, monkeypatch):
    """``self.offset`` in a method: set on the base class, then on the subclass
    (where it was inherited, not held). Before: both served 11."""
    RAN.clear()
    f = Memory(tmp_path, verbose=0).cache(_by_method)
    assert f(1) == 11
    monkeypatch.setattr(Base, "offset", 20)
    assert f(1) == 21
    monkeypatch.setattr(Sub, "offset", 30, raising=False)
    assert f(1) == 31 and len(RAN) == 3


def test_a_class_attribute_the_cached_call_sets_itself_is_its_state(tmp_path, monkeypatch):
    """``Tally.calls += 1`` in the call: its bookkeeping, as a global's; the next
    calls hit."""
    RAN.clear()
    monkeypatch.setattr(Tally, "calls", 0)
    f = Memory(tmp_path, verbose=0).cache(_tallied)
    assert [f(5), f(5), f(5)] == [4, 4, 4]
    assert RAN == [("tallied", 5)] and Tally.calls == 1


CLASS_SCRIPT = (
    SCRIPT.replace("SIZE = 2\n", "class Cfg:\n    size = 2\n")
    .replace("x * SIZE", "x * Cfg.size")
    .replace("        SIZE = 3\n", "        Cfg.size = 3\n")
)


def test_a_result_computed_after_a_class_attribute_is_set_is_not_served_to_the_old_value(
    tmp_path,
):
    """The same with ``Cfg.size = 3`` in the loop. Before: the sweep stored 6 under
    the key of ``size = 2``, and the next run was served 6 for 4."""
    assert "Cfg.size = 3" in CLASS_SCRIPT and "x * Cfg.size" in CLASS_SCRIPT
    folder = ScriptFolder(tmp_path)
    folder.write("sweep.py", CLASS_SCRIPT)
    assert folder.execute("sweep.py", "sweep").stdout.split() == ["2", "6"]
    assert folder.execute("sweep.py", "again").stdout.split() == ["4"]
    assert folder.logged() == ["computed2"]
