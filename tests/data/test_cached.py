"""CachedDataset, the synthetic patients, and PyTorch DataLoader workers."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mlcache import CacheWarning
from mlcache.data import CachedDataset, PackedDataset
from mlcache.demo.synthetic import VITALS, read_patient, write_patients

BUILDS: list[str] = []


class PatientSeries(CachedDataset):
    def __init__(self, root, **kw):
        self.root = str(root)
        super().__init__(**kw)

    def source_files(self):
        return sorted(Path(self.root).glob("*.csv"))

    def load_source(self):
        BUILDS.append(self.root)
        for path in self.source_files():
            yield read_patient(path)


@pytest.fixture
def source(tmp_path):
    write_patients(tmp_path / "src", 40, seed=3)
    BUILDS.clear()
    return tmp_path / "src"


def test_synthetic_patients_are_deterministic_and_parse(tmp_path):
    a = write_patients(tmp_path / "a", 5, seed=7)
    b = write_patients(tmp_path / "b", 5, seed=7)
    assert [p.read_text() for p in a] == [p.read_text() for p in b]
    j = write_patients(tmp_path / "j", 5, seed=7, fmt="json")
    for pa, pj in zip(a, j):
        sa, sj = read_patient(pa), read_patient(pj)
        assert sa["vitals"].shape[1] == len(VITALS) and sa["vitals"].dtype == np.float32
        np.testing.assert_allclose(sa["vitals"], sj["vitals"], atol=0.01)
        assert (sa["age"], sa["label"], sa["id"]) == (sj["age"], sj["label"], sj["id"])
    with pytest.raises(ValueError):
        write_patients(tmp_path / "x", 0)


def test_builds_once_then_opens(source, tmp_path):
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert len(ds) == 40 and [str(source)] == BUILDS
    first = read_patient(sorted(source.glob("*.csv"))[7])
    again = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert [str(source)] == BUILDS  # opened, not rebuilt
    np.testing.assert_array_equal(again[7]["vitals"], first["vitals"])
    assert again[7]["id"] == first["id"]
    PatientSeries(source, cache_dir=tmp_path / "cache", progress=False, force_recache=True)
    assert len(BUILDS) == 2


def test_a_changed_source_file_rebuilds(source, tmp_path):
    first = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    victim = sorted(source.glob("*.csv"))[0]
    text = victim.read_text().replace("# age: ", "# age: 1", 1)
    time.sleep(0.01)
    victim.write_text(text)
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert len(BUILDS) == 2
    assert ds[0]["age"] == read_patient(victim)["age"]
    # the first version is still open (first): it stays, readable, while it is read;
    # the pack of other arguments stays
    other = source.parent / "other"
    write_patients(other, 3, seed=4)
    PatientSeries(other, cache_dir=tmp_path / "cache", progress=False)
    packs = sorted(p.name for p in Path(ds.pack_path).parent.glob("*.pack"))
    assert len(packs) == 3 and {Path(ds.pack_path).name, Path(first.pack_path).name} < set(packs)
    assert first[1]["id"] == ds[1]["id"] and first[0]["age"] != ds[0]["age"]
    old = Path(first.pack_path)
    del first  # released: the next open of the dataset removes it
    gc.collect()
    again = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert len(BUILDS) == 3 and again.pack_path == ds.pack_path  # the third: other's
    packs = sorted(p.name for p in Path(ds.pack_path).parent.glob("*.pack"))
    assert len(packs) == 2 and old.name not in packs
    # a change met while another version is read: a rebuild, the old one goes at once
    time.sleep(0.01)  # a new modification time even on coarse clocks
    victim.write_text(text.replace("# age: 1", "# age: 2", 1))
    newest = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    packs = sorted(p.name for p in Path(ds.pack_path).parent.glob("*.pack"))
    assert Path(newest.pack_path).name in packs and Path(ds.pack_path).name in packs
    assert ds[1]["id"] == newest[1]["id"]  # the replaced pack is still readable while open


def test_a_changed_class_or_argument_rebuilds(source, tmp_path):
    PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)

    class Doubled(PatientSeries):
        def load_source(self):
            for sample in super().load_source():
                sample["age"] *= 2
                yield sample

    ds = Doubled(source, cache_dir=tmp_path / "cache", progress=False)
    assert len(BUILDS) == 2 and ds[0]["age"] % 2 == 0
    other = source.parent / "other"
    write_patients(other, 3, seed=4)
    assert len(PatientSeries(other, cache_dir=tmp_path / "cache", progress=False)) == 3


USER_MODULE = """
from pathlib import Path

