"""A cache on S3 (issue 7), against a real SeaweedFS server on this machine.

(a) hit of a small call: the entry already copied to this machine (warm), and
    not yet (cold: one GET into the local read-through cache), beside the same
    hit on a local cache;
(b) the same for a 100 MB array, memory-mapped from the local copy;
(c) a full pass over a pack of 20,000 samples: opened from S3 with an empty
    local copy (fetch, then read) and opened from a local file;
(d) ``cached_map`` of a function that waits 0.2 s (like a download or a
    database query) over 16 new items, on a Dask cluster of 1, 2 and 4
    worker processes sharing the S3 cache.

Here the S3 server runs on the same 2-core VM as the benchmark, so "remote"
costs a loopback round trip and the server's own CPU, not a network.

    python benchmarks/bench_remote.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from typing import Any

import numpy as np

import mlcache
from _bench import (
    Contender,
    Outcome,
    Result,
    Target,
    finish,
    machine_note,
    measure,
    parse_args,
    report,
    scratch_dir,
)
from mlcache.data import PackedDataset, pack
from mlcache.testing import s3_options, seaweedfs


def small(a: int, b: int) -> dict[str, Any]:
    return {"a": a, "b": b, "sum": a + b}


def big(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def waits(x: int, salt: str) -> int:
    time.sleep(0.2)
    return x * 2


def _memory(url: str, options: dict[str, Any], local: str, **kw: Any) -> mlcache.Memory:
    return mlcache.Memory(
        url,
        verbose=0,
        secret="bench",
        backend_options={**options, "local_cache_dir": local},
        **kw,
    )


def bench_hits(
    root: str, url: str, options: dict[str, Any], n: int, trials: int
) -> tuple[dict[str, dict[str, Result]], list[Outcome]]:
    warm_dir, cold_dir = os.path.join(root, "warm"), os.path.join(root, "cold")
    s3_small = _memory(f"{url}/c", options, warm_dir).cache(small)
    cold_small = _memory(f"{url}/c", options, cold_dir).cache(small)
    local_small = mlcache.Memory(os.path.join(root, "local"), verbose=0, secret="bench").cache(
        small
    )
    s3_big = _memory(f"{url}/c", options, warm_dir, mmap_mode="r").cache(big)
    cold_big = _memory(f"{url}/c", options, cold_dir, mmap_mode="r").cache(big)
    s3_small(3, 4), local_small(3, 4), s3_big(n)

    def empty_cold() -> None:
        shutil.rmtree(cold_dir, ignore_errors=True)
        os.makedirs(cold_dir)

    res_a = measure(
        [
            Contender("S3 cache, warm (local copy)", lambda: s3_small(3, 4), trials, reps=50),
            Contender(
                "S3 cache, cold (one GET)", lambda: cold_small(3, 4), trials, before=empty_cold
            ),
            Contender("local cache", lambda: local_small(3, 4), trials, reps=50, info=True),
        ]
    )
    out = report(
        "(a) hit of a small call",
        res_a,
        [
            Target(
                "(a) cold / warm",
                "S3 cache, cold (one GET)",
                "S3 cache, warm (local copy)",
                ">=",
                1,
            )
        ],
    )
    res_b = measure(
        [
            Contender("S3 cache, warm, mmap", lambda: s3_big(n), trials),
            Contender(
                "S3 cache, cold, mmap (fetch)", lambda: cold_big(n), trials, before=empty_cold
            ),
        ]
    )
    out += report(
        f"(b) hit of a {8 * n / 1e6:.0f} MB array, mmap_mode='r'",
        res_b,
        [
            Target(
                "(b) cold / warm", "S3 cache, cold, mmap (fetch)", "S3 cache, warm, mmap", ">=", 1
            )
        ],
    )
    return {"a": res_a, "b": res_b}, out


def bench_pack(
    root: str, url: str, options: dict[str, Any], samples: int, trials: int
) -> tuple[dict[str, Result], list[Outcome]]:
    import s3fs

    rows = ({"x": np.full(600, i, dtype=np.float32), "i": i} for i in range(samples))
    local = pack(rows, os.path.join(root, "train.pack"), progress=False)
    remote = f"{url}/packs/train.pack"
    s3fs.S3FileSystem(**options).put_file(local.path, remote[5:])
    copies = os.path.join(root, "pack-copies")

    def full_pass(ds: PackedDataset) -> float:
        return float(sum(float(ds[i]["x"][0]) for i in range(len(ds))))

    def from_s3() -> float:
        return full_pass(PackedDataset(remote, storage_options=options, local_cache_dir=copies))

    res = measure(
        [
            Contender(
                "open from S3 (fetch) + pass",
                from_s3,
                trials,
                before=lambda: shutil.rmtree(copies, ignore_errors=True),
            ),
            Contender("open from S3 (local copy) + pass", from_s3, trials),
            Contender(
                "open a local file + pass", lambda: full_pass(PackedDataset(local.path)), trials
            ),
        ]
    )
    size = os.path.getsize(local.path) / 1e6
    out = report(
        f"(c) a full pass over a pack of {samples:,} samples ({size:.0f} MB)",
        res,
        [
            Target(
                "(c) S3 with local copy / local file",
                "open from S3 (local copy) + pass",
                "open a local file + pass",
                "<=",
                1.5,
            )
        ],
    )
    return res, out


def bench_scaling(
    root: str, url: str, options: dict[str, Any], items: int, trials: int
) -> tuple[dict[str, Result], list[Outcome]]:
    import distributed

    from mlcache.memo.parallel import cached_map

    res: dict[str, Result] = {}
    for workers in (1, 2, 4):
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            silence_logs=50,  # its shutdown chatter is not the benchmark's
        )
        with cluster, distributed.Client(cluster) as client:
            f = _memory(f"{url}/map", options, os.path.join(root, f"map-{workers}")).cache(waits)
            client.run(lambda: None)  # workers up

            def run(f: Any = f, client: Any = client) -> None:
                salt = uuid.uuid4().hex  # new items every trial: all computed
                cached_map(
                    f,
                    [(i, salt) for i in range(items)],
                    executor="dask",
                    client=client,
                    progress=False,
                    star=True,
                )

            res.update(measure([Contender(f"{workers} worker(s)", run, trials)], progress=False))
    out = report(
        f"(d) cached_map over {items} new items of a function that waits 0.2 s, Dask workers",
        res,
        [
            Target("(d) 1 worker / 2 workers", "1 worker(s)", "2 worker(s)", ">=", 1.6),
            Target("(d) 1 worker / 4 workers", "1 worker(s)", "4 worker(s)", ">=", 3),
        ],
    )
    return res, out


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n, samples, items, trials = (
        (100_000, 2_000, 4, 1) if args.quick else (12_500_000, 20_000, 16, 9)
    )
    print(f"# bench_remote\n\n{machine_note()}")
    with scratch_dir(args.dir, "remote") as root, seaweedfs(os.path.join(root, "s3")) as endpoint:
        import s3fs

        options = s3_options(endpoint)
        s3fs.S3FileSystem(**options).mkdir("bench")
        url = "s3://bench"
        hits, out = bench_hits(root, url, options, n, trials)
        packs, out_c = bench_pack(root, url, options, samples, max(trials, 3) // 3)
        scaling, out_d = bench_scaling(root, url, options, items, max(trials, 3) // 3)
    return finish(args, "bench_remote", {**hits, "c": packs, "d": scaling}, out + out_c + out_d)


if __name__ == "__main__":
    sys.exit(main())
