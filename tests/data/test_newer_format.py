"""A pack written by a newer mlcache (a higher format version in its header: a
cache shared mid-upgrade) is never removed nor replaced by this one (issue 23).

The dataset keeps it byte for byte and builds its own beside it, with one
warning naming the cause; ``verify --fix``, ``prune`` and ``clear`` leave it.
As the function cache keeps a newer entry (``NewerFormat``, see
``tests/entry/test_reader.py``).
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import struct
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest
import xxhash

from mlcache import Memory, NewerFormat
from mlcache.admin import clear, prune, verify
from mlcache.data import CachedDataset, PackedDataset
from mlcache.data.format import FORMAT_VERSION
from mlcache.data.replaced import own_beside
from mlcache.data.writer import write_pack
from mlcache.errors import CacheWarning


class Squares(CachedDataset):
    loaded: ClassVar[list[int]] = []

    def source_items(self) -> list[int]:
        return [1, 2, 3]

    def load_item(self, i: int) -> dict[str, Any]:
        Squares.loaded.append(i)
        return {"sq": i * i}


def _as_if_newer(path: str) -> bytes:
    """Rewrite the header of the pack at ``path`` as a newer mlcache would write
    it (the format version one higher, the header checksum made over it); its
    bytes now."""
    data = bytearray(Path(path).read_bytes())
    struct.pack_into("<H", data, 8, FORMAT_VERSION + 1)
    struct.pack_into("<Q", data, 48, xxhash.xxh3_64_intdigest(bytes(data[:48])))
    Path(path).write_bytes(data)
    return bytes(data)


def _open(cache: Path) -> tuple[Squares, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = Squares(cache_dir=str(cache), fill="up-front", progress=False)
        samples = [int(ds[i]["sq"]) for i in range(len(ds))]
    assert samples == [1, 4, 9]
    return ds, [w for w in said if issubclass(w.category, CacheWarning)]


def test_a_newer_packs_bytes_are_kept_and_the_dataset_works_beside_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, said = _open(cache)
    assert said == []
    newer_path = first.pack_path
    del first
    newer = _as_if_newer(newer_path)
    with pytest.raises(NewerFormat, match="newer mlcache"):  # not PackCorrupted: not damage
        PackedDataset(newer_path)

    Squares.loaded.clear()
    ds, said = _open(cache)
    assert Squares.loaded == [1, 2, 3]  # built its own: nothing of the newer one is read
    assert ds.pack_path != newer_path
    assert [str(w.message) for w in said] == [
        f"mlcache: {newer_path} was written by a newer mlcache (a newer pack format): it is "
        f"kept as it is, and this version uses its own pack beside it "
        f"({Path(ds.pack_path).name}); upgrade mlcache to share one"
    ]
    assert Path(newer_path).read_bytes() == newer

    Squares.loaded.clear()
    again, said = _open(cache)  # its own pack, opened; said once per process
    assert (Squares.loaded, said, again.pack_path) == ([], [], ds.pack_path)
    assert Path(newer_path).read_bytes() == newer


def test_verify_fix_prune_and_clear_leave_a_newer_pack(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = _open(cache)
    newer_path = first.pack_path
    del first
    newer = _as_if_newer(newer_path)
    ds, _ = _open(cache)
    mine = ds.pack_path
    del ds
    gc.collect()  # its reader's lock released: prune may remove this version's own pack
    mem = Memory(str(cache), verbose=0)

    found = verify(mem, str(cache), fix=True)
    assert [(d.kind, d.unreadable, d.removed) for d in found] == [("pack", True, False)]
    assert "newer mlcache" in found[0].reason
    pruned = prune(mem, older_than=0.0, all_packs=True)
    assert [Path(e.name).name for e in pruned.removed] == [Path(mine).name]
    assert not Path(mine).exists()
    cleared = clear(mem, str(cache))
    assert cleared is not None and cleared.packs == []
    assert Path(newer_path).read_bytes() == newer


class Cubes(CachedDataset):
    loaded: ClassVar[list[int]] = []

    def source_items(self) -> list[int]:
        return list(range(6))

    def load_item(self, i: int) -> dict[str, Any]:
        Cubes.loaded.append(i)
        return {"cube": i**3}


RIGHT = [i**3 for i in range(6)]


def _newer_at(path: str, n: int) -> bytes:
    """A pack of other samples published at ``path`` by a newer mlcache (written
    aside and renamed in, as its seal does); its bytes."""
    aside = path + ".newer"
    write_pack(({"cube": -1} for _ in range(n)), aside, progress=False)
    newer = _as_if_newer(aside)
    os.replace(aside, path)
    return newer


def _said(said: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in said if issubclass(w.category, CacheWarning)]


@pytest.mark.parametrize("its_seal_removed_the_records", [True, False])
def test_a_newer_pack_sealed_under_the_name_mid_fill_is_kept_and_every_read_served(
    tmp_path: Path, its_seal_removed_the_records: bool
) -> None:
    # another version fills the same pack and seals it first (a cache shared
    # mid-upgrade): its seal removes the records' folder, or leaves this one's
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = Cubes(cache_dir=str(tmp_path / "cache"), fill="as-read", progress=False, audit=False)
        first = [int(ds[i]["cube"]) for i in range(3)]
        path = ds.pack_path
        newer = _newer_at(path, 6)
        if its_seal_removed_the_records:
            shutil.rmtree(path + ".fill")
        rest = [int(ds[i]["cube"]) for i in range(3, 6)]  # the last one seals
        again = [int(ds[i]["cube"]) for i in range(6)]
    assert first + rest == again == RIGHT
    assert Path(path).read_bytes() == newer  # kept byte for byte
    assert ds.pack_path == own_beside(path) and Path(ds.pack_path).is_file()
    assert [int(s["cube"]) for s in PackedDataset(ds.pack_path)] == RIGHT
    assert not Path(path + ".fill").exists() and not Path(ds.pack_path + ".fill").exists()
    assert _said(said) == [
        f"mlcache: {path} was written by a newer mlcache (a newer pack format): it is "
        f"kept as it is, and this version uses its own pack beside it "
        f"({Path(ds.pack_path).name}); upgrade mlcache to share one"
    ]

    Cubes.loaded.clear()  # a new open finds this version's sealed pack beside it
    opened = Cubes(cache_dir=str(tmp_path / "cache"), fill="as-read", progress=False, audit=False)
    assert [int(opened[i]["cube"]) for i in range(6)] == RIGHT
    assert (opened.pack_path, Cubes.loaded) == (ds.pack_path, [])


def test_a_pack_replaced_by_a_newer_ones_before_a_copy_opens_it_is_kept(tmp_path: Path) -> None:
    # a dataset sent to another process (pickled: the pack is opened there, by
    # its name) after a newer mlcache published its pack under that name
    ds = Cubes(cache_dir=str(tmp_path / "cache"), fill="up-front", progress=False, audit=False)
    copy = pickle.loads(pickle.dumps(ds))
    path = ds.pack_path
    newer = _newer_at(path, 6)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        samples = [int(copy[i]["cube"]) for i in range(6)]
    assert samples == RIGHT
    assert Path(path).read_bytes() == newer
    assert copy.pack_path == own_beside(path)
    assert [int(s["cube"]) for s in PackedDataset(copy.pack_path)] == RIGHT
    assert len(_said(said)) == 1 and "written by a newer mlcache" in _said(said)[0]


def test_a_forced_fill_never_seals_over_a_newer_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # force_recache named the pack before a newer mlcache published its own under
    # that name: the forced fill ignores that file (it is not adopted), and its
    # seal still never replaces it
    cache = tmp_path / "cache"
    path = Cubes(cache_dir=str(cache), fill="up-front", progress=False, audit=False).pack_path
    newer = _newer_at(path, 6)
    monkeypatch.setattr("mlcache.data.building.is_newer_pack", lambda p: False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = Cubes(
            cache_dir=str(cache), fill="up-front", progress=False, audit=False, force_recache=True
        )
        samples = [int(ds[i]["cube"]) for i in range(6)]
    assert samples == RIGHT
    assert Path(path).read_bytes() == newer
    assert ds.pack_path == own_beside(path)
    assert len(_said(said)) == 1 and "written by a newer mlcache" in _said(said)[0]
