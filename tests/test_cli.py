"""The `mlcache` command, run as a user would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mlcache import Memory
from mlcache.memo.layout import is_entry


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a script runs it: no terminal, nothing on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "mlcache", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "CI": "true"},
    )


def test_demo_quick_prints_timings_writes_a_chart_and_a_report(tmp_path):
    out = tmp_path / "report"
    res = subprocess.run(
        [sys.executable, "-m", "mlcache", "demo", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "MLCACHE_DIR": str(tmp_path / "never-used")},
    )
    assert res.returncode == 0, res.stderr
    text = res.stdout
    for step in (
        "read the files (every run)",
        "mlcache, load_item",
        "mlcache, load_source() (the alternative)",
        'mlcache, mmap_mode="r"',
        "joblib, mmap_mode",
    ):
        assert step in text
    assert "preprocess(x) again: a hit (nothing computed)" in text
    assert "argument 'scale' changed since the last entry" in text
    assert "changed code of preprocess(), same call: a miss, its code changed" in text
    # the README's story: an edited file is one load at the next open, not a rebuild
    edited = next(line for line in text.splitlines() if "edited one source file" in line)
    assert "(p00000.csv, age 67 -> 68): at the next open 1 file loaded again" in edited
    assert "rebuilt" not in edited and edited.endswith("patient 0's age is now 68")
    assert "opened again: 0 files loaded, the same pack" in text
    assert "with load_source() instead (the alternative), the same edit rebuilds" in text
    assert re.search(r"what the cache saved so far \(mlcache ls\): [\d.]+ \w+ of computing", text)
    assert "after clear(), the last call is cached? False" in text
    # part 4, at every size (--quick: 300, 3,000 and 30,000 samples), a row each
    assert "reopen and per-worker memory at every size" in text
    for n in ("300", "3,000", "30,000"):  # plain text or rich's table
        assert re.search(rf"^\W*{n}\b.*x (faster|slower).* MB", text, re.MULTILINE), n
    assert "chart at every size (reopen, memory): " in text
    # the first epochs: a line each (files, pickled list, mlcache), the chart, its section
    assert re.search(r"^  epoch 3: reading the files .* mlcache .*files parsed", text, re.M)
    assert "chart of the first epochs: " in text and (out / "mlcache-demo-epochs.png").exists()
    # the charts are real images of some size
    import matplotlib.image

    image = matplotlib.image.imread(out / "mlcache-demo.png")
    assert image.shape[0] > 400 and image.shape[1] > 600
    image = matplotlib.image.imread(out / "mlcache-demo-scaling.png")
    assert image.shape[0] > 300 and image.shape[1] > 800
    # the report holds the very numbers printed
    report = (out / "mlcache-demo.md").read_text()
    printed = re.findall(r"\d[\d,]*\.\d+x (?:faster|slower)", text)
    assert printed and all(p in report for p in printed)
    assert "![timings](mlcache-demo.png)" in report
    assert "![reopen and memory at every size](mlcache-demo-scaling.png)" in report
    assert "![per-epoch time](mlcache-demo-epochs.png)" in report
    assert "| 30,000 |" in report
    # every timed row of parts 1-2 has its min and median, and the reopen figures say
    # what they time: part 1's a fresh process to ds[0], the files checked or not; part
    # 4's the file alone
    tables = [t for t in report.split("\n## ") if "| step | what is timed |" in t]
    assert len(tables) == 5  # a first run, a new run, an epoch, a first and a repeated call
    for table in tables:
        assert "| min of 3 | median of 3 |" in table
        rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
        assert rows
        for row in rows:
            cells = row.strip("| ").split(" | ")
            assert len(cells) == 5, row
            assert all(re.fullmatch(r"[\d.,]+ (s|ms|µs)", c) for c in cells[2:4]), row
    new_run = next(t for t in tables if t.startswith("a new run: 300 patient files"))
    assert "| mlcache, load_item | a fresh process: open (300 files checked), ds[0] |" in new_run
    assert "| mlcache: the pack alone | a fresh process: PackedDataset(pack)[0], nothing" in new_run
    assert "reopen: a fresh process opens the file alone, no source to check" in report
    # caches went to a temporary folder, removed: nothing in the user's cache
    assert not (tmp_path / "never-used").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_verify_reports_and_fixes_damage(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(lambda x: x * 2)
    f(np.arange(50.0))
    f(np.arange(60.0))
    entry = next(e for e in mem.store.list() if is_entry(e.name))
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


def test_verify_of_a_missing_cache_finds_nothing_and_creates_nothing(tmp_path):
    res = run("--location", str(tmp_path / "nope"), "verify")
    assert res.returncode == 0 and "no cache at" in res.stdout
    assert not (tmp_path / "nope").exists()


def work(x, scale=2.0):
    return np.asarray(x) * scale


def populated(tmp_path):
    """A cache with two functions (hits and misses) and one dataset pack."""
    from mlcache.data import pack

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(work)
    f(np.arange(10.0))
    f(np.arange(10.0))
    f(np.arange(20.0), scale=3.0)
    g = mem.cache(np.cumsum)
    g(np.arange(5))
    mem.stats()  # writes this process's counts
    pack(
        ({"x": np.arange(i + 1.0), "y": i, "name": f"s{i}"} for i in range(30)),
        tmp_path / "datasets" / "demo" / "d.pack",
        progress=False,
    )
    return mem


def test_ls_shows_functions_and_datasets(tmp_path):
    populated(tmp_path)
    res = run("--location", str(tmp_path), "ls", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    by_name = {f["func"].rpartition(".")[2]: f for f in out["functions"]}
    assert by_name["work"]["entries"] == 2 and by_name["work"]["hits"] == 1
    assert by_name["work"]["misses"] == 2 and by_name["work"]["size"] > 0
    assert by_name["cumsum"]["entries"] == 1
    [ds] = out["datasets"]
    assert ds["samples"] == 30 and ds["name"].endswith("d.pack")
    text = run("--location", str(tmp_path), "ls").stdout
    assert "work" in text and "d.pack" in text and "30" in text


def test_info_of_a_function_and_of_a_pack(tmp_path):
    populated(tmp_path)
    res = run("--location", str(tmp_path), "info", "work", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["entries"]) == 2
    assert {e["args"]["scale"] for e in out["entries"]} == {"2.0", "3.0"}
    assert all(e["size"] > 0 and e["duration"] >= 0 for e in out["entries"])
    res = run("--location", str(tmp_path), "info", "d.pack", "--json")
    [out] = json.loads(res.stdout)["datasets"]
    assert out["samples"] == 30 and out["version"] == 1 and out["size"] > 0
    assert [f["name"] for f in out["fields"]] == ["x", "y", "name"]
    lines = run("--location", str(tmp_path), "info", "d.pack").stdout.splitlines()
    assert any(line.split()[:2] == ["x", "ragged"] for line in lines)
    assert any(line.split()[:2] == ["y", "column"] for line in lines)
    res = run("--location", str(tmp_path), "info", "nothing")
    assert res.returncode == 2 and "no function or dataset named 'nothing'" in res.stderr
    assert f"`mlcache --location {tmp_path} ls` lists the names" in res.stderr


def test_clear_one_function_one_pack_then_everything(tmp_path):
    mem = populated(tmp_path)
    assert run("--location", str(tmp_path), "clear", "work").returncode == 0
    names = {f.func.rpartition(".")[2] for f in mem.stats().values()}
    assert "work" not in names and "cumsum" in names
    assert run("--location", str(tmp_path), "clear", "d.pack").returncode == 0
    assert not (tmp_path / "datasets" / "demo" / "d.pack").exists()
    populated(tmp_path)
    res = run("--location", str(tmp_path), "clear", "--yes")
    assert res.returncode == 0, res.stderr
    assert "removed 3 results of 2 functions and 1 dataset pack" in res.stdout
    out = json.loads(run("--location", str(tmp_path), "ls", "--json").stdout)
    assert out["functions"] == [] and out["datasets"] == []


def test_prune_dry_run_lists_and_keeps_then_prunes(tmp_path):
    populated(tmp_path)
    where = ("--location", str(tmp_path))
    res = run(*where, "prune", "--max-size", "1K", "--dry-run", "--json", "--all-packs")
    assert res.returncode == 0, res.stderr
    planned = json.loads(res.stdout)["removed"]
    assert planned and any(p["name"].endswith(".pack") for p in planned)
    before = json.loads(run("--location", str(tmp_path), "ls", "--json").stdout)
    assert sum(f["entries"] for f in before["functions"]) == 3 and len(before["datasets"]) == 1
    res = run(*where, "prune", "--max-size", "1K", "--all-packs")
    assert res.returncode == 0 and "removed" in res.stdout
    after = json.loads(run("--location", str(tmp_path), "ls", "--json").stdout)
    total = sum(f["size"] for f in after["functions"]) + sum(d["size"] for d in after["datasets"])
    assert total <= 1024
    assert run("--location", str(tmp_path), "prune").returncode == 2  # nothing asked


def test_verify_covers_packs(tmp_path):
    populated(tmp_path)
    path = tmp_path / "datasets" / "demo" / "d.pack"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    res = run("--location", str(tmp_path), "verify", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["damaged"] == [] and out["damaged_packs"][0]["name"].endswith("d.pack")
    # made by pack(): mlcache cannot rebuild it, so --fix keeps it unless told
    assert run("--location", str(tmp_path), "verify", "--fix").returncode == 1
    assert path.exists()
    assert run("--location", str(tmp_path), "verify", "--fix", "--all-packs").returncode == 0
    assert not path.exists()


def test_bench_runs_the_benchmarks_and_prints_ratios():
    # one script: tests/test_benchmarks.py runs each of them once
    res = run("bench", "--quick", "--only", "bench_hash.py")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "## Summary (quick run: targets not enforced)" in res.stdout
    assert "| bench_hash.py | joblib.hash / mlcache |" in res.stdout
    assert "| bench_hit.py |" not in res.stdout
    res = run("bench", "--quick", "--only", "bench_nothing.py")
    assert res.returncode == 2 and "invalid choice: 'bench_nothing.py'" in res.stderr


def test_demo_with_a_location_keeps_its_caches_there_and_reruns_clean(tmp_path):
    loc = tmp_path / "cache"
    for _ in range(2):
        res = run("demo", "--quick", "--location", str(loc), "--out", str(tmp_path / "r"))
        assert res.returncode == 0, res.stderr
    out = json.loads(run("--location", str(loc), "ls", "--json").stdout)
    # the demo ends with clear(): no results left; this run's packs only
    assert all(f["entries"] == 0 for f in out["functions"])
    assert 1 <= len(out["datasets"]) <= 2
    assert all(
        d["name"].startswith("datasets/mlcache.demo.datasets.PatientsByItem")
        for d in out["datasets"]
    )


def test_demo_says_when_it_cannot_write_its_report(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    res = run("demo", "--quick", "--out", str(blocker / "sub"))
    assert res.returncode == 2 and "cannot write the report" in res.stderr


def test_location_after_the_command_and_plain_seconds(tmp_path):
    populated(tmp_path)
    res = run("ls", "--json", "--location", str(tmp_path))
    assert res.returncode == 0 and json.loads(res.stdout)["datasets"]
    res = run("prune", "--older-than", "3600", "--dry-run", "--location", str(tmp_path))
    assert res.returncode == 0 and "would remove 0 items" in res.stdout
    res = run("prune", "--max-size", "lots", "--location", str(tmp_path))
    assert res.returncode == 2


def test_prune_says_why_each_entry_goes_and_keeps_what_is_worth_most(tmp_path):
    mem = Memory(tmp_path, verbose=0)

    @mem.cache
    def slow_small(i):
        time.sleep(0.05)  # what its entry saves: its compute time
        return i

    @mem.cache
    def quick_large(i):
        return np.zeros(100_000) + i  # 800 KB, computed at once

    for i in range(2):
        slow_small(i)
        quick_large(i)
    where = ("--location", str(tmp_path))
    res = run(*where, "prune", "--max-size", "1MB", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    removed = json.loads(res.stdout)["removed"]
    # what goes is the quick, large result (800 KB that recompute in a millisecond)
    assert removed and all(e["size"] > 500_000 and e["reason"] != "age" for e in removed)
    res = run(*where, "prune", "--max-size", "1MB", "--dry-run")
    gone = [line for line in res.stdout.splitlines() if line.startswith("would remove ")]
    assert len(gone) == len(removed) + 1, res.stdout  # and the total
    for line in gone[:-1]:
        assert "worth least: recomputes in" in line and "per MiB kept" in line, line
    res = run(*where, "prune", "--older-than", "0s", "--dry-run", "--json")
    reasons = {e.get("reason") for e in json.loads(res.stdout)["removed"]}
    assert reasons == {"age"}, res.stdout
    res = run(*where, "prune", "--older-than", "0s", "--dry-run")
    assert "unused for more than" in res.stdout
