"""The fsspec store: the store conformance suite on memory:// and on a real S3
server (SeaweedFS, started by the tests on 127.0.0.1), shared caches, the local
read-through copy, and leases across processes."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from mlcache import Memory
from mlcache.memo.layout import is_entry
from mlcache.store import Store
from mlcache.store.fsspec import FsspecStore
from mlcache.testing.stores import StoreTests, get, put

pytest.importorskip("s3fs")


class RemoteConformance(StoreTests):
    """An object store cannot touch an object: last use is the last write."""

    def test_touch_updates_last_used(self, store):
        put(store, "f/v/a", b"x")
        before = {e.name: e.last_used for e in store.list()}
        store.touch(["f/v/a", "f/v/missing"])  # accepted, names checked, nothing changes
        assert {e.name: e.last_used for e in store.list()} == before
        assert get(store, "f/v/a") == b"x"

    def test_a_write_is_also_the_local_copy(self, store):
        put(store, "f/v/a", b"hello")
        assert Path(store.local_path("f/v/a")).read_bytes() == b"hello"

    def test_local_path_copies_once_and_reads_locally_after(self, store, tmp_path):
        put(store, "f/v/a", b"data" * 100)
        other = self.reopen(store, tmp_path / "other-local")
        gets = []
        real = other.fs.get_file
        other.fs.get_file = lambda *a, **k: gets.append(a) or real(*a, **k)
        assert Path(other.local_path("f/v/a")).read_bytes() == b"data" * 100
        assert Path(other.local_path("f/v/a")).read_bytes() == b"data" * 100
        assert len(gets) == 1
        with pytest.raises(FileNotFoundError):
            other.local_path("f/v/missing")

    def test_the_local_copy_keeps_its_limit(self, store, tmp_path):
        other = self.reopen(store, tmp_path / "small", local_cache_limit=10_000)
        for i in range(20):
            put(store, f"f/v/{i}", bytes(1000))
        for i in range(20):
            other.local_path(f"f/v/{i}")
        other.trim_local()
        total = sum(p.stat().st_size for p in (tmp_path / "small").rglob("*") if p.is_file())
        assert total <= 10_000

    def reopen(self, store: Store, local: Path, **kw) -> FsspecStore:
        raise NotImplementedError


class TestMemoryUrlStore(RemoteConformance):
    def make_store(self, tmp_path: Path) -> Store:
        return FsspecStore(f"memory://mlc-{uuid.uuid4().hex[:8]}/c", local_cache_dir=tmp_path / "l")

    def reopen(self, store, local, **kw):
        return FsspecStore(store.location, local_cache_dir=local, **kw)


class TestS3Store(RemoteConformance):
    @pytest.fixture
    def store(self, tmp_path, s3_bucket) -> Store:
        url, options = s3_bucket
        self.options = options
        return FsspecStore(f"{url}/cache", local_cache_dir=tmp_path / "l", **options)

    def reopen(self, store, local, **kw):
        return FsspecStore(store.location, local_cache_dir=local, **self.options, **kw)

    def test_conditional_creation_is_refused_when_the_object_exists(self, store):
        """A real server: conditional creation is refused when the object exists."""
        store.fs.pipe_file(store.lease_path("x"), b"1", mode="create")
        with pytest.raises((FileExistsError, OSError)):
            store.fs.pipe_file(store.lease_path("x"), b"2", mode="create")


# -- Memory on S3 -------------------------------------------------------------------------
def _log(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def features(n, log):
    _log(log)
    return np.arange(n, dtype=np.float64) * 3


def _memory(url, options, local, **kw):
    return Memory(
        url,
        verbose=0,
        secret="team secret",  # machines sharing a cache share a key
        backend_options={**options, "local_cache_dir": str(local)},
        **kw,
    )


def test_two_memories_on_two_machines_share_results(s3_bucket, tmp_path):
    url, options = s3_bucket
    log = str(tmp_path / "calls")
    a = _memory(f"{url}/c", options, tmp_path / "a").cache(features, ignore=["log"])
    b = _memory(f"{url}/c", options, tmp_path / "b", mmap_mode="r").cache(features, ignore=["log"])
    np.testing.assert_array_equal(a(1000, log), np.arange(1000) * 3.0)
    got = b(1000, log)  # the other machine: fetched once, then memory-mapped
    assert isinstance(got, np.memmap)
    np.testing.assert_array_equal(got, np.arange(1000) * 3.0)
    assert Path(log).read_text().count("\n") == 1
    assert any(is_entry(e.name) for e in a.memory.store.list())


def _contend(url, options, local, log, start):
    while time.time() < start:
        time.sleep(0.005)
    f = _memory(url, options, local).cache(slow_features, ignore=["log"])
    return float(f(500, log).sum())


def slow_features(n, log):
    _log(log)
    time.sleep(1.0)
    return np.arange(n, dtype=np.float64)


def test_a_contested_key_is_computed_once_across_machines(s3_bucket, tmp_path):
    """Four processes, each with its own Memory and local cache (four machines),
    ask for the same new key at once: one lease, one computation."""
    url, options = s3_bucket
    log = str(tmp_path / "calls")
    start = time.time() + 1.5
    ctx = multiprocessing.get_context("spawn")
    args = [(f"{url}/c", options, tmp_path / f"m{i}", log, start) for i in range(4)]
    with ctx.Pool(4) as pool:
        sums = pool.starmap(_contend, args)
    assert len(set(sums)) == 1
    assert Path(log).read_text().count("\n") == 1


def _hold(url, options, local, log):
    mem = _memory(url, options, local)
    mem.store.lease_seconds = 2.0
    mem.cache(stuck, ignore=["log"])(7, log)


def stuck(n, log):
    _log(log)
    time.sleep(600)
    return n


def test_a_killed_lease_holder_is_taken_over(s3_bucket, tmp_path):
    url, options = s3_bucket
    log = tmp_path / "calls"
    holder = multiprocessing.get_context("spawn").Process(
        target=_hold, args=(f"{url}/c", options, tmp_path / "h", str(log))
    )
    holder.start()
    deadline = time.time() + 60
    while not (log.exists() and log.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    assert log.exists(), "the holder never started"
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    mem = _memory(f"{url}/c", options, tmp_path / "w")
    base = mem.store.lease_path(mem.cache(stuck, ignore=["log"])._name((7, str(log)), {}))
    assert mem.store.leases.numbers(base) == (1,)  # the dead holder's lease is still there
    t0 = time.monotonic()
    with mem.store.lock(mem.cache(stuck, ignore=["log"])._name((7, str(log)), {}), 30) as held:
        waited = time.monotonic() - t0
    assert held and waited < 30  # taken over once it expired (2 s after its last beat)


# -- packs on S3 -------------------------------------------------------------------------
def _pack_on_s3(s3_bucket, tmp_path, n=300, bump=0):
    import s3fs

    from mlcache.data import pack

    url, options = s3_bucket
    samples = ({"x": np.full(20, i + bump, dtype=np.float32), "i": i} for i in range(n))
    local = pack(samples, tmp_path / f"built-{bump}.pack", progress=False)
    fs = s3fs.S3FileSystem(**options)
    fs.put_file(local.path, f"{url[5:]}/data/train.pack")
    return f"{url}/data/train.pack", options


def _read_in_workers(url, options, local_dir, out):
    import json

    import torch

    from mlcache.data import PackedDataset

    ds = PackedDataset(url, storage_options=options, local_cache_dir=local_dir)
    loader = torch.utils.data.DataLoader(ds, batch_size=50, num_workers=2)
    Path(out).write_text(json.dumps(sorted(int(i) for batch in loader for i in batch["i"])))


def test_a_pack_on_s3_is_fetched_once_and_refetched_when_replaced(s3_bucket, tmp_path):
    from mlcache.data import PackedDataset

    url, options = _pack_on_s3(s3_bucket, tmp_path)
    local_dir = str(tmp_path / "local")
    ds = PackedDataset(url, storage_options=options, local_cache_dir=local_dir)
    assert len(ds) == 300 and ds[7]["i"] == 7 and float(ds[7]["x"][0]) == 7.0
    copy = Path(ds.path)
    assert copy.parent == Path(local_dir)
    first = copy.stat().st_ino
    again = PackedDataset(url, storage_options=options, local_cache_dir=local_dir)
    assert Path(again.path).stat().st_ino == first  # not fetched again
    _pack_on_s3(s3_bucket, tmp_path, bump=1000)  # someone replaces it
    newer = PackedDataset(url, storage_options=options, local_cache_dir=local_dir)
    assert float(newer[7]["x"][0]) == 1007.0
    assert float(ds[7]["x"][0]) == 7.0  # the old map still reads its own copy


def test_a_pack_on_s3_is_read_by_dataloader_workers_in_another_process(s3_bucket, tmp_path):
    pytest.importorskip("torch")
    url, options = _pack_on_s3(s3_bucket, tmp_path)
    import json

    out = tmp_path / "read.json"
    reader = multiprocessing.get_context("spawn").Process(
        target=_read_in_workers, args=(url, options, str(tmp_path / "other-machine"), str(out))
    )
    reader.start()
    reader.join(300)
    assert reader.exitcode == 0
    assert json.loads(out.read_text()) == list(range(300))


# -- CachedDataset with its packs on S3 ---------------------------------------------------


def _squares_dataset():
    from mlcache.data import CachedDataset

    class RemoteSquares(CachedDataset):
        def __init__(self, n, log, **kw):
            self.n, self.log = n, log
            super().__init__(**kw)

        cache_on = ("n",)

        def load_source(self):
            _log(self.log)
            for i in range(self.n):
                yield {"x": np.full(10, i, dtype=np.int64), "i": i}

    return RemoteSquares


def _open_remote_squares(url, options, local_home, log, out):
    os.environ["XDG_CACHE_HOME"] = str(local_home)  # another machine's cache folder
    os.environ.pop("MLCACHE_DIR", None)
    cls = _squares_dataset()
    ds = cls(50, log, cache_dir=f"{url}/datasets", storage_options=options, progress=False)
    Path(out).write_text(str(sum(int(ds[i]["i"]) for i in range(len(ds)))))


def test_a_cached_dataset_on_s3_is_built_once_for_every_machine(s3_bucket, tmp_path):
    url, options = s3_bucket
    log = str(tmp_path / "builds")
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=_open_remote_squares,
            args=(url, options, tmp_path / f"machine{i}", log, str(tmp_path / f"out{i}")),
        )
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    assert Path(log).read_text().count("\n") == 1  # one machine built it
    assert {(tmp_path / f"out{i}").read_text() for i in range(3)} == {str(sum(range(50)))}


def test_a_pack_on_s3_can_be_read_by_ranges(s3_bucket, tmp_path):
    """fetch="ranges": a sparse local copy; each block is fetched when a read
    first touches it, and checked against its checksum like any block."""
    import s3fs

    from mlcache.data import PackedDataset, pack

    url, options = s3_bucket
    rows = ({"x": np.full(1000, i, dtype=np.float32), "i": i} for i in range(200))
    built = pack(rows, tmp_path / "r.pack", progress=False, block_size=4096)
    s3fs.S3FileSystem(**options).put_file(built.path, f"{url[5:]}/r.pack")
    local = tmp_path / "sparse"
    ds = PackedDataset(
        f"{url}/r.pack", storage_options=options, local_cache_dir=str(local), fetch="ranges"
    )
    assert float(ds[150]["x"][3]) == 150.0 and ds[150]["i"] == 150
    copy = next(local.glob("*.sparse"))
    size = copy.stat().st_size
    assert size == Path(built.path).stat().st_size
    assert copy.stat().st_blocks * 512 < size / 4  # most of it was never fetched
    for i in range(200):
        assert ds[i]["i"] == i and float(ds[i]["x"][0]) == float(i)
    ds.verify()
    again = PackedDataset(
        f"{url}/r.pack", storage_options=options, local_cache_dir=str(local), fetch="ranges"
    )
    assert again[199]["i"] == 199
    with pytest.raises(ValueError, match="fetch"):
        PackedDataset(f"{url}/r.pack", storage_options=options, fetch="some")


def _race(store, name, barrier, held_during):
    barrier.wait()
    with store.lock(name, 0) as held:
        if held:
            start = time.monotonic()
            time.sleep(0.5)  # hold it while the others try
            held_during.append((start, time.monotonic()))


@pytest.mark.parametrize("where", ["file", "s3"])
def test_one_holder_among_racing_takers_of_an_expired_lease(tmp_path, s3_bucket, where):
    """An expired lease (its holder died) and six threads taking it over at once:
    never two holders at a time (a numbered lease made by a conditional create).
    A thread the machine runs late may get the lease after the first released it."""
    import threading

    if where == "file":
        store = FsspecStore(f"file://{tmp_path}/shared", local_cache_dir=tmp_path / "l")
    else:
        url, options = s3_bucket
        store = FsspecStore(f"{url}/c", local_cache_dir=tmp_path / "l", **options)
    base = store.lease_path("f/v/k")
    assert store.leases.create(f"{base}.1", b'{"owner": "dead", "expires": 0}')
    assert not store.leases.create(f"{base}.1", b"again")  # a create never replaces
    barrier, held = threading.Barrier(6), []
    threads = [
        threading.Thread(target=_race, args=(store, "f/v/k", barrier, held)) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert held, "nobody took the expired lease over"
    spans = sorted(held)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans  # never overlap
    assert store.leases.numbers(base) == ()  # the holder removed its lease, and the dead one


def test_a_store_that_refuses_writes_does_not_block_a_miss(tmp_path, monkeypatch):
    """Read-only credentials: leasing fails at once (not a 600 s wait for a holder
    that is not there); the value is computed and returned."""
    store = FsspecStore("memory://ro-test/c", local_cache_dir=tmp_path / "l")

    def refuse(*a, **k):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(store.fs, "pipe_file", refuse)
    with pytest.raises(PermissionError), store.lock("f/v/k", 600):
        pass


class _Versions(dict):  # the source of a filled dataset: item -> version
    pass


def _filled_dataset():
    from mlcache.data import CachedDataset

    class RemoteRows(CachedDataset):
        """Filled item by item; a row's version says when it changed."""

        cache_ignore = ("versions", "loads")

        def __init__(self, versions, loads, **kw):
            self.versions, self.loads = versions, loads
            super().__init__(**kw)

        def source_items(self):
            return sorted(self.versions)

        def item_fingerprint(self, item):
            return self.versions[item]

        def load_item(self, item):
            self.loads.append(item)
            return {"x": np.full(4, item * 10 + self.versions[item], dtype=np.int64)}

    return RemoteRows


def test_a_filled_dataset_on_s3_is_published_sealed_and_refilled_item_by_item(
    s3_bucket, tmp_path, monkeypatch
):
    """A dataset filled item by item with a remote cache_dir: one machine loads every
    item up front and publishes the sealed pack; another machine loads nothing; after
    one item changes, the next machine loads that item alone and publishes again."""
    url, options = s3_bucket
    rows = _filled_dataset()
    versions = _Versions({i: 0 for i in range(20)})

    def machine(name):
        monkeypatch.setenv("MLCACHE_DIR", str(tmp_path / name))  # its own local copies
        loads = []
        ds = rows(versions, loads, cache_dir=f"{url}/datasets", storage_options=options)
        return [int(ds[i]["x"][0]) for i in range(len(ds))], loads

    expected = [i * 10 for i in range(20)]
    assert machine("a") == (expected, list(range(20)))
    assert machine("b") == (expected, [])
    versions[7] = 1
    assert machine("c") == ([*expected[:7], 71, *expected[8:]], [7])
    assert machine("d")[1] == []
