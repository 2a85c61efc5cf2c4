"""Packs of what a JSON source gives, without pickle (issue 18): lists of numbers
(arrays), lists of str (kind ``strs``) and nested dicts (kind ``dict``).

20,000 records (2,000 with ``--quick``) as a JSON-lines file gives them::

    {"id": 7, "tokens": [int] * 32..128, "tags": [str] * 0..4,
     "meta": {"age": int, "site": str, "scores": [float] * 3}}

are packed twice, side by side: with ``allow_pickle=False`` (the new kinds) and
with ``allow_pickle=True`` (each list and dict a pickle, as before issue 18).
Timed, each trial preceded by an untimed warm-up, rounds interleaved
(``_bench.py``): a full pass in random order over each pack (``ds[i]``, every
field touched), the same pass parsing the JSON lines (``json.loads`` of each
line, in memory: the source's own cost, no disk), and building each pack.
Printed: min and median, and the ratios. No target in the issue: the figures
go into ``benchmarks/RESULTS.md``.

    python benchmarks/bench_field_kinds.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from _bench import Contender, Target, machine_note, measure, parse_args, report, scratch_dir
from mlcache.data import PackedDataset, pack


def records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` records of the shape above, deterministic."""
    rng = np.random.default_rng(seed)
    words = ["pos", "neg", "icu", "er", "ward", "child", "adult"]
    out = []
    for i in range(n):
        tokens = rng.integers(0, 50_000, int(rng.integers(32, 129))).tolist()
        tags = [words[int(k)] for k in rng.integers(0, len(words), int(rng.integers(0, 5)))]
        meta = {
            "age": int(rng.integers(0, 100)),
            "site": f"site-{int(rng.integers(0, 40))}",
            "scores": rng.random(3).round(4).tolist(),
        }
        out.append({"id": i, "tokens": tokens, "tags": tags, "meta": meta})
    return out


def _touch(sample: dict[str, Any]) -> int:
    """Every field used, as a training step would (a length, a value)."""
    return len(sample["tokens"]) + len(sample["tags"]) + sample["meta"]["age"]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n = 2_000 if args.quick else 20_000
    trials = 3 if args.quick else 9
    build_trials = 2 if args.quick else 5
    rows = records(n)
    lines = [json.dumps(r) for r in rows]
    order = np.random.default_rng(1).permutation(n).tolist()
    with scratch_dir(args.dir, "kinds") as d:
        plain_path, pickled_path = os.path.join(d, "plain.pack"), os.path.join(d, "pickled.pack")

        def build_plain() -> None:
            pack((json.loads(line) for line in lines), plain_path, progress=False)

        def build_pickled() -> None:
            pack(
                (json.loads(line) for line in lines),
                pickled_path,
                progress=False,
                allow_pickle=True,
            )

        build_plain()
        build_pickled()
        plain = PackedDataset(plain_path)
        pickled = PackedDataset(pickled_path, allow_pickle=True)
        assert plain[5]["tokens"].tolist() == rows[5]["tokens"]
        assert plain[5]["tags"] == rows[5]["tags"] and pickled[5] == rows[5]
        print(
            f"{n:,} records; packs: no pickle {os.path.getsize(plain_path) / 2**20:.1f} MiB, "
            f"pickled {os.path.getsize(pickled_path) / 2**20:.1f} MiB; "
            f"JSON {sum(map(len, lines)) / 2**20:.1f} MiB"
        )

        def pass_over(ds: PackedDataset) -> Any:
            def run() -> int:
                return sum(_touch(ds[i]) for i in order)

            return run

        def pass_json() -> int:
            return sum(_touch(json.loads(lines[i])) for i in order)

        results = measure(
            [
                Contender("pass, pack without pickle", pass_over(plain), trials),
                Contender("pass, pickled pack", pass_over(pickled), trials),
                Contender("pass, json.loads each line", pass_json, trials),
                Contender("build, without pickle", build_plain, build_trials),
                Contender("build, pickled", build_pickled, build_trials),
            ]
        )
        report(
            f"Field kinds of a JSON source, {n:,} records ({machine_note()})",
            results,
            [
                Target(
                    "pass: without pickle / pickled",
                    "pass, pack without pickle",
                    "pass, pickled pack",
                    "<=",
                    1.0,
                ),
                Target(
                    "pass: without pickle / json.loads",
                    "pass, pack without pickle",
                    "pass, json.loads each line",
                    "<=",
                    1.0,
                ),
                Target(
                    "build: without pickle / pickled",
                    "build, without pickle",
                    "build, pickled",
                    "<=",
                    2.0,
                ),
            ],
        )


if __name__ == "__main__":
    main()
