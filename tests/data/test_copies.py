"""A dataset unpickled where its code reads other values than where it was opened
(a spawned DataLoader worker re-importing the script: a value set under
``if __name__ == "__main__":`` is not the worker's): the copy loads its samples,
unstored, and the pack keeps only the samples of the values it is named by."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache import CacheWarning
from mlcache.data import CachedDataset, PackedDataset
from scripts import ScriptFolder

#: what ``Sized.load_item`` reads
SIZE = 2


class Sized(CachedDataset):
    def __init__(self, n: int, **kw: Any) -> None:
        self.n = n
        super().__init__(progress=False, **kw)

    def source_items(self) -> range:
        return range(self.n)

    def item_fingerprint(self, item: int) -> int:
        return item

    def load_item(self, i: int) -> dict[str, Any]:
        return {"x": np.full(SIZE, i)}


def _xs(ds: CachedDataset) -> list[list[int]]:
    return [ds[i]["x"].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("sealed", [False, True])
def test_a_copy_whose_code_reads_other_values_loads_unstored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sealed: bool
) -> None:
    """Before: the copy served the pack's samples (a sealed pack) or recorded its own
    in the pack named by the other values (a pack being filled), which the next run
    with those values then read."""
    ds = Sized(6, cache_dir=tmp_path)
    if sealed:
        assert _xs(ds) == [[i] * 2 for i in range(6)]
    else:
        assert ds[0]["x"].tolist() == [0, 0]
    same = pickle.loads(pickle.dumps(ds))  # the same values: the dataset as it was
    assert same[1]["x"].tolist() == [1, 1]
    sent = pickle.dumps(ds)
    monkeypatch.setattr(sys.modules[__name__], "SIZE", 3)  # as the worker's module has it
    with pytest.warns(CacheWarning, match="reads other values in this process"):
        copy = pickle.loads(sent)
    assert len(copy) == 6 and _xs(copy) == [[i] * 3 for i in range(6)]
    assert [s["x"].tolist() for s in copy[1:3]] == [[1] * 3, [2] * 3]
    assert copy.get_batch([0, 1])["x"].tolist() == [[0] * 3, [1] * 3]
    monkeypatch.undo()
    again = Sized(6, cache_dir=tmp_path)  # SIZE 2: the pack holds no sample of SIZE 3
    assert _xs(again) == [[i] * 2 for i in range(6)]


def test_a_copy_whose_code_cannot_be_walked_loads_unstored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not sure: a copy whose code walk fails where it is unpickled cannot show that
    it reads the pack's values, so it loads its samples, unstored, and says so."""
    from mlcache.data import copies

    ds = Sized(4, cache_dir=tmp_path)
    assert _xs(ds) == [[i] * 2 for i in range(4)]
    sent = pickle.dumps(ds)

    def fails(cls: type, state: dict[str, str]) -> tuple[str, str]:
        raise RuntimeError("a global whose attribute access fails")

    monkeypatch.setattr(copies, "code_key", fails)
    with pytest.warns(CacheWarning, match="reads other values in this process"):
        copy = pickle.loads(sent)
    assert copy.elsewhere and _xs(copy) == [[i] * 2 for i in range(4)]


def test_a_spawned_worker_under_a_main_guard_stores_nothing_in_the_parents_pack(
    tmp_path: Path,
) -> None:
    """The user's run: ``SIZE`` set under the main guard, the samples read by spawned
    processes (as DataLoader workers), then a run without workers reads the pack."""
    scripts = ScriptFolder(tmp_path)
    scripts.write(
        "sweep.py",
        textwrap.dedent(
            """
            import multiprocessing, os, sys
            import numpy as np
            from mlcache.data import CachedDataset, PackedDataset

            SIZE = 2

            class Tiles(CachedDataset):
                def source_items(self):
                    return range(4)

                def item_fingerprint(self, i):
                    return i

                def load_item(self, i):
                    return {"x": np.full(SIZE, i)}

            def read(ds, i):
                return len(ds[i]["x"])

            if __name__ == "__main__":
                SIZE = 3
                ds = Tiles(cache_dir=os.environ["CACHE"], progress=False)
                if sys.argv[1] == "spawn":
                    with multiprocessing.get_context("spawn").Pool(1) as pool:
                        print(pool.starmap(read, [(ds, i) for i in range(4)]))
                else:
                    print([read(ds, i) for i in range(4)])
            """
        ),
    )
    spawned = scripts.execute("sweep.py", "spawn").stdout.split("\n")[0]
    assert spawned == "[2, 2, 2, 2]"  # the worker's own values, as without the cache
    assert scripts.execute("sweep.py", "main").stdout.strip() == "[3, 3, 3, 3]"  # before: 2s


