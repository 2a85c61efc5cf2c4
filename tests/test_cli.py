"""The `mlcache` command, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mlcache import Memory


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlcache", *args], capture_output=True, text=True, timeout=300
    )


def test_demo_quick_prints_timings_and_leaves_nothing(tmp_path):
    res = run("--location", str(tmp_path), "demo", "--quick")
    assert res.returncode == 0, res.stderr
    assert "mlcache repeated, mmap" in res.stdout
    assert "after clear(), original call in cache? False" in res.stdout


def test_verify_reports_and_fixes_damage(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(lambda x: x * 2)
    f(np.arange(50.0))
    f(np.arange(60.0))
    entry = next(e for e in mem.store.list())
    path = Path(mem.store.local_path(entry.name))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    res = run("--location", str(tmp_path), "verify", "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout)["damaged"] == [entry.name]
    res = run("--location", str(tmp_path), "verify", "--fix")
    assert res.returncode == 0 and "removed" in res.stdout
    assert not path.exists()
    assert run("--location", str(tmp_path), "verify").returncode == 0


def test_missing_cache_is_exit_code_2(tmp_path):
    res = run("--location", str(tmp_path / "nope"), "verify")
    assert res.returncode == 2 and "no cache" in res.stderr
