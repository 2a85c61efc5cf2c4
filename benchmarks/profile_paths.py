"""Where mlcache's time goes: its hot paths next to the primitives they are made of.

Not a benchmark with targets: the figures behind the findings in RESULTS.md.
Each section times mlcache (through its public API) and a few hand-written
variants of the same work, side by side, interleaved, with warm-ups:

1. storing 800 MB durably: the entry writer's scheme (32 MiB chunks, xxh3 of
   each chunk, fsync) with and without preallocating the file
   (``os.posix_fallocate``, which ``numpy.save`` also does) and smaller chunks;
2. loading 800 MB into memory: ``MemorizedResult.get()`` against one
   ``readinto``, ``readinto`` then the checksum, and chunked read + checksum;
3. the key of an 800 MB array: xxh3-128 on one thread against two threads
   hashing halves (xxhash releases the GIL);
4. a small hit's pieces: opening and reading a tiny file through ``io.open``
   (with the ``fstat``) against ``os.open``/``os.read``;
5. the first hit of an entry (the next run of a script): mlcache's, its read
   (``EntryReader`` + ``decode``), and the floor: the file read, every check
   mlcache makes (header, checksums, layout JSON, signature) and the ``npy``
   decode written inline, without the layers, over 200 entries hit once each.

    python benchmarks/profile_paths.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

import mlcache
from _bench import (
    Contender,
    check_free_disk,
    machine_note,
    measure,
    parse_args,
    report,
    scratch_dir,
)

_CHUNK = 1 << 25  # the entry writer's chunk (entry._WRITE_CHUNK)


ARRAY = np.empty(0)


def double(x: np.ndarray) -> np.ndarray:
    return x * 2


def produce(i: int) -> np.ndarray:
    return ARRAY


def small(a: int, b: int) -> dict[str, Any]:
    return {"a": a, "b": b, "sum": a + b, "name": "small"}


def _rm(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_variant(path: str, mv: memoryview, *, prealloc: bool, chunk: int) -> Callable[[], None]:
    def run() -> None:
        h = xxhash.xxh3_64()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if prealloc:
                os.posix_fallocate(fd, 0, len(mv))
            for start in range(0, len(mv), chunk):
                piece = mv[start : start + chunk]
                h.update(piece)
                os.write(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)

    return run


def read_variant(path: str, off: int, n: int, *, chunk: int, check: bool) -> Callable[[], Any]:
    def run() -> Any:
        buf = np.empty(n, dtype=np.uint8)
        mv = memoryview(buf)
        h = xxhash.xxh3_64()
        fd = os.open(path, os.O_RDONLY)
        try:
            got = 0
            while got < n:
                k = os.preadv(fd, [mv[got : got + chunk]], off + got)
                if check and chunk < n:
                    h.update(mv[got : got + k])
                got += k
        finally:
            os.close(fd)
        if check and chunk >= n:
            h.update(mv)
        return buf

    return run


def two_thread_hash(mv: memoryview) -> Callable[[], bytes]:
    def run() -> bytes:
        half = len(mv) // 2
        out: list[bytes] = [b"", b""]

        def work(i: int) -> None:
            out[i] = xxhash.xxh3_128(mv[i * half : len(mv) if i else half]).digest()

        t = threading.Thread(target=work, args=(1,))
        t.start()
        work(0)
        t.join()
        return xxhash.xxh3_128(out[0] + out[1]).digest()

    return run


def main() -> int:
    global ARRAY
    args = parse_args(__doc__.splitlines()[0])
    n, trials = (1000, 3) if args.quick else (10000, 9)
    print(f"# profile_paths\n\n{machine_note()}")
    x = ARRAY = np.random.default_rng(0).random((n, n))
    mv = memoryview(x.reshape(-1).view(np.uint8))
    mb = x.nbytes / 1e6
    with scratch_dir(args.dir, "profile") as root:
        check_free_disk(root, 6 * x.nbytes)

        # 1. the write path
        store = mlcache.Memory(os.path.join(root, "w"), verbose=0).cache(produce)
        shelf = store.call_and_shelve(0)  # the entry's name; removed before each trial
        sink = os.path.join(root, "variant.bin")

        def ml_store() -> None:
            store.call(0)  # always computes (returns a precomputed array) and stores

        res = measure(
            [
                Contender(
                    "mlcache MemorizedFunc.call (store only)",
                    ml_store,
                    trials,
                    before=shelf.clear,
                ),
                Contender(
                    "32 MiB chunks + xxh3 + fsync (mlcache's scheme)",
                    write_variant(sink, mv, prealloc=False, chunk=_CHUNK),
                    trials,
                    before=lambda: _rm(sink),
                    after=lambda: _rm(sink),
                ),
                Contender(
                    "posix_fallocate + 32 MiB chunks + xxh3 + fsync",
                    write_variant(sink, mv, prealloc=True, chunk=_CHUNK),
                    trials,
                    before=lambda: _rm(sink),
                    after=lambda: _rm(sink),
                ),
                Contender(
                    "posix_fallocate + 1 MiB chunks + xxh3 + fsync",
                    write_variant(sink, mv, prealloc=True, chunk=1 << 20),
                    trials,
                    before=lambda: _rm(sink),
                    after=lambda: _rm(sink),
                ),
            ]
        )
        report(f"1. Storing {mb:.0f} MB durably", res, [])
        shelf.clear()

        # 2. the read path
        ml = mlcache.Memory(os.path.join(root, "r"), verbose=0).cache(double)
        ml(x)
        shelf = ml.call_and_shelve(x)
        path = os.path.join(ml.memory.location, shelf.name)
        off = os.path.getsize(path) - x.nbytes  # the payload is the file's tail
        res = measure(
            [
                Contender("mlcache MemorizedResult.get() (read + checksum)", shelf.get, trials),
                Contender(
                    "one preadv, no checksum",
                    read_variant(path, off, x.nbytes, chunk=x.nbytes, check=False),
                    trials,
                ),
                Contender(
                    "one preadv, then xxh3_64",
                    read_variant(path, off, x.nbytes, chunk=x.nbytes, check=True),
                    trials,
                ),
                Contender(
                    "1 MiB preadv + xxh3_64 of each chunk",
                    read_variant(path, off, x.nbytes, chunk=1 << 20, check=True),
                    trials,
                ),
            ]
        )
        report(f"2. Loading {mb:.0f} MB into memory", res, [])

        # 3. the key of a big array
        res = measure(
            [
                Contender("mlcache.hash_value(x)", lambda: mlcache.hash_value(x), 2 * trials + 1),
                Contender(
                    "xxh3_128, one thread", lambda: xxhash.xxh3_128(mv).digest(), 2 * trials + 1
                ),
                Contender(
                    "xxh3_128 of two halves, two threads", two_thread_hash(mv), 2 * trials + 1
                ),
            ]
        )
        report(f"3. The key of a {mb:.0f} MB array", res, [])

        # 4. a small hit
        sm = mlcache.Memory(os.path.join(root, "s"), verbose=0).cache(small)
        sm(3, 4)
        small_shelf = sm.call_and_shelve(3, 4)
        tiny = os.path.join(sm.memory.location, small_shelf.name)

        def io_read() -> bytes:
            with open(tiny, "rb", buffering=0) as f:
                os.fstat(f.fileno())
                return f.read(1 << 16)

        def os_read() -> bytes:
            fd = os.open(tiny, os.O_RDONLY)
            try:
                return os.read(fd, 1 << 16)
            finally:
                os.close(fd)

        reps = 200 if args.quick else 2000
        res = measure(
            [
                Contender("mlcache hit f(3, 4)", lambda: sm(3, 4), 4 * trials, reps),
                Contender(
                    "its key: hash_value((3, 4))",
                    lambda: mlcache.hash_value((3, 4)),
                    4 * trials,
                    reps,
                ),
                Contender("io.open(buffering=0) + fstat + read", io_read, 4 * trials, reps),
                Contender("os.open + os.read + os.close", os_read, 4 * trials, reps),
            ]
        )
        report("4. A small hit's pieces", res, [])
        report("5. A first hit and its floor", first_hits(sm, trials), [])
    return 0


def first_hits(f: Any, trials: int) -> dict[str, Any]:
    """Section 5: each timed run hits 200 entries of ``f`` once each, the
    in-process tier and the layout cache emptied before it (a first hit each)."""
    from mlcache.codecs import codecs
    from mlcache.entry import format as fmt
    from mlcache.entry.reader import EntryReader, decode
    from mlcache.memo.tier import tier

    n = 200
    for i in range(n):
        f(i, i + 1)
    names = [f._name((i, i + 1), {}) for i in range(n)]
    paths = [f._path(name) for name in names]
    signer, npy = f._ctx.signer, codecs["npy"]
    at = iter(())

    def reset() -> None:
        nonlocal at
        fmt._parse_small_layout.cache_clear()
        tier.clear()
        at = itertools.cycle(range(n))

    def read(path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 1 << 16)
        finally:
            os.close(fd)

    def checked(path: str, name: str) -> Any:  # every check of entry/reader, inline
        head = read(path)
        magic, version, flags, lay_n, info_n, _n, p_off, p_len, p_sum, h_sum, _r = (
            fmt.HEADER.unpack_from(head)
        )
        meta_end = 64 + lay_n + info_n
        mv = memoryview(head)
        seed = xxhash.xxh3_64_intdigest(mv[:48])
        ok = magic == fmt.MAGIC and version == fmt.FORMAT_VERSION and not _r
        ok = ok and len(head) == p_off + p_len and flags == fmt.SIGNED
        ok = ok and xxhash.xxh3_64_intdigest(mv[64:meta_end], seed=seed) == h_sum
        ok = ok and xxhash.xxh3_64_intdigest(mv[p_off:]) == p_sum
        lay = json.loads(head[64 : 64 + lay_n].decode())
        name_b = name.encode()
        message = b"".join((head[:48], mv[64:meta_end], len(name_b).to_bytes(4, "little"), name_b))
        key_id, mac = head[meta_end : meta_end + 8], head[meta_end + 8 : meta_end + 40]
        if not (ok and signer.verify(mac, message) and key_id == signer.key_id):
            raise ValueError(f"{path}: not a whole signed entry")
        return lay

    def one(work: Callable[[int], Any]) -> Callable[[], Any]:
        return lambda: work(next(at))

    rows = [
        ("mlcache first hit f(i, i + 1)", lambda i: f(i, i + 1)),
        (
            "mlcache's read: EntryReader + decode",
            lambda i: decode(EntryReader(paths[i], None, signer, names[i]), allow_pickle=True),
        ),
        ("floor: os.open + os.read + os.close", lambda i: read(paths[i])),
        ("floor: + every check, inline", lambda i: checked(paths[i], names[i])),
        (
            "floor: + the npy decode, inline",
            lambda i: npy._dec(checked(paths[i], names[i])["c"]["tree"], None),
        ),
        ("floor: the key of (i, i + 1)", lambda i: f._key((i, i + 1), {})),
    ]
    return measure([Contender(name, one(work), 4 * trials, n, before=reset) for name, work in rows])


if __name__ == "__main__":
    sys.exit(main())