def test_spawned_build_workers_under_a_main_guard_leave_the_build_to_the_parent(
    tmp_path: Path,
) -> None:
    """An up-front build in parallel spawns its workers when other threads run: a
    value set under the main guard is not theirs, so they load nothing and the
    building process loads every item with its own values (before: the workers'
    samples, of SIZE 2, went into the pack named by SIZE 3). The building process
    waits, once its workers are starting, for one to hold its copy: whatever the machine's
    speed, the workers are there before the build is done."""
    scripts = ScriptFolder(tmp_path)
    scripts.write(
        "build.py",
        textwrap.dedent(
            """
            import multiprocessing, os, threading, time
            import numpy as np
            from mlcache.data import CachedDataset, workers

            SIZE = 2
            HELD = os.environ["CACHE"] + ".held"  # a worker holds its copy

            class Tiles(CachedDataset):
                def source_items(self):
                    return range(48)

                def item_fingerprint(self, i):
                    return i

                def load_item(self, i):
                    if __name__ == "__main__" and multiprocessing.active_children():
                        for _ in range(1200):  # the workers are starting: at most 60 s
                            if os.path.exists(HELD):
                                break
                            time.sleep(0.05)
                    time.sleep(0.02)
                    return {"x": np.full(SIZE, i)}

                def __setstate__(self, state):
                    super().__setstate__(state)
                    open(HELD, "w").close()

            if __name__ == "__main__":
                SIZE = 3
                workers._START_SECONDS["spawn"] = 0.0  # whatever this machine's start costs
                stop = threading.Event()  # another thread: fork is unsafe, workers spawn
                threading.Thread(target=stop.wait, daemon=True).start()
                ds = Tiles(cache_dir=os.environ["CACHE"], progress=False, fill="up-front",
                           num_workers=2)
                print(sorted({len(ds[i]["x"]) for i in range(len(ds))}))
                stop.set()
            """
        ),
    )
    res = scripts.execute("build.py")
    assert res.stdout.strip() == "[3]", res.stdout + res.stderr  # before: [2, 3]
    assert "loading the remaining" in res.stderr  # the workers stood down, said here


def test_a_spawned_worker_whose_values_are_the_same_reads_the_pack(tmp_path: Path) -> None:
    """The script's own classes and functions held by the values its code reads (a
    dataclass config, an enum, a registry of functions) are ``__mp_main__``'s in a
    spawned worker: they are the same values, so the copy reads the pack, without a
    warning (before: every read of every epoch was loaded again, unstored)."""
    scripts = ScriptFolder(tmp_path)
    scripts.write(
        "same.py",
        textwrap.dedent(
            """
            import dataclasses, enum, multiprocessing, os, sys
            import numpy as np
            from mlcache.data import CachedDataset, PackedDataset

            @dataclasses.dataclass
            class Cfg:
                size: int = 2

            class Mode(enum.Enum):
                A = 1

            def shift(i):
                return i + 1

            CFG, MODE, REG = Cfg(), Mode.A, {"shift": shift}

            class Tiles(CachedDataset):
                def source_items(self):
                    return range(4)

                def item_fingerprint(self, i):
                    return i

                def load_item(self, i):
                    x = REG["shift"](i) * MODE.value
                    return {"x": np.full(CFG.size, x), "pid": os.getpid()}

            def read(ds, i):
                return ds.elsewhere, int(ds[i]["pid"])

            if __name__ == "__main__":
                ds = Tiles(cache_dir=os.environ["CACHE"], progress=False)
                [ds[i] for i in range(4)]  # the pack, filled here
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    read_there = pool.starmap(read, [(ds, i) for i in range(4)])
                print(read_there == [(False, os.getpid())] * 4, read_there)
            """
        ),
    )
    res = scripts.execute("same.py")
    assert res.stdout.startswith("True"), res.stdout + res.stderr  # before: (True, <its pid>)
    assert "reads other values" not in res.stderr


