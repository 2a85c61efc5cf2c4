"""Issue 12: every payload is verified before its first use in a process, large
memory-mapped ones included.

A flipped byte in a large mapped payload, or a write through an ``r+`` map, is
never handed out again by an ``mmap_mode="r"`` hit: it is one warning, the entry
is removed and the value recomputed. Cases that a user meets across runs are run
in fresh processes (``sys.executable``); the payloads are just over the size from
which entries carry a table of block checksums (:data:`mlcache.entry.writer.BLOCK_TABLE_MIN`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from mlcache import CacheWarning, Memory, entry

#: float64 elements of a payload just over the block-table threshold
N = entry.BLOCK_TABLE_MIN // 8 + 4096

#: one run of a user's job: a cached function returning an N-element ramp, called
#: in the modes given on the command line; prints what happened as JSON
JOB = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    from mlcache import Memory

    loc, steps = sys.argv[1], sys.argv[2:]
    N = {n}
    LOG = loc + ".calls"  # calls are counted outside the process's own state

    def ramp(n):
        with open(LOG, "a") as fh:
            fh.write("x")
        return np.arange(n, dtype=np.float64)

    def calls():
        try:
            with open(LOG) as fh:
                return len(fh.read())
        except FileNotFoundError:
            return 0

    report = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in steps:
            mode, _, edit = step.partition(":")
            f = Memory(loc, verbose=0, mmap_mode=None if mode == "none" else mode).cache(ramp)
            before = calls()
            out = f(N)
            report.append({{
                "mode": mode,
                "computed": calls() - before,
                "good": bool(np.array_equal(out, np.arange(N, dtype=np.float64))),
            }})
            if edit:  # write through the map, as a user of mmap_mode="r+" may
                out[7] = -5.0
                out.flush()
            del out
    print(json.dumps({{
        "steps": report,
        "warnings": [str(w.message) for w in caught],
    }}))
    """
)


def _job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    if not script.exists():
        script.write_text(JOB.format(n=N))
    return script


