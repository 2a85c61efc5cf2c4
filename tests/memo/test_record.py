"""The record of a code folder's small entries (mlcache.memo.record): the next run
serves its first hits from it, and never a value its entry file no longer holds.

Each run is a fresh interpreter (tests/scripts.py); ``run.py`` counts the entry
files it reads (the tier's ``EntryReader``) and logs what it computes."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from mlcache import Memory
from mlcache.entry.reader import SETTLED_NS, read_info
from mlcache.memo import record
from scripts import ScriptFolder

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the tier is on on POSIX only")

N = 6

WORK = """
import os
import numpy as np

def small(a, b):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{a} ")
    offset = int(os.environ.get("OFFSET", "0"))
    return {"sum": a + b + offset, "pair": [a, (b,)], "arr": np.arange(a, dtype="f4")}
"""

RUN = f"""
import json, os, sys
from mlcache import Memory
from mlcache.memo import tier as T

reads = []

class Counting(T.EntryReader):
    def __init__(self, path, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        reads.append(os.path.basename(str(path)))  # read and checked

T.EntryReader = Counting
if os.environ.get("NO_WRITES"):  # a cache folder this process cannot write to
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    import mlcache.memo.record as R
    R.write_bytes_atomic = refused
if os.environ.get("NFS"):  # the cache on a network file system (its mount type)
    import mlcache._util as U
    U._FS_TYPES[os.stat(os.environ["CACHE"]).st_dev] = "nfs4"
import work
secret = os.environ.get("SECRET", "k" * 32)
mem = Memory(os.environ["CACHE"], verbose=0, secret=secret if secret != "off" else False,
             allow_pickle=not os.environ.get("NO_PICKLE"))
f = mem.cache(work.small)
if sys.argv[1:] == ["clear"]:
    f.clear(warn=False)
values = [f(i, i + 1) for i in (range({N}) if sys.argv[1:] != ["2"] else [2])]
print(json.dumps({{"reads": len(reads),
                  "values": [[v["sum"], v["pair"], v["arr"].tolist()] for v in values],
                  "read": reads}}))
"""


def expected(offset: int = 0, changed: int | None = None) -> list[list[object]]:
    return [
        [2 * i + 1 + (offset if i == changed or changed is None else 0), [i, [i + 1]],
         list(map(float, range(i)))]
        for i in range(N)
    ]  # fmt: skip


class Runs(ScriptFolder):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.write("work.py", WORK)
        self.write("run.py", RUN)

    def run(self, *args: str, **env: str) -> dict[str, object]:
        res = self.execute("run.py", *args, env=env)
        out: dict[str, object] = json.loads(res.stdout)
        out["computed"] = [int(w) for w in self.logged()]
        out["stderr"] = res.stderr
        return out

    def settle(self) -> None:
        """Past the time a freshly written entry must wait to be kept (tier)."""
        time.sleep(SETTLED_NS / 1e9 + 0.02)

    def records(self) -> list[Path]:
        return sorted(self.cache.glob("*/*/" + record.NAME))

    def entry(self, i: int) -> Path:
        """The entry file of ``small(i, i + 1)``."""
        for path in self.cache.glob("*/*/" + "[0-9a-f]" * 32):
            if read_info(str(path))["input_args"]["a"] == str(i):
                return path
        raise AssertionError(f"no entry for {i}")


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    r = Runs(tmp_path)
    assert r.run()["computed"] == list(range(N))  # the first run computes
    r.settle()
    second = r.run()  # reads every entry file, and writes the record
    assert second["computed"] == [] and second["reads"] == N
    assert len(r.records()) == 1
    return r


@pytest.mark.parametrize(
    "env", [{}, {"NO_PICKLE": "1"}, {"SECRET": "off"}], ids=["signed", "no pickle", "unsigned"]
)
def test_the_next_run_serves_its_first_hits_from_the_record(tmp_path, env):
    runs = Runs(tmp_path)
    runs.run(**env)
    runs.settle()
    assert runs.run(**env)["reads"] == N
    for _ in range(2):  # the touch of the run before is carried over
        got = runs.run(**env)
        assert got["values"] == expected()
        assert got["reads"] == 0 and got["computed"] == [] and got["stderr"] == ""


@pytest.mark.parametrize("how", ["evicted", "rewritten", "corrupted"])
def test_an_entry_changed_after_the_record_is_not_served_from_it(runs, how):
    path = runs.entry(2)
    if how == "evicted":  # what eviction, `prune` and `verify --fix` do
        path.unlink()
    elif how == "rewritten":  # computed again (another value: a hidden input) by a
        path.unlink()  # run that leaves the record as it was
        assert runs.run("2", OFFSET="100", NO_WRITES="1")["computed"] == [2]
    else:  # a byte of the value flipped in place, its mtime restored
        st = path.stat()
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01
        path.write_bytes(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = runs.run(OFFSET="100")  # a computation here would show
    assert got["values"] == expected(100, changed=2)
    # the changed entry: read (a new file) or computed again; the others: recorded
    assert got["reads"] == (1 if how == "rewritten" else 0)
    assert got["computed"] == ([] if how == "rewritten" else [2])


def test_a_cleared_function_is_not_served_from_its_record(runs):
    got = runs.run("clear")
    assert got["values"] == expected() and got["computed"] == list(range(N))


@pytest.mark.parametrize("damage", ["torn", "flipped", "another key", "unsigned"])
def test_a_torn_damaged_or_forged_record_is_not_used_and_is_replaced(runs, damage):
    (path,) = runs.records()
    if damage == "torn":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "flipped":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    else:  # rows of other values, written by someone without the readers' key
        signer = Memory(runs.cache, verbose=0, secret="k" * 32).context.signer
        found = record.load(str(path.parent), signer)
        assert found is not None and len(found) == N
        forged = {
            key: (ident, codec, info, record.freeze({"sum": -1, "pair": [0, [0]], "arr": []}))
            for key, (ident, codec, info, _) in found.rest().items()
        }
        other = Memory(runs.cache, verbose=0, secret="another key").context.signer
        path.write_bytes(record.pack(forged, other if damage == "another key" else None))
    got = runs.run()
    assert got["reads"] == N and got["values"] == expected() and got["computed"] == []
    assert got["stderr"] == ""
    assert runs.run()["reads"] == 0  # the run before wrote it again


def test_a_network_file_system_has_no_records(runs):
    # a stat there may come from the client's attribute cache (NFS: up to acregmax)
    # while another machine recomputed the entry: the record is neither used...
    (path,) = runs.records()
    written = path.stat().st_mtime_ns
    got = runs.run(NFS="1")
    assert got["values"] == expected() and got["reads"] == N and got["stderr"] == ""
    assert path.stat().st_mtime_ns == written  # ...nor written
    path.unlink()
    runs.run(NFS="1")
    assert runs.records() == []


def test_a_cache_folder_that_cannot_be_written_is_read_without_a_warning(tmp_path):
    runs = Runs(tmp_path)
    runs.run()
    runs.settle()
    for _ in range(2):
        got = runs.run(NO_WRITES="1")
        assert got["values"] == expected() and got["reads"] == N
        assert got["stderr"] == ""
    assert runs.records() == []


# -- the value's bytes ------------------------------------------------------------
def test_a_row_loads_plain_values_and_arrays_of_numbers_only():
    value = {"a": [1, 2.5, None, True], "b": (b"x", "y"), "c": {3, 4}, "m": np.eye(2, order="F")}
    got = record.thaw(record.freeze(value))
    assert got["a"] == value["a"] and got["b"] == value["b"] and got["c"] == value["c"]
    assert np.array_equal(got["m"], value["m"]) and got["m"].flags.writeable
    for other in (np.float64(1.0), np.array([object()]), {"k": complex(1, 2)}, object()):
        assert record.freeze(other) is None  # needs a global: its entry is read
    with pytest.raises(pickle.UnpicklingError):
        record.thaw(pickle.dumps(os.getcwd))
    with pytest.raises(pickle.UnpicklingError):
        record.thaw(pickle.dumps(eval))


# -- the last-use touch ---------------------------------------------------------
RACE = """
import json, os, sys
from mlcache import Memory
import work

mem = Memory(os.environ["CACHE"], verbose=0, secret="k" * 32)
f = mem.cache(work.small)
path, other = sys.argv[1], sys.argv[2]
if os.environ.get("KEPT"):  # served from what this process keeps, not from a record
    os.unlink(os.path.join(os.path.dirname(path), "record"))
first = f(2, 3)["sum"]
with open(other, "rb") as src:
    recomputed = src.read()
real = mem.store.touch
reused = []

def touch(names):
    # while this process touches: another evicts the entry and computes it again
    # (another value, the same size), its new file made right after the unlink,
    # when the freed inode is the one a file system like ext4 hands out next
    ino = os.stat(path).st_ino
    os.unlink(path)
    with open(path + ".new", "wb") as out:
        out.write(recomputed)
    reused.append(os.stat(path + ".new").st_ino == ino)
    os.rename(path + ".new", path)
    real(names)

mem.store.touch = touch
mem.flush_usage()
mem.store.touch = real
print(json.dumps({"first": first, "next": f(2, 3)["sum"], "reused": reused}))
"""


@pytest.mark.parametrize("served", ["record", "kept"])
def test_an_entry_computed_again_during_the_touch_is_never_served_old(runs, served, tmp_path):
    path = runs.entry(2)
    # the other value's file, computed in a copy of the cache (the record untouched)
    other = tmp_path / "other"
    shutil.copytree(runs.cache, other)
    (other / path.relative_to(runs.cache)).unlink()
    got = runs.run("2", OFFSET="3", NO_WRITES="1", CACHE=str(other))
    assert got["computed"] == [2]
    recomputed = other / path.relative_to(runs.cache)
    assert recomputed.stat().st_size == path.stat().st_size  # what hides it from a stat
    runs.write("race.py", RACE)
    env = {"KEPT": "1"} if served == "kept" else {}
    race = json.loads(runs.execute("race.py", str(path), str(recomputed), env=env).stdout)
    assert race["first"] == 5
    assert race["next"] == 8  # the file's value, in this process
    for _ in range(2):  # and in each next run
        assert runs.run()["values"] == expected(3, changed=2)


# -- what a row may hold ----------------------------------------------------------
BIG = """
import json, os, sys
import numpy as np
from mlcache import Memory
from mlcache.memo import record
from mlcache.memo.tier import tier

def value(n):
    return np.zeros(n) if n > 10 else {"n": n}

mem = Memory(os.environ["CACHE"], verbose=0, compress=("bz2", 9))
f = mem.cache(value)
got = [f(n) for n in (1, 2, 3, 400_000)]  # the big one (3.2 MB in a file of ~100 bytes) last
mem.flush_usage()
(folder,) = {os.path.dirname(p) for p in tier._kept} or {""}
found = record.load(folder, mem.context.signer) if folder else None
print(json.dumps({"kept": tier._bytes, "rows": len(found) if found else 0,
                  "values": [v["n"] if isinstance(v, dict) else v.shape[0] for v in got]}))
"""


def test_a_value_larger_than_a_row_is_not_kept_and_leaves_the_others_recorded(tmp_path):
    runs = Runs(tmp_path)
    runs.write("big.py", BIG)
    runs.execute("big.py")  # computes
    runs.settle()
    got = json.loads(runs.execute("big.py").stdout)  # reads, keeps, records
    assert got["values"] == [1, 2, 3, 400_000]
    # the small ones are recorded; the big one is neither kept (its 3.2 MB are not
    # the size of its file) nor recorded, nor does it push the small ones out
    assert got["rows"] == 3
    assert 0 < got["kept"] < 3 * 4096


@pytest.mark.parametrize("planted", ["record", "entry"])
def test_a_fifo_planted_in_a_code_folder_does_not_hang_a_hit(runs, planted):
    # whoever can write the cache folder: a hit must not wait for a fifo's writer
    path = runs.records()[0] if planted == "record" else runs.entry(2)
    path.unlink()
    os.mkfifo(path)
    got = runs.run()
    assert got["values"] == expected()
    # the entry: a damaged file, computed again; the record: the files are read
    assert got["computed"] == ([2] if planted == "entry" else [])
    assert got["reads"] == (0 if planted == "entry" else N)  # the others: recorded


FLUSHES = """
import os
from mlcache import Memory
from mlcache.memo import usage
import work

usage.FLUSH_SECONDS = -1.0  # every hit flushes on its way, as a busy process does
mem = Memory(os.environ["CACHE"], verbose=0, secret="k" * 32)
f = mem.cache(work.small)
record = os.path.join(os.path.dirname(os.environ["ENTRY"]), "record")
def written():  # a new file by rename: its inode may be the old one's, freed
    st = os.stat(record)
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns

before = written()
for i in range(6):
    f(i, i + 1)
print(written() == before)
"""


def test_a_flush_on_a_hits_path_does_not_rewrite_a_record_for_touches_only(runs):
    runs.write("flushes.py", FLUSHES)
    out = runs.execute("flushes.py", env={"ENTRY": str(runs.entry(0))}).stdout
    assert out.split() == ["True"]  # not rewritten while hitting...
    assert runs.run()["reads"] == 0  # ...but at exit, with the touches carried over


CLEARED = """
import json, os, time
from mlcache import Memory
from mlcache.entry.reader import SETTLED_NS
import work

def other(x):
    return x

mem = Memory(os.environ["CACHE"], verbose=0, secret="k" * 32)
f, g = mem.cache(work.small), mem.cache(other)
folder = os.path.dirname(os.environ["ENTRY"])
os.unlink(os.path.join(folder, "record"))
f(0, 1)  # read and kept: its folder's record is to be written
g(1)
f.clear(warn=False)
g(1)  # a hit elsewhere: the flush tries to write the record of a removed folder
mem.flush_usage()
f(1, 2)  # computed: the folder made again
time.sleep(SETTLED_NS / 1e9 + 0.02)
f(1, 2)  # read: kept, for the record of the new folder
mem.flush_usage()
print(json.dumps(sorted(os.listdir(folder))))
"""


def test_a_record_is_written_again_after_its_folder_was_cleared(runs):
    runs.write("cleared.py", CLEARED)
    out = runs.execute("cleared.py", env={"ENTRY": str(runs.entry(0))}).stdout
    assert record.NAME in json.loads(out)