@pytest.mark.parametrize("then", ["read", "packed", "get_batch"])
def test_a_value_rebound_after_the_open_is_never_recorded_in_the_old_values_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """``SIZE = 3`` while the pack of ``SIZE = 2`` is being filled (a notebook cell,
    a script's loop), then a read, or the pack completed (``ds.packed``,
    ``get_batch``). Before: the samples loaded after it were recorded in the pack of
    ``SIZE = 2``, and the next open with ``SIZE = 2`` served them ([3, 3, 3] for
    items 3 to 5)."""
    ds = Sized(6, cache_dir=tmp_path)
    assert [ds[i]["x"].tolist() for i in range(3)] == [[0, 0], [1, 1], [2, 2]]
    monkeypatch.setattr(sys.modules[__name__], "SIZE", 3)
    with pytest.warns(CacheWarning, match=r"\(SIZE rebound since\)"):
        if then == "read":
            assert ds[3]["x"].tolist() == [3, 3, 3]
        elif then == "packed":
            assert ds.packed[3]["x"].tolist() == [3, 3, 3]
        else:
            assert ds.get_batch([3])["x"].tolist() == [[3, 3, 3]]
    assert _xs(ds) == [[i] * 3 for i in range(6)]  # loaded as the code reads now
    monkeypatch.setattr(sys.modules[__name__], "SIZE", 2)
    assert _xs(Sized(6, cache_dir=tmp_path)) == [[i] * 2 for i in range(6)]


#: raised by ``Counting.load_item`` itself, at each load
LOADS = 0


class Counting(Sized):
    def load_item(self, i: int) -> dict[str, Any]:
        global LOADS
        LOADS += 1
        return {"x": np.full(SIZE, i)}


def test_a_name_load_item_rebinds_itself_is_its_state(tmp_path: Path) -> None:
    """``global LOADS; LOADS += 1`` in ``load_item``: not a rebinding by other code;
    the pack fills and seals (a warning would fail the test)."""
    before = LOADS
    ds = Counting(5, cache_dir=tmp_path)
    assert _xs(ds) == [[i] * 2 for i in range(5)]
    assert _xs(ds) == [[i] * 2 for i in range(5)]  # the second epoch reads the pack
    assert before + 5 == LOADS
    assert isinstance(ds.packed, PackedDataset)  # sealed, not unstored loads


#: set by ``Flagging.load_item`` at one item only (a warn-once flag)
FLAGGED = False


class Flagging(Sized):
    def load_item(self, i: int) -> dict[str, Any]:
        global FLAGGED
        if i == 3 and not FLAGGED:
            FLAGGED = True
        return {"x": np.full(SIZE, i)}


def test_a_name_load_item_rebinds_later_in_the_epoch_is_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag ``load_item`` sets at the fourth item, not the first: still its own
    state (a warning would fail the test), and the pack seals."""
    monkeypatch.setattr(sys.modules[__name__], "FLAGGED", False)
    ds = Flagging(6, cache_dir=tmp_path)
    assert _xs(ds) == [[i] * 2 for i in range(6)]
    assert isinstance(ds.packed, PackedDataset)


#: a handle opened lazily: by ``source_items`` (Listed) or by a DataLoader's
#: ``worker_init_fn`` in each worker (set by the test)
_HANDLE: Any = None


class Handle:
    def scale(self) -> int:
        return 2


class Listed(Sized):
    def source_items(self) -> range:
        global _HANDLE
        if _HANDLE is None:
            _HANDLE = Handle()
        return range(self.n)

    def load_item(self, i: int) -> dict[str, Any]:
        return {"x": np.full(_HANDLE.scale(), i)}


@pytest.mark.parametrize("fill", ["as-read", "up-front"])
def test_a_handle_opened_lazily_is_the_datasets_own_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fill: str
) -> None:
    """``_DB = None`` at import, opened by ``source_items`` (after the code walk of
    the open) or by a ``worker_init_fn``: no rebinding of the open's values. Before
    (the review), the up-front fill raised ``Rebound`` out of the constructor and
    the fill as read went unstored with a warning (a warning fails the test)."""
    monkeypatch.setattr(sys.modules[__name__], "_HANDLE", None)
    ds = Listed(4, cache_dir=tmp_path, fill=fill)
    assert _xs(ds) == [[i] * 2 for i in range(4)]
    assert isinstance(ds.packed, PackedDataset)


def test_a_handle_a_worker_init_fn_opens_is_the_datasets_own_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LMDB / HDF5 recipe: ``load_item`` reads a global handle that each
    DataLoader worker's ``worker_init_fn`` opens (None before). Before (the review),
    every worker warned and loaded unstored at every epoch."""
    monkeypatch.setattr(sys.modules[__name__], "_HANDLE", None)
    ds = Opened(4, cache_dir=tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_HANDLE", Handle())  # worker_init_fn
    assert _xs(ds) == [[i] * 2 for i in range(4)]
    assert isinstance(ds.packed, PackedDataset)


class Opened(Sized):
    """Reads the handle a ``worker_init_fn`` opens (the LMDB / HDF5 recipe)."""

    def load_item(self, i: int) -> dict[str, Any]:
        return {"x": np.full(_HANDLE.scale(), i)}
