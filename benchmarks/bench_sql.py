"""A database query into a pack, and the disk a pack build needs (issue 13).

(a) ``pack(from_sql(query, connection))`` of a sqlite file of 500,000 rows (two
    int, two float and a text column, some NULLs, a NUMERIC column holding ints
    and floats), against ``pandas.read_sql`` of the same query and a pickle of
    the frame to a file. Target: mlcache / pandas <= 2. Breakdown rows: the
    rows fetched alone (``cursor.fetchall``), and the same pack built from one
    dict per row (``iter(source)``, what ``pack`` did before it took columns).
(b) Peak disk use while packing ~200 MB of arrays: the sum of the file sizes
    in the pack's folder, sampled by a thread all along the build, against the
    pack's size. Target: peak / pack <= 1.2 (a build used to need 2x).

    python benchmarks/bench_sql.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import sys
import threading
from typing import Any

import numpy as np
import pandas as pd

from _bench import (
    Contender,
    Outcome,
    Result,
    Target,
    check_free_disk,
    finish,
    machine_note,
    mb,
    measure,
    outcome,
    parse_args,
    print_outcomes,
    report,
    scratch_dir,
)
from mlcache.data import pack
from mlcache.data.sql import from_sql
from mlcache.data.writer import SPILL_CHUNK

QUERY = "SELECT id, age, score, weight, name, amount FROM visits"


def make_db(path: str, rows: int) -> None:
    """``rows`` visits: ints, floats (some NULL), text (some NULL), a NUMERIC mix."""
    rng = np.random.default_rng(0)
    ages = rng.integers(18, 95, rows).tolist()
    scores = rng.normal(50, 10, rows).round(3).tolist()
    weights = rng.normal(70, 12, rows).round(1).tolist()
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE visits (id INTEGER, age INTEGER, score REAL, weight REAL, "
        "name TEXT, amount NUMERIC)"
    )
    db.executemany(
        "INSERT INTO visits VALUES (?, ?, ?, ?, ?, ?)",
        (
            (
                i,
                ages[i],
                scores[i],
                None if i % 97 == 0 else weights[i],
                None if i % 31 == 0 else f"patient {i:07d}",
                i if i % 3 else i + 0.25,
            )
            for i in range(rows)
        ),
    )
    db.commit()
    db.close()


def bench_sql(root: str, rows: int, trials: int) -> tuple[dict[str, Result], list[Outcome]]:
    db_path = os.path.join(root, "visits.db")
    make_db(db_path, rows)
    out_pickle = os.path.join(root, "frame.pkl")
    out_pack = os.path.join(root, "visits.pack")
    out_rows = os.path.join(root, "rows.pack")

    def pandas_way() -> None:
        with sqlite3.connect(db_path) as db:
            frame = pd.read_sql(QUERY, db)
        with open(out_pickle, "wb") as f:
            pickle.dump(frame, f, protocol=5)

    def mlcache_way() -> Any:
        with sqlite3.connect(db_path) as db:
            return pack(from_sql(QUERY, db), out_pack, progress=False)

    def mlcache_rows() -> Any:
        with sqlite3.connect(db_path) as db:
            return pack(iter(from_sql(QUERY, db)), out_rows, progress=False)

    def fetch_only() -> None:
        with sqlite3.connect(db_path) as db:
            db.execute(QUERY).fetchall()

    ds = mlcache_way()
    frame = pd.read_sql(QUERY, sqlite3.connect(db_path))
    for j in (0, 1, 31, rows - 1):  # the same rows as pandas reads (NULL: None or NaN)
        got, want = ds[j], frame.iloc[j].to_dict()
        for key, value in want.items():
            if got[key] is None:
                assert value is None or value != value, (j, key)
            else:
                assert got[key] == value, (j, key, got[key], value)
    res = measure(
        [
            Contender("pandas.read_sql + pickle.dump", pandas_way, trials),
            Contender("mlcache: pack(from_sql(...))", mlcache_way, trials),
            Contender("mlcache: pack of one dict per row", mlcache_rows, trials, info=True),
            Contender("sqlite3 fetchall alone", fetch_only, trials, info=True),
        ]
    )
    sizes = f"pickle {mb(os.path.getsize(out_pickle))}, pack {mb(os.path.getsize(out_pack))}"
    outcomes = report(
        f"(a) {rows:,} rows of 6 columns from sqlite into a file ({sizes})",
        res,
        [
            Target(
                "(a) from_sql + pack / read_sql + pickle",
                "mlcache: pack(from_sql(...))",
                "pandas.read_sql + pickle.dump",
                "<=",
                2,
            )
        ],
    )
    return res, outcomes


def _folder_size(folder: str) -> int:
    total = 0
    for where, _dirs, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(where, name)).st_size
            except FileNotFoundError:  # a spill file deleted meanwhile
                pass
    return total


def bench_disk(root: str, total_mb: int, trials: int) -> list[Outcome]:
    folder = os.path.join(root, "disk")
    os.makedirs(folder)
    per = 256 * 1024  # bytes of each sample's array
    n = total_mb * (1 << 20) // per
    check_free_disk(root, 3 * total_mb * (1 << 20))
    ratios, lines = [], []
    for _ in range(trials):
        peak = [0]
        done = threading.Event()

        def sample(peak: list[int] = peak, done: threading.Event = done) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _folder_size(folder))
                done.wait(0.002)

        watcher = threading.Thread(target=sample)
        watcher.start()
        try:
            ds = pack(
                (
                    {
                        "x": np.full(per // 4, i, dtype=np.float32),
                        "label": i % 10,
                        "name": f"s{i}",
                    }
                    for i in range(n)
                ),
                os.path.join(folder, "big.pack"),
                progress=False,
            )
        finally:
            done.set()
            watcher.join()
        size = os.path.getsize(ds.path)
        del ds
        os.unlink(os.path.join(folder, "big.pack"))
        ratios.append(peak[0] / size)
        lines.append(
            f"| {mb(size)} | {mb(peak[0])} | {mb(peak[0] - size)} | {peak[0] / size:.3f} |"
        )
    print(f"\n### (b) peak disk use while packing {n:,} samples of {per // 1024} KiB\n")
    print("| pack | peak in the folder | over the pack | peak / pack |")
    print("|---:|---:|---:|---:|")
    print("\n".join(lines))
    result = outcome("(b) peak disk / pack size", float(np.median(ratios)), min(ratios), "<=", 1.2)
    print_outcomes([result])
    return [result]


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    rows, trials, disk_mb = (20_000, 3, 20) if args.quick else (500_000, 7, 200)
    print(f"# bench_sql\n\n{machine_note()}")
    with scratch_dir(args.dir, "sql") as root:
        a, out_a = bench_sql(root, rows, trials)
        out_b = bench_disk(root, disk_mb, 3)
    print(f"\n(spill files are at most {mb(SPILL_CHUNK)} each)")
    return finish(args, "bench_sql", {"a": a}, out_a + out_b)


if __name__ == "__main__":
    sys.exit(main())
