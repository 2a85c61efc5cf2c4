"""Pipeline chaining and code fingerprints (issue 6).

(a) A three-step pipeline over an 800 MB float64 array (``load(n)`` -> ``scale``
    -> ``shift`` -> ``summarize``), every step memoized with ``mmap_mode="r"``,
    run again when everything is cached: mlcache passes each cached result on
    by the name of its entry, joblib hashes each 800 MB argument again.
    Target: joblib / mlcache >= 50.
(b) The transitive code fingerprint of a function that reaches 40 helpers in
    four modules (with constants and a class): the walk, paid once per function
    per process, and a hit of that function, which never pays it.

    python benchmarks/bench_chain.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any

import joblib
import numpy as np

import mlcache
from _bench import (
    Contender,
    Outcome,
    Result,
    Target,
    check_free_disk,
    finish,
    machine_note,
    measure,
    parse_args,
    report,
    scratch_dir,
)
from mlcache.keys import bytecode
from mlcache.keys import code_version as deps
from mlcache.keys.hashing import bytes_hashed


def load(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def scale(x: np.ndarray) -> np.ndarray:
    return x * 2.0


def shift(x: np.ndarray) -> np.ndarray:
    return x + 1.0


def summarize(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    return {"mean": float(x[:1000].mean()), "head": np.stack([x[:3], y[:3]])}


def make_pipeline(memory: Any, n: int) -> Any:
    steps = [memory.cache(f) for f in (load, scale, shift, summarize)]

    def run() -> Any:
        raw = steps[0](n)
        a = steps[1](raw)
        b = steps[2](a)
        return steps[3](a, b)

    return run


def bench_pipeline(root: str, n: int, trials: int) -> tuple[dict[str, Result], list[Outcome]]:
    check_free_disk(root, 8 * n * 3 * 2 + (1 << 30))
    ml = make_pipeline(mlcache.Memory(os.path.join(root, "ml"), verbose=0, mmap_mode="r"), n)
    jl = make_pipeline(joblib.Memory(os.path.join(root, "jl"), verbose=0, mmap_mode="r"), n)
    first_ml, first_jl = ml(), jl()  # compute and store every step
    assert first_ml["mean"] == first_jl["mean"]
    before = bytes_hashed()
    ml()
    hashed = bytes_hashed() - before
    res = measure(
        [
            Contender("mlcache, all hits", ml, trials),
            Contender("joblib, all hits", jl, max(3, trials // 3)),
        ]
    )
    mb = 8 * n / 1e6
    outcomes = report(
        f"(a) three-step pipeline over a {mb:.0f} MB array, every step a hit, mmap_mode='r'",
        res,
        [
            Target(
                "(a) joblib / mlcache, pipeline", "joblib, all hits", "mlcache, all hits", ">=", 50
            )
        ],
        note=f"Bytes mlcache hashed in one all-hit run: {hashed} (the array: {8 * n:,}).",
    )
    return res, outcomes


def _write_project(root: str, helpers: int) -> str:
    """A package of four modules with ``helpers`` helpers in all, each calling the
    next, with constants, an array and a class; returns the package folder's parent."""
    pkg = os.path.join(root, "benchpkg")
    os.makedirs(pkg, exist_ok=True)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    per = helpers // 4
    for m in range(4):
        lines = ["import numpy as np", f"from benchpkg import mod{(m + 1) % 4} as nxt", ""]
        lines += [f"WEIGHTS = np.linspace(0, 1, 1000) * {m + 1}", f"FACTOR_{m} = {m + 2}", ""]
        lines += [
            "class Step:",
            "    scale = 2",
            "    def apply(self, x):",
            "        return x * self.scale",
            "",
        ]
        for i in range(per):
            call = f"h{i + 1}(x)" if i + 1 < per else ("nxt.h0(x - 1)" if m < 3 else "x")
            body = f"""
            def h{i}(x):
                \"\"\"Helper {i} of module {m}.\"\"\"
                if x <= 0:
                    return Step().apply(x) + float(WEIGHTS[0]) * FACTOR_{m}
                return {call} + {i}
            """
            lines.append(textwrap.dedent(body))
        if m == 0:
            lines.append("def entry(x):\n    return h0(x)\n")
        with open(os.path.join(pkg, f"mod{m}.py"), "w") as f:
            f.write("\n".join(lines))
    return root


def bench_fingerprint(
    root: str, helpers: int, trials: int
) -> tuple[dict[str, Result], list[Outcome]]:
    sys.path.insert(0, _write_project(root, helpers))
    try:
        from benchpkg import mod0

        entry = mod0.entry

        def forget() -> None:  # a new process: nothing walked yet
            deps._VERSIONS.clear()
            bytecode.code_digest.cache_clear()
            bytecode.references.cache_clear()

        version = deps.code_version(entry)
        walked = len(version.parts)
        mem = mlcache.Memory(os.path.join(root, "fp-cache"), verbose=0)
        f = mem.cache(entry)
        plain = mem.cache(lambda x: x + 1)
        f(3), plain(3)
        res = measure(
            [
                Contender(
                    f"code version of a function reaching {helpers} helpers (walked once)",
                    lambda: deps.code_version(entry),
                    trials,
                    before=forget,
                ),
                Contender("hit of that function", lambda: f(3), trials, reps=200),
                Contender("hit of a function without helpers", lambda: plain(3), trials, reps=200),
            ]
        )
    finally:
        sys.path.pop(0)
        for name in [m for m in sys.modules if m.startswith("benchpkg")]:
            del sys.modules[name]
    outcomes = report(
        f"(b) transitive code fingerprint: {walked} parts (helpers, constants, a class, numpy)",
        res,
        [],
    )
    return res, outcomes


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n, trials, helpers = (1_000_000, 3, 40) if args.quick else (100_000_000, 9, 40)
    print(f"# bench_chain\n\n{machine_note()}")
    with scratch_dir(args.dir, "chain") as root:
        a, out_a = bench_pipeline(root, n, trials)
        b, out_b = bench_fingerprint(root, helpers, trials if args.quick else 15)
    return finish(args, "bench_chain", {"a": a, "b": b}, out_a + out_b)


if __name__ == "__main__":
    sys.exit(main())
