"""A synthetic, MIMIC-like dataset for demos, tests and benchmarks.

:func:`write_patients` writes one CSV file per patient: an hourly time series of
vitals of variable length, preceded by ``# key: value`` lines of demographics
and a label. :func:`read_patient` parses one back into a sample dict, the
way a user's loader would. Deterministic for a seed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._util import progress as _progress

__all__ = ["VITALS", "read_patient", "write_patients"]

#: the vitals columns, in file order
VITALS = ("heart_rate", "sys_bp", "dia_bp", "spo2", "temperature", "resp_rate")
_MEAN = np.array([80.0, 120.0, 75.0, 97.0, 37.0, 16.0])
_SPREAD = np.array([12.0, 15.0, 10.0, 2.0, 0.6, 3.0])


def write_patients(
    folder: str | os.PathLike[str],
    n_patients: int,
    seed: int = 0,
    *,
    fmt: str = "csv",
    min_hours: int = 12,
    max_hours: int = 96,
    progress: bool = False,
) -> list[Path]:
    """Write ``n_patients`` files (``p00000.csv`` ...) into ``folder``; return their paths.

    A file that already holds what it would be written with is left as it is.

    ``fmt`` is ``"csv"`` or ``"json"``; ``progress`` shows a progress bar (tqdm,
    on a terminal).

    >>> import tempfile
    >>> paths = write_patients(tempfile.mkdtemp(), 3, seed=1)
    >>> sorted(read_patient(paths[0]))
    ['age', 'id', 'label', 'sex', 'vitals']
    """
    if n_patients < 1:
        raise ValueError(f"n_patients must be at least 1, got {n_patients}")
    if fmt not in ("csv", "json"):
        raise ValueError(f"fmt must be 'csv' or 'json', got {fmt!r}")
    if not 1 <= min_hours <= max_hours:
        raise ValueError(f"need 1 <= min_hours <= max_hours, got {min_hours}, {max_hours}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    steps = _progress(range(n_patients), "writing patient files", unit=" files", enabled=progress)
    for i in steps:
        hours = int(rng.integers(min_hours, max_hours + 1))
        age = int(rng.integers(18, 95))
        sex = "F" if rng.random() < 0.5 else "M"
        drift = rng.normal(0, 1, size=(hours, 6)).cumsum(axis=0) * 0.3
        vitals = (_MEAN + _SPREAD * (rng.normal(0, 0.5, size=(hours, 6)) + drift)).astype(
            np.float32
        )
        risk = (
            0.02 * (age - 50) + 0.05 * (vitals[:, 0].mean() - 80) - 0.2 * (vitals[:, 3].mean() - 97)
        )
        label = int(rng.random() < 1 / (1 + np.exp(-risk)))
        pid = f"p{i:05d}"
        path = out / f"{pid}.{fmt}"
        if fmt == "csv":
            header = (
                f"# id: {pid}\n# age: {age}\n# sex: {sex}\n# label: {label}\n"
                f"hour,{','.join(VITALS)}\n"
            )
            rows = "\n".join(
                f"{h}," + ",".join(f"{v:.2f}" for v in row) for h, row in enumerate(vitals)
            )
            _write_if_new(path, header + rows + "\n")
        else:
            record = {
                "id": pid,
                "age": age,
                "sex": sex,
                "label": label,
                "vitals": {
                    name: [round(float(v), 2) for v in vitals[:, k]]
                    for k, name in enumerate(VITALS)
                },
            }
            _write_if_new(path, json.dumps(record))
        paths.append(path)
    return paths


def _write_if_new(path: Path, text: str) -> None:
    """Write ``text`` unless the file holds it already: a script that makes its data
    at each run (the README's examples) leaves files it would write unchanged as
    they were (their mtime too), as a real folder of data that did not change."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)


def read_patient(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse one patient file into ``{"vitals": float32[T, 6], "age", "sex", "label", "id"}``."""
    p = Path(path)
    if p.suffix == ".json":
        record = json.loads(p.read_text())
        vitals = np.array([record["vitals"][name] for name in VITALS], dtype=np.float32).T
        return {
            "vitals": np.ascontiguousarray(vitals),
            "age": int(record["age"]),
            "sex": record["sex"],
            "label": int(record["label"]),
            "id": record["id"],
        }
    meta: dict[str, str] = {}
    rows = []
    with open(p) as f:
        for line in f:
            if line.startswith("#"):
                key, _, value = line[1:].partition(":")
                meta[key.strip()] = value.strip()
            elif line[0].isdigit():
                rows.append([float(x) for x in line.split(",")[1:]])
    return {
        "vitals": np.array(rows, dtype=np.float32).reshape(-1, len(VITALS)),
        "age": int(meta["age"]),
        "sex": meta["sex"],
        "label": int(meta["label"]),
        "id": meta["id"],
    }
