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

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache.data import CachedDataset
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


#: what ``Sized.load_item`` reads: a sweep (or a notebook cell) rebinds it between opens
SIZE = 2


class Sized(CachedDataset):
    scale = 1  # a class attribute, rebound the same way

    def __init__(self, n: int, **kw: Any) -> None:
        self.n = n
        super().__init__(**kw)

    def source_items(self) -> range:
        return range(self.n)

    def item_fingerprint(self, item: int) -> int:
        return item

    def load_item(self, i: int) -> dict[str, Any]:
        return {"x": np.full(SIZE, i * self.scale)}


@pytest.mark.parametrize("rebound", ["module", "class"])
def test_a_value_rebound_in_the_process_is_seen_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rebound: str
) -> None:
    """``for s in sizes: SIZE = s; ds = Tiles(...)`` in one script: each open reads
    the module-level values (and class attributes) as they are now, and a rebound
    one is another pack (before: the walk of the class's code was kept for the
    process, and every later open served the first value's samples)."""
    first = Sized(3, cache_dir=tmp_path, progress=False)
    assert [first[i]["x"].tolist() for i in range(3)] == [[0, 0], [1, 1], [2, 2]]
    if rebound == "module":
        monkeypatch.setattr(sys.modules[__name__], "SIZE", 3)
        want = [[i] * 3 for i in range(3)]
    else:
        monkeypatch.setattr(Sized, "scale", 10)
        want = [[10 * i] * 2 for i in range(3)]
    again = Sized(3, cache_dir=tmp_path, progress=False)
    assert again.pack_path != first.pack_path
    assert [again[i]["x"].tolist() for i in range(3)] == want
    monkeypatch.undo()  # back to the first value: its pack again
    assert Sized(3, cache_dir=tmp_path, progress=False).pack_path == first.pack_path
