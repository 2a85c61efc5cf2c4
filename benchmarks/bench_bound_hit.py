"""A hit of a bound method whose object is part of the key: mem.cache(model.predict)
with 10 float attributes; timeit of the key (MemorizedFunc._key), of hashing what
it captures whole (hash_value(call_state(...))) and of the whole hit, three rounds.

    python benchmarks/bench_bound_hit.py
    PYTHONPATH=<a checkout of another commit>/src python benchmarks/bench_bound_hit.py
"""

from __future__ import annotations

import tempfile
import timeit

from mlcache import Memory
from mlcache.keys.hashing import hash_value
from mlcache.keys.identity import call_state


class Model:
    def __init__(self) -> None:
        for i in range(10):
            setattr(self, f"a{i}", i * 1.5)

    def predict(self, x: float) -> dict[str, float]:
        return {"y": x * self.a1}  # type: ignore[attr-defined]


def main() -> None:
    mem = Memory(tempfile.mkdtemp(), verbose=0)
    f = mem.cache(Model().predict)
    f(3)
    for _ in range(3):
        state = timeit.timeit(lambda: hash_value(call_state(f.func)), number=20000) / 20000
        key = timeit.timeit(lambda: f._key((3,), {}), number=20000) / 20000
        hit = timeit.timeit(lambda: f(3), number=5000) / 5000
        us = [f"{t * 1e6:.1f} µs" for t in (state, key, hit)]
        print(f"captured, hashed whole {us[0]}  key {us[1]}  hit {us[2]}")


if __name__ == "__main__":
    main()
