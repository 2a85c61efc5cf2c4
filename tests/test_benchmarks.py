"""The benchmark scripts run (their --quick smoke versions; the figures come from full runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run_quick(script: str, scratch: Path) -> str:
    """Run ``benchmarks/<script> --quick`` with its scratch folder under ``scratch``;
    check it succeeds and leaves nothing behind; return its output."""
    res = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--dir", str(scratch)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list(scratch.iterdir()) == []  # scratch data removed
    return res.stdout


def test_quick_benchmarks_run_and_report_every_target(tmp_path):
    out = run_quick("run_all.py", tmp_path)
    for target in (
        "joblib.hash / mlcache",
        "(b) joblib / mlcache, mmap",
        "(c) diskcache",
        "(a) joblib / mlcache, pipeline",
        "(d) 1 worker / 2 workers",
        "declared 'open' / floor",
        "declared 'background' + pass / pickled list + pass",
    ):
        assert target in out


@pytest.mark.slow  # 18 s; run_all's quick run (above) runs the script too
def test_quick_typed_benchmark_runs_and_reports_every_target(tmp_path):
    out = run_quick("bench_typed.py", tmp_path)
    for target in (
        "DataFrame, 200,000 rows of 10 column kinds: joblib / mlcache",
        "state_dict, 100 MB of torch tensors: joblib / mlcache, mmap_mode='c'",
        "scipy.sparse csr 200,000 x 10,000, 0.1% dense: joblib / mlcache",
        "mlcache pickle-5 / typed",
    ):
        assert target in out


def test_path_profiler_runs(tmp_path):
    assert "mlcache hit f(3, 4)" in run_quick("profile_paths.py", tmp_path)


def test_quick_data_benchmark_runs_and_reports_every_target(tmp_path):
    out = run_quick("bench_data.py", tmp_path)
    for target in (
        "open 20,000 / open 2,000 samples",
        "open at 20,000 samples, ms",
        "(a) read_patient / mlcache",
        "(b) pickle list / mlcache",
        "(e) pass, pack open / list in memory",
    ):
        assert target in out


def test_quick_data_memory_benchmark_runs_and_reports_every_target(tmp_path):
    out = run_quick("bench_data_memory.py", tmp_path)
    for target in (
        "packing 4x the budget: peak RSS / budget",
        "DataLoader: peak Σ PSS anon + shmem",
    ):
        assert target in out
