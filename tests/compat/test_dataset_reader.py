"""The pack reader, the PyTorch adapter and sharded packs as users really run them
(issue 13).

Each case is what a training job does: in-place normalisation of the samples a
DataLoader hands it, spawn DataLoader workers while a second job rebuilds the
pack, a pack copied over or truncated under an open reader, a sharded pack
re-packed (or interrupted) while a reader is using it. Anything that could crash
the interpreter (SIGSEGV, SIGBUS) runs in a fresh process: a crash shows as a
failing return code, never as a dead pytest.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlcache.data import PackCorrupted, PackedDataset, ShardedDataset, open_pack, pack
from mlcache.errors import PackChanged

#: a "large" array: well above the size from which a read maps its pages privately
BIG = 300_000


def _run(script: str, *args: str, cwd: Path | None = None, timeout: float = 240) -> str:
    """Run ``script`` as a file (spawn workers re-import it) in a fresh interpreter,
    warnings as errors; its return code must be 0 (a signal is a negative code)."""
    folder = cwd or Path(os.environ.get("TMPDIR", "/tmp"))
    path = folder / f"job_{abs(hash(script)) % 10**8}.py"
    path.write_text(textwrap.dedent(script))
    res = subprocess.run(
        [sys.executable, "-W", "error", str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(folder),
    )
    if res.returncode < 0:
        pytest.fail(f"killed by {signal.Signals(-res.returncode).name}:\n{res.stderr[-3000:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def samples(n: int, gen: int = 1, big: bool = True):
    for i in range(n):
        s = {
            "x": np.full((4, 8), i, dtype=np.float32),
            "tokens": np.arange(i % 7 + 1, dtype=np.int64),
            "i": i,
            "gen": gen,
        }
        if big:
            s["big"] = np.full(BIG, i % 200, dtype=np.uint8)
        yield s


# -- 1. in-place operations -------------------------------------------------------------

IN_PLACE = """
import sys
from pathlib import Path
import numpy as np
import torch
from mlcache.data import PackedDataset, ShardedDataset, pack
from mlcache.torch import TorchDataset

def samples(n):
    for i in range(n):
        yield {
            "x": np.full((4, 8), i, dtype=np.float32),
            "tokens": np.arange(i % 7 + 1, dtype=np.int64),
            "big": np.full(300_000, i % 200, dtype=np.uint8),
            "i": i,
        }

def normalise(s):
    # what training code does to the samples it is handed
    s["x"] /= 255
    s["tokens"] += 1
    s["big"] += 1

def right(s, i):
    return (
        float(s["x"].max()) == float(i) and int(s["tokens"][0]) == 0
        and int(s["big"][0]) == i % 200 and len(s["tokens"]) == i % 7 + 1
    )

def epochs(loader, n):
    for epoch in range(2):
        seen = 0
        for s in loader:
            i = int(s["i"])
            assert right(s, i), f"epoch {epoch}: sample {i} came back modified"
            normalise(s)
            assert abs(float(s["x"].max()) - i / 255) < 1e-6  # the write took
            seen += 1
        assert seen == n

if __name__ == "__main__":
    where, workers = sys.argv[1], int(sys.argv[2])
    kind = sys.argv[3]
    if kind == "sharded":
        ds = pack(samples(24), where + "/d.shards", shard_size="2MB", progress=False)
    else:
        ds = pack(samples(24), where + "/d.pack", progress=False)
    before = Path(ds.path).read_bytes() if kind == "packed" else None
    kw = dict(num_workers=workers)
    if workers:
        kw.update(multiprocessing_context="spawn", persistent_workers=True)
    if kind == "tensors":
        epochs(torch.utils.data.DataLoader(TorchDataset(ds), batch_size=None, **kw), 24)
        t = TorchDataset(ds)
        for _ in range(2):
            s = t[5]
            assert isinstance(s["x"], torch.Tensor) and right(s, 5)
            normalise(s)
    else:
        epochs(torch.utils.data.DataLoader(ds, batch_size=None, **kw), 24)
    for _ in range(2):  # plain numpy reads
        s = ds[7]
        assert right(s, 7)
        normalise(s)
    if before is not None:
        assert Path(ds.path).read_bytes() == before, "the pack file changed"
    print("ok")
