"""Filling under fire (issue 17): runs SIGKILLed while they fill, several fillers
at once, DataLoader workers (fork and spawn) filling one pack together.

Every run is a fresh interpreter over a dataset module (``fillds.py``) written to
a temporary folder; each ``load_item`` call appends ``<item> <pid>`` to a log
file (``BUILDS``), so the loads of every process are counted. What a killed run
had recorded is read from its segment files (their records' headers and
checksums, as :mod:`mlcache.data.records` lays them out): the next run must load
exactly the items that no run recorded. The final pack is compared sample by
sample with a fresh ``load_item`` of each item.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xxhash

from mlcache.data.frozen import MAX_PROBES, PROBE_EVERY
from mlcache.data.records import MAGIC, RECORD
from scripts import TIMEOUT, ScriptFolder

FILLDS = """
import os, time
import numpy as np
from mlcache.data import CachedDataset


def logged(what):
    fd = os.open(os.environ["BUILDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {os.getpid()}\\n".encode())
    finally:
        os.close(fd)


def sample_of(path):
    with open(path) as f:
        value = int(f.read())
    size = (2000 + 997 * value % 20000) * int(os.environ.get("SAMPLE_SCALE", "1"))  # ragged
    return {"name": os.path.basename(path), "value": value,
            "x": np.arange(size, dtype=np.float32) * value}


class Files(CachedDataset):
    cache_ignore = ("sleep",)

    def __init__(self, root, sleep=0.0, **kw):
        self.root = root
        self.sleep = sleep
        super().__init__(progress=False, cache_dir=os.environ["CACHE"], **kw)

    def source_items(self):
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path):
        logged(os.path.basename(path))
        kill_at = int(os.environ.get("KILL_AT_LOAD", "0"))
        if kill_at:
            mine = os.environ["BUILDS"] + f".{os.getpid()}"
            with open(mine, "a") as f:
                f.write("x")
            if os.path.getsize(mine) == kill_at:  # this process's k-th load
                os.kill(os.getpid(), 9)
        if self.sleep:
            time.sleep(self.sleep)
        return sample_of(path)


def wrong_samples(ds):
    \"\"\"The indices whose sample is not a fresh load of its item.\"\"\"
    bad = []
    items = ds.source_items()
    for i in range(len(ds)):
        got, want = ds[i], sample_of(items[i])
        if (got["name"], int(got["value"])) != (want["name"], want["value"]) or not (
            np.array_equal(got["x"], want["x"])
        ):
            bad.append(i)
    return bad
"""

FILL = """
import json, random, sys
from fillds import Files, wrong_samples

ds = Files(sys.argv[1], sleep=float(sys.argv[2]))
order = list(range(len(ds)))
if sys.argv[3] != "-":
    random.Random(int(sys.argv[3])).shuffle(order)
print("open", flush=True)
for i in order:
    ds[i]
print(json.dumps({"wrong": wrong_samples(ds), "n": len(ds)}), flush=True)
"""

VERIFY = """
import json, sys
from fillds import Files, wrong_samples

