"""``mlcache demo``: what the function cache saves, timed on this machine.

Times a preprocessing function over a large float64 array: without a cache,
the first call (compute and store), a repeated call, a repeated call with
``mmap_mode="r"``, and, when joblib is installed, the same with
``joblib.Memory`` beside it. Then shows that a changed argument is a miss and
that ``clear`` works. It uses a temporary folder unless ``location`` is given.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .memory import Memory

__all__ = ["preprocess", "run_demo"]


def preprocess(x: np.ndarray, scale: float = 2.0) -> np.ndarray:
    """A stand-in for feature extraction: a few full passes over the array."""
    centered = x - x.mean(axis=0)
    return np.tanh(centered * scale) + np.sqrt(np.abs(centered))


def _timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def run_demo(
    size: int = 4000, location: str | None = None, out: Callable[[str], None] = print
) -> dict[str, float]:
    """Run the demo on a ``size`` x ``size`` float64 array; return the timings (seconds)."""
    log = logging.getLogger("mlcache")
    level = log.level
    log.setLevel(logging.WARNING)
    tmp = None if location is not None else tempfile.mkdtemp(prefix="mlcache-demo-")
    root = location if location is not None else tmp
    assert root is not None
    try:
        x = np.random.default_rng(0).standard_normal((size, size))
        out(
            f"mlcache demo: preprocess() on a {size}x{size} float64 array "
            f"({x.nbytes / 1e6:.0f} MB), cache in {root}"
        )
        mem = Memory(f"{root}/mlcache", verbose=0)
        mapped = Memory(f"{root}/mlcache", mmap_mode="r", verbose=0)
        cached, cached_mm = mem.cache(preprocess), mapped.cache(preprocess)
        t: dict[str, float] = {}
        preprocess(x)  # warm-up: fresh memory is slow to touch the first time on some VMs
        t["no cache"] = _timed(lambda: preprocess(x), repeat=2)
        t["mlcache first call"] = _timed(lambda: cached(x))
        t["mlcache repeated"] = _timed(lambda: cached(x), repeat=3)
        t["mlcache repeated, mmap"] = _timed(lambda: cached_mm(x), repeat=3)
        try:
            import joblib
        except ImportError:
            joblib = None
        if joblib is not None:
            jm = joblib.Memory(f"{root}/joblib", verbose=0)
            jm_mm = joblib.Memory(f"{root}/joblib", mmap_mode="r", verbose=0)
            jf, jf_mm = jm.cache(preprocess), jm_mm.cache(preprocess)
            t["joblib first call"] = _timed(lambda: jf(x))
            t["joblib repeated"] = _timed(lambda: jf(x), repeat=3)
            t["joblib repeated, mmap"] = _timed(lambda: jf_mm(x), repeat=3)
        base = t["no cache"]
        out("")
        out(f"{'step':<28}{'seconds':>10}{'vs no cache':>14}")
        for name, sec in t.items():
            out(f"{name:<28}{sec:>10.4f}{base / sec:>13.1f}x")
        if joblib is not None:
            out("")
            plain = t["joblib repeated"] / t["mlcache repeated"]
            mm = t["joblib repeated, mmap"] / t["mlcache repeated, mmap"]
            out(f"repeated call: mlcache is {plain:.1f}x faster than joblib; with mmap {mm:.1f}x")
        out("")
        changed = cached.check_call_in_cache(x, scale=3.0)
        out(f"changed argument (scale=3.0) in cache? {changed} -> it will be computed")
        cached.clear()
        out(f"after clear(), original call in cache? {cached.check_call_in_cache(x)}")
        return t
    finally:
        log.setLevel(level)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