"""


@pytest.mark.parametrize(
    ("kind", "workers"),
    [("packed", 0), ("tensors", 0), ("sharded", 0), ("packed", 2), ("tensors", 2)],
)
def test_in_place_operations_work_and_never_reach_the_next_epoch(tmp_path, kind, workers):
    """``s["x"] /= 255`` on what a DataLoader (``batch_size=None``) or
    ``TorchDataset`` hands out works, in numpy too, without a warning, and the
    sample is right again in the next epoch; the pack file is untouched."""
    out = _run(IN_PLACE, str(tmp_path), str(workers), kind, cwd=tmp_path)
    assert out.strip() == "ok"


def test_private_samples_stay_zero_copy_until_written(tmp_path):
    """A large array is a private copy-on-write map of the pack's pages: no copy is
    made until a page is written, and writing one leaves every other read alone."""
    ds = pack(samples(6), tmp_path / "d.pack", progress=False)
    a, b = ds[2], ds[2]
    assert a["big"].flags.writeable and not a["big"].flags.owndata
    a["big"][:10] = 255
    assert int(b["big"][0]) == 2 and int(ds[2]["big"][0]) == 2
    batch = ds.get_batch([1, 2])
    batch["tokens"][1] += 5
    assert ds[2]["tokens"].tolist() == [0, 1, 2]


def test_read_only_views_on_request(tmp_path):
    """``writable=False``: the read-only zero-copy views of before (the fastest
    read); numpy refuses an in-place operation cleanly. Kept by pickling."""
    pack(samples(4), tmp_path / "d.pack", progress=False)
    ds = PackedDataset(tmp_path / "d.pack", writable=False)
    for copy in (ds, pickle.loads(pickle.dumps(ds))):
        s = copy[1]
        assert not s["x"].flags.writeable and not s["big"].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            s["x"] /= 255


# -- 2. workers read the pack the dataset opened --------------------------------------

WORKERS = """
import json, os, sys
import numpy as np
import torch
from mlcache.data import CachedDataset, PackedDataset, pack

def samples(n, gen):
    for i in range(n):
        yield {"x": np.full(3, i, dtype=np.float32), "i": i, "gen": gen}

class Job(CachedDataset):
    # the samples come from a JSON file whose changes the fingerprint leaves out,
    # so that a rebuild with force_recache=True writes the same pack name
    def __init__(self, source, **kw):
        self.source = source
        super().__init__(**kw)

    def source_fingerprint(self):
        return "fixed"

    def load_source(self):
        with open(self.source) as f:
            spec = json.load(f)
        return samples(spec["n"], spec["gen"])

def collate(batch):
    return [(int(s["i"]), int(s["gen"])) for s in batch]

def epoch(ds):
    loader = torch.utils.data.DataLoader(
        ds, batch_size=5, num_workers=2, multiprocessing_context="spawn", collate_fn=collate
    )
    return sorted(pair for batch in loader for pair in batch)

if __name__ == "__main__":
    where, kind = sys.argv[1], sys.argv[2]
    source = os.path.join(where, "source.json")
    if kind == "rebuild":  # the second job
        with open(source, "w") as f:
            json.dump({"n": 25, "gen": 2}, f)
        Job(source, cache_dir=os.path.join(where, "c"), progress=False, force_recache=True)
        sys.exit(0)
    if kind == "packed":
        ds = pack(samples(40, 1), os.path.join(where, "d.pack"), progress=False)
    else:
        with open(source, "w") as f:
            json.dump({"n": 40, "gen": 1}, f)
        ds = Job(source, cache_dir=os.path.join(where, "c"), progress=False)
    first = epoch(ds)
    assert first == [(i, 1) for i in range(40)], first
    if kind == "packed":  # another job packs to the same path: fewer, other samples
        pack(samples(25, 2), os.path.join(where, "d.pack"), progress=False)
    else:
        import subprocess
        subprocess.run([sys.executable, "-W", "error", __file__, where, "rebuild"], check=True)
        assert Job(source, cache_dir=os.path.join(where, "c"), progress=False)[0]["gen"] == 2
    second = epoch(ds)
    assert second == first, f"the workers mixed in another pack: {second}"
    assert len(ds) == 40 and ds[39]["gen"] == 1
    print("ok")
