"""``CachedDataset`` as users really write and run it (issue 13).

Each case is what a user does: a dataset built from ``source_items()`` +
``load_item()`` whose files change between runs, a module-level list edited
between two runs, ``num_workers=2`` in a script without a main guard or at the
import of the dataset's own module, an attribute that is new at every run. The
runs are fresh interpreters (scripts in a temporary folder sharing one cache),
each with a timeout, so that a hang is a failure and never a stuck test run.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import ClassVar

import pytest

from mlcache.data import CachedDataset
from scripts import ScriptFolder


class Runner(ScriptFolder):
    """Scripts in a temporary folder, run in fresh interpreters sharing one cache.

    A script calls ``built()`` from its ``load_item``/``load_source`` (the
    ``BUILDS`` log file counts them across processes)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, log="builds.log")

    def run(self, rel: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """One run of the script ``rel``; ``builds()`` then says what it loaded."""
        return self.execute(rel, *args, env={"BUILDS": str(self.log)}, ok=ok)

    def builds(self) -> list[str]:
        """What the last run loaded (one line per ``built(...)`` call)."""
        return self.log.read_text().split() if self.log.exists() else []

    def packs(self) -> list[Path]:
        return sorted(self.cache.rglob("*.pack"))


HELPERS = """
import os

def built(what="x"):
    with open(os.environ["BUILDS"], "a") as f:
        f.write(f"{what}\\n")
"""


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    r = Runner(tmp_path)
    r.write("helpers.py", HELPERS)
    return r


# -- 1. source_items() + load_item(): a changed source is noticed ------------------------
ITEMS_SCRIPT = """
import os, sys
from pathlib import Path
from mlcache.data import CachedDataset
from helpers import built

class Notes(CachedDataset):
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        return sorted(Path(self.root).glob("*.txt"))

    def load_item(self, path):
        built(path.name)
        return {"name": path.name, "text": path.read_text()}

ds = Notes(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(f"{ds[i]['name']}={ds[i]['text']}" for i in range(len(ds))))
"""


def test_source_items_that_are_files_are_fingerprinted(runner: Runner) -> None:
    """Edited (same size, new mtime), added, deleted and renamed files each
    rebuild the pack: no run serves the old samples."""
    src = runner.root / "notes"
    src.mkdir()
    for name, text in (("a.txt", "one"), ("b.txt", "two")):
        (src / name).write_text(text)
    runner.write("notes.py", ITEMS_SCRIPT)

    def samples() -> str:
        return runner.run("notes.py", str(src)).stdout.strip()

    assert samples() == "a.txt=one b.txt=two" and runner.builds() == ["a.txt", "b.txt"]
    assert samples() == "a.txt=one b.txt=two" and runner.builds() == []
    (src / "a.txt").write_text("uno")  # the same size: only the mtime tells
    st = os.stat(src / "a.txt")
    os.utime(src / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    # item by item: only what changed is loaded again
    assert samples() == "a.txt=uno b.txt=two" and runner.builds() == ["a.txt"]
    (src / "c.txt").write_text("three")
    assert samples() == "a.txt=uno b.txt=two c.txt=three" and runner.builds() == ["c.txt"]
    (src / "b.txt").unlink()
    assert samples() == "a.txt=uno c.txt=three" and runner.builds() == []
    (src / "c.txt").rename(src / "d.txt")
    assert samples() == "a.txt=uno d.txt=three" and runner.builds() == ["d.txt"]
    assert samples() == "a.txt=uno d.txt=three" and runner.builds() == []


SHAPES_SCRIPT = """
import os, sys
from pathlib import Path
from mlcache.data import CachedDataset

class Pairs(CachedDataset):  # (path, label) tuples
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        return [(str(p), i) for i, p in enumerate(sorted(Path(self.root).glob("*.txt")))]

    def load_item(self, item):
        return {"text": Path(item[0]).read_text(), "label": item[1]}

class Relative(Pairs):  # names relative to the dataset's folder
    def source_items(self):
        return sorted(n for n in os.listdir(self.root) if n.endswith(".txt"))

    def load_item(self, name):
        return {"text": Path(self.root, name).read_text()}

class Folders(Pairs):  # one folder per patient
    def source_items(self):
        return sorted(p for p in Path(self.root).iterdir() if p.is_dir())

    def load_item(self, folder):
        return {"text": (folder / "a.txt").read_text()}

kind = {"pairs": Pairs, "relative": Relative, "folders": Folders}[sys.argv[2]]
ds = kind(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(ds[i]["text"] for i in range(len(ds))))
"""


@pytest.mark.parametrize("kind", ["pairs", "relative", "folders"])
def test_source_items_that_hold_or_name_files_notice_an_edit(runner: Runner, kind: str) -> None:
    """(path, label) tuples, names relative to the dataset's folder, and folders
    of files: editing a file (same size, new mtime) rebuilds the pack."""
    src = runner.root / "src"
    target = src / ("p0" if kind == "folders" else "") / "a.txt"
    target.parent.mkdir(parents=True)
    target.write_text("one")
    runner.write("shapes.py", SHAPES_SCRIPT)

    def samples() -> str:
        return runner.run("shapes.py", str(src), kind).stdout.strip()

    assert samples() == "one"
    target.write_text("uno")
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert samples() == "uno"


class Rows(CachedDataset):
    """Items that are not files: row ids, tuples, URLs."""

    def __init__(self, ids, **kw):
        self.n = len(ids)  # an attribute that stays the same when the ids change
        self._ids = ids
        super().__init__(**kw)

    cache_on = ("n",)
    loaded: ClassVar[list[object]] = []

    def source_items(self):
        return self._ids

    def load_item(self, item):
        Rows.loaded.append(item)
        return {"item": str(item)}


def test_source_items_that_are_not_files_count_by_value(tmp_path: Path) -> None:
    """Row ids, tuples and strings that name no file are keyed by their value:
    the first open loads what is read; the next loads the rest (a few items
    missing are loaded at the open, and the pack sealed)."""
    cache = tmp_path / "cache"
    ids: list[object] = [1, ("b", 2), "https://example.org/x.csv"]
    Rows.loaded.clear()
    assert Rows(ids, cache_dir=cache, progress=False)[1]["item"] == "('b', 2)"
    assert Rows(ids, cache_dir=cache, progress=False) and len(Rows.loaded) == 3
    # item by item: a new item is loaded, the others are kept; a new order loads nothing
    for changed, new in (
        ([1, ("b", 3), "https://example.org/x.csv"], [("b", 3)]),
        ([ids[2], ("b", 3), ids[0]], []),
    ):
        Rows.loaded.clear()
        ds = Rows(changed, cache_dir=cache, progress=False)
        assert [ds[i]["item"] for i in range(3)] == [str(c) for c in changed]
        assert Rows.loaded == new


# -- 2. a module-level value the loading code reads is input; one it changes is state ------
CONFIG_MODULE = """
from helpers import built

cols = [1, 2]
_seen = {}  # a memo the build fills: state, not input

def columns():
    return list(cols)

def scaled(c):
    if c not in _seen:
        _seen[c] = c * 10
    return _seen[c]
"""

CONFIG_SCRIPT = """
import os
from mlcache.data import CachedDataset
import config

class Table(CachedDataset):
    def __init__(self, **kw):
        super().__init__(**kw)

    def source_items(self):
        return config.columns()

    def load_item(self, c):
        config.built(str(c))
        return {"c": c, "v": config.scaled(c)}

for _ in range(2):  # a notebook cell run twice: the filled memo is no new input
    ds = Table(cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(str(ds[i]["v"]) for i in range(len(ds))))
"""


def test_a_module_list_edited_between_runs_rebuilds(runner: Runner) -> None:
    """``cols = [1, 2]`` edited to ``[1, 2, 30]`` between two fresh runs."""
    runner.write("config.py", CONFIG_MODULE)
    runner.write("table.py", CONFIG_SCRIPT)
    assert runner.run("table.py").stdout.split() == ["10", "20"]
    runner.edit("config.py", "cols = [1, 2]", "cols = [1, 2, 30]")
    assert runner.run("table.py").stdout.split() == ["10", "20", "300"]
    assert runner.builds() == ["1", "2", "30"]


NOTEBOOK = """
import os
import config
from table import Table  # the class of table.py, built once there

config.cols.append(30)  # a notebook cell edits the list, the next one reopens
ds = Table(cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(str(ds[i]["v"]) for i in range(len(ds))))
"""


def test_a_module_list_changed_in_the_same_process_rebuilds(runner: Runner) -> None:
    """The code version is walked once per process, but what it reads counts as
    it is at each open (a notebook changing ``config.cols`` between two cells)."""
    runner.write("config.py", CONFIG_MODULE)
    runner.write("table.py", CONFIG_SCRIPT)
    runner.write("notebook.py", NOTEBOOK)
    assert runner.run("notebook.py").stdout.split() == ["10", "20", "10", "20", "300"]
    assert runner.builds() == ["1", "2", "1", "2", "30"]


def test_a_memo_the_build_fills_is_state(runner: Runner) -> None:
    """A module dict that the build changes does not make the next open (in the
    same process, or the next run) rebuild; the values it only reads still count."""
    runner.write("config.py", CONFIG_MODULE)
    runner.write("table.py", CONFIG_SCRIPT)
    assert runner.run("table.py").stdout.split() == ["10", "20"]
    assert runner.builds() == ["1", "2"]  # once, not once per construction
    assert runner.run("table.py").stdout.split() == ["10", "20"]
    assert runner.builds() == []
    assert len(runner.packs()) == 1
    runner.edit("config.py", "cols = [1, 2]", "cols = [2]")
    assert runner.run("table.py").stdout.split() == ["20"] and runner.builds() == ["2"]
    assert runner.run("table.py").stdout.split() == ["20"] and runner.builds() == []


VOCAB = """
import os
from mlcache.data import CachedDataset

vocab = {"<pad>": 0}  # the build adds the words it meets: a memo it also reads

class Tokens(CachedDataset):
    def source_items(self):
        return ["a", "b", "a"]

    def load_item(self, word):
        vocab.setdefault(word, len(vocab))
        return {"id": vocab[word]}

ds = Tokens(cache_dir=os.environ["CACHE"], progress=False)
print(" ".join(str(ds[i]["id"]) for i in range(len(ds))))
"""


def test_a_dict_the_build_fills_still_counts_by_what_it_held(runner: Runner) -> None:
    """Only the keys a build adds are state: editing the dict's literal (another
    starting vocabulary) rebuilds, and the first version comes back."""
    runner.write("tokens.py", VOCAB)
    assert runner.run("tokens.py").stdout.split() == ["1", "2", "1"]
    assert runner.run("tokens.py").stdout.split() == ["1", "2", "1"]
    assert len(runner.packs()) == 1  # the second run opened the first pack
    runner.edit("tokens.py", '{"<pad>": 0}', '{"<pad>": 0, "<unk>": 1}')
    assert runner.run("tokens.py").stdout.split() == ["2", "3", "2"]


# -- 3. num_workers: never re-runs the script, never hangs -----------------------------
FILES_DATASET = """
import os, time
from pathlib import Path
from mlcache.data import CachedDataset
from helpers import built

class Files(CachedDataset):
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        return sorted(Path(self.root).glob("*.txt"))

    def load_item(self, path):
        built(str(os.getpid()))
        # slow enough that workers pay (a faster build stays serial); slower in the
        # script's own process if it asks (SLOW_PARENT: its pid), so that spawned
        # workers, slow to start on a busy machine, still find items left to load
        slow_here = os.environ.get("SLOW_PARENT") == str(os.getpid())
        time.sleep(0.05 if slow_here else 0.01)
        return {"name": path.name, "n": int(path.read_text())}
"""

UNGUARDED = """
import os, sys
from filesds import Files
ds = Files(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False, num_workers=2)
print(sum(ds[i]["n"] for i in range(len(ds))), len(ds), os.getpid())
"""


def _numbered_files(folder: Path, n: int = 200) -> int:
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:04d}.txt").write_text(str(i))
    return sum(range(n))


def test_num_workers_in_a_script_without_a_main_guard(runner: Runner) -> None:
    total = _numbered_files(runner.root / "src")
    runner.write("filesds.py", FILES_DATASET)
    runner.write("unguarded.py", UNGUARDED)
    res = runner.run("unguarded.py", str(runner.root / "src"))
    total_seen, n, pid = res.stdout.split()
    assert (total_seen, n) == (str(total), "200") and "Traceback" not in res.stderr
    assert len(runner.builds()) == 200 and set(runner.builds()) - {pid}  # workers loaded


def test_num_workers_after_a_progress_bar(runner: Runner) -> None:
    """A progress bar on a terminal (ours while building, or the user's) starts
    tqdm's monitor thread: it does not stop the build from forking."""
    total = _numbered_files(runner.root / "src")
    runner.write("filesds.py", FILES_DATASET)
    bar = "import sys, tqdm\nfor _ in tqdm.tqdm(range(3), file=sys.stderr, disable=False): pass\n"
    runner.write("barred.py", bar + UNGUARDED)
    res = runner.run("barred.py", str(runner.root / "src"))
    total_seen, n, pid = res.stdout.split()
    assert (total_seen, n) == (str(total), "200") and "thread" not in res.stderr
    assert set(runner.builds()) - {pid}  # workers loaded


AT_IMPORT = """
import os, sys
from filesds import Files
DATA = Files(os.environ["SRC"], cache_dir=os.environ["CACHE"], progress=False, num_workers=2)
"""


def test_num_workers_at_import_of_the_datasets_module(runner: Runner) -> None:
    """The dataset is made while its own module is being imported."""
    total = _numbered_files(runner.root / "src")
    runner.write("filesds.py", FILES_DATASET)
    runner.write("data_at_import.py", AT_IMPORT)
    runner.write("use.py", "from data_at_import import DATA\nprint(sum(s['n'] for s in DATA))\n")
    os.environ["SRC"] = str(runner.root / "src")
    try:
        assert runner.run("use.py").stdout.split() == [str(total)]
    finally:
        del os.environ["SRC"]
    assert len(runner.builds()) == 200


WITH_A_THREAD = """
import os, sys, threading
os.environ["SLOW_PARENT"] = str(os.getpid())  # spawned workers get items on a busy machine
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()  # a user's background thread
from filesds import Files
{guard}
    ds = Files(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False, num_workers=2)
    print(sum(ds[i]["n"] for i in range(len(ds))), len(ds), os.getpid())
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_num_workers_with_threads_running(runner: Runner, guarded: bool) -> None:
    """fork with a thread running is unsafe: a guarded script builds in spawn
    workers; an unguarded one (spawn would re-run it) builds in this process and
    says why."""
    total = _numbered_files(runner.root / "src")
    runner.write("filesds.py", FILES_DATASET)
    guard = 'if __name__ == "__main__":' if guarded else "if True:"
    runner.write("threaded.py", WITH_A_THREAD.format(guard=guard))
    res = runner.run("threaded.py", str(runner.root / "src"))
    total_seen, n, pid = res.stdout.split()
    assert (total_seen, n) == (str(total), "200") and len(runner.builds()) == 200
    if guarded:  # loaded by worker processes
        assert set(runner.builds()) - {pid} and "Traceback" not in res.stderr
    else:
        assert set(runner.builds()) == {pid} and "thread is running" in res.stderr


SPAWN_CHILD = """
import multiprocessing, os, sys
from filesds import Files
# no main guard: a spawned child re-runs this, and would rebuild the pack
ds = Files(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False, force_recache=True)
print("samples", len(ds), flush=True)
p = multiprocessing.get_context("spawn").Process(target=print, args=("child",))
p.start()
p.join(60)
print("exit", p.exitcode)
"""


def test_a_spawned_child_rerunning_the_script_is_told_why(runner: Runner) -> None:
    """A spawn child that re-imports an unguarded script and reaches a build gets a
    clear error (before this it rebuilt the pack, or waited for the parent's lock)."""
    _numbered_files(runner.root / "src", 5)
    runner.write("filesds.py", FILES_DATASET)
    runner.write("spawner.py", SPAWN_CHILD)
    res = runner.run("spawner.py", str(runner.root / "src"))
    assert res.stdout.split()[:2] == ["samples", "5"] and "exit 1" in res.stdout
    assert "if __name__ == " in res.stderr and "re-running" in res.stderr
    assert runner.builds() == []  # the parent fills as it reads: nothing read yet


PICKLE_COUNT = """
import os, sys
from filesds import Files
from helpers import built

class Heavy:
    '''A large attribute: counts how often it reaches a worker.'''
    def __init__(self):
        self.blob = b"x" * 1_000_000
    def __getstate__(self):
        return self.blob
    def __setstate__(self, blob):
        built("unpickled")
        self.blob = blob

class WithHeavy(Files):
    cache_on = ("root",)
    def __init__(self, root, **kw):
        self.heavy = Heavy()
        super().__init__(root, **kw)

if __name__ == "__main__":
    method = sys.argv[2]
    if method == "spawn":  # a thread: fork is unsafe, so the guarded script uses spawn
        import threading
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    ds = WithHeavy(sys.argv[1], cache_dir=os.environ["CACHE"] + method, num_workers=2,
                   progress=False)
    print(len(ds))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_dataset_reaches_each_worker_once(runner: Runner, method: str) -> None:
    """Not once per chunk of items: a large attribute is sent at most once per worker."""
    _numbered_files(runner.root / "src", 400)
    runner.write("filesds.py", FILES_DATASET)
    runner.write("heavy.py", PICKLE_COUNT)
    assert runner.run("heavy.py", str(runner.root / "src"), method).stdout.split() == ["400"]
    assert runner.builds().count("unpickled") <= 2


class Tiny(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def source_items(self):
        return range(self.n)

    def load_item(self, i):
        return {"i": i, "pid": os.getpid()}


def test_tiny_items_stay_in_this_process(tmp_path: Path) -> None:
    """2,000 items of microseconds each: workers would cost more than they save."""
    ds = Tiny(2000, cache_dir=tmp_path / "c", progress=False, num_workers=2)
    assert [ds[i]["i"] for i in range(0, 2000, 500)] == [0, 500, 1000, 1500]
    assert {ds[i]["pid"] for i in range(len(ds))} == {os.getpid()}


# -- 4. packs that are no longer current go; an attribute new at every run is named ----------
TEMPDIR_SCRIPT = """
import os, sys, tempfile
from filesds import Files

class Scratch(Files):
    {ignore}
    def __init__(self, root, **kw):
        self.out_dir = tempfile.mkdtemp()  # new at every run
        super().__init__(root, **kw)

ds = Scratch(sys.argv[1], cache_dir=os.environ["CACHE"], progress=False)
print(len(ds))
for i in range(len(ds)):  # an epoch: the pack fills, and is sealed
    ds[i]
"""


def test_an_attribute_new_at_every_run_is_named(runner: Runner) -> None:
    _numbered_files(runner.root / "src", 10)
    runner.write("filesds.py", FILES_DATASET)
    runner.write("scratch.py", TEMPDIR_SCRIPT.format(ignore=""))
    errs = [runner.run("scratch.py", str(runner.root / "src")).stderr for _ in range(3)]
    assert "out_dir" not in errs[0] + errs[1]
    assert "out_dir" in errs[2] and "cache_ignore" in errs[2]
    assert "root" not in errs[2].split("out_dir")[1].split("\n")[0]


def test_cache_ignore_leaves_an_attribute_out(runner: Runner) -> None:
    _numbered_files(runner.root / "src", 10)
    runner.write("filesds.py", FILES_DATASET)
    runner.write("scratch.py", TEMPDIR_SCRIPT.format(ignore='cache_ignore = ("out_dir",)'))
    for _ in range(3):
        res = runner.run("scratch.py", str(runner.root / "src"))
        assert res.stdout.split() == ["10"] and "out_dir" not in res.stderr
    assert len(runner.packs()) == 1


class Numbers(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def load_source(self):
        return ({"i": i} for i in range(self.n))


def test_packs_are_kept_as_long_as_old_function_results() -> None:
    """The data package keeps its own constant (it does not import the function
    cache, its sibling layer): the two agree."""
    from mlcache.data.cached import UNUSED_PACKS_KEPT_FOR
    from mlcache.memo.versions import OLD_VERSIONS_KEPT_FOR

    assert UNUSED_PACKS_KEPT_FOR == OLD_VERSIONS_KEPT_FOR


def test_packs_unused_for_a_long_time_go(tmp_path: Path) -> None:
    """A pack of other attributes not opened for UNUSED_PACKS_KEPT_FOR goes when
    another pack of the class is built; one opened recently stays."""
    from mlcache.data.cached import UNUSED_PACKS_KEPT_FOR

    cache = tmp_path / "cache"
    old = Numbers(1, cache_dir=cache, progress=False)
    recent = Numbers(2, cache_dir=cache, progress=False)
    long_ago = time.time() - UNUSED_PACKS_KEPT_FOR - 3600
    os.utime(old.pack_path, (long_ago, long_ago))
    Numbers(3, cache_dir=cache, progress=False)
    assert not os.path.exists(old.pack_path) and os.path.exists(recent.pack_path)
    assert len(Numbers(1, cache_dir=cache, progress=False)) == 1  # rebuilt when asked again


class Counting(CachedDataset):
    """Filled item by item (load_item)."""

    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def source_items(self):
        return list(range(self.n))

    def load_item(self, i):
        return {"i": i}


def test_records_of_a_pack_never_sealed_go_when_unused(tmp_path: Path) -> None:
    """The records of a pack filled half way (another attribute's, not opened for
    UNUSED_PACKS_KEPT_FOR) go when a pack of the class is sealed; recent ones stay."""
    from mlcache.data.cached import UNUSED_PACKS_KEPT_FOR

    cache = tmp_path / "cache"
    half, recent = Counting(4, cache_dir=cache), Counting(5, cache_dir=cache)
    half[0], recent[0]  # one record each, never sealed
    old = Path(half.pack_path + ".fill")
    assert old.is_dir() and not os.path.exists(half.pack_path)
    long_ago = time.time() - UNUSED_PACKS_KEPT_FOR - 3600
    os.utime(old, (long_ago, long_ago))
    sealed = Counting(3, cache_dir=cache)
    for i in range(3):
        sealed[i]
    assert os.path.exists(sealed.pack_path) and not os.path.exists(sealed.pack_path + ".fill")
    assert not old.exists() and Path(recent.pack_path + ".fill").is_dir()


TORCH_BUILD = """
import time
import torch
from mlcache.data import CachedDataset

a = torch.randn(1000, 1000)
(a @ a).sum()  # torch's OpenMP pool has run: a forked child must not use it

class T(CachedDataset):
    def source_items(self):
        return list(range(120))

    def load_item(self, i):
        x = torch.randn(200, 200)
        time.sleep(0.02)  # slow enough that the build uses its workers
        return {"i": i, "s": float((x @ x).sum())}

import os
ds = T(cache_dir=os.environ["CACHE"], num_workers=2, progress=False)
print(len(ds), ds[7]["i"])
"""


def test_num_workers_after_torch_ran_does_not_hang(runner):
    """A script (no main guard) that ran a torch op before a parallel build:
    forked workers used to wait for ever on the parent's OpenMP pool."""
    pytest.importorskip("torch")
    runner.write("torch_build.py", TORCH_BUILD)
    res = runner.run("torch_build.py")
    assert res.stdout.split() == ["120", "7"]


IMPORTED_BUILD = """
import os, threading, time
from mlcache.data import CachedDataset

class Slow(CachedDataset):
    def source_items(self):
        return list(range(60))

    def load_item(self, i):
        time.sleep(0.03)
        return {"i": i}

stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()  # fork is unsafe now
ds = Slow(cache_dir=os.environ["CACHE"], num_workers=2, progress=False)
stop.set()
"""

GUARDED_MAIN = """
import warnings

if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import slowmod
    print(len(slowmod.ds), "|".join(str(w.message) for w in seen))
"""


def test_a_dataset_built_at_import_of_its_module_with_threads_running(runner: Runner) -> None:
    """Spawn workers would import the module again and build again (each printing
    an error about a main guard the script has): one warning naming the module,
    and the build runs here."""
    runner.write("slowmod.py", IMPORTED_BUILD)
    runner.write("main.py", GUARDED_MAIN)
    res = runner.run("main.py")
    count, _, said = res.stdout.strip().partition(" ")
    assert count == "60"
    assert "'slowmod' is being imported" in said
    assert "Traceback" not in res.stderr and "RuntimeError" not in res.stderr
