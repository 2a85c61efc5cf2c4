"""data/sequence: datasets are Sequences: ``ds[2:4]``, ``ds[[1, 2]]``, numpy integer
arrays and negative indices, for PackedDataset, ShardedDataset and CachedDataset;
and a CachedDataset's repr says what it is."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mlcache.data import CachedDataset, PackedDataset, ShardedDataset, open_pack, pack


def _samples(n=10):
    return ({"i": i, "x": np.full(2, i, dtype=np.int32), "s": f"s{i}"} for i in range(n))


class Tens(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def load_source(self):
        return list(_samples(self.n))


@pytest.fixture(params=["packed", "sharded", "cached", "cached+transform"])
def ds(request, tmp_path):
    if request.param == "packed":
        return pack(_samples(), tmp_path / "d.pack", progress=False)
    if request.param == "sharded":
        pack(_samples(), tmp_path / "d.shards", shard_size="200B", progress=False)
        opened = open_pack(tmp_path / "d.shards")
        assert isinstance(opened, ShardedDataset) and opened.shards_opened == 0
        return opened
    transform = (lambda s: {**s, "t": s["i"] * 10}) if "transform" in request.param else None
    return Tens(10, cache_dir=tmp_path / "c", progress=False, transform=transform)


def _ids(samples):
    return [s["i"] for s in samples]


def test_slices_lists_arrays_and_negative_indices(ds):
    assert ds[-1]["i"] == 9 and ds[np.int64(-10)]["i"] == 0 and ds[np.int32(3)]["i"] == 3
    assert _ids(ds[2:4]) == [2, 3]
    assert _ids(ds[::-3]) == [9, 6, 3, 0]
    assert _ids(ds[8:100]) == [8, 9] and ds[5:2] == []
    assert _ids(ds[[1, 2]]) == [1, 2] and _ids(ds[[7, -1, 7]]) == [7, 9, 7]
    assert _ids(ds[np.array([4, 0])]) == [4, 0] and _ids(ds[range(3)]) == [0, 1, 2]
    assert ds[[]] == [] and ds[np.array([], dtype=np.int64)] == []
    assert ds[[3]][0]["x"].tolist() == [3, 3] and ds[[3]][0]["s"] == "s3"
    if isinstance(ds, CachedDataset) and ds.transform is not None:
        assert [s["t"] for s in ds[1:3]] == [10, 20]  # the transform, per sample


def test_bad_keys_say_what_a_dataset_is_indexed_by(ds):
    for key in (1.0, "a", [1.5], np.array([True] * 10), np.zeros((2, 2), dtype=int)):
        with pytest.raises(TypeError, match="indexed by an integer, a slice"):
            ds[key]
    for key in (10, -11, [0, 10], np.array([-11])):
        with pytest.raises(IndexError, match="out of range"):
            ds[key]


def test_a_cached_datasets_repr_says_what_it_holds(tmp_path):
    ds = Tens(10, cache_dir=tmp_path / "c", progress=False)
    text = repr(ds)
    assert text.startswith("Tens(samples=10, fields=['i', 'x', 's'], pack=")
    assert repr(ds.pack_path) in text and "source='load_source()'" in text
    assert text.endswith("stale=False)")
    files = tmp_path / "files"
    files.mkdir()
    (files / "a.txt").write_text("a")

    class Declared(CachedDataset):
        source_glob = "*.txt"

        def load_source(self):
            for path in self.source_files():
                yield {"n": os.path.getsize(path)}

    declared = Declared(cache_dir=tmp_path / "c", source_dir=files, progress=False)
    assert f"source='{files}/*.txt'" in repr(declared)
    assert "samples=1, fields=['n']" in repr(declared)
    listed = Declared(cache_dir=tmp_path / "c", source_paths=[files / "a.txt"], progress=False)
    assert "source='1 files'" in repr(listed)
    assert repr(PackedDataset(ds.pack_path)).startswith("PackedDataset(")