"""


@pytest.mark.parametrize("kind", ["packed", "cached"])
def test_spawn_workers_read_the_pack_the_dataset_opened(tmp_path, kind):
    """A second job rebuilds the pack (``pack()`` to the same path, or
    ``force_recache=True``) between two epochs: the spawn workers of the first
    job keep serving the pack it opened, with its length."""
    assert _run(WORKERS, str(tmp_path), kind, cwd=tmp_path).strip() == "ok"


def test_a_pickled_dataset_refuses_another_pack_at_its_path(tmp_path):
    """Outside a worker start (a pickle sent elsewhere), a dataset travels by path:
    reopened on a pack rebuilt since, it refuses, naming the file."""
    path = tmp_path / "d.pack"
    ds = pack(samples(10, big=False), path, progress=False)
    blob = pickle.dumps(ds)
    assert pickle.loads(blob)[3]["i"] == 3  # the same pack: fine
    pack(samples(10, gen=2, big=False), path, progress=False)
    with pytest.raises(PackChanged, match="d.pack"):
        pickle.loads(blob)
    assert ds[3]["gen"] == 1  # the opened dataset keeps its own file


# -- 3. a pack changed under an open reader ------------------------------------------


def _flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_byte_flipped_in_a_checked_block_is_not_served(tmp_path):
    """All blocks verified, then a byte of sample 5 flipped in place: the next
    epoch notices the file changed and verifies again; the sample raises, every
    other one is still right."""
    ds = pack(samples(20, big=False), tmp_path / "d.pack", progress=False, block_size=256)
    for i in range(len(ds)):
        ds[i]
    region = ds._fields[0].regions["data"]
    _flip(tmp_path / "d.pack", region.off + 5 * 128 + 3)
    len(ds)  # what a sampler does at the start of each epoch
    with pytest.raises(PackCorrupted, match="d.pack"):
        ds[5]
    for i in (0, 1, 19):
        assert float(ds[i]["x"][0, 0]) == i


def _same_size_other(tmp_path: Path, path: Path) -> PackedDataset:
    """Another pack of 20 samples (other values) of exactly the size of ``path``."""
    for gen in range(2, 200):
        other = pack(samples(20, gen=gen, big=False), tmp_path / "o.pack", progress=False)
        if os.path.getsize(other.path) == os.path.getsize(path):
            return other
    raise AssertionError("no pack of the same size")


def test_a_same_size_copy_onto_an_open_pack_is_refused(tmp_path):
    """``cp other.pack d.pack`` (same size, same inode, other samples): the next
    epoch raises PackChanged naming the file, never serves the other samples."""
    path = tmp_path / "d.pack"
    ds = pack(samples(20, big=False), path, progress=False)
    other = _same_size_other(tmp_path, path)
    ds[3]
    shutil.copyfile(other.path, path)
    with pytest.raises(PackChanged, match="d.pack"):
        for s in ds:  # iter starts an epoch too
            assert s["gen"] == 1
    with pytest.raises(PackChanged, match="rewritten in place"):
        ds[4]


def test_reads_notice_a_change_within_the_check_interval(tmp_path):
    """With no epoch boundary at all, a read loop notices the change in place
    within ``CHECK_EVERY`` reads (before that, a shared map shows the new bytes:
    the documented limit of an mmap reader)."""
    from mlcache.data.reader import CHECK_EVERY

    path = tmp_path / "d.pack"
    ds = pack(samples(20, big=False), path, progress=False)
    other = _same_size_other(tmp_path, path)
    ds[0]
    shutil.copyfile(other.path, path)
    reads = 0
    with pytest.raises(PackChanged):
        for k in range(10_000):
            ds[k % 20]
            reads += 1
    assert reads < CHECK_EVERY


TRUNCATED = """
import os, shutil, sys
import numpy as np
from mlcache.data import PackCorrupted, PackedDataset, pack
from mlcache.data.reader import PackChanged

where, how = sys.argv[1], sys.argv[2]
path = os.path.join(where, "d.pack")
ds = pack(({"x": np.full(300_000, i % 200, np.uint8), "y": np.full(5, i, np.float32)}
           for i in range(40)), path, progress=False)
