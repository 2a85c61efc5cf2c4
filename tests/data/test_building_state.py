"""What a dataset's build changes of module-level values: state only when it is
provably bookkeeping, by the function cache's rules (issue 23).

A build that raises an int (``STATS["loaded"] += 1``) or only grows a container
leaves the pack's name as it was before the build (by its baseline), so the next
run opens the pack. Anything else it changes stays in the pack's name: a value
it sets (``CFG["scale"] = float(...)``), an object it changes inside
(``ctx.model.eval()``). Each case runs what a user runs: fresh interpreters
sharing one cache, with the source edited between runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import ScriptFolder

#: every script's dataset: three items, loaded through ``load``, a line each in LOG
DATASET = """
import os
from mlcache.data import CachedDataset
{setup}

class Items(CachedDataset):
    def source_items(self):
        return [1, 2, 3]

    def load_item(self, x):
        with open(os.environ["LOG"], "a") as log:
            log.write(f"{{x}}\\n")
        return {{"y": load(x)}}

ds = Items(cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(str(ds[i]["y"]) for i in range(len(ds))))
"""


@pytest.fixture
def scripts(tmp_path: Path) -> ScriptFolder:
    return ScriptFolder(tmp_path)


def _run(scripts: ScriptFolder) -> tuple[list[str], list[str]]:
    """One fresh run of ``ds.py``: (what it printed, the items it loaded)."""
    printed = scripts.execute("ds.py").stdout.split()
    return printed, scripts.logged()


def test_a_value_a_build_sets_stays_in_the_packs_name(scripts: ScriptFolder) -> None:
    """``load`` normalises ``CFG["scale"]`` (an int set to a float): not
    bookkeeping, so editing ``CFG`` in the source between runs rebuilds (before:
    the key left the pack's name and the old pack was served)."""
    setup = """
CFG = {"scale": 3}

def load(x):
    CFG["scale"] = float(CFG["scale"])  # a computed value the build sets
    return x * CFG["scale"]
"""
    scripts.write("ds.py", DATASET.format(setup=setup))
    assert _run(scripts) == (["3.0", "6.0", "9.0"], ["1", "2", "3"])
    assert _run(scripts) == (["3.0", "6.0", "9.0"], [])  # the same source: the pack
    scripts.edit("ds.py", '{"scale": 3}', '{"scale": 5}')
    assert _run(scripts) == (["5.0", "10.0", "15.0"], ["1", "2", "3"])


def test_a_model_a_build_switches_to_eval_stays_in_the_packs_name(
    scripts: ScriptFolder,
) -> None:
    """A module-level holder's model whose ``eval()`` the build calls: the model,
    weights included, stays in the pack's name (before: ``ctx.model`` was learned
    as state, and a new weight served the old pack)."""
    setup = """
class Model:
    def __init__(self, w):
        self.w, self.training = w, True

    def eval(self):
        self.training = False
        return self

class Context:
    pass

ctx = Context()
ctx.model = Model(2)

def load(x):
    return x * ctx.model.eval().w
"""
    scripts.write("ds.py", DATASET.format(setup=setup))
    assert _run(scripts) == (["2", "4", "6"], ["1", "2", "3"])
    assert _run(scripts) == (["2", "4", "6"], [])
    scripts.edit("ds.py", "Model(2)", "Model(7)")
    assert _run(scripts) == (["7", "14", "21"], ["1", "2", "3"])


def test_a_counter_a_build_raises_lets_the_next_run_open_the_pack(scripts: ScriptFolder) -> None:
    """``STATS["loaded"] += 1`` is bookkeeping: the next run opens the pack (no
    rebuild at each run), and the value the build only reads still counts."""
    setup = """
STATS = {"loaded": 0}
SCALE = {"by": 10}

def load(x):
    STATS["loaded"] += 1
    return x * SCALE["by"]
"""
    scripts.write("ds.py", DATASET.format(setup=setup))
    assert _run(scripts) == (["10", "20", "30"], ["1", "2", "3"])
    assert _run(scripts) == (["10", "20", "30"], [])
    assert _run(scripts) == (["10", "20", "30"], [])
    assert len(list(scripts.cache.rglob("*.pack"))) == 1
    scripts.edit("ds.py", '{"by": 10}', '{"by": 100}')
    assert _run(scripts) == (["100", "200", "300"], ["1", "2", "3"])


def test_a_list_a_build_grows_counts_by_what_it_held(scripts: ScriptFolder) -> None:
    """A label vocabulary the build extends with unseen labels is bookkeeping, by
    its baseline: the next run opens the pack, and editing the list's literal
    rebuilds (before: the list left the pack's name, and ``"dog"`` stayed 1)."""
    setup = """
LABELS = ["cat", "dog"]
WORDS = {1: "dog", 2: "cat", 3: "eel"}

def load(x):
    if WORDS[x] not in LABELS:
        LABELS.append(WORDS[x])
    return LABELS.index(WORDS[x])
"""
    scripts.write("ds.py", DATASET.format(setup=setup))
    assert _run(scripts) == (["1", "0", "2"], ["1", "2", "3"])
    assert _run(scripts) == (["1", "0", "2"], [])
    scripts.edit("ds.py", '["cat", "dog"]', '["dog", "cat"]')
    assert _run(scripts) == (["0", "1", "2"], ["1", "2", "3"])
