"""The default source check of a filled dataset, item by item as samples are first
read (issue 26: an open that does not stat the world; :mod:`mlcache.data.checking`).

Every test that opens a declared folder sleeps a little more than the margin a
listing needs after the folder's last change (``trusted_after``: 0.1 s on a file
system with nanosecond times), so that its listing is trusted at the next open:
sleeping makes that condition hold, it is not a race.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from mlcache.data import CachedDataset, checking
from mlcache.data.checking import ItemCheck, record_listing, stat_fingerprint, trusted_after
from mlcache.data.items import item_table

MARGIN = 0.15  # a little more than trusted_after() for nanosecond times


class Declared(CachedDataset):
    """One sample per ``*.txt`` file of a declared folder: the int it holds."""

    cache_ignore: ClassVar[tuple[str, ...]] = ("loads",)
    source_glob = "*.txt"

    def __init__(self, root: Path, **kw: Any) -> None:
        self.source_dir = str(root)
        self.loads: list[str] = []
        super().__init__(progress=False, **kw)

    def load_item(self, path: str) -> dict[str, Any]:
        self.loads.append(os.path.basename(path))
        with open(path) as f:
            return {"value": int(f.read())}


class Datalist(CachedDataset):
    """Items that are dicts naming a file (MONAI's datalist), listed by the user."""

    cache_ignore: ClassVar[tuple[str, ...]] = ("loads",)

    def __init__(self, root: Path, **kw: Any) -> None:
        self.root = str(root)
        self.loads: list[str] = []
        super().__init__(progress=False, **kw)

    def source_items(self) -> list[dict[str, Any]]:
        names = sorted(os.listdir(self.root))
        return [{"image": os.path.join(self.root, n), "label": i} for i, n in enumerate(names)]

    def load_item(self, item: dict[str, Any]) -> dict[str, Any]:
        self.loads.append(os.path.basename(item["image"]))
        with open(item["image"]) as f:
            return {"value": int(f.read()), "label": item["label"]}


def make_source(root: Path, n: int) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"{i:03d}.txt").write_text(str(i))
    time.sleep(MARGIN)  # see the module docstring
    return root


def edit(path: Path, value: int) -> None:
    """Same size, a later modification time."""
    st = os.stat(path)
    path.write_text(str(value))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def values(ds: CachedDataset) -> list[int]:
    return [ds[i]["value"] for i in range(len(ds))]


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each file is stat'ed (by name), from now on."""
    counted: dict[str, int] = {}
    real = os.stat

    def stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        name = os.path.basename(os.fspath(path))
        counted[name] = counted.get(name, 0) + 1
        return real(path, *args, **kw)

    monkeypatch.setattr(os, "stat", stat)
    return counted


def source_stats(counted: dict[str, int]) -> int:
    return sum(v for k, v in counted.items() if k.endswith(".txt"))


def filled(cls: type[CachedDataset], src: Path, cache: Path) -> None:
    """A first run: every sample read, the pack sealed."""
    ds = cls(src, cache_dir=cache)
    values(ds)
    assert len(list(cache.rglob("*.pack"))) == 1 and not list(cache.rglob("*.fill"))


@pytest.mark.parametrize("cls", [Declared, Datalist])
def test_reopen_stats_no_source_file_before_a_read_and_one_per_item_read(tmp_path, cls, stats):
    src, cache = make_source(tmp_path / "src", 30), tmp_path / "cache"
    filled(cls, src, cache)
    stats.clear()
    ds = cls(src, cache_dir=cache)
    assert source_stats(stats) == 0  # was 30: every file before ds[0]
    assert ds[4]["value"] == 4 and {k for k in stats if k.endswith(".txt")} == {"004.txt"}
    once = source_stats(stats)  # a stat (a dict item: its file found, then stat'ed)
    assert ds[4]["value"] == 4 and source_stats(stats) == once  # once a process
    assert values(ds) == list(range(30)) and ds.loads == []
    ds[0]
    assert ds._pack is not None and ds._checking is None  # all checked: the pack as is


@pytest.mark.parametrize("cls", [Declared, Datalist])
def test_a_file_edited_after_the_open_is_loaded_again_at_its_first_read(tmp_path, cls):
    src, cache = make_source(tmp_path / "src", 30), tmp_path / "cache"
    filled(cls, src, cache)
    ds = cls(src, cache_dir=cache)
    assert ds[2]["value"] == 2
    edit(src / "007.txt", 77)
    assert ds[7]["value"] == 77 and ds.loads == ["007.txt"]
    assert values(ds) == [*range(7), 77, *range(8, 30)] and ds.loads == ["007.txt"]
    again = cls(src, cache_dir=cache)
    assert values(again) == [*range(7), 77, *range(8, 30)] and again.loads == []


