"""The benchmark scripts run (their --quick smoke versions; the figures come from full runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run_quick(script: str, scratch: Path, *options: str) -> str:
    """Run ``benchmarks/<script> --quick`` with its scratch folder under ``scratch``;
    check it succeeds and leaves nothing behind; return its output."""
    scratch.mkdir(exist_ok=True)
    res = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--dir", str(scratch), *options],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list(scratch.iterdir()) == []  # scratch data removed
    return res.stdout


#: run_all's scripts, each run once by its own test (so the run shows it is moving and
#: each script has its own time limit), with the targets its summary must carry
TARGETS: dict[str, tuple[str, ...]] = {
    "bench_hash.py": ("joblib.hash / mlcache",),
    "bench_pandas.py": (),
    "bench_typed.py": (
        "DataFrame, 200,000 rows of 10 column kinds: joblib / mlcache",
        "state_dict, 100 MB of torch tensors: joblib / mlcache, mmap_mode='c'",
        "scipy.sparse csr 200,000 x 10,000, 0.1% dense: joblib / mlcache",
        "mlcache pickle-5 / typed",
    ),
    "bench_hit.py": ("(b) joblib / mlcache, mmap", "(c) diskcache"),
    "bench_miss.py": (),
    "bench_audit.py": (
        "(a) small hit: audit on / off",
        "(b) audit seconds / seconds saved",
        "(c) ds[i]: audit on / off",
        "(d) dataset audit seconds / seconds saved",
    ),
    "bench_new_run.py": ("new run: joblib / mlcache", "repeated: joblib / mlcache"),
    "bench_data.py": (
        "open 20,000 / open 2,000 samples",
        "open at 20,000 samples, ms",
        "(a) read_patient / mlcache",
        "(b) pickle list / mlcache",
        "(e) pass, pack open / list in memory",
    ),
    "bench_data_memory.py": (
        "packing 4x the budget: peak RSS / budget",
        "DataLoader: peak Σ PSS anon + shmem",
    ),
    "bench_cached_open.py": (
        "declared 'open' / floor",
        "declared 'background' + pass / pickled list + pass",
    ),
    "bench_build.py": (),
    "bench_fill.py": (),
    "bench_chain.py": ("(a) joblib / mlcache, pipeline",),
    "bench_remote.py": ("(d) 1 worker / 2 workers",),
    "bench_eviction.py": (
        "uniform: mlcache / LRU",
        "equal costs: mlcache / LRU",
        "hot set: mlcache / LRU",
    ),
}


def test_every_benchmark_has_its_smoke_test():
    sys.path.insert(0, str(BENCH))
    try:
        import run_all
    finally:
        sys.path.remove(str(BENCH))
    assert sorted(run_all.SCRIPTS) == sorted(TARGETS)


#: the longest smoke runs (a SeaweedFS server and a Dask cluster; datasets opened in
#: fresh processes; memory budgets measured): `make test-all` runs them, so that `make
#: test` stays under 15 minutes on a busy machine
SLOW_SMOKES = {"bench_remote.py", "bench_cached_open.py", "bench_data_memory.py"}


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SMOKES else s for s in sorted(TARGETS)],
)
def test_quick_benchmark_runs_and_reports_its_targets(script, tmp_path):
    """Each script once, through run_all (as `mlcache bench` runs it): a row in the
    summary for every target, every row a ratio."""
    scratch = tmp_path / "scratch"
    out = run_quick("run_all.py", scratch, "--only", script)
    rows = [r for r in out.splitlines() if r.startswith(f"| {script} |")]
    assert rows and not any("crashed" in r for r in rows), out[-3000:]
    for target in TARGETS[script]:
        assert any(target in r for r in rows), target


def test_path_profiler_runs(tmp_path):
    assert "mlcache hit f(3, 4)" in run_quick("profile_paths.py", tmp_path)