ds = Files(sys.argv[1])
print(json.dumps({"wrong": wrong_samples(ds), "n": len(ds)}))
"""


class Fills(ScriptFolder):
    """The dataset module, its scripts, its source files and the loads log."""

    def __init__(self, root: Path, n: int) -> None:
        super().__init__(root, log="builds.log")
        self.src = root / "src"
        self.src.mkdir(parents=True)
        for i in range(n):
            (self.src / f"{i:03d}.txt").write_text(str(i))
        self.write("fillds.py", FILLDS)
        self.write("fill.py", FILL)
        self.write("verify.py", VERIFY)
        self.stderr = ""  # of the last DataLoader run

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "CACHE": str(self.cache),
            "BUILDS": str(self.log),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.root), os.environ.get("PYTHONPATH")])
            ),
            **extra,
        }
        env.pop("PYTHONWARNINGS", None)
        return env

    def start(self, script: str, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(self.root / script), *args],
            env=self.env(**env),
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, script: str, *args: str, **env: str) -> dict[str, object]:
        """A run to its end; its last line of output (a JSON object)."""
        done = subprocess.run(
            [sys.executable, str(self.root / script), *args],
            env=self.env(**env),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def loads(self) -> list[tuple[str, int]]:
        """Every load_item call logged so far: (item name, pid)."""
        if not self.log.exists():
            return []
        rows = [line.split() for line in self.log.read_text().splitlines()]
        return [(name, int(pid)) for name, pid in rows]

    def names(self) -> list[str]:
        return sorted(p.name for p in self.src.iterdir())

    def keys(self) -> dict[bytes, str]:
        """The key of each item (its path: see data/records.py's table)."""
        return {xxhash.xxh3_128_digest(b"p" + str(self.src / n).encode()): n for n in self.names()}

    def recorded(self) -> set[str]:
        """The items some segment holds a whole, valid record of."""
        return self._scan()[0]

    def torn(self) -> int:
        """How many segments end in a partial record (their writer killed mid-write)."""
        return self._scan()[1]

    def _scan(self) -> tuple[set[str], int]:
        keys, found, torn = self.keys(), set(), 0
        for seg in self.cache.rglob("*.pack.fill/*.seg"):
            data, off = seg.read_bytes(), 0
            while off + RECORD.size <= len(data):
                head = data[off : off + RECORD.size]
                magic, _f, length, key, _fp, psum, hsum = RECORD.unpack(head)
                if magic != MAGIC or xxhash.xxh3_64_intdigest(head[:56]) != hsum:
                    break
                payload = data[off + RECORD.size : off + RECORD.size + length]
                if len(payload) < length:
                    break
                if xxhash.xxh3_64_intdigest(payload) == psum:
                    found.add(keys[key])
                off += RECORD.size + length
            torn += off != len(data)
        return found, torn

    def packs(self) -> list[Path]:
        return sorted(self.cache.rglob("*.pack"))

    def fill_folders(self) -> list[Path]:
        return sorted(self.cache.rglob("*.pack.fill"))


def wait_for_loads(fills: Fills, count: int, proc: subprocess.Popen[str]) -> None:
    """Until ``count`` loads are logged (or the run ended)."""
    deadline = time.monotonic() + TIMEOUT
    while len(fills.loads()) < count and proc.poll() is None:
        assert time.monotonic() < deadline, "the run hung"
        time.sleep(0.002)


def the_rest_and_probes(loads: list[str], rest: set[str]) -> bool:
    """A run loaded each of ``rest`` once as read, and the seal loaded again as
    many of them as its probe for random augmentation takes (data/frozen.py)."""
    probes = min(MAX_PROBES, len(rest) // PROBE_EVERY)
    return set(loads) == rest and len(loads) == len(rest) + probes


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)


# -- one filler killed, run after run -------------------------------------------------------
def killed_runs(tmp_path: Path, n: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    fills = Fills(tmp_path, n)
    everything = set(fills.names())
    loaded_before: set[str] = set()
    for run in range(kills):
        recorded = fills.recorded()
        assert recorded <= loaded_before
        fills.log.unlink(missing_ok=True)
        order = str(rng.randrange(1000)) if run % 2 else "-"
        proc = fills.start("fill.py", str(fills.src), "0.004", order)
        left = len(everything - recorded)
        if left < 10:
            kill(proc)
            break
        wait_for_loads(fills, rng.randrange(1, left - 5), proc)
        time.sleep(rng.random() * 0.01)  # anywhere: loading, encoding, writing
        kill(proc)
        loads = [name for name, _pid in fills.loads()]
        assert len(loads) == len(set(loads)), "an item loaded twice in one run"
        assert not set(loads) & recorded, "an item recorded by an earlier run loaded again"
        assert fills.packs() == []
        loaded_before |= set(loads)
        # what it had loaded is recorded, but for the item being loaded when killed
        assert len(set(loads) - fills.recorded()) <= 1
    recorded = fills.recorded()
    fills.log.unlink(missing_ok=True)
    last = fills.run("fill.py", str(fills.src), "0", "-")
    assert last == {"wrong": [], "n": n}
    loads = [name for name, _pid in fills.loads()]
    assert the_rest_and_probes(loads, everything - recorded), "the last run loads only the rest"
    assert len(fills.packs()) == 1 and fills.fill_folders() == []
    fills.log.unlink(missing_ok=True)
    assert fills.run("verify.py", str(fills.src)) == {"wrong": [], "n": n}
    assert fills.loads() == []


def test_a_filler_killed_twice_loses_only_what_it_had_not_recorded(tmp_path):
    killed_runs(tmp_path, n=60, kills=2, seed=17)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_a_filler_killed_again_and_again(tmp_path, seed):
    killed_runs(tmp_path, n=150, kills=8, seed=seed)


# -- several fillers at once ------------------------------------------------------------
def concurrent_fillers(tmp_path: Path, n: int, procs: int, killed: int, seed: int) -> int:
    """``procs`` fillers in shuffled orders, ``killed`` of them SIGKILLed at a random
    point; returns how many items were loaded more than once."""
    rng = random.Random(seed)
    fills = Fills(tmp_path, n)
    runs = [
        fills.start("fill.py", str(fills.src), "0.003", str(rng.randrange(1000)))
        for _ in range(procs)
    ]
    for victim in runs[:killed]:
        wait_for_loads(fills, rng.randrange(5, n), victim)
        kill(victim)
    for survivor in runs[killed:]:
        out, err = survivor.communicate(timeout=TIMEOUT)
        assert survivor.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == {"wrong": [], "n": n}
    assert len(fills.packs()) == 1
    loads = [name for name, _pid in fills.loads()]
    assert set(loads) == set(fills.names())
    fills.log.unlink(missing_ok=True)
    assert fills.run("verify.py", str(fills.src)) == {"wrong": [], "n": n}
    assert fills.loads() == [] and fills.fill_folders() == []
    return len(loads) - n


def test_three_fillers_at_once_one_killed_seal_one_right_pack(tmp_path):
    concurrent_fillers(tmp_path, n=80, procs=3, killed=1, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_fillers_at_once_some_killed(tmp_path, seed):
    concurrent_fillers(tmp_path, n=200, procs=2 + seed % 2, killed=1 + seed % 2, seed=seed)


# -- DataLoader workers ------------------------------------------------------------------
LOADER = """
import json, os, sys
import numpy as np
from torch.utils.data import DataLoader
from fillds import Files, sample_of


def as_is(batch):
    return batch


def state(ds):
    folder = os.path.dirname(ds.pack_path)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    log = os.environ["BUILDS"]
    loads = len(open(log).read().split()) // 2 if os.path.exists(log) else 0
    return {"loads": loads, "sealed": any(n.endswith(".pack") for n in names),
            "filling": any(n.endswith(".pack.fill") for n in names)}


def main():
    method, persistent, epochs = sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    ds = Files(sys.argv[1], sleep=float(sys.argv[5]))
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=as_is,
                        multiprocessing_context=method, persistent_workers=persistent)
    report = []
    for _ in range(epochs):
        seen, wrong = [], 0
        try:
            for batch in loader:
                for sample in batch:
                    want = sample_of(os.path.join(ds.root, sample["name"]))
                    if int(sample["value"]) != want["value"] or not np.array_equal(
                        sample["x"], want["x"]
                    ):
                        wrong += 1
                    seen.append(sample["name"])
        except RuntimeError as exc:  # a worker killed: torch says so
            report.append({"error": str(exc), **state(ds)})
            break
        report.append({"seen": seen, "wrong": wrong, **state(ds)})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
"""


@pytest.fixture
def loader_fills(tmp_path: Path) -> Fills:
    pytest.importorskip("torch")
    fills = Fills(tmp_path, 48)
    fills.write("loader.py", LOADER)
    return fills


def epochs(fills: Fills, method: str, persistent: bool, count: int, **env: str) -> list[dict]:
    done = subprocess.run(
        [
            sys.executable,
            str(fills.root / "loader.py"),
            str(fills.src),
            method,
            "1" if persistent else "0",
            str(count),
            "0.005",
        ],
        env=fills.env(**env),
        cwd=fills.root,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    fills.stderr = done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


SPAWN = pytest.param("spawn", marks=pytest.mark.slow)  # ~15-30 s here: torch imported per worker


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("method", ["fork", SPAWN])
def test_dataloader_workers_fill_one_pack_together(loader_fills, method, persistent):
    fills = loader_fills
    first, second = epochs(fills, method, persistent, 2)
    names = fills.names()
    assert sorted(first["seen"]) == names and first["wrong"] == 0  # each once, right
    assert first["loads"] == len(names), "a sample loaded twice by the workers"
    pids = {pid for _name, pid in fills.loads()}
    assert len(pids) == 2  # the workers loaded, the main process did not
    assert sorted(second["seen"]) == names and second["wrong"] == 0
    assert second["loads"] == len(names), "epoch 2 loaded samples again"
    assert second["sealed"] and not second["filling"], (first, second, fills.stderr)
    fills.log.unlink()
    assert fills.run("verify.py", str(fills.src)) == {"wrong": [], "n": len(names)}
    assert fills.loads() == []


@pytest.mark.parametrize("method", ["fork", SPAWN])
def test_workers_killed_mid_epoch_the_next_run_loads_only_the_rest(loader_fills, method):
    fills = loader_fills
    (killed,) = epochs(fills, method, False, 1, KILL_AT_LOAD="7")
    assert "exited unexpectedly" in killed["error"] or "killed by signal" in killed["error"]
    assert not killed["sealed"]
    loaded = {name for name, _pid in fills.loads()}
    recorded = fills.recorded()
    assert recorded < loaded and len(loaded - recorded) <= 2  # the two being loaded
    fills.log.unlink()
    (first,) = epochs(fills, method, False, 1)
    assert sorted(first["seen"]) == fills.names() and first["wrong"] == 0
    assert sorted(name for name, _pid in fills.loads()) == sorted(set(fills.names()) - recorded)


# -- killed while sealing ------------------------------------------------------------------
def sealing(fills: Fills) -> bool:
    """A seal is being written: its scratch folder or temporary file is there."""
    return any(".pack.tmp-" in p.name for p in fills.cache.rglob("*"))


def test_a_filler_killed_while_sealing_loses_nothing(tmp_path):
    fills = Fills(tmp_path, 200)
    proc = fills.start("fill.py", str(fills.src), "0", "-")
    deadline = time.monotonic() + TIMEOUT
    while not sealing(fills) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run hung"
        time.sleep(0.0005)
    kill(proc)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    assert fills.recorded() == set(fills.names())
    fills.log.unlink()
    assert fills.run("verify.py", str(fills.src)) == {"wrong": [], "n": 200}
    assert fills.loads() == [], "every item was recorded: the next run loads none"
    assert len(fills.packs()) == 1 and fills.fill_folders() == []
    # (the killed seal's scratch folder, a few kB, goes at a later build once 10 s old)


# -- an up-front fill in worker processes, its parent killed ---------------------------------
UP_FRONT = """
import json, sys
from fillds import Files, wrong_samples

if __name__ == "__main__":
    ds = Files(sys.argv[1], sleep=float(sys.argv[2]), num_workers=2, fill="up-front")
    print(json.dumps({"wrong": wrong_samples(ds), "n": len(ds)}), flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: it only waits for its parent
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_an_up_front_fill_in_workers_killed_loses_only_what_was_not_recorded(tmp_path):
    """``num_workers=2``: the parent records what its workers load; SIGKILLed, its
    workers end too, and the next run loads exactly what no record holds."""
    fills = Fills(tmp_path, 120)
    fills.write("upfront.py", UP_FRONT)
    proc = fills.start("upfront.py", str(fills.src), "0.01")
    wait_for_loads(fills, 60, proc)
    kill(proc)
    assert fills.packs() == []
    pids = {pid for _name, pid in fills.loads()} - {proc.pid}
    assert pids, "no worker loaded"
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "workers of a killed parent go on"
        time.sleep(0.05)
    recorded = fills.recorded()
    assert recorded and recorded <= {name for name, _pid in fills.loads()}
    fills.log.unlink()
    assert fills.run("verify.py", str(fills.src)) == {"wrong": [], "n": 120}
    loads = [name for name, _pid in fills.loads()]
    assert the_rest_and_probes(loads, set(fills.names()) - recorded)
    assert len(fills.packs()) == 1 and fills.fill_folders() == []


def kill_a_worker(tmp_path: Path, seed: int) -> int:
    """A DataLoader epoch (fork, 2 workers, records of up to 0.8 MB) whose worker
    is SIGKILLed from outside at a random point (loading, encoding or writing); the
    next run loads only what no record holds. Returns how many segments were torn."""
    rng = random.Random(seed)
    fills = Fills(tmp_path, 48)
    fills.write("loader.py", LOADER)
    scale = {"SAMPLE_SCALE": "10"}
    args = [str(fills.src), "fork", "0", "1", "0"]
    proc = fills.start("loader.py", *args, **scale)
    wait_for_loads(fills, rng.randrange(4, 40), proc)
    workers = sorted({pid for _name, pid in fills.loads()})
    time.sleep(rng.random() * 0.02)
    os.kill(rng.choice(workers), signal.SIGKILL)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    (killed,) = json.loads(out.strip().splitlines()[-1])
    if "error" not in killed:  # it had loaded all: nothing to check
        return 0
    torn, recorded = fills.torn(), fills.recorded()
    if fills.packs():  # the worker left recorded the last items and sealed after the
        recorded = set(fills.names())  # report, before the run's exit ended it: all in
    fills.log.unlink()
    (after,) = epochs(fills, "fork", False, 1, **scale)
    assert sorted(after["seen"]) == fills.names() and after["wrong"] == 0
    assert sorted(name for name, _pid in fills.loads()) == sorted(set(fills.names()) - recorded)
    return torn


@pytest.mark.slow  # ~90 s here; 1 of the 12 kills tore a record when written
def test_dataloader_workers_killed_from_outside_again_and_again(tmp_path):
    pytest.importorskip("torch")
    torn = sum(kill_a_worker(tmp_path / str(seed), seed) for seed in range(12))
    print(f"{torn} of 12 kills tore a record")
