"""mlcache.demo.scaling: the demo's part 4, reopen time and per-worker memory of
the pickled list and of a pack at every size. Times are only checked to exist
(never their values); memory is checked where it is a fact of the layout: a
worker holding the unpickled list holds at least its arrays, a worker reading
a pack holds little of its own and maps the pack's pages."""

from __future__ import annotations

import math
import os
import pickle

import pytest

from mlcache.demo import scaling
from mlcache.demo.children import PACK, PICKLE, Server, resident
from mlcache.demo.scaling import Measure, Scaling

SMAPS = os.path.exists("/proc/self/smaps_rollup")


def test_sizes_follow_the_patients_up_to_the_cap():
    assert scaling.sizes_for(5000) == (5_000, 50_000, 500_000)
    assert scaling.sizes_for(300) == (300, 3_000, 30_000)
    assert scaling.sizes_for(20_000) == (20_000, 200_000, scaling.MAX_SAMPLES)
    assert scaling.sizes_for(10**6) == (scaling.MAX_SAMPLES,)
    with pytest.raises(ValueError, match="at least 1"):
        scaling.sizes_for(0)


def test_both_caches_are_measured_at_every_size_in_fresh_processes(tmp_path):
    said: list[str] = []
    folder = tmp_path / "work"
    result = scaling.measure(str(folder), [10_000, 1_000], trials=1, workers=2, out=said.append)
    assert result.sizes == [1_000, 10_000] and len(said) == 2
    assert sorted((m.approach, m.samples) for m in result.measures) == [
        (PACK, 1_000),
        (PACK, 10_000),
        (PICKLE, 1_000),
        (PICKLE, 10_000),
    ]
    for m in result.measures:
        assert len(m.reopen) == 1 and all(0 < t < math.inf for t in m.reopen)
        assert len(m.passes) == 2 and m.file_bytes > m.samples * 64 * 4
    assert list(folder.iterdir()) == []  # each size's files went when it was done
    rows = result.cells()
    assert [r[0] for r in rows] == ["1,000", "10,000"]
    assert all(len(r) == len(Scaling.HEADERS) for r in rows)
    if not SMAPS:
        assert all(m.private is None for m in result.measures)
        return
    arrays = 10_000 * 64 * 4  # the float32[64] of every sample: 2.6 MB
    listed, packed = result.at(PICKLE, 10_000), result.at(PACK, 10_000)
    assert listed.private is not None and packed.private is not None
    assert packed.shared is not None and listed.shared is not None
    # every worker has its own copy of the list, at least its arrays
    assert len(listed.private) == 2 and all(v >= arrays for v in listed.private)
    # a pack's worker holds little of its own, and reads the pack's pages mapped
    assert all(v < arrays / 4 for v in packed.private)
    assert all(v >= arrays / 2 for v in packed.shared)
    assert listed.shared == [0, 0]  # a pickle is read, never mapped
    assert "n/a" not in " ".join(c for row in rows for c in row)


def _measure(approach: str, n: int, best: float, private: int) -> Measure:
    return Measure(
        approach,
        n,
        n * 300,
        0.1,
        reopen=[best, best * 1.5, best * 2],
        passes=[1.0, 1.0],
        private=[private, private],
        shared=[0, 0] if approach == PICKLE else [n * 300, n * 300],
    )


def _synthetic() -> Scaling:
    """Measures made up: the list wins at 1,000 samples, the pack at 100,000."""
    result = Scaling([1_000, 100_000], workers=2, trials=3)
    result.measures = [
        _measure(PICKLE, 1_000, 0.001, 10**6),
        _measure(PACK, 1_000, 0.002, 10**4),
        _measure(PICKLE, 100_000, 0.5, 10**8),
        _measure(PACK, 100_000, 0.004, 10**4),
    ]
    return result


def test_the_table_says_where_the_pickled_list_wins():
    result = _synthetic()
    rows = result.cells()
    assert rows[0][3] == "2.0x slower" and rows[1][3] == "125.0x faster"
    assert rows[0][1] == "1.0 ms / 1.5 ms" and rows[1][4] == "100.0, 100.0 MB"
    notes = "\n".join(result.notes())
    assert "at 1,000 samples the pickled list reopens faster: 1.0 ms against" in notes
    assert "at 100,000 samples the pickled list" not in notes
    assert "at every size here" not in notes
    assert "the pickled list's load took 500.0x as long, mlcache's open 2.0x" in notes
    assert "(100.0, 100.0 MB, 200.0 MB in all)" in notes
    said: list[str] = []
    result.show(said.append)
    printed = "\n".join(said)
    assert all(cell in printed for row in rows for cell in row)
    assert all(line in printed for line in result.notes())


def test_the_chart_is_drawn_and_in_the_report(tmp_path):
    result = _synthetic()
    said: list[str] = []
    result.chart = chart = scaling.chart(result, str(tmp_path / "c.png"), said.append)
    import matplotlib.image

    assert chart is not None
    image = matplotlib.image.imread(chart)
    assert image.shape[0] > 300 and image.shape[1] > 800
    report = "\n".join(result.markdown())
    assert "![reopen and memory at every size](c.png)" in report
    assert all(f"| {' | '.join(row)} |" in report for row in result.cells())
    assert all(f"- {line}" in report for line in result.notes())


def test_resident_reads_this_process_and_a_mapped_file(tmp_path):
    if not SMAPS:
        assert resident() is None
        return
    import mmap

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (1 << 20))
    assert resident(str(path))["Mapped"] == 0  # not mapped yet
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert sum(mm[i] for i in range(0, len(mm), 4096)) == 120 * 256  # every page touched
        now = resident(str(path))
        assert now is not None and now["Mapped"] == 1 << 20
        assert now["Rss"] >= now["Anonymous"] > 0


def test_a_failing_child_is_an_error_and_the_server_serves_on(tmp_path):
    server = Server()
    try:
        with pytest.raises(RuntimeError, match="FileNotFoundError"):
            server.ask("reopen", PACK, str(tmp_path / "missing.pack"))
        path = tmp_path / "one.pkl"
        path.write_bytes(pickle.dumps([{"y": 1}]))
        assert server.ask("reopen", PICKLE, str(path)) > 0
    finally:
        server.close()
    assert server.proc.returncode == 0


def test_notes_say_when_mlcache_wins_everywhere():
    result = _synthetic()
    result.measures[0] = _measure(PICKLE, 1_000, 0.003, 10**6)
    notes = "\n".join(result.notes())
    assert "the pickled list reopens faster" not in notes
    assert "the pack opened faster than the list loaded at every size here, 1,000 samples" in notes
