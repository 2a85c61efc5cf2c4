"""What filling a pack costs per sample in system calls (issue 26): a miss of an
as-read fill looks for a sealed pack and for other processes' records by one
``stat`` of the records' folder, and an up-front fill writes its records a batch
at a time. Counted by wrapping ``os.stat`` and ``os.writev``: no timing."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from mlcache.data import CachedDataset, filling, recording
from scripts import ScriptFolder

N = 40


class Files(CachedDataset):
    """One sample per file of ``root``: the int the file holds."""

    cache_ignore: ClassVar[tuple[str, ...]] = ("loads",)

    def __init__(self, root: Path, **kw: Any) -> None:
        self.root = str(root)
        self.loads: list[str] = []
        super().__init__(progress=False, **kw)

    def source_items(self) -> list[str]:
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path: str) -> dict[str, Any]:
        self.loads.append(os.path.basename(path))
        with open(path) as f:
            value = int(f.read())
        return {"value": value, "x": np.full(3, value)}


def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    for i in range(N):
        (root / f"{i:03d}.txt").write_text(str(i))
    return root


def right(ds: Files) -> bool:
    """Every sample is the one its file holds."""
    return len(ds) == N and all(
        ds[i]["value"] == i and ds[i]["x"].tolist() == [i] * 3 for i in range(N)
    )


def test_misses_stat_the_records_folder_not_the_pack_and_still_see_a_seal(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Ten misses in a row: no ``stat`` of the pack's path (before: one a miss,
    beside the folder's). A seal removes the segments, so the folder's ``stat``
    still tells it: a filler whose records another filler sealed reads the
    sealed pack at its next miss and loads nothing more."""
    src, cache = source(tmp_path), tmp_path / "cache"
    # (a process alone looks at most every _LOOK_ALONE s: here at every miss)
    monkeypatch.setattr(filling, "_LOOK_ALONE", 0.0)
    ds = Files(src, cache_dir=cache)
    ds[0]  # the first record makes the folder
    (folder,) = cache.rglob("*.pack.fill")
    past = time.time() - 60
    os.utime(folder, (past, past))  # a listing from now on is trusted (no shared clock tick)
    ds[1]  # lists the folder once more
    stats: list[str] = []
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        stats.append(os.path.abspath(path))
        return real_stat(path, *args, **kw)

    monkeypatch.setattr(os, "stat", stat)
    for i in range(2, 12):
        ds[i]
    monkeypatch.undo()
    assert stats and set(stats) == {str(folder)}  # not the pack's path
    other = Files(src, cache_dir=cache)  # another filler: loads the other 28 and seals
    assert right(other) and sorted(other.loads) == sorted(os.listdir(src))[12:]
    assert len(list(cache.rglob("*.pack"))) == 1 and not folder.exists()
    assert right(ds)  # the first reads the sealed pack: nothing loaded again
    assert sorted(ds.loads) == sorted(os.listdir(src))[:12]


def test_an_up_front_fill_writes_its_records_a_batch_at_a_time(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """40 items loaded up front: their records in one ``writev`` (before: one a
    record), and every one of them in the sealed pack."""
    src, cache = source(tmp_path), tmp_path / "cache"
    writes: list[int] = []
    real_writev = os.writev

    def writev(fd: int, buffers: Any) -> int:
        writes.append(len(buffers))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    # the batch is also written after _FILL_WAIT s (samples from slow workers): not here
    monkeypatch.setattr(recording, "_FILL_WAIT", float("inf"))
    ds = Files(src, cache_dir=cache, fill="up-front")
    monkeypatch.undo()
    assert writes == [2 * N]  # a header and a payload a record
    assert sorted(ds.loads) == sorted(os.listdir(src))
    assert len(list(cache.rglob("*.pack"))) == 1 and not list(cache.rglob("*.pack.fill"))
    assert right(ds) and len(ds.loads) == N


def test_a_forked_child_finds_the_records_its_parent_wrote(tmp_path: Path) -> None:
    """The parent's records are on the disk when it forks (a DataLoader's workers),
    so a child loads none of those samples again, and writes its own at once."""
    src, cache = source(tmp_path), tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(10):
        ds[i]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the ten recorded, and one more of its own, written at once
        try:
            os.close(read)
            ok = [ds[i]["value"] for i in range(11)] == list(range(11))
            segments = list(cache.rglob("*.seg"))
            written = len(segments) == 2 and all(s.stat().st_size for s in segments)
            os.write(write, f"{len(ds.loads)} {ok} {written}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == "11 True True"  # 10 loaded by the parent, 1 by the child


def test_a_process_alone_looks_for_other_fillers_at_most_every_look_alone(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Misses of the process that opened the dataset, no other filling the pack:
    no ``stat`` of the records' folder within ``_LOOK_ALONE`` of the last look
    (before: one a miss). Once it has seen another filler (here a second dataset
    of the pack in this process: two processes, as the tests' fillers stand for
    them), it looks at every miss again, and loads nothing the other recorded."""
    src, cache = source(tmp_path), tmp_path / "cache"
    monkeypatch.setattr(filling, "_LOOK_ALONE", float("inf"))
    ds = Files(src, cache_dir=cache)
    stats: list[str] = []
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        if str(path).endswith((".pack", ".fill")):  # (makedirs stats the pack's folder)
            stats.append(os.path.abspath(path))
        return real_stat(path, *args, **kw)

    monkeypatch.setattr(os, "stat", stat)
    for i in range(10):
        ds[i]
    assert stats == []
    other = Files(src, cache_dir=cache)  # writes ds's ten records; loads the next ten
    for i in range(20):
        other[i]
    assert sorted(other.loads) == sorted(os.listdir(src))[10:20]
    for i in range(10, 30):  # ds sees other's ten, loads the next ten
        ds[i]
    assert sorted(ds.loads) == sorted(os.listdir(src))[:10] + sorted(os.listdir(src))[20:30]
    monkeypatch.undo()
    assert right(other) and right(ds)
    assert sorted(ds.loads + other.loads) == sorted(os.listdir(src))  # each once


SEAL_IN_A_FRESH_PROCESS = """
import os, sys
import numpy as np
from mlcache.data import CachedDataset


class Files(CachedDataset):
    def __init__(self, root):
        self.root = root
        super().__init__(progress=False, cache_dir=os.environ["CACHE"])

    def source_items(self):
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path):
        with open(path) as f:
            value = int(f.read())
        return {"value": value, "x": np.full(3, value), "name": os.path.basename(path)}


ds = Files(sys.argv[1])
assert [ds[i]["value"] for i in range(len(ds))] == list(range(len(ds)))
assert ds._filler is None or ds._filler.sealed is not None, "not sealed"
print("numpy.ma" in sys.modules)
"""


def test_a_seal_imports_no_numpy_ma(tmp_path: Path) -> None:
    """An epoch that fills and seals a pack in a fresh process does not import
    ``numpy.ma`` (the first ``np.unique`` of a process does: ~11 ms of a seal)."""
    scripts = ScriptFolder(tmp_path)
    scripts.write("seal.py", SEAL_IN_A_FRESH_PROCESS)
    done = scripts.execute("seal.py", str(source(tmp_path)))
    assert done.stdout.split() == ["False"], done.stdout + done.stderr