from mlcache.data import CachedDataset
from mlcache.demo.synthetic import read_patient


class Patients(CachedDataset):
    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_files(self):
        return sorted(Path(self.root).glob("*.csv"))

    def load_source(self):
        print("BUILD")
        for path in self.source_files():
            sample = read_patient(path)
            sample["age"] = sample["age"] * 1
            yield sample
"""

USER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from userdata import Patients
ds = Patients(sys.argv[2], cache_dir=sys.argv[3], progress=False)
print("AGE", ds[0]["age"])
"""


def test_editing_the_class_in_its_file_rebuilds_and_a_comment_does_not(source, tmp_path):
    """A new process after each edit of the user's module, as in real use."""
    import subprocess

    module = tmp_path / "userdata.py"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

    def run(code: str) -> tuple[bool, int]:
        module.write_text(code)
        out = subprocess.run(
            [sys.executable, "-c", USER_SCRIPT, str(tmp_path), str(source), str(tmp_path / "c")],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        return "BUILD" in out, int(out.split("AGE ")[1])

    age = read_patient(sorted(source.glob("*.csv"))[0])["age"]
    assert run(USER_MODULE) == (True, age)
    assert run(USER_MODULE) == (False, age)
    commented = USER_MODULE.replace(
        "    def source_files", "    # a comment\n\n    def source_files"
    )
    assert run(commented) == (False, age)
    assert run(USER_MODULE.replace("* 1", "* 2")) == (True, 2 * age)


def test_a_damaged_pack_is_logged_and_rebuilt(source, tmp_path, caplog):
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    path = Path(ds.pack_path)
    path.write_bytes(path.read_bytes()[:100])
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="rebuilding it"),
    ):
        again = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert "rebuilding" in caplog.text and len(BUILDS) == 2 and len(again) == 40


def test_damage_met_while_reading_is_logged_and_rebuilt(source, tmp_path, caplog):
    """A block whose checksum fails at a read (not at open): the read rebuilds the
    pack and returns the right sample; the next open uses the rebuilt pack."""
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    want = read_patient(sorted(source.glob("*.csv"))[9])
    vitals = next(f for f in ds.packed.pack_index["fields"] if f["name"] == "vitals")
    with open(ds.pack_path, "r+b") as f:  # damage the data in place, after the open
        f.seek(vitals["data"]["off"] + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="checksum mismatch"),
    ):
        got = ds[9]
    assert "checksum mismatch" in caplog.text and "rebuilding" in caplog.text
    np.testing.assert_array_equal(got["vitals"], want["vitals"])
    assert len(BUILDS) == 2
    ds.packed.verify()
    PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    assert len(BUILDS) == 2


def test_transform_is_applied_on_read(source, tmp_path):
    ds = PatientSeries(
        source, cache_dir=tmp_path / "cache", progress=False, transform=lambda s: s["label"]
    )
    assert set(ds[i] for i in range(len(ds))) <= {0, 1}


def test_pickling_sends_no_samples(source, tmp_path):
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    data = pickle.dumps(ds)
    assert len(data) < 1000
    assert pickle.loads(data)[5]["id"] == ds[5]["id"]


def _open_in_child(args):
    source, cache = args
    ds = PatientSeries(source, cache_dir=cache, progress=False)
    return len(ds), os.getpid(), list(BUILDS)


def test_two_processes_build_once(source, tmp_path):
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        results = pool.map(_open_in_child, [(source, tmp_path / "cache")] * 3)
    assert all(n == 40 for n, _, _ in results)
    assert sum(len(builds) for _, _, builds in results) == 1  # one process built it


