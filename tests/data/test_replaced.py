"""data/replaced: a rebuilt dataset's old pack goes as soon as no reader holds it
(in this process, another one, or a spawned DataLoader-style worker it was handed
to), and :func:`replaced_by` tells ``mlcache ls`` which pack is current."""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from pathlib import Path

from mlcache.data import CachedDataset
from mlcache.data.replaced import in_use, remove_replaced, replaced_by


class Lines(CachedDataset):
    """One sample per line of the declared file."""

    def load_source(self):
        for path in self.source_files():
            for line in Path(path).read_text().splitlines():
                yield {"line": line}


def _open(tmp_path):
    return Lines(cache_dir=tmp_path / "c", source_paths=[tmp_path / "a.txt"], progress=False)


def _rewrite(tmp_path, text):
    time.sleep(0.01)  # a new modification time even on coarse clocks
    (tmp_path / "a.txt").write_text(text)


def _packs(ds):
    return sorted(p.name for p in Path(ds.pack_path).parent.glob("*.pack"))


def test_a_rebuild_removes_the_old_pack_at_once_when_nobody_reads_it(tmp_path):
    (tmp_path / "a.txt").write_text("a\nb\n")
    old = _open(tmp_path).pack_path  # the dataset is released at once
    _rewrite(tmp_path, "a\nb\nc\n")
    new = _open(tmp_path)
    assert len(new) == 3 and _packs(new) == [Path(new.pack_path).name]
    assert not os.path.exists(old) and replaced_by(new.pack_path) is None


def test_an_old_pack_still_read_stays_until_released_and_ls_says_it_is_replaced(tmp_path):
    (tmp_path / "a.txt").write_text("a\nb\n")
    first = _open(tmp_path)
    assert replaced_by(first.pack_path) is None and in_use(first.pack_path)
    _rewrite(tmp_path, "x\ny\nz\n")
    new = _open(tmp_path)
    assert sorted([Path(first.pack_path).name, Path(new.pack_path).name]) == _packs(new)
    assert replaced_by(first.pack_path) == new.pack_path  # what `mlcache ls` marks
    assert replaced_by(new.pack_path) is None
    assert [s["line"] for s in first] == ["a", "b"]  # still its own samples
    old = first.pack_path
    del first
    gc.collect()
    assert not in_use(old)
    assert remove_replaced(new.pack_path) == [old]  # what the next open or build does
    assert _packs(new) == [Path(new.pack_path).name]
    assert remove_replaced(str(tmp_path / "plain.pack")) == []  # a pack() file: never


def _hold(packed, ready, go, out):
    """A spawned worker holding the pack its parent handed it (its descriptor)."""
    ready.set()
    go.wait(60)
    out.put([packed[j]["line"] for j in range(len(packed))])


def test_a_spawned_worker_keeps_the_old_pack_it_was_handed(tmp_path):
    """A DataLoader spawn worker receives the open file, not the path: while it
    runs the old pack stays (it is read through that descriptor), and once it
    is gone the next open removes it."""
    (tmp_path / "a.txt").write_text("a\nb\n")
    ds = _open(tmp_path)
    old = ds.pack_path
    ctx = multiprocessing.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    worker = ctx.Process(target=_hold, args=(ds.packed, ready, go, out))
    worker.start()
    try:
        assert ready.wait(60)
        del ds
        gc.collect()
        assert in_use(old)  # the worker's descriptor holds it
        _rewrite(tmp_path, "new\n")
        new = _open(tmp_path)
        assert os.path.exists(old) and replaced_by(old) == new.pack_path
        go.set()
        assert out.get(timeout=60) == ["a", "b"]
    finally:
        go.set()
        worker.join(60)
    assert not in_use(old)
    again = _open(tmp_path)  # an open: the released old pack goes
    assert not os.path.exists(old) and [s["line"] for s in again] == ["new"]