@pytest.mark.parametrize("cls", [Declared, Datalist])
def test_a_dataset_checked_as_read_goes_whole_to_a_spawned_worker(tmp_path, cls):
    """A spawned DataLoader worker gets the dataset pickled while its items are
    checked as read (the README's reopen): the copy serves the samples and still
    checks each item at its first read there (a closure in the check made the
    pickle fail: 'Can't pickle local object')."""
    src, cache = make_source(tmp_path / "src", 30), tmp_path / "cache"
    filled(cls, src, cache)
    ds = cls(src, cache_dir=cache)
    assert ds[3]["value"] == 3 and ds._checking is not None
    copy = pickle.loads(pickle.dumps(ds))
    edit(src / "009.txt", 99)
    assert copy[9]["value"] == 99 and copy.loads == ["009.txt"]
    assert values(copy) == [*range(9), 99, *range(10, 30)]


def test_a_file_replaced_by_one_of_equal_size_and_times_is_loaded_again(tmp_path):
    src, cache = make_source(tmp_path / "src", 20), tmp_path / "cache"
    filled(Declared, src, cache)
    ds = Declared(src, cache_dir=cache)
    target = src / "005.txt"
    st = os.stat(target)
    target.unlink()  # cp -p: a new inode, the old size and times
    target.write_text("9")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ds[5]["value"] == 9 and ds.loads == ["005.txt"]


def test_a_file_removed_after_the_open_is_not_served(tmp_path):
    src, cache = make_source(tmp_path / "src", 20), tmp_path / "cache"
    filled(Declared, src, cache)
    ds = Declared(src, cache_dir=cache)
    (src / "006.txt").unlink()
    with pytest.raises(FileNotFoundError):  # load_item's own error, as over the files
        ds[6]
    assert ds[7]["value"] == 7  # the items of the open are kept: no index moves


def test_a_file_added_is_seen_by_the_next_open_and_later_opens_check_as_read(tmp_path, stats):
    src, cache = make_source(tmp_path / "src", 20), tmp_path / "cache"
    filled(Declared, src, cache)
    (src / "020.txt").write_text("20")
    ds = Declared(src, cache_dir=cache)  # the folder changed: listed, every file stat'ed
    assert len(ds) == 21 and values(ds) == list(range(21)) and ds.loads == ["020.txt"]
    time.sleep(MARGIN)  # a listing begun this long after the change is trusted
    Declared(src, cache_dir=cache)  # (the last one began too soon after it)
    stats.clear()
    ds = Declared(src, cache_dir=cache)
    assert len(ds) == 21 and source_stats(stats) == 0
    (src / "003.txt").unlink()
    (src / "021.txt").write_text("21")  # one removed, one added: same count
    ds = Declared(src, cache_dir=cache)
    assert values(ds) == [0, 1, 2, *range(4, 22)] and ds.loads == ["021.txt"]


def test_a_damaged_listing_record_means_a_check_at_the_open(tmp_path, stats):
    src, cache = make_source(tmp_path / "src", 20), tmp_path / "cache"
    filled(Declared, src, cache)
    (record,) = list(cache.rglob("*.listing"))
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0x20
    record.write_bytes(bytes(data))
    edit(src / "004.txt", 44)  # not seen by the folder's times
    stats.clear()
    ds = Declared(src, cache_dir=cache)
    assert source_stats(stats) == 20 and ds.loads == ["004.txt"]  # at the open, as before
    assert values(ds)[4] == 44


def _fake_listing(tmp_path: Path, began_after: int) -> tuple[Any, Path, str]:
    src, cache = make_source(tmp_path / "src", 5), tmp_path / "cache"
    filled(Declared, src, cache)
    ds = Declared(src, cache_dir=cache)
    pack = ds._checking.pack if ds._checking is not None else ds.packed
    record = ds._listing_path()
    st = os.stat(src)
    before = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    paths = [str(src / f"{i:03d}.txt") for i in range(5)]
    table = pack.item_table()
    os.unlink(record)
    record_listing(record, ds._root, str(src), before, st.st_ctime_ns + began_after, paths, table)
    return pack, src, record


def test_a_listing_begun_within_the_margin_of_the_folders_change_is_not_trusted(tmp_path):
    pack, src, record = _fake_listing(tmp_path, 1_000_000)  # 1 ms after: same clock tick
    assert ItemCheck.of_folder(pack, str(src), record, True) is None
    os.unlink(record)
    pack, src, record = _fake_listing(tmp_path / "b", 10**10)
    assert ItemCheck.of_folder(pack, str(src), record, True) is not None
    assert trusted_after(5 * 10**9) == 2 * 10**9  # whole seconds: two of them