def run(tmp_path: Path, *steps: str) -> dict[str, Any]:
    """Run the job in a fresh process, with one call per step (``"r"``, ``"r+:edit"``...)."""
    res = subprocess.run(
        [sys.executable, str(_job(tmp_path)), str(tmp_path / "cache"), *steps],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def entry_file(location: Path) -> Path:
    """The one result entry under ``location`` (the largest file)."""
    files = [p for p in location.rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def flip(path: Path, where: int) -> None:
    """Flip one byte of ``path`` in place (same inode, same size)."""
    with open(path, "r+b") as fh:
        fh.seek(where)
        b = fh.read(1)
        fh.seek(where)
        fh.write(bytes([b[0] ^ 0x10]))


def damaged_warnings(out: dict[str, Any]) -> list[str]:
    return [w for w in out["warnings"] if "damaged" in w]


# -- a damaged byte on disk --------------------------------------------------------------
def test_a_flipped_byte_in_a_large_mapped_payload_is_recomputed_in_a_fresh_process(tmp_path):
    first = run(tmp_path, "r")
    assert first["steps"][0]["computed"] == 1
    path = entry_file(tmp_path / "cache")
    assert path.stat().st_size > entry.BLOCK_TABLE_MIN
    flip(path, path.stat().st_size - 8 * (N // 2))  # the middle of the array

    out = run(tmp_path, "r", "r")
    assert [s["computed"] for s in out["steps"]] == [1, 0]
    assert all(s["good"] for s in out["steps"])
    assert len(damaged_warnings(out)) == 1, out["warnings"]
    assert len(out["warnings"]) == 1


# -- writes through an r+ map ----------------------------------------------------------------
def test_a_write_through_an_r_plus_hit_is_not_returned_by_a_mapped_hit_in_the_same_process(
    tmp_path,
):
    run(tmp_path, "none")  # stores the entry
    # a verified "r" hit first, so that the file is known good in this process;
    # then an r+ hit written through, then "r" hits: never the altered value
    out = run(tmp_path, "r", "r+:edit", "r", "r")
    steps = out["steps"]
    assert [s["computed"] for s in steps] == [0, 0, 1, 0]
    assert steps[2]["good"] and steps[3]["good"]
    assert len(damaged_warnings(out)) == 1, out["warnings"]


def test_a_write_through_an_r_plus_hit_is_not_returned_by_a_mapped_hit_in_a_fresh_process(
    tmp_path,
):
    run(tmp_path, "none")
    edited = run(tmp_path, "r+:edit")
    assert edited["steps"][0]["computed"] == 0 and not edited["warnings"]

    out = run(tmp_path, "r")
    assert out["steps"][0]["computed"] == 1 and out["steps"][0]["good"]
    assert len(damaged_warnings(out)) == 1, out["warnings"]


def test_r_plus_hits_keep_their_own_edits(tmp_path):
    # joblib's r+ semantics stay: an r+ hit is the caller's to change, not damage
    run(tmp_path, "none")
    out = run(tmp_path, "r+:edit", "r+")
    assert [s["computed"] for s in out["steps"]] == [0, 0]
    assert not out["warnings"]


def test_a_copy_on_write_hit_changes_nothing_and_stays_verified(tmp_path):
    run(tmp_path, "none")
    out = run(tmp_path, "c:edit", "r", "none")
    assert [s["computed"] for s in out["steps"]] == [0, 0, 0]
    assert all(s["good"] for s in out["steps"][1:])
    assert not out["warnings"]


# -- verified once per process ---------------------------------------------------------------
def ramp(n: int) -> np.ndarray:
    CALLS.append(n)
    return np.arange(n, dtype=np.float64)


CALLS: list[int] = []


@pytest.fixture
def digested(monkeypatch):
    """Bytes passed to xxh3-64 one-shot digests (payload checks) from now on;
    file times are trusted as soon as they are set (no settling delay)."""
    count = [0]
    real = xxhash.xxh3_64_intdigest

    def counting(data: Any, *args: Any, **kwargs: Any) -> int:
        count[0] += memoryview(data).nbytes
        return real(data, *args, **kwargs)

    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", counting)
    monkeypatch.setattr(entry.reader, "SETTLED_NS", 0)
    monkeypatch.setattr(entry.reader, "COARSE_SETTLED_NS", 0)
    entry.forget_verified()
    yield count
    entry.forget_verified()


def test_a_valid_large_entry_is_verified_once_per_process(tmp_path, digested):
    CALLS.clear()
    Memory(tmp_path, verbose=0).cache(ramp)(N)  # stored, not mapped
    time.sleep(0.05)  # past the file system's clock tick: the next change shows
    f = Memory(tmp_path, verbose=0, mmap_mode="r").cache(ramp)
    digested[0] = 0
    a = f(N)
    first = digested[0]
    assert first >= 8 * N  # the whole payload, before its first use
    for _ in range(5):
        b = f(N)
        assert b[N - 1] == N - 1
    # later hits hash only headers: nothing in the array's size
    assert digested[0] - first < 1 << 16
    assert CALLS == [N] and a[N // 2] == N // 2


def test_recording_use_keeps_a_file_verified(tmp_path, digested):
    # last use is the entry's mtime, set in batches by this process: that change
    # of times is mlcache's own and does not make the next hit check again
    CALLS.clear()
    Memory(tmp_path, verbose=0).cache(ramp)(N)
    time.sleep(0.05)
    mem = Memory(tmp_path, verbose=0, mmap_mode="r")
    f = mem.cache(ramp)
    f(N)
    path = entry_file(tmp_path)
    before = path.stat().st_mtime_ns
    time.sleep(0.05)
    mem.stats()  # flushes the notes of use: the entry's mtime is set
    assert path.stat().st_mtime_ns != before
    digested[0] = 0
    f(N)
    assert digested[0] < 1 << 16
    assert CALLS == [N]


def test_a_file_changed_in_place_is_verified_again(tmp_path, digested):
    CALLS.clear()
    Memory(tmp_path, verbose=0).cache(ramp)(N)
    time.sleep(0.05)
    f = Memory(tmp_path, verbose=0, mmap_mode="r").cache(ramp)
    f(N)
    path = entry_file(tmp_path)
    flip(path, path.stat().st_size - 8 * 100)
    with pytest.warns(CacheWarning, match="damaged"):
        c = f(N)
    assert CALLS == [N, N] and c[N - 100] == N - 100


def test_an_r_plus_hit_drops_the_verified_mark(tmp_path, digested):
    CALLS.clear()
    Memory(tmp_path, verbose=0).cache(ramp)(N)
    time.sleep(0.05)
    r = Memory(tmp_path, verbose=0, mmap_mode="r").cache(ramp)
    rw = Memory(tmp_path, verbose=0, mmap_mode="r+").cache(ramp)
    r(N)
    w = rw(N)
    # "r" hits while a writable map is alive are checked every time, even before
    # the write: the map can change the file at any moment without a new mtime
    digested[0] = 0
    r(N)
    assert digested[0] >= 8 * N
    w[3] = -1.0
    with pytest.warns(CacheWarning, match="damaged"):
        again = r(N)
    assert again[3] == 3.0 and CALLS == [N, N]


@pytest.mark.parametrize("mmap_mode", [None, "r", "c"])
def test_small_payloads_are_checked_too(tmp_path, mmap_mode):
    CALLS.clear()
    f = Memory(tmp_path, verbose=0, mmap_mode=mmap_mode).cache(ramp)
    f(1000)
    path = entry_file(tmp_path)
    flip(path, path.stat().st_size - 8)
    with pytest.warns(CacheWarning, match="damaged"):
        out = f(1000)
    assert out[999] == 999.0 and CALLS == [1000, 1000]
    assert os.path.getsize(path) == path.stat().st_size
