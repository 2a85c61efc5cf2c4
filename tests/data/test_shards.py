"""Sharded packs: written as shards plus a manifest, read as one dataset, fetched
shard by shard from S3, and built by Dask workers."""

from __future__ import annotations

import pickle
import re
import shutil

import numpy as np
import pytest

from mlcache.data import (
    PackCorrupted,
    PackedDataset,
    ShardedDataset,
    open_pack,
    pack,
    pack_with_dask,
)


def sample(i: int) -> dict:
    return {"x": np.full(250, i, dtype=np.float32), "i": i, "name": f"s{i}"}


def test_shards_round_trip_and_read_as_one(tmp_path):
    ds = pack(
        (sample(i) for i in range(1000)), tmp_path / "d.shards", shard_size="100KB", progress=False
    )
    assert isinstance(ds, ShardedDataset) and len(ds) == 1000
    shards = sorted(p.name for p in tmp_path.glob("d-*.pack"))
    assert len(shards) >= 9 and re.fullmatch(r"d-[0-9a-f]{12}-00000\.pack", shards[0])
    assert all(p.stat().st_size < 130_000 for p in tmp_path.glob("d-*.pack"))
    for i in (0, 1, 99, 500, 999, -1):
        got = ds[i]
        assert got["i"] == i % 1000 and got["name"] == f"s{i % 1000}"
        np.testing.assert_array_equal(got["x"], sample(i % 1000)["x"])
    batch = ds.get_batch([3, 998, 4])
    assert batch["x"].shape == (3, 250) and batch["i"] == [3, 998, 4]
    again = open_pack(tmp_path / "d.shards")  # opened by its manifest
    assert isinstance(again, ShardedDataset) and again[500]["i"] == 500
    assert again.field_names == ["x", "i", "name"]
    with pytest.raises(ValueError, match=r"open_pack.*ShardedDataset"):
        PackedDataset(tmp_path / "d.shards")  # a manifest is not a pack file
    assert pickle.loads(pickle.dumps(again))[7]["i"] == 7
    with pytest.raises(IndexError):
        ds[1000]


def test_only_the_shards_read_are_opened(tmp_path):
    pack(
        (sample(i) for i in range(1000)), tmp_path / "d.shards", shard_size="100KB", progress=False
    )
    fresh = ShardedDataset(tmp_path / "d.shards")
    fresh[999]
    assert fresh.shards_opened == 1


def test_a_damaged_manifest_is_refused(tmp_path):
    pack((sample(i) for i in range(50)), tmp_path / "d.shards", shard_size="10KB", progress=False)
    manifest = tmp_path / "d.shards"
    manifest.write_text(manifest.read_text().replace('"n": 50', '"n": 51'))
    with pytest.raises(PackCorrupted, match="manifest"):
        ShardedDataset(manifest)
    with pytest.raises(ValueError, match=".shards"):
        pack((sample(i) for i in range(5)), tmp_path / "e.pack", shard_size="1KB")
    with pytest.raises(FileNotFoundError):
        ShardedDataset(tmp_path / "missing.shards")


def test_shards_on_s3_are_fetched_one_by_one(s3_bucket, tmp_path):
    import s3fs

    url, options = s3_bucket
    pack(
        (sample(i) for i in range(1000)),
        tmp_path / "up" / "d.shards",
        shard_size="100KB",
        progress=False,
    )
    fs = s3fs.S3FileSystem(**options)
    for p in sorted((tmp_path / "up").glob("d-*.pack")):
        fs.put_file(str(p), f"{url[5:]}/ds/{p.name}")
    fs.put_file(str(tmp_path / "up" / "d.shards"), f"{url[5:]}/ds/d.shards")  # last
    local = tmp_path / "machine"
    ds = open_pack(f"{url}/ds/d.shards", storage_options=options, local_cache_dir=str(local))
    assert isinstance(ds, ShardedDataset) and len(ds) == 1000
    assert ds[999]["i"] == 999
    fetched = sorted(p.name for p in local.glob("*.pack"))
    assert fetched == [sorted(p.name for p in (tmp_path / "up").glob("d-*.pack"))[-1]]


def _load(i):
    return sample(i)


def _cluster():
    import distributed

    return distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        silence_logs=50,
    )


def test_dask_workers_build_the_shards(s3_bucket, tmp_path):
    distributed = pytest.importorskip("distributed")
    url, options = s3_bucket
    with _cluster() as cluster, distributed.Client(cluster) as client:
        ds = pack_with_dask(
            list(range(700)),
            _load,
            f"{url}/built/d.shards",
            client,
            items_per_shard=100,
            storage_options=options,
        )
        assert len(ds) == 700 and ds[654]["i"] == 654 and ds[0]["name"] == "s0"
        # the same into a folder the workers share
        local = tmp_path / "l" / "d.shards"
        ds2 = pack_with_dask(list(range(250)), _load, str(local), client, items_per_shard=100)
    assert len(ds2) == 250 and ds2[249]["i"] == 249
    names = sorted(p.name for p in local.parent.glob("*.pack"))
    assert [n[-10:] for n in names] == ["00000.pack", "00001.pack", "00002.pack"]
    assert len({n[:-11] for n in names}) == 1  # one build


def test_a_shard_that_is_not_the_manifests_is_refused(tmp_path):
    """A shard replaced by another pack (by hand: mlcache writes new names) is
    refused by its index checksum, never read as part of this version."""
    ds = pack(
        (sample(i) for i in range(300)), tmp_path / "d.shards", shard_size="50KB", progress=False
    )
    other = pack(
        ({**sample(i), "i": i + 1} for i in range(300)),
        tmp_path / "o.shards",
        shard_size="50KB",
        progress=False,
    )
    shutil.copyfile(tmp_path / other._names[0], tmp_path / ds._names[0])
    fresh = ShardedDataset(tmp_path / "d.shards")
    with pytest.raises(PackCorrupted, match="not the one the manifest names"):
        fresh[0]


def test_sharded_datasets_are_keyed_by_their_contents(tmp_path):
    from mlcache.keys.hashing import hash_value

    a = pack(
        (sample(i) for i in range(100)), tmp_path / "a.shards", shard_size="30KB", progress=False
    )
    b = pack(
        ({**sample(i), "x": sample(i)["x"] + 1} for i in range(100)),
        tmp_path / "b.shards",
        shard_size="30KB",
        progress=False,
    )
    assert hash_value(a) != hash_value(b)  # same sizes, other values


def test_a_manifest_name_without_shard_size_and_a_plain_pack_opened_as_shards(tmp_path):
    from mlcache.data import ShardedDataset, pack

    read = []

    def samples():
        for i in range(3):
            read.append(i)
            yield {"y": i}

    with pytest.raises(ValueError, match="shard_size="):
        pack(samples(), tmp_path / "d.shards", progress=False)
    assert read == [] and not list(tmp_path.iterdir())  # said before reading the source
    pack(samples(), tmp_path / "d.pack", progress=False)
    with pytest.raises(ValueError, match="is a plain pack.*open_pack"):
        ShardedDataset(tmp_path / "d.pack")