ds[0]
if how == "truncate":
    os.truncate(path, os.path.getsize(path) // 3)
else:  # a smaller pack copied over it
    small = pack(({"x": np.zeros(10, np.uint8), "y": np.zeros(5, np.float32)}
                  for i in range(3)), os.path.join(where, "s.pack"), progress=False)
    shutil.copyfile(small.path, path)
for read in (lambda: ds[39]["x"].sum(), lambda: (len(ds), ds[38]["y"].sum())):
    try:
        read()
    except PackChanged as exc:
        assert "d.pack" in str(exc), exc
    else:
        raise SystemExit("a read of the truncated pack returned")
print("ok")
"""


@pytest.mark.parametrize("how", ["truncate", "smaller copy"])
def test_a_truncated_pack_raises_instead_of_sigbus(tmp_path, how):
    assert _run(TRUNCATED, str(tmp_path), how, cwd=tmp_path).strip() == "ok"


WORKER_START = """
import os, sys
import numpy as np
import torch
from mlcache.data import PackCorrupted, pack

if __name__ == "__main__":
    path = os.path.join(sys.argv[1], "d.pack")
    ds = pack(({"x": np.full(300_000, i % 200, np.uint8)} for i in range(20)), path,
              progress=False)
    ds[0]
    os.truncate(path, os.path.getsize(path) // 3)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=sys.argv[2]
    )
    try:
        for s in loader:
            pass
    except PackCorrupted as exc:
        assert "d.pack" in str(exc), exc
        print("ok")
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_worker_started_on_a_truncated_pack_reports_it(tmp_path, context):
    """The workers get the open file (spawn and forkserver alike), find it
    truncated, and the DataLoader raises the error naming the file."""
    assert _run(WORKER_START, str(tmp_path), context, cwd=tmp_path).strip() == "ok"


# -- 4. sharded packs ----------------------------------------------------------------


def _shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".pack"))


def test_an_interrupted_repack_keeps_the_previous_sharded_pack(tmp_path):
    path = tmp_path / "d.shards"
    pack(samples(60, big=False), path, shard_size="2KB", progress=False)

    def failing():
        for i, s in enumerate(samples(60, gen=2, big=False)):
            if i == 45:
                raise RuntimeError("the loader failed")
            yield s

    with pytest.raises(RuntimeError, match="loader failed"):
        pack(failing(), path, shard_size="2KB", progress=False)
    ds = open_pack(path)
    assert len(ds) == 60
    assert [ds[i]["gen"] for i in range(60)] == [1] * 60
    assert [ds[i]["i"] for i in range(60)] == list(range(60))


def test_a_repack_leaves_a_live_reader_its_samples_and_no_orphans(tmp_path):
    path = tmp_path / "d.shards"
    ds = pack(samples(60, big=False), path, shard_size="2KB", progress=False)
    ds[0]  # opens the first shard only
    worker = pickle.loads(pickle.dumps(ds))  # as a worker holds it
    new = pack(samples(20, gen=2, big=False), path, shard_size="2KB", progress=False)
    assert len(new) == 20 and new[19]["gen"] == 2
    for reader in (ds, worker):
        assert len(reader) == 60
        assert [reader[i]["gen"] for i in range(60)] == [1] * 60
    assert len(open_pack(path)) == 20
    # the old shards stay while a reader holds them, and go at the next build after
    del ds, worker, reader, new
    import gc

    gc.collect()
    pack(samples(20, gen=3, big=False), path, shard_size="2KB", progress=False)
    fresh = ShardedDataset(path)
    assert _shard_files(tmp_path) == sorted(fresh._names)
    assert [fresh[i]["gen"] for i in range(20)] == [3] * 20


HOLDER = """
import sys, time
from mlcache.data import open_pack
ds = open_pack(sys.argv[1])
ds[0]
print("open", flush=True)
time.sleep(120)
"""


def test_old_shards_are_kept_while_another_process_reads_them(tmp_path):
    path = tmp_path / "d.shards"
    pack(samples(30, big=False), path, shard_size="2KB", progress=False)
    old = set(_shard_files(tmp_path))
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        pack(samples(10, gen=2, big=False), path, shard_size="2KB", progress=False)
        assert old <= set(_shard_files(tmp_path))  # still read by the holder
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    pack(samples(10, gen=3, big=False), path, shard_size="2KB", progress=False)
    assert not old & set(_shard_files(tmp_path))


def test_spawn_workers_of_a_sharded_pack_keep_its_build(tmp_path):
    out = _run(
        WORKERS.replace('"d.pack"', '"d.shards"')
        .replace("progress=False)", 'progress=False, shard_size="200B")')
        .replace('kind == "packed"', 'kind in ("packed", "sharded")'),
        str(tmp_path),
        "sharded",
        cwd=tmp_path,
    )
    assert out.strip() == "ok"
