"""mlcache.demo.epochs: the first epochs of one training run (files, pickled list,
mlcache). Times are only checked to exist, never their values; what is checked
is what the figures mean: every file parsed once in mlcache's first epoch and
none after, a wrong sample reported, the lines, table and chart written."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mlcache.demo import PatientsByItem, epochs
from mlcache.demo.epochs import APPROACHES, FILES, MLCACHE, PICKLED, Epochs
from mlcache.demo.synthetic import read_patient, write_patients


def _paths(tmp_path: Any, n: int) -> list[str]:
    return sorted(str(p) for p in write_patients(tmp_path / "patients", n, seed=3))


def test_every_epoch_is_timed_and_mlcache_parses_each_file_once(tmp_path):
    paths = _paths(tmp_path, 24)
    said: list[str] = []

    def open_dataset(counter: str) -> PatientsByItem:
        return PatientsByItem(
            str(tmp_path / "patients"), counter, cache_dir=str(tmp_path / "cache"), progress=False
        )

    work = tmp_path / "work"
    result = epochs.measure(paths, read_patient, open_dataset, str(work), out=said.append)
    assert said == ["first epochs: 3 epochs of each approach over 24 files"]
    assert result.samples == 24 and sorted(result.times) == sorted(APPROACHES)
    assert all(len(t) == 3 and all(0 < s < math.inf for s in t) for t in result.times.values())
    # epoch 1 parses every file once (built up front or filled as it is read); later
    # epochs read the pack
    assert result.loads == [24, 0, 0]
    assert 0 < result.first_sample <= result.times[MLCACHE][0]
    assert result.wrong == []
    assert list(work.iterdir()) == []  # the pickle and the counter went
    lines = result.lines()
    assert len(lines) == 4 and lines[0].startswith("epoch 1: reading the files ")
    assert "(read + dump + pass)" in lines[0] and "24 files parsed" in lines[0]
    assert "first sample after " in lines[0] and "(in memory)" in lines[1]
    assert "(0 files parsed)" in lines[1] and "(0 files parsed)" in lines[2]
    assert lines[3] == "the samples checked after the last epoch equal a new parse of their files"


class _OneWrong:
    """A dataset whose sample 0 is not what its file says."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = read_patient(self.paths[i])
        if i == 0:
            sample["vitals"] = sample["vitals"] + 1
        return sample


def test_a_wrong_sample_is_said(tmp_path):
    paths = _paths(tmp_path, 5)
    result = epochs.measure(
        paths, read_patient, lambda counter: _OneWrong(paths), str(tmp_path / "w"), epochs=2
    )
    assert result.wrong == [0] and result.loads == [0, 0]
    assert result.lines()[-1] == "WRONG SAMPLES from mlcache at indices [0]"


def test_nothing_to_measure_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 1 epoch"):
        epochs.measure([], read_patient, lambda c: [], str(tmp_path))
    with pytest.raises(ValueError, match="at least 1 epoch"):
        epochs.measure(["x.csv"], read_patient, lambda c: [], str(tmp_path), epochs=0)


def _synthetic() -> Epochs:
    """Made up: mlcache's first epoch slower than the files, later ones faster."""
    return Epochs(
        300,
        {FILES: [2.0, 2.0, 2.0], PICKLED: [2.5, 0.001, 0.001], MLCACHE: [2.2, 0.02, 0.02]},
        first_sample=0.05,
        loads=[300, 0, 0],
    )


def test_one_line_per_epoch_and_the_report_section(tmp_path):
    result = _synthetic()
    lines = result.lines()
    assert lines[0] == (
        "epoch 1: reading the files 2.00 s, pickled list 2.50 s (read + dump + pass), "
        "mlcache 2.20 s (first sample after 50.0 ms; 300 files parsed): 1.1x slower than "
        "the files"
    )
    assert lines[1] == (
        "epoch 2: reading the files 2.00 s, pickled list 1.0 ms (in memory), mlcache 20.0 ms "
        "(0 files parsed): 100.0x faster than the files"
    )
    said: list[str] = []
    result.show(said.append)
    assert said[1] == f"## {result.title}" and all(f"  {line}" in said for line in lines)
    said.clear()
    result.chart = epochs.chart(result, str(tmp_path / "e.png"), said.append)
    assert result.chart is not None and said == []
    import matplotlib.image

    image = matplotlib.image.imread(result.chart)
    assert image.shape[0] > 300 and image.shape[1] > 600
    report = "\n".join(result.markdown())
    assert "| epoch | reading the files | pickled list | mlcache |" in report
    assert "| 1 | 2.00 s | 2.50 s | 2.20 s |" in report
    assert "| 3 | 2.00 s | 1.0 ms | 20.0 ms |" in report
    assert all(f"- {line}" in report for line in lines)
    assert "![per-epoch time](e.png)" in report


def test_count_appends_one_byte_a_call(tmp_path):
    counter = str(tmp_path / "loads")
    epochs.count(None)  # no counter: nothing
    assert epochs.counted(counter) == 0
    for _ in range(3):
        epochs.count(counter)
    assert epochs.counted(counter) == 3
