"""Run every benchmark, each in its own process, and print a summary of the targets.

    python benchmarks/run_all.py [--quick] [--dir PARENT] [--only SCRIPT ...]

Exits with 1 if a benchmark failed or (in a full run) missed a target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [
    "bench_hash.py",
    "bench_pandas.py",
    "bench_typed.py",
    "bench_hit.py",
    "bench_audit.py",
    "bench_new_run.py",
    "bench_miss.py",
    "bench_data.py",
    "bench_data_memory.py",
    "bench_cached_open.py",
    "bench_build.py",
    "bench_fill.py",
    "bench_chain.py",
    "bench_remote.py",
    "bench_eviction.py",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny smoke runs (a few seconds each)")
    p.add_argument("--dir", default=None, help="parent folder of the scratch cache folders")
    p.add_argument(
        "--only",
        nargs="+",
        choices=SCRIPTS,
        metavar="SCRIPT",
        help="run these scripts only (default: all of %(choices)s)",
    )
    args = p.parse_args()
    rows, status = [], 0
    with tempfile.TemporaryDirectory(prefix="mlcache-bench-json-") as tmp:
        for script in args.only or SCRIPTS:
            out = os.path.join(tmp, script + ".json")
            cmd = [sys.executable, os.path.join(HERE, script), "--json", out]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--dir", args.dir] if args.dir else []
            print(f"\n$ {' '.join(cmd[1:])}", flush=True)
            rc = subprocess.call(cmd)
            if not os.path.exists(out):
                rows.append((script, "crashed", "", "", "", f"exit status {rc}"))
                status = 1
                continue
            with open(out) as f:
                record = json.load(f)
            for t in record["targets"]:
                rows.append(
                    (
                        script,
                        t["label"],
                        f"{t['ratio_median']:.2f}",
                        f"{t['ratio_min']:.2f}",
                        f"{t['op']} {t['bound']:g}",
                        t["verdict"],
                    )
                )
            status = status or rc
    print("\n## Summary" + (" (quick run: targets not enforced)" if args.quick else "") + "\n")
    print("| script | ratio | of medians | of minima | target | verdict |")
    print("|---|---|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return status


if __name__ == "__main__":
    sys.exit(main())