def _collate(batch):
    return batch


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize(
    ("method", "workers"), [(None, 0), ("fork", 2), ("fork", 4), ("spawn", 2), ("spawn", 4)]
)
@pytest.mark.parametrize("kind", ["packed", "cached"])
def test_dataloader_workers(source, tmp_path, method, workers, kind):
    """Every sample exactly once per epoch, each worker mapping the pack itself."""
    torch = pytest.importorskip("torch")
    ds = PatientSeries(source, cache_dir=tmp_path / "c", progress=False)
    if kind == "packed":
        ds = PackedDataset(ds.pack_path)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        collate_fn=_collate,
        multiprocessing_context=method,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(0),
    )
    for _epoch in range(2):
        seen = sorted(sample["id"] for batch in loader for sample in batch)
        assert seen == sorted(ds[i]["id"] for i in range(len(ds)))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_cached_dataset_in_forked_dataloader(source, tmp_path):
    torch = pytest.importorskip("torch")
    ds = PatientSeries(
        source, cache_dir=tmp_path / "c", progress=False, transform=lambda s: s["age"]
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2)
    ages = torch.cat(list(loader)).tolist()
    assert ages == [ds[i] for i in range(len(ds))]


class PatientFiles(CachedDataset):
    """The same data, loaded file by file (so it can use several processes)."""

    def __init__(self, root, **kw):
        self.root = str(root)
        super().__init__(**kw)

    def source_files(self):
        return sorted(Path(self.root).glob("*.csv"))

    def load_item(self, path):
        return read_patient(path)


def test_parallel_build_keeps_the_order(source, tmp_path):
    one = PatientFiles(source, cache_dir=tmp_path / "one", progress=False)
    two = PatientFiles(source, cache_dir=tmp_path / "two", progress=False, num_workers=2)
    assert len(one) == len(two) == 40
    for i in range(40):
        assert one[i]["id"] == two[i]["id"]
        np.testing.assert_array_equal(one[i]["vitals"], two[i]["vitals"])
    with pytest.raises(ValueError, match="num_workers"):
        PatientFiles(source, cache_dir=tmp_path / "x", num_workers=-1)


BUILD_IN_A_TERMINAL = """
import sys
sys.path.insert(0, sys.argv[1])
from test_cached import PatientFiles, PatientList
PatientFiles(sys.argv[2], cache_dir=sys.argv[3], progress=True, num_workers=2)
PatientList(sys.argv[2], cache_dir=sys.argv[3], progress=True)
"""


class PatientList(PatientSeries):
    """The same data, loaded into a list: its length is known before the build."""

    def load_source(self):
        return [read_patient(path) for path in self.source_files()]


@pytest.mark.skipif(sys.platform != "linux", reason="a pseudo-terminal")
def test_a_parallel_build_shows_progress_with_a_total(source, tmp_path):
    """On a terminal (a real pseudo-terminal here) the build shows the dataset's
    class name (not its pack's hash name), n/total, a rate and an ETA, whether the
    source is loaded by items (parallel) or is a list; off a terminal (CI logs)
    the bar stays quiet."""
    import fcntl
    import pty
    import re
    import struct
    import subprocess
    import termios

    main, follower = pty.openpty()
    # a fresh pseudo-terminal is 0 columns wide, where tqdm draws nothing
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    args = [str(Path(__file__).parent), str(source), str(tmp_path / "bar")]
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD_IN_A_TERMINAL, *args], stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(120) == 0
    os.close(main)
    err = b"".join(chunks).decode(errors="replace")
    assert "40/40" in err and "samples/s" in err
    for name in ("PatientFiles", "PatientList"):  # label, total, elapsed<remaining
        assert re.search(name + r": 100%.*40/40 \[\d\d:\d\d<\d\d:\d\d", err), err
    assert ".pack" not in err
    quiet = subprocess.run(
        [sys.executable, "-c", BUILD_IN_A_TERMINAL, *args[:2], str(tmp_path / "quiet")],
        capture_output=True,
        text=True,
    )
    assert quiet.returncode == 0 and "40/40" not in quiet.stderr


def test_a_class_without_a_source_says_so(tmp_path):
    class Nothing(CachedDataset):
        pass

    with pytest.raises(NotImplementedError, match="must define load_source"):
        Nothing(cache_dir=tmp_path, progress=False)


