"""A sealed pack of a dataset filled item by item, found damaged while reading:
one warning, the pack filled again, never a wrong sample."""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np
import pytest

from mlcache.data import CachedDataset


class Rows(CachedDataset):
    loads: ClassVar[list[int]] = []

    def source_items(self):
        return list(range(40))

    def load_item(self, i):
        Rows.loads.append(i)
        return {"x": np.full(20_000, i, dtype=np.int64)}  # 160 KB a sample


def test_a_damaged_sealed_pack_is_filled_again(tmp_path):
    ds = Rows(cache_dir=tmp_path, progress=False)
    assert [int(ds[i]["x"][0]) for i in range(40)] == list(range(40))
    assert os.path.exists(ds.pack_path) and not os.path.exists(ds.pack_path + ".fill")
    # flip a byte inside sample 30's values (a block no read has checked yet here)
    fresh = Rows(cache_dir=tmp_path, progress=False)
    region = fresh.packed.pack_index["fields"][0]["data"]
    with open(fresh.pack_path, "r+b") as f:
        f.seek(region["off"] + 30 * 160_000 + 8)
        f.write(b"\xff")
    Rows.loads.clear()
    with pytest.warns(UserWarning, match="checksum mismatch"):
        sample = fresh[30]
    assert int(sample["x"][1]) == 30 and (sample["x"] == 30).all()  # never the damaged one
    assert [int(fresh[i]["x"][-1]) for i in range(40)] == list(range(40))
    assert sorted(set(Rows.loads)) == list(range(40))  # filled again, each once
    assert len(Rows.loads) == 40
    again = Rows(cache_dir=tmp_path, progress=False)
    Rows.loads.clear()
    assert [int(again[i]["x"][7]) for i in range(40)] == list(range(40)) and not Rows.loads


def test_verify_checks_the_item_table_of_a_filled_pack(tmp_path):
    """verify() counts the items region as a region (not damage between regions)
    and checks its checksum."""
    ds = Rows(cache_dir=tmp_path, fill="up-front", progress=False)
    ds.packed.verify()
    region = ds.packed.pack_index["items"]
    with open(ds.pack_path, "r+b") as f:
        f.seek(region["off"] + 3)
        f.write(b"\x01")
    from mlcache.data import PackedDataset
    from mlcache.errors import PackCorrupted

    with pytest.raises(PackCorrupted, match="checksum mismatch"):
        PackedDataset(ds.pack_path).verify()