def test_a_folder_on_a_file_system_whose_times_are_not_known_to_move_is_listed(
    tmp_path, monkeypatch
):
    pack, src, record = _fake_listing(tmp_path, 10**10)
    monkeypatch.setattr(checking, "fs_type", lambda dev: "fuse.gcsfuse")
    assert ItemCheck.of_folder(pack, str(src), record, True) is None
    monkeypatch.setattr(checking, "fs_type", lambda dev: "nfs4")
    assert ItemCheck.of_folder(pack, str(src), record, True) is None


def test_one_files_fingerprint_is_the_listings():
    rng = np.random.default_rng(0)
    fields = rng.integers(-(2**62), 2**62, size=(50, 4), dtype=np.int64)
    fields[0] = (-1, -(2**63), 2**63 - 1, 0)
    table = item_table([f"{i}" for i in range(50)], stats=fields.astype("<i8").tobytes())
    for i, (size, mtime, ino, ctime) in enumerate(fields.tolist()):
        st = os.stat_result((0, ino, 0, 0, 0, 0, size, 0, 0, 0, 0.0, 0.0, 0.0, 0, mtime, ctime))
        assert st.st_mtime_ns == mtime and st.st_ctime_ns == ctime
        assert stat_fingerprint(st) == table[i, 2:].tobytes()
    assert struct.calcsize("<QQ") == 16


def test_a_thread_reading_while_another_rechecks_never_gets_the_old_pack(tmp_path):
    """Threads reading one dataset (a thread pool, MONAI's ThreadDataLoader): one
    meets an edited item and rechecks every item; another reading meanwhile is
    served through the check, never the old pack opened again unchecked (before:
    it opened the old pack, and when its open ended after the recheck, every
    later read served the edited items' old samples)."""
    src, cache = make_source(tmp_path / "src", 30), tmp_path / "cache"
    filled(Declared, src, cache)
    ds = Declared(src, cache_dir=cache)
    assert ds._checking is not None
    edit(src / "003.txt", 33)
    edit(src / "009.txt", 99)
    in_recheck, b_moved, a_done = threading.Event(), threading.Event(), threading.Event()
    recheck, reopen = ds._open_filled, ds._open_again

    def rechecking(*args: Any, **kw: Any) -> Any:  # thread A, once it met item 3
        in_recheck.set()
        b_moved.wait(30)  # until the other read is served, or reached the old pack
        return recheck(*args, **kw)

    def reopening() -> Any:  # the old pack opened again, unchecked (before)
        opened = reopen()
        b_moved.set()
        a_done.wait(30)  # its open ends after the recheck (which sealed anew)
        return opened

    ds._open_filled, ds._open_again = rechecking, reopening  # type: ignore[method-assign]
    got: dict[int, int] = {}

    def a() -> None:
        got[3] = ds[3]["value"]
        a_done.set()

    thread = threading.Thread(target=a)
    thread.start()
    assert in_recheck.wait(30)
    got[5] = ds[5]["value"]  # unchanged: through the check, while A rechecks
    b_moved.set()
    thread.join(30)
    assert got == {3: 33, 5: 5}
    assert values(ds) == [*range(3), 33, *range(4, 9), 99, *range(10, 30)]


def test_two_threads_first_reading_one_item_count_it_once(tmp_path):
    """Two threads' first reads of one item both pass its check; it is counted
    once, so the check is not dropped before every item was checked (before: both
    counted it, and the other items were then served unchecked)."""
    src, cache = make_source(tmp_path / "src", 10), tmp_path / "cache"
    filled(Declared, src, cache)
    ds = Declared(src, cache_dir=cache)
    check = ds._checking
    assert check is not None
    both = threading.Barrier(2, timeout=30)
    real = check._fingerprint

    def fingerprint(i: int) -> Any:  # both threads past the "not checked yet" test
        both.wait()
        return real(i)

    check._fingerprint = fingerprint  # type: ignore[method-assign]
    threads = [threading.Thread(target=ds.__getitem__, args=(4,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    check._fingerprint = real  # type: ignore[method-assign]
    edit(src / "007.txt", 77)
    assert [ds[i]["value"] for i in (0, 1, 2, 3, 5, 6, 8, 9)] == [0, 1, 2, 3, 5, 6, 8, 9]
    assert ds[7]["value"] == 77  # the last item not checked yet: checked still