def test_a_database_source(tmp_path):
    import sqlite3

    from mlcache.data import from_sql

    db = tmp_path / "h.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE adm (id TEXT, age INTEGER, los REAL, label INTEGER)")
        con.executemany(
            "INSERT INTO adm VALUES (?, ?, ?, ?)",
            [(f"a{i}", 20 + i, 1.5 * i, i % 2) for i in range(30)],
        )
    con.close()

    class Admissions(CachedDataset):
        def __init__(self, db, version, **kw):
            self.db, self.version = str(db), version
            super().__init__(**kw)

        def query(self):
            con = sqlite3.connect(self.db)
            return from_sql("SELECT * FROM adm WHERE age >= ?", con, (25,), data_version="v1")

        def load_source(self):
            BUILDS.append("sql")
            return self.query()

        def source_fingerprint(self):
            return self.query().fingerprint()

    BUILDS.clear()
    ds = Admissions(db, 1, cache_dir=tmp_path / "c", progress=False)
    assert len(ds) == 25 and ds[0] == {"id": "a5", "age": 25, "los": 7.5, "label": 1}
    Admissions(db, 1, cache_dir=tmp_path / "c", progress=False)
    assert BUILDS == ["sql"]
    a = from_sql("SELECT 1", sqlite3.connect(db), data_version="v1").fingerprint()
    b = from_sql("SELECT 1", sqlite3.connect(db), data_version="v2").fingerprint()
    assert a != b
    with pytest.raises(TypeError):
        from_sql("SELECT 1", object())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_tensors_are_the_packs_samples_private_to_each_read(source, tmp_path, method):
    pytest.importorskip("torch")
    from mlcache.torch import TorchDataset

    ds = PatientSeries(source, cache_dir=tmp_path / "c", progress=False)
    tds = TorchDataset(ds)
    sample = tds[3]
    import torch

    assert isinstance(sample["vitals"], torch.Tensor) and sample["id"] == ds[3]["id"]
    torch.testing.assert_close(sample["vitals"], torch.from_numpy(ds[3]["vitals"]))
    sample["vitals"] += 1  # in place: private to this read (issue 13)
    assert not torch.equal(sample["vitals"], torch.from_numpy(ds[3]["vitals"]))
    loader = torch.utils.data.DataLoader(
        tds, batch_size=None, num_workers=2, multiprocessing_context=method
    )
    ids = [s["id"] for s in loader]
    assert ids == [ds[i]["id"] for i in range(len(ds))]


def test_a_fresh_worker_meeting_a_damaged_header_rebuilds(source, tmp_path):
    ds = PatientSeries(source, cache_dir=tmp_path / "cache", progress=False)
    worker = pickle.loads(pickle.dumps(ds))  # as a DataLoader worker gets it: not yet opened
    path = Path(ds.pack_path)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # the header
    path.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="rebuilding it"):
        sample = worker[3]
    assert sample["id"] == read_patient(sorted(source.glob("*.csv"))[3])["id"]
    assert len(BUILDS) == 2


def test_torch_tensor_dataset_is_a_deprecated_alias_that_warns_once(monkeypatch):
    pytest.importorskip("torch")
    import mlcache.torch as mtorch

    monkeypatch.setattr(mtorch, "_warned_tensor_dataset", False)
    with pytest.warns(DeprecationWarning, match="TorchDataset"):
        from mlcache.torch import TensorDataset
    assert TensorDataset is mtorch.TorchDataset
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mtorch.TensorDataset is mtorch.TorchDataset  # once: no second warning
    with pytest.raises(AttributeError):
        mtorch.NoSuchName  # noqa: B018


class _LateRoot(CachedDataset):
    def __init__(self, root, **kw):
        super().__init__(**kw)
        self.root = root  # too late: opening read it

    def source_files(self):
        return sorted(Path(self.root).glob("*.txt"))

    def load_source(self):
        for p in self.source_files():
            yield {"t": p.read_text()}


def test_an_attribute_set_after_super_init_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(
        AttributeError, match=r"_LateRoot\.root is not set .*before calling super"
    ) as e:
        _LateRoot(str(tmp_path), cache_dir=tmp_path / "c", progress=False)
    assert e.value.name == "root" and isinstance(e.value.__cause__, AttributeError)
