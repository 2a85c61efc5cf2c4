"""data/writer + data/fetch: ``pack(samples, url)`` uploads the pack (it used to
write a local folder named ``s3:``), and the dataset it returns reads it by URL
from the copy it wrote (nothing fetched back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import fsspec
import numpy as np
import pytest

from mlcache.data import PackedDataset, open_pack, pack
from mlcache.data.writer import write_pack


def _samples(n=20, bump=0):
    return ({"x": np.full(3, i + bump, dtype=np.float32), "i": i} for i in range(n))


@pytest.fixture
def memory_url():
    """A fresh folder of fsspec's in-memory file system (one per process)."""
    fs = fsspec.filesystem("memory")
    folder = f"/mlcache-test-{uuid.uuid4().hex[:12]}"
    yield f"memory://{folder}"
    fs.rm(folder, recursive=True)


def test_pack_to_a_memory_url_uploads_it_and_writes_no_local_folder(
    memory_url, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLCACHE_DIR", str(tmp_path / "home"))
    url = f"{memory_url}/train.pack"
    ds = pack(_samples(), url, progress=False)
    assert os.listdir(tmp_path) == ["home"]  # no "memory:" folder beside the script
    assert isinstance(ds, PackedDataset) and ds.url == url
    assert len(ds) == 20 and ds[7]["i"] == 7 and ds[7]["x"].tolist() == [7.0] * 3
    fs = fsspec.filesystem("memory")
    with open(ds.path, "rb") as f:
        assert fs.cat_file(url[len("memory://") :]) == f.read()
    # another machine (another copies folder) reads it by its URL
    other = open_pack(url, local_cache_dir=str(tmp_path / "other"))
    assert other.path.startswith(str(tmp_path / "other"))
    assert [other[j]["i"] for j in range(20)] == list(range(20))


def test_pack_passes_its_copies_folder_on_and_shards_refuse_a_url(memory_url, tmp_path):
    local = str(tmp_path / "copies")
    ds = pack(_samples(), f"{memory_url}/c.pack", progress=False, local_cache_dir=local)
    assert ds.path.startswith(local + os.sep) and ds[3]["i"] == 3
    with pytest.raises(ValueError, match="local paths only"):
        pack(_samples(), f"{memory_url}/c.shards", progress=False, shard_size="1MB")
    with pytest.raises(ValueError, match="local path"):
        pack(_samples(), f"{memory_url}/c.shards", shard_size="1MB", local_cache_dir=local)
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())


def test_the_uploaded_pack_is_the_local_copy_and_a_replacement_is_seen(memory_url, tmp_path):
    url, local = f"{memory_url}/d.pack", str(tmp_path / "copies")
    ds = write_pack(_samples(), url, progress=False, local_cache_dir=local)
    inode = os.stat(ds.path).st_ino
    again = PackedDataset(url, local_cache_dir=local)
    assert os.stat(again.path).st_ino == inode  # the copy written is read: not fetched
    newer = write_pack(_samples(bump=100), url, progress=False, local_cache_dir=local)
    assert float(newer[3]["x"][0]) == 103.0
    assert float(PackedDataset(url, local_cache_dir=str(tmp_path / "b"))[3]["x"][0]) == 103.0
    assert float(ds[3]["x"][0]) == 3.0  # the old reader keeps its own file


def test_a_failed_build_uploads_nothing_and_keeps_the_previous_copy(
    memory_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("MLCACHE_DIR", str(tmp_path / "home"))
    url, local = f"{memory_url}/d.pack", str(tmp_path / "copies")
    first = write_pack(_samples(), url, progress=False, local_cache_dir=local)

    def broken():
        yield from _samples(5, bump=100)
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        pack(broken(), url, progress=False)  # default copies folder: untouched here
    with pytest.raises(RuntimeError, match="source failed"):
        write_pack(broken(), url, progress=False, local_cache_dir=local)
    assert sorted(os.listdir(local)) == ["d.pack", "d.pack.source.json"]
    again = PackedDataset(url, local_cache_dir=local)
    assert os.stat(again.path).st_ino == os.stat(first.path).st_ino
    assert len(again) == 20 and float(again[3]["x"][0]) == 3.0
    with pytest.raises(RuntimeError, match="source failed"):
        write_pack(broken(), f"{memory_url}/never.pack", progress=False)
    assert not fsspec.filesystem("memory").exists(f"{memory_url[len('memory://') :]}/never.pack")


PACK_TO_S3 = """
import sys, numpy as np
from mlcache.data import pack
ds = pack(({"i": i, "x": np.arange(i % 5)} for i in range(50)), sys.argv[1], progress=False)
print(type(ds).__name__, ds.url, len(ds), ds[49]["i"])
"""


def test_pack_to_an_s3_url_uploads_it_to_a_real_server(s3_bucket, tmp_path):
    """``pack(samples, "s3://...")`` as a user runs it, credentials from fsspec's
    environment configuration; then read back on "another machine"."""
    url, options = s3_bucket
    env = dict(os.environ, FSSPEC_S3=json.dumps(options), MLCACHE_DIR=str(tmp_path / "home"))
    out = subprocess.run(
        [sys.executable, "-c", PACK_TO_S3, f"{url}/packs/train.pack"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout
    assert out.split() == ["PackedDataset", f"{url}/packs/train.pack", "50", "49"]
    assert sorted(os.listdir(tmp_path)) == ["home"]
    ds = PackedDataset(
        f"{url}/packs/train.pack", storage_options=options, local_cache_dir=str(tmp_path / "b")
    )
    assert len(ds) == 50 and ds[13]["x"].tolist() == [0, 1, 2]
