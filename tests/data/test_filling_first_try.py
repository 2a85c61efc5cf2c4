"""What a new user met first with a dataset that fills itself: samples whose fields
differ (an optional JSON key), a field that changes kind, a read-only cache_dir."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlcache.data import CachedDataset


class Records(CachedDataset):
    source_glob = "*.json"

    def __init__(self, root, **kw):
        self.source_dir = root
        super().__init__(**kw)

    def load_item(self, path):
        with open(path) as f:
            return json.load(f)


def _records(folder: Path, n: int, make) -> Path:
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:03d}.json").write_text(json.dumps(make(i)))
    return folder


def test_an_optional_key_is_refused_at_the_sample_naming_its_file(tmp_path):
    src = _records(tmp_path / "src", 30, lambda i: {"id": i, **({"extra": 1} if i == 0 else {})})
    ds = Records(src, cache_dir=tmp_path / "c", progress=False)
    assert ds[0]["id"] == 0
    with pytest.raises(ValueError, match=r"001\.json.*it lacks the field 'extra'.*sample\.get"):
        ds[1]
    # the next open is not poisoned: nothing recorded disagrees with it
    again = Records(src, cache_dir=tmp_path / "c", progress=False)
    assert again[0]["extra"] == 1


class Getting(Records):
    def load_item(self, path):  # the fix the error suggests
        with open(path) as f:
            record = json.load(f)
        return {"id": record["id"], "extra": record.get("extra")}


def test_with_missing_values_as_none_the_pack_is_sealed(tmp_path):
    src = _records(tmp_path / "src", 30, lambda i: {"id": i, **({"extra": 1} if i % 10 else {})})
    ds = Getting(src, cache_dir=tmp_path / "c", progress=False)
    assert [ds[i]["extra"] for i in range(30)][:3] == [None, 1, 1]
    assert Path(ds.pack_path).is_file()
    assert Getting(src, cache_dir=tmp_path / "c", progress=False)[10]["extra"] is None


def test_a_field_that_changes_kind_names_the_item_at_the_seal(tmp_path):
    src = _records(tmp_path / "src", 12, lambda i: {"v": i if i < 6 else f"s{i}"})
    ds = Records(src, cache_dir=tmp_path / "c", progress=False)
    with pytest.raises(TypeError, match=r"sample 6.*item .*006\.json"):
        for i in range(12):
            ds[i]


class Arrays(CachedDataset):
    source_glob = "*.npy"

    def __init__(self, root, **kw):
        self.source_dir = root
        super().__init__(**kw)

    def load_item(self, path):
        return {"x": np.load(path)}


def test_an_empty_read_only_cache_dir_serves_the_samples_with_one_warning(tmp_path, tmpfs):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        np.save(src / f"{i:02d}.npy", np.full(3, i))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = Arrays(src, cache_dir=tmpfs, progress=False)
        assert [int(ds[i]["x"][0]) for i in range(20)] == list(range(20))
        assert [int(ds[i]["x"][2]) for i in range(20)] == list(range(20))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "Read-only file system" in messages[0], messages


class Five(CachedDataset):
    def source_items(self):
        return list(range(5))

    def load_item(self, i):
        return {"i": i}


def test_repr_shows_what_other_processes_filled(tmp_path):
    """print(ds) in a DataLoader's parent after its workers filled and sealed the
    pack says so (it said 'filled 0 of 5' for ever)."""
    parent = Five(cache_dir=tmp_path, progress=False)
    assert "filled='0 of 5 samples'" in repr(parent)
    worker = Five(cache_dir=tmp_path, progress=False)  # another reader fills it all
    for i in range(5):
        worker[i]
    shown = repr(parent)
    assert "filled" not in shown and "fields=['i']" in shown and "samples=5" in shown
    assert [parent[i]["i"] for i in range(5)] == list(range(5))
