"""mlcache.demo.loading and the report's tables: each step of part 1 timed a few
times (min and median), each saying what it times, so a reopen in a fresh process
with the source checked is never read against an open of the pack alone. Times
are only checked to exist, never their values."""

from __future__ import annotations

import math
import re
from pathlib import Path

from mlcache.demo import loading, report
from mlcache.demo.datasets import Patients, PatientsByItem
from mlcache.demo.epochs import counted
from mlcache.demo.report import BASELINE, MLCACHE, PICKLED, Row
from mlcache.demo.scaling import Scaling


def test_part_one_times_each_step_again_and_says_what_it_times(tmp_path):
    said: list[str] = []
    cache = tmp_path / "cache"
    rows, loaded = loading.measure(str(tmp_path), str(cache), 12, said.append, loader=False)
    assert all(len(r.times) == loading.REPEATS and 0 < r.seconds < math.inf for r in rows)
    assert all(r.seconds <= r.median for r in rows)
    first = [r for r in rows if r.group.startswith("a first run: 12 patient files")]
    fresh = [r for r in rows if r.group.startswith("a new run: 12 patient files")]
    assert [r.name for r in first] == [
        "read the files (every run)",
        "pickled list",
        "mlcache, load_item",
        "mlcache, load_source() (the alternative)",
    ]
    assert [r.who for r in first] == [BASELINE, PICKLED, MLCACHE, MLCACHE]
    assert all(r.what.startswith("this process") for r in first)
    assert "an empty cache" in first[2].what and "fills the pack" in first[2].what
    assert "builds the pack" in first[3].what
    # a new run: each trial a fresh process, the dataset's files checked, the pack's not
    assert [r.what for r in fresh] == [
        "a fresh process: pickle.load, list[0]",
        "a fresh process: open (12 files checked), ds[0]",
        "a fresh process: PackedDataset(pack)[0], nothing checked (as in part 4)",
    ]
    assert all(r.baseline == first[0].seconds for r in rows)
    # epoch 1 of each repeat loaded every file (an empty cache each time); the fresh
    # processes opened the filled pack and loaded none
    assert counted(loaded.counter) == 12 * loading.REPEATS
    assert loaded.ds.pack_path.startswith(str(cache))
    # the alternative's packs went once timed; the README's dataset's is kept
    names = [p.name for p in cache.iterdir() if p.name.startswith("mlcache.")]
    assert len(names) == 1 and names[0].startswith("mlcache.demo.datasets.PatientsByItem")
    assert Patients.__module__ == PatientsByItem.__module__ == "mlcache.demo.datasets"
    assert said[1:] == [
        f"timing a first run over 12 files ({loading.REPEATS}x each)",
        f"timing a new run, to its first sample ({loading.REPEATS} fresh processes each)",
    ]


def test_each_row_of_the_report_has_its_min_and_median(tmp_path):
    rows = [
        Row("g", "no cache", "this process: a call", BASELINE, [0.3, 0.1, 0.2], 0.1),
        Row("g", "mlcache", "a fresh process: open, ds[0]", MLCACHE, [0.004, 0.002, 0.05], 0.1),
    ]
    assert report.cells(rows[1]) == [
        "mlcache",
        "a fresh process: open, ds[0]",
        "2.0 ms",
        "4.0 ms",
        "50.0x faster",
    ]
    path = report.markdown(rows, [], None, str(tmp_path / "r.md"), conditions="Busy.")
    text = Path(path).read_text(encoding="utf-8")
    assert "| step | what is timed | min of 3 | median of 3 | vs the baseline (min) |" in text
    assert "| no cache | this process: a call | 100.0 ms | 200.0 ms | baseline |" in text
    assert "'a fresh process': a new run of a training script" in text
    assert re.search(r"^\d{4}-\d\d-\d\d .*Python [\d.]+\. Busy\.$", text, re.M)
    said: list[str] = []
    report.show(rows, ["a change"], said.append)
    assert said[1].startswith("Each step is timed 3 times: min")
    assert "  a change" in said


def test_part_four_says_its_reopen_is_the_file_alone():
    title = Scaling([1_000], workers=2, trials=3).title
    assert "reopen: a fresh process opens the file alone, no source to check" in title
    assert "min / median of 3" in title
