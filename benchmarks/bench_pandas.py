"""Hashing a 1M-row pandas DataFrame, one column kind at a time: mlcache vs joblib.

One frame per kind (numeric, categorical, tz-aware datetimes, object strings, the
default string dtype, nullable integers, periods, intervals), each with a
DatetimeIndex, hashed by ``mlcache.hash_value`` and by ``joblib.hash`` side by
side, trials interleaved, min and median.

Targets: at least 2x joblib for every kind; at least 8x for the numeric frame.

    python benchmarks/bench_pandas.py [--quick]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import joblib
import numpy as np
import pandas as pd

import mlcache
from _bench import Contender, Result, Target, finish, machine_note, measure, parse_args, report


def frames(n: int) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    index = pd.date_range("2020-01-01", periods=n, freq="min", name="t")
    words = np.array([f"word{i}" for i in range(1000)], dtype=object)
    ints = rng.integers(0, 1000, n)

    def frame(col: Any) -> pd.DataFrame:
        return pd.DataFrame({"c": col}, index=index)

    nullable = pd.array(ints, dtype="Int64")
    nullable[::7] = pd.NA
    return {
        "numeric": pd.DataFrame(
            {"a": rng.random(n), "b": ints, "c": rng.random(n).astype("float32")}, index=index
        ),
        "categorical": frame(pd.Categorical(words[ints])),
        "tz-aware datetime": frame(pd.date_range("2020-01-01", periods=n, freq="s", tz="UTC")),
        "object strings": frame(pd.Series(words[ints], dtype=object, index=index)),
        "string dtype": frame(pd.Series(words[ints], dtype="str", index=index)),
        "nullable Int64": frame(nullable),
        "period": frame(pd.period_range("2020-01", periods=n, freq="D")),
        "interval": frame(pd.IntervalIndex.from_breaks(np.arange(n + 1))),
    }


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n = 10_000 if args.quick else 1_000_000
    fast, slow = (3, 3) if args.quick else (9, 5)
    print(f"# bench_pandas: {n:,}-row DataFrames, one per column kind\n\n{machine_note()}")
    sections: dict[str, dict[str, Result]] = {}
    outcomes = []
    for kind, df in frames(n).items():

        def hashed(f: Callable[[Any], str], df: pd.DataFrame = df) -> Callable[[], str]:
            return lambda: f(df)

        contenders = [
            Contender("mlcache.hash_value", hashed(mlcache.hash_value), fast),
            Contender("joblib.hash", hashed(joblib.hash), slow),
        ]
        results = measure(contenders, progress=False)
        bound = 8 if kind == "numeric" else 2
        targets = [
            Target(f"{kind}: joblib / mlcache", "joblib.hash", "mlcache.hash_value", ">=", bound)
        ]
        outcomes += report(
            f"{kind} ({df.memory_usage(deep=True).sum() / 1e6:.0f} MB)", results, targets
        )
        sections[kind] = results
    return finish(args, "bench_pandas", sections, outcomes)


if __name__ == "__main__":
    sys.exit(main())
