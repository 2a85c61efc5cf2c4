"""The benchmark scripts run (their --quick smoke versions; the figures come from full runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_quick_benchmarks_run_and_report_every_target(tmp_path):
    res = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for target in ("joblib.hash / mlcache", "(b) joblib / mlcache, mmap", "(c) diskcache"):
        assert target in res.stdout
    assert list(tmp_path.iterdir()) == []  # scratch caches removed


def test_path_profiler_runs(tmp_path):
    res = subprocess.run(
        [sys.executable, str(BENCH / "profile_paths.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "mlcache hit f(3, 4)" in res.stdout


def test_quick_data_benchmark_runs_and_reports_every_target(tmp_path):
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_data.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for target in (
        "open 20,000 / open 2,000 samples",
        "open at 20,000 samples, ms",
        "(a) read_patient / mlcache",
        "(b) pickle list / mlcache",
        "packing 4x the budget: peak RSS / budget",
        "DataLoader: peak Σ PSS anon + shmem",
    ):
        assert target in res.stdout
    assert list(tmp_path.iterdir()) == []  # scratch data removed
