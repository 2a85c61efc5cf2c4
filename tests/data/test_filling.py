"""Write-through filling (issue 17), in one process: what ``ds[i]`` loads while
the pack fills, when it is sealed, and what a damaged, torn or refused record does.

Each dataset counts its ``load_item`` calls in ``self.loads`` (left out of the
key); the pack's state is read from its files: ``<pack>.pack`` once sealed,
``<pack>.pack.fill/`` (one segment per process) while it fills.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from mlcache import CacheWarning
from mlcache.data import CachedDataset, filling
from mlcache.data.filling import RECORD
from mlcache.errors import UnsupportedValue


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
        return {"name": os.path.basename(path), "value": value, "x": np.full(3, value)}


def make_source(root: Path, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i:03d}.txt").write_text(str(i))
    return root


def edit(path: Path, value: int) -> None:
    """Write ``value`` to ``path`` with a modification time 1 s later (same size
    or not, the fingerprint must tell)."""
    st = os.stat(path)
    path.write_text(str(value))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def packs(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.pack"))


def fills(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.pack.fill"))


def segments(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.pack.fill/*.seg"))


def expected(name: str, value: int) -> dict[str, Any]:
    return {"name": name, "value": value, "x": [value] * 3}


def plain(sample: Any) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in sample.items()}


def check_all(ds: CachedDataset, values: dict[str, int]) -> None:
    """Every sample of ``ds`` is the one its file holds, in order."""
    names = sorted(values)
    assert len(ds) == len(names)
    for i, name in enumerate(names):
        assert plain(ds[i]) == expected(name, values[name]), i


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path / "src", 40)


def values_of(src: Path) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in src.iterdir()}


# -- the life of a pack: open, epoch, seal, reopen -----------------------------------------
def test_open_loads_nothing_an_epoch_loads_each_item_once_and_seals(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    assert ds.loads == [] and packs(cache) == []
    check_all(ds, values_of(src))
    assert sorted(ds.loads) == sorted(os.listdir(src))  # each once
    assert len(packs(cache)) == 1 and fills(cache) == []  # sealed, records gone
    check_all(ds, values_of(src))  # a second pass reads the pack
    assert len(ds.loads) == 40
    again = Files(src, cache_dir=cache)
    check_all(again, values_of(src))
    assert again.loads == []


def test_records_are_kept_until_the_seal(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(10):
        ds[i]
    assert packs(cache) == [] and len(segments(cache)) == 1
    assert segments(cache)[0].stat().st_size > 10 * RECORD.size
    later = Files(src, cache_dir=cache)  # another run: the 10 recorded are not loaded
    check_all(later, values_of(src))
    assert sorted(later.loads) == sorted(os.listdir(src))[10:]
    assert len(packs(cache)) == 1 and fills(cache) == []


def test_editing_one_file_of_200_reads_that_one_again(tmp_path):
    src = make_source(tmp_path / "src", 200)
    cache = tmp_path / "cache"
    check_all(Files(src, cache_dir=cache), values_of(src))
    edit(src / "117.txt", 1170)
    ds = Files(src, cache_dir=cache)
    assert ds.loads == []  # each item is checked as it is first read (mlcache.data.checking)
    assert plain(ds[117])["value"] == 1170 and ds.loads == ["117.txt"]  # sealed again
    assert fills(cache) == [] and len(packs(cache)) == 1
    check_all(ds, values_of(src))
    assert ds.loads == ["117.txt"]
    again = Files(src, cache_dir=cache)
    check_all(again, values_of(src))
    assert again.loads == []


def test_added_removed_and_renamed_items(src, tmp_path):
    cache = tmp_path / "cache"
    check_all(Files(src, cache_dir=cache), values_of(src))
    (src / "zz.txt").write_text("99")
    ds = Files(src, cache_dir=cache)
    check_all(ds, values_of(src))
    assert ds.loads == ["zz.txt"]
    (src / "005.txt").unlink()
    ds = Files(src, cache_dir=cache)
    check_all(ds, values_of(src))
    assert ds.loads == [] and len(ds) == 40
    (src / "007.txt").rename(src / "yy.txt")
    ds = Files(src, cache_dir=cache)
    check_all(ds, values_of(src))
    assert ds.loads == ["yy.txt"]
    assert len(packs(cache)) == 1 and fills(cache) == []


class Twice(Files):
    """Every item listed twice (an oversampled class, a list built by hand)."""

    def source_items(self) -> list[str]:
        once = super().source_items()
        return once + once[::-1]


def test_items_listed_twice_are_loaded_once(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Twice(src, cache_dir=cache)
    assert len(ds) == 80
    names = sorted(os.listdir(src))
    for i in range(80):
        name = names[i] if i < 40 else names[79 - i]
        assert plain(ds[i]) == expected(name, int(name[:3])), i
    assert sorted(ds.loads) == names  # the twin of a recorded item is read from its record
    assert len(packs(cache)) == 1 and fills(cache) == []
    again = Twice(src, cache_dir=cache)
    assert plain(again[79]) == expected("000.txt", 0) and again.loads == []


def test_items_listed_twice_are_loaded_once_up_front(src, tmp_path):
    ds = Twice(src, cache_dir=tmp_path / "cache", fill="up-front")
    assert sorted(ds.loads) == sorted(os.listdir(src))
    assert [ds[i]["value"] for i in (0, 39, 40, 79)] == [0, 39, 39, 0]


class Rows(CachedDataset):
    """Rows of a table (``db``: id -> (version, value)): fingerprinted by version."""

    cache_ignore: ClassVar[tuple[str, ...]] = ("db", "loads")

    def __init__(self, db: dict[int, tuple[int, str]], **kw: Any) -> None:
        self.db, self.loads = db, []
        super().__init__(progress=False, **kw)

    def source_items(self) -> list[int]:
        return sorted(self.db)

    def item_fingerprint(self, row: int) -> Any:
        return self.db[row][0]

    def load_item(self, row: int) -> dict[str, Any]:
        self.loads.append(row)
        return {"id": row, "text": self.db[row][1]}


def test_item_fingerprint_tells_which_rows_changed(tmp_path):
    cache = tmp_path / "cache"
    db = {i: (1, f"row {i}") for i in range(50)}
    ds = Rows(db, cache_dir=cache)
    assert [ds[i]["text"] for i in range(50)] == [f"row {i}" for i in range(50)]
    assert ds.loads == list(range(50)) and len(packs(cache)) == 1
    db[7] = (1, "changed, version not bumped")  # the fingerprint is what counts
    assert Rows(db, cache_dir=cache).loads == []
    db[7] = (2, "row 7, v2")
    db[50] = (1, "row 50")
    ds = Rows(db, cache_dir=cache)
    assert sorted(ds.loads) == [7, 50]
    assert ds[7]["text"] == "row 7, v2" and ds[50]["text"] == "row 50"
    assert ds[8]["text"] == "row 8" and len(ds) == 51


def test_fill_up_front_loads_everything_at_the_open(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache, fill="up-front")
    assert sorted(ds.loads) == sorted(os.listdir(src))
    assert len(packs(cache)) == 1 and fills(cache) == []
    check_all(ds, values_of(src))
    assert len(ds.loads) == 40


def test_fill_as_read_after_a_partial_up_front_fill(src, tmp_path):
    """An as-read fill of 10 items, then an up-front open: only the other 30."""
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache, fill="as-read")
    for i in range(10):
        ds[i]
    up = Files(src, cache_dir=cache, fill="up-front")
    assert sorted(up.loads) == sorted(os.listdir(src))[10:]
    assert len(packs(cache)) == 1 and fills(cache) == []
    check_all(up, values_of(src))


# -- check_source with filling -------------------------------------------------------------
def test_check_source_never_trusts_the_sealed_pack(src, tmp_path):
    cache = tmp_path / "cache"
    check_all(Files(src, cache_dir=cache), values_of(src))
    edit(src / "003.txt", 33)
    trusted = Files(src, cache_dir=cache, check_source="never")
    assert trusted.loads == [] and plain(trusted[3])["value"] == 3  # as documented
    checked = Files(src, cache_dir=cache)  # its items are checked as they are first read
    assert plain(checked[3])["value"] == 33 and checked.loads == ["003.txt"]


# -- reading while the pack fills ----------------------------------------------------------
def test_slices_lists_and_negative_indices_while_filling(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    assert [s["value"] for s in ds[2:5]] == [2, 3, 4]
    assert [s["value"] for s in ds[[30, 1, 30]]] == [30, 1, 30]
    assert ds[-1]["value"] == 39 and ds[-40]["value"] == 0
    assert [s["value"] for s in ds[-3:]] == [37, 38, 39]
    assert [s["value"] for s in ds[::-13]] == [39, 26, 13, 0]
    assert ds[np.int64(6)]["value"] == 6
    with pytest.raises(IndexError):
        ds[40]
    with pytest.raises(IndexError):
        ds[-41]
    assert sorted(ds.loads) == sorted(
        f"{i:03d}.txt" for i in (0, 1, 2, 3, 4, 6, 13, 26, 30, 37, 38, 39)
    )
    assert packs(cache) == []


def test_len_and_repr_while_filling_load_nothing(src, tmp_path):
    ds = Files(src, cache_dir=tmp_path / "cache")
    assert len(ds) == 40 and "filled='0 of 40 samples'" in repr(ds)
    ds[0]
    ds[5]
    assert "filled='2 of 40 samples'" in repr(ds) and len(ds) == 40
    assert len(ds.loads) == 2


def test_packed_while_filling_completes_the_pack(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    ds[0]
    ds[1]
    pack = ds.packed
    assert len(pack) == 40 and pack[39]["value"] == 39
    assert sorted(ds.loads) == sorted(os.listdir(src))
    assert len(packs(cache)) == 1 and fills(cache) == []
    check_all(ds, values_of(src))
    assert len(ds.loads) == 40 and "filled" not in repr(ds)


def test_get_batch_while_filling_completes_the_pack(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    ds[3]
    batch = ds.get_batch([5, 3, 39])
    assert list(batch["value"]) == [5, 3, 39]
    assert batch["x"].tolist() == [[5] * 3, [3] * 3, [39] * 3]
    assert sorted(ds.loads) == sorted(os.listdir(src))
    assert len(packs(cache)) == 1 and fills(cache) == []


# -- damaged records -----------------------------------------------------------------------
def record_offsets(segment: Path) -> list[int]:
    """Where each record of a segment starts (read by its header's length)."""
    data, offsets, off = segment.read_bytes(), [], 0
    while off + RECORD.size <= len(data):
        offsets.append(off)
        off += RECORD.size + RECORD.unpack(data[off : off + RECORD.size])[2]
    assert off == len(data)
    return offsets


def test_a_torn_last_record_is_loaded_again_and_nothing_else(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(20):
        ds[i]
    (seg,) = segments(cache)
    offsets = record_offsets(seg)
    assert len(offsets) == 20
    size = seg.stat().st_size
    os.truncate(seg, (offsets[-1] + size) // 2 + 1)  # item 19's record, torn mid-payload
    later = Files(src, cache_dir=cache)
    check_all(later, values_of(src))
    assert sorted(later.loads) == sorted(os.listdir(src))[19:]
    assert len(packs(cache)) == 1 and fills(cache) == []


@pytest.mark.parametrize("where", ["header", "payload"])
def test_a_torn_record_anywhere_costs_that_item_only(src, tmp_path, where):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(20):
        ds[i]
    (seg,) = segments(cache)
    last = record_offsets(seg)[-1]
    os.truncate(seg, last + (RECORD.size // 2 if where == "header" else RECORD.size + 3))
    later = Files(src, cache_dir=cache)
    for i in range(40):
        assert plain(later[i]) == expected(f"{i:03d}.txt", i)
    assert sorted(later.loads) == sorted(os.listdir(src))[19:]


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_flipped_byte_in_a_record_is_never_returned(src, tmp_path, where):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(20):
        ds[i]
    (seg,) = segments(cache)
    offsets = record_offsets(seg)
    data = bytearray(seg.read_bytes())
    at = offsets[7] + (RECORD.size + 40 if where == "payload" else 20)  # item 7's record
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))
    later = Files(src, cache_dir=cache)
    check_all(later, values_of(src))
    names = sorted(os.listdir(src))
    # a damaged payload: that item again; a damaged header ends what the segment
    # can be trusted for: that item and the ones after it
    again = names[7:8] if where == "payload" else names[7:20]
    assert sorted(later.loads) == sorted(again + names[20:])
    assert len(packs(cache)) == 1 and fills(cache) == []
    assert Files(src, cache_dir=cache).loads == []


def test_a_flipped_record_met_at_the_seal_is_loaded_again(src, tmp_path):
    """The record is damaged after this process scanned it: the seal loads it
    again (it is never copied into the pack)."""
    cache = tmp_path / "cache"
    first = Files(src, cache_dir=cache)
    for i in range(20):
        first[i]
    later = Files(src, cache_dir=cache)  # knows the 20 records
    (seg,) = segments(cache)
    data = bytearray(seg.read_bytes())
    data[record_offsets(seg)[4] + RECORD.size + 40] ^= 0xFF
    seg.write_bytes(bytes(data))
    for i in range(20, 40):
        later[i]
    assert len(packs(cache)) == 1 and fills(cache) == []
    assert sorted(later.loads) == sorted([*sorted(os.listdir(src))[20:], "004.txt"])
    check_all(Files(src, cache_dir=cache), values_of(src))


# -- samples the pack refuses --------------------------------------------------------------
class Objects(Files):
    """Samples from item 5 on hold a set (it needs pickle)."""

    def load_item(self, path: str) -> dict[str, Any]:
        sample = super().load_item(path)
        sample["tags"] = {sample["value"]} if sample["value"] >= 5 else None
        return sample


class ObjectsUpFront(CachedDataset):
    """The same samples, by load_source(): the error an up-front build gives."""

    def __init__(self, root: Path, **kw: Any) -> None:
        self.root = str(root)
        super().__init__(progress=False, **kw)

    def load_source(self) -> Any:
        for name in sorted(os.listdir(self.root)):
            value = int(Path(self.root, name).read_text())
            yield {"value": value, "tags": {value} if value >= 5 else None}


def test_a_sample_that_needs_pickle_without_allow_pickle_is_a_clear_error(src, tmp_path):
    with pytest.raises(UnsupportedValue) as built:
        ObjectsUpFront(src, cache_dir=tmp_path / "built")
    assert "sample 5, field 'tags': a value of type builtins.set needs pickle" in str(built.value)
    cache = tmp_path / "cache"
    ds = Objects(src, cache_dir=cache)
    assert [ds[i]["tags"] for i in range(5)] == [None] * 5
    with pytest.raises(UnsupportedValue) as read:
        ds[5]
    assert str(read.value) == str(built.value)  # the same words as an up-front build
    with pytest.raises(UnsupportedValue, match="sample 39, field 'tags'"):
        ds[-1]
    assert packs(cache) == []  # never a pack without them
    with pytest.raises(UnsupportedValue) as up:
        Objects(src, cache_dir=cache, fill="up-front")
    assert str(up.value) == str(built.value)
    assert packs(cache) == [] and len(segments(cache)) == 1
    ok = Objects(src, cache_dir=cache, allow_pickle=True)  # another pack: pickled fields
    assert [ok[i]["tags"] for i in (4, 5, 39)] == [None, {5}, {39}]


class Kinds(Files):
    """Field ``v`` is an int for the first items, a str from item 20 on."""

    def load_item(self, path: str) -> dict[str, Any]:
        sample = super().load_item(path)
        return {"v": sample["value"] if sample["value"] < 20 else str(sample["value"])}


class KindsUpFront(CachedDataset):
    """The same samples, by load_source(): the error an up-front build gives."""

    def __init__(self, root: Path, **kw: Any) -> None:
        self.root = str(root)
        super().__init__(progress=False, **kw)

    def load_source(self) -> Any:
        for name in sorted(os.listdir(self.root)):
            value = int(Path(self.root, name).read_text())
            yield {"v": value if value < 20 else str(value)}


def test_fields_that_change_kind_fail_at_the_seal_as_an_up_front_build(src, tmp_path):
    with pytest.raises(TypeError) as built:
        KindsUpFront(src, cache_dir=tmp_path / "built")
    cache = tmp_path / "cache"
    ds = Kinds(src, cache_dir=cache)
    assert [ds[i]["v"] for i in range(20, 39)] == [str(i) for i in range(20, 39)]
    assert [ds[i]["v"] for i in range(20)] == list(range(20))
    with pytest.raises(TypeError) as sealed:
        ds[39]  # the last: the seal
    # the up-front build's words, and the item that sample came from
    assert str(sealed.value).startswith(str(built.value)) and "020.txt" in str(sealed.value)
    assert packs(cache) == []
    with pytest.raises(TypeError) as again:
        Kinds(src, cache_dir=cache)  # every item recorded: sealed at the open
    assert str(again.value) == str(sealed.value)


def test_a_sample_that_is_not_a_dict_is_a_clear_error(src, tmp_path):
    class Bare(Files):
        def load_item(self, path: str) -> Any:
            return super().load_item(path)["value"]

    ds = Bare(src, cache_dir=tmp_path / "cache")
    with pytest.raises(TypeError, match="sample 3 is a int, not a dict of fields"):
        ds[3]

    class Pairs(Files):  # a PyTorch-style (x, y): the message says what to return
        def load_item(self, path: str) -> Any:
            return (super().load_item(path)["value"], 0)

    with pytest.raises(TypeError, match=r"a tuple, not a dict of fields: return one, e\.g\."):
        Pairs(src, cache_dir=tmp_path / "pairs")[3]


def open_files() -> set[str]:
    """What this process has open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def test_a_dataset_dropped_while_filling_closes_its_segment(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    ds[0]
    (seg,) = segments(cache)
    assert str(seg) in open_files()
    del ds
    gc.collect()
    assert str(seg) not in open_files()
    again = Files(src, cache_dir=cache)
    check_all(again, values_of(src))
    assert len(again.loads) == 39


# -- a cache that cannot be written --------------------------------------------------------
def test_a_read_only_cache_still_serves_every_sample_with_one_warning(src, tmpfs):
    cache = tmpfs / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(10):
        ds[i]  # 10 recorded
    del ds  # its segment is closed (a read-only remount needs no file open to write)
    gc.collect()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.warns(CacheWarning) as seen:
        ro = Files(src, cache_dir=cache)
        check_all(ro, values_of(src))
        check_all(ro, values_of(src))
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert "Read-only" in str(seen[0].message) or "read-only" in str(seen[0].message)
    assert sorted(set(ro.loads)) == sorted(os.listdir(src))[10:]  # the records are read
    assert packs(cache) == []


def test_check_source_background_with_filling(src, tmp_path, caplog):
    cache = tmp_path / "cache"
    check_all(Files(src, cache_dir=cache, check_source="background"), values_of(src))
    edit(src / "003.txt", 33)
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="changed since its pack was built"),
    ):
        ds = Files(src, cache_dir=cache, check_source="background")
        assert ds.loads == [] and plain(ds[3])["value"] == 3  # the old pack, at once
        ds._record.thread.join(timeout=60)
    assert ds.is_stale
    assert "changed since its pack was built" in caplog.text
    nxt = Files(src, cache_dir=cache, check_source="background")
    assert nxt.loads == ["003.txt"], "the next open re-reads the edited item"
    assert plain(nxt[3])["value"] == 33 and not nxt.is_stale


def test_force_recache_does_not_use_the_records(src, tmp_path):
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(10):
        ds[i]
    forced = Files(src, cache_dir=cache, force_recache=True)
    assert forced.loads == [] and segments(cache) == []
    check_all(forced, values_of(src))
    assert sorted(forced.loads) == sorted(os.listdir(src))
    assert len(packs(cache)) == 1
    forced = Files(src, cache_dir=cache, force_recache=True)  # a sealed pack: the same
    check_all(forced, values_of(src))
    assert len(forced.loads) == 40


def test_damage_met_while_reading_a_sealed_pack_is_filled_again(src, tmp_path, caplog):
    """A block of the sealed pack whose checksum fails at a read: that read
    returns the right sample (loaded again), one warning; the pack is sealed anew."""
    cache = tmp_path / "cache"
    check_all(Files(src, cache_dir=cache), values_of(src))
    ds = Files(src, cache_dir=cache)
    assert ds.loads == []
    x = next(f for f in ds.packed.pack_index["fields"] if f["name"] == "x")
    (pack,) = packs(cache)
    with open(pack, "r+b") as f:  # damage the data in place, after the open
        f.seek(x["data"]["off"] + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="checksum mismatch"),
    ):
        got = ds[0]
    assert plain(got) == expected("000.txt", 0)
    check_all(ds, values_of(src))
    ds.packed.verify()
    assert len(packs(cache)) == 1 and fills(cache) == []
    check_all(Files(src, cache_dir=cache), values_of(src))


@pytest.mark.parametrize("recorded", [39, 40])
def test_a_read_only_cache_that_needs_a_seal_still_serves(src, tmpfs, tmp_path, recorded):
    """Every item (or all but one) recorded, the pack not sealed (a run killed at
    the end), the cache now read-only: the open cannot seal; samples still come."""
    cache, other = tmpfs / "cache", tmp_path / "other"
    first, second = Files(src, cache_dir=cache), Files(src, cache_dir=other)
    for i in range(20):
        first[i]
    for i in range(20, recorded):
        second[i]
    del first, second
    gc.collect()
    (theirs,) = segments(other)
    (fill,) = fills(cache)
    (fill / theirs.name).write_bytes(theirs.read_bytes())  # the same pack's records
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with pytest.warns(CacheWarning) as seen:
        ro = Files(src, cache_dir=cache)
        check_all(ro, values_of(src))
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert "read-only" in str(seen[0].message).lower()
    assert sorted(set(ro.loads)) == sorted(os.listdir(src))[recorded:]


class Typed(Files):
    """Fields a JSON source gives: lists, nested dicts, 0-d arrays, numpy str."""

    def load_item(self, path: str) -> dict[str, Any]:
        v = super().load_item(path)["value"]
        return {
            "ids": [v, v + 1, v + 2],
            "mixed": [v, 0.5],
            "rows": [[v, 1], [2, 3]],
            "tags": ["a", str(v)],
            "meta": {"w": [1.0, float(v)], "deep": {"z": np.array(v)}, "t": ["x"]},
            "zero_d": np.array(float(v)),
            "flag": np.array(v % 2 == 0),
            "s": np.str_(f"s{v}"),
            "b": np.bytes_(b"b"),
            "n": v,
        }


def shape_of(value: Any) -> Any:
    """A value's types (and dtypes, shapes), recursively: what a collate sees."""
    if isinstance(value, dict):
        return {k: shape_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", *map(shape_of, value)]
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape)
    return type(value).__name__


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_a_sample_has_the_same_types_loaded_recorded_and_sealed(src, tmp_path, allow_pickle):
    """Epoch 1 returns what the sealed pack returns: a list of numbers is an array
    while filling too (a list when pickled), a 0-d array a numpy scalar, np.str_ a str."""
    cache = tmp_path / "cache"
    filling = Typed(src, cache_dir=cache, allow_pickle=allow_pickle)
    loaded = [filling[i] for i in range(20)]  # loaded now
    recorded = Typed(src, cache_dir=cache, allow_pickle=allow_pickle)
    from_records = [recorded[i] for i in range(20)]  # read from the records
    for i in range(20, 40):
        recorded[i]
    assert len(packs(cache)) == 1
    sealed = Typed(src, cache_dir=cache, allow_pickle=allow_pickle)
    assert sealed.loads == []
    for i in range(20):
        want = shape_of(sealed[i])
        assert shape_of(loaded[i]) == want, i
        assert shape_of(from_records[i]) == want, i
        assert str(loaded[i]) == str(sealed[i]) == str(from_records[i])
    if not allow_pickle:
        assert shape_of(sealed[3])["ids"] == ("ndarray", "<i8", (3,))
        assert shape_of(sealed[3])["meta"]["deep"]["z"] == "int64"


def test_an_edit_between_two_runs_of_a_fill_reloads_the_edited_record(src, tmp_path):
    """Records of an item edited (or removed) since they were written are never
    used: the edited item is loaded again, its new value comes back."""
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(20):
        ds[i]
    edit(src / "005.txt", 55)
    (src / "006.txt").unlink()
    later = Files(src, cache_dir=cache)
    check_all(later, values_of(src))
    names = sorted(os.listdir(src))
    assert sorted(later.loads) == sorted(["005.txt", *names[19:]])
    assert later[5]["value"] == 55 and len(later) == 39
    assert len(packs(cache)) == 1 and fills(cache) == []


def test_a_segment_started_right_after_a_look_is_seen_by_the_next_look(src, tmp_path):
    """Another filler's first record, within a millisecond of this one's look (a
    DataLoader's workers starting together): the next miss reads it, never loads
    it again. Twenty rounds, so a folder's coarse modification time would tell."""
    for round_ in range(20):
        cache = tmp_path / f"cache{round_}"
        a, b = Files(src, cache_dir=cache), Files(src, cache_dir=cache)
        a[0]  # a's segment
        a[1]  # a looks (its own segment only), loads, records
        b[2]  # b's segment, now
        assert a[2]["value"] == 2
        assert a.loads == ["000.txt", "001.txt"], round_


def test_a_seal_between_a_look_for_the_pack_and_its_read_of_the_records(src, tmp_path, monkeypatch):
    """Another filler seals (and removes the segments) right after this one looked
    for the pack and before it read the segments (a DataLoader's worker meeting the
    other's seal, on a busy machine): the look finds the pack, and loads nothing."""
    cache = tmp_path / "cache"
    a, b = Files(src, cache_dir=cache), Files(src, cache_dir=cache)
    for i in range(39):
        a[i]  # every item recorded by a but the last
    filler = b._filler
    assert filler is not None
    looked = filler._find_sealed

    def then_a_seals() -> bool:
        found = looked()
        if not packs(cache):
            a[39]  # a's last load: its seal removes the segments b listed
            assert len(packs(cache)) == 1 and fills(cache) == []
        return found

    monkeypatch.setattr(filler, "_find_sealed", then_a_seals)
    assert b[0]["value"] == 0
    assert b.loads == []  # read from a's pack, not loaded again
    check_all(b, values_of(src))
    assert b.loads == []


def test_fillers_that_each_missed_the_others_last_record_seal_at_the_next_read(
    src, tmp_path, monkeypatch
):
    """Two fillers look, then each records its last item (a DataLoader's two
    persistent workers ending epoch 1 together): neither sees every item in. The
    one that recorded last seals at its next read of a sample it has, whichever
    (epoch 2 may never ask either the item it missed)."""
    monkeypatch.setattr(filling, "_SEAL_CHECK_EVERY", float("inf"))  # no timed look
    cache = tmp_path / "cache"
    a, b = Files(src, cache_dir=cache), Files(src, cache_dir=cache)
    for i in range(19):
        a[i]
    for i in range(20, 39):
        b[i]
    filler = a._filler
    assert filler is not None
    load = filler.load_item

    def b_loads_its_last_first(item: Any) -> Any:
        b[39]  # after a's look (before its load of 19), before a records 19
        return load(item)

    monkeypatch.setattr(filler, "load_item", b_loads_its_last_first)
    a[19]
    assert packs(cache) == []  # a misses b's 39, b missed a's 19
    assert a[0]["value"] == 0  # a recorded last: its look sees every item in
    assert len(packs(cache)) == 1 and fills(cache) == []
    assert b[20]["value"] == 20
    check_all(a, values_of(src))
    check_all(b, values_of(src))
    assert sorted(a.loads + b.loads) == sorted(os.listdir(src))  # each once


def test_random_damage_to_the_records_never_gives_a_wrong_sample(tmp_path):
    """A byte flipped (or the file cut) anywhere in a segment, 40 times: every sample
    read is right, and at most the damaged record's item and those after it in that
    segment are loaded again."""
    import random

    rng = random.Random(18)
    src = make_source(tmp_path / "src", 30)
    for trial in range(40):
        cache = tmp_path / f"cache{trial}"
        ds = Files(src, cache_dir=cache)
        for i in range(20):
            ds[i]
        del ds
        (seg,) = segments(cache)
        offsets = record_offsets(seg)  # of the records as written
        data = bytearray(seg.read_bytes())
        at = rng.randrange(len(data))
        if trial % 4 == 3:
            del data[at:]
        else:
            data[at] ^= 1 << rng.randrange(8)
        seg.write_bytes(bytes(data))
        damaged = sum(1 for off in offsets if off <= at) - 1  # the record hit
        later = Files(src, cache_dir=cache)
        check_all(later, values_of(src))
        again = set(later.loads) & set(sorted(os.listdir(src))[:20])
        assert again <= {f"{i:03d}.txt" for i in range(damaged, 20)}, (trial, at)
        assert f"{damaged:03d}.txt" in again, (trial, at)  # every byte is checked
        assert len(packs(cache)) == 1 and fills(cache) == []


@pytest.mark.parametrize("then", ["up-front", "few"])
def test_a_fill_begun_as_read_and_ended_at_an_open_seals(src, tmp_path, then):
    """Records made by reads and by an open's loads (fill='up-front', or the few
    missing items an open loads itself) hold the same form: the seal takes both."""
    cache = tmp_path / "cache"
    ds = Typed(src, cache_dir=cache)
    for i in range(20 if then == "up-front" else 35):
        ds[i]
    done = Typed(src, cache_dir=cache, fill="up-front" if then == "up-front" else "auto")
    assert len(done.loads) == (20 if then == "up-front" else 5)
    assert len(packs(cache)) == 1 and fills(cache) == []
    assert shape_of(done[0]) == shape_of(done[39])


class Pairs(Files):
    """A field a pack cannot store without pickle, whatever the other samples hold."""

    def load_item(self, path: str) -> dict[str, Any]:
        sample = super().load_item(path)
        return {"value": sample["value"], "pair": (sample["value"], 1)}


class PairsUpFront(CachedDataset):
    def __init__(self, root: Path, **kw: Any) -> None:
        self.root = str(root)
        super().__init__(progress=False, **kw)

    def load_source(self) -> Any:
        for name in sorted(os.listdir(self.root)):
            value = int(Path(self.root, name).read_text())
            yield {"value": value, "pair": (value, 1)}


def test_a_value_no_pack_stores_is_refused_at_its_first_load(src, tmp_path):
    """A tuple (allow_pickle=False): refused by the read that loads it, in the
    build's words, not after a whole epoch filled, by the seal and every later open."""
    with pytest.raises(UnsupportedValue) as built:
        PairsUpFront(src, cache_dir=tmp_path / "built")
    cache = tmp_path / "cache"
    ds = Pairs(src, cache_dir=cache)
    with pytest.raises(UnsupportedValue) as read:
        ds[0]
    assert str(read.value) == str(built.value)
    assert "field 'pair': a value of type builtins.tuple needs pickle" in str(read.value)
    assert segments(cache) == [] and packs(cache) == []
    ok = Pairs(src, cache_dir=cache, allow_pickle=True)
    assert ok[3]["pair"] == (3, 1)


def test_random_damage_to_records_of_lists_and_dicts_never_gives_a_wrong_sample(tmp_path):
    """The same with samples of lists, dicts, 0-d arrays and str (their own record
    layouts): each read equals the sample of an undamaged pack, types included."""
    import random

    rng = random.Random(19)
    src = make_source(tmp_path / "src", 24)
    clean = Typed(src, cache_dir=tmp_path / "clean")
    want = [str(clean[i]) + repr(shape_of(clean[i])) for i in range(24)]
    assert len(packs(tmp_path / "clean")) == 1
    for trial in range(24):
        cache = tmp_path / f"cache{trial}"
        ds = Typed(src, cache_dir=cache)
        for i in range(16):
            ds[i]
        del ds
        (seg,) = segments(cache)
        data = bytearray(seg.read_bytes())
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        seg.write_bytes(bytes(data))
        later = Typed(src, cache_dir=cache)
        got = [str(later[i]) + repr(shape_of(later[i])) for i in range(24)]
        assert got == want, (trial, at)
        assert len(packs(cache)) == 1


def test_records_left_by_a_run_killed_after_its_seal_are_removed(src, tmp_path):
    """Killed between the seal's rename and the removal of the records: the next
    open reads the sealed pack and removes the records (no second copy on disk)."""
    cache = tmp_path / "cache"
    ds = Files(src, cache_dir=cache)
    for i in range(39):
        ds[i]
    (fill,) = fills(cache)
    kept = {p.name: p.read_bytes() for p in fill.iterdir()}
    ds[39]  # sealed: the records go
    assert fills(cache) == [] and len(packs(cache)) == 1
    fill.mkdir()
    for name, data in kept.items():
        (fill / name).write_bytes(data)
    again = Files(src, cache_dir=cache)
    check_all(again, values_of(src))
    assert again.loads == []
    assert fills(cache) == [], "the records of a sealed pack stay on disk"


class Broken(Files):
    """Item 7's file cannot be parsed (a corrupt file in a folder of thousands)."""

    def load_item(self, path: str) -> dict[str, Any]:
        if path.endswith("007.txt"):
            raise ValueError("cannot parse 007.txt")
        return super().load_item(path)


def test_an_item_that_fails_to_load_does_not_stop_the_next_open(src, tmp_path):
    """An epoch that skipped a broken item (the user caught its error): the next
    open still opens (the error is raised by the read of that item, as in the first
    epoch), and the other samples come from the records without a load."""
    cache = tmp_path / "cache"
    ds = Broken(src, cache_dir=cache)
    failed = []
    for i in range(40):
        try:
            ds[i]
        except ValueError:
            failed.append(i)
    assert failed == [7] and len(ds.loads) == 39
    again = Broken(src, cache_dir=cache)
    assert again[3]["value"] == 3 and again[39]["value"] == 39
    with pytest.raises(ValueError, match="cannot parse 007.txt"):
        again[7]
    assert again.loads == []
    with pytest.raises(ValueError, match="cannot parse 007.txt"):
        Broken(src, cache_dir=cache, fill="up-front")  # asked to load everything: raised
