"""The first memory-mapped hit in a fresh process, which checks the payload.

An 800 MB float64 result (``x * 2``) is stored once; then each trial starts a
fresh Python process that makes the ``mmap_mode="r"`` hit twice: the first hit
checks the mapped payload (its block table, on all cores), the second finds the
file already checked and stays O(1). The difference of the two is the check;
its speed is reported in GB/s. The map alone (``EntryReader``) is timed the same
way, first and second, in the same process. File pages are warm (the entry was
just written or read), as for a hit that follows a run.

    python benchmarks/bench_first_hit.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

import mlcache
from _bench import check_free_disk, machine_note, parse_args, scratch_dir

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import mlcache
    from mlcache.entry import EntryReader

    loc, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def double(x):
        return x * 2

    x = np.arange(n * n, dtype=np.float64).reshape(n, n)
    f = mlcache.Memory(loc, verbose=0, mmap_mode="r").cache(double)
    out = {}
    t0 = time.perf_counter(); a = f(x); t1 = time.perf_counter(); b = f(x)
    t2 = time.perf_counter()
    out["hit1"], out["hit2"] = t1 - t0, t2 - t1
    assert a[n - 1, n - 1] == 2 * (n * n - 1) and b.shape == (n, n)
    mlcache.entry.forget_verified()
    t0 = time.perf_counter(); EntryReader(path, "r"); t1 = time.perf_counter()
    EntryReader(path, "r"); t2 = time.perf_counter()
    out["map1"], out["map2"] = t1 - t0, t2 - t1
    print(json.dumps(out))
    """
)


def double(x: np.ndarray) -> np.ndarray:
    return x * 2


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n, trials = (1000, 3) if args.quick else (10000, 7)
    print(f"# bench_first_hit\n\n{machine_note()}\n")
    with scratch_dir(args.dir, "first-hit") as root:
        loc = os.path.join(root, "mlcache")
        x = np.arange(n * n, dtype=np.float64).reshape(n, n)
        check_free_disk(root, 2 * x.nbytes)
        f = mlcache.Memory(loc, verbose=0).cache(double)
        f(x)
        shelf = f.call_and_shelve(x)
        path = f.memory.store.local_path(shelf.name)  # type: ignore[union-attr]
        del x
        time.sleep(2.5)  # past SETTLED_NS: a checked file is remembered
        script = os.path.join(root, "child.py")
        with open(script, "w") as fh:
            fh.write(CHILD)
        runs = []
        for _ in range(trials):
            res = subprocess.run(
                [sys.executable, script, loc, str(n), path],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    size = n * n * 8
    print("| in a fresh process | trials | min | median |\n|---|---:|---:|---:|")
    rows = {
        "first mapped hit (key + map + check)": "hit1",
        "second mapped hit (key + map)": "hit2",
        "first map (EntryReader, check)": "map1",
        "second map (EntryReader)": "map2",
    }
    for label, k in rows.items():
        v = [r[k] * 1e3 for r in runs]
        print(f"| {label} | {trials} | {min(v):.1f} ms | {statistics.median(v):.1f} ms |")
    check = [r["map1"] - r["map2"] for r in runs]
    hit = [r["hit1"] - r["hit2"] for r in runs]
    gbs = [size / c / 1e9 for c in check]
    print(
        f"\nThe check of {size / 1e6:.0f} MB: median {statistics.median(check) * 1e3:.1f} ms "
        f"({statistics.median(gbs):.1f} GB/s; best {max(gbs):.1f} GB/s) from the maps, "
        f"median {statistics.median(hit) * 1e3:.1f} ms "
        f"({size / statistics.median(hit) / 1e9:.1f} GB/s) from the hits."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
