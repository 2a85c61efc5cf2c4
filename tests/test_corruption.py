"""Damaged files, counted: random bit flips, truncations and appended bytes in
function-cache entries and dataset packs.

For an entry, every damage is a miss with exactly one warning, the function
runs again, and the entry is overwritten (the next call is a silent hit); for a
pack opened through ``CachedDataset``, every damage is noticed (at open, by the
read that touches it, or, for bytes no read touches, by ``verify``) and the pack
rebuilt. Never a wrong value.

Damage goes to the bytes that mean something: everything but the zero padding
between an entry's metadata and its payload, which no reader looks at (a flip
there changes no value). The default run does a few hundred trials;
``pytest -m slow tests/test_corruption.py -s`` runs the published number and
prints the figures quoted in the README's "Reliability" section.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mlcache import CacheWarning, Memory
from mlcache.data import CachedDataset, PackCorrupted
from mlcache.entry import HEADER
from mlcache.memo.layout import is_entry

#: the dataset's builds; each function counts its calls in a counter of its own,
#: which its calls only raise (bookkeeping, out of its key): a counter that the
#: three functions all raised would be input to each one's key, changed by the
#: others' calls (mlcache cannot tell which of its keys a function reads)
CALLS: Counter = Counter()
ARRAY_CALLS: Counter = Counter()
OBJECT_CALLS: Counter = Counter()
PLAIN_CALLS: Counter = Counter()


def _array(i: int) -> np.ndarray:
    return np.arange(1000 * (i + 1), dtype=np.float64) * (i + 1)


def _object(i: int) -> dict:
    return {"i": i, "set": {i, -i}, "w": np.full(50, i)}  # pickled


def _plain(i: int) -> dict:
    return {"i": i, "name": f"n{i}", "t": (i, float(i))}


def array_result(i: int) -> np.ndarray:
    ARRAY_CALLS["n"] += 1
    return _array(i)


def object_result(i: int) -> dict:
    OBJECT_CALLS["n"] += 1
    return _object(i)


def plain_result(i: int) -> dict:
    PLAIN_CALLS["n"] += 1
    return _plain(i)


#: the values, computed without counting (a count raised outside cached calls is
#: input to the function's key, as it should be)
REFERENCE = {"array": _array, "object": _object, "plain": _plain}
FUNCS = {"array": array_result, "object": object_result, "plain": plain_result}
COUNTS = {"array": ARRAY_CALLS, "object": OBJECT_CALLS, "plain": PLAIN_CALLS}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _meaningful(data: bytes) -> list[range]:
    """The byte ranges of an entry that a reader checks (all but the zero padding)."""
    f = HEADER.unpack_from(data)
    flags, lay_n, info_n, p_off, p_len = f[2], f[3], f[4], f[6], f[7]
    meta_end = 64 + lay_n + info_n + (40 if flags & 1 else 0)
    if flags & 4:  # a block table: its block size, then one digest per block
        block = int.from_bytes(data[64 + lay_n + info_n :][:8], "little")
        meta_end += 8 + 8 * -(-p_len // block)
    return [range(0, meta_end), range(p_off, len(data))]


def _damage(data: bytes, rng: random.Random, ranges: list[range]) -> tuple[str, bytes]:
    kind = rng.choices(["flip", "truncate", "append"], weights=(8, 3, 1))[0]
    if kind == "flip":
        r = rng.choice([r for r in ranges if len(r)])
        pos = rng.choice(r)
        out = bytearray(data)
        out[pos] ^= 1 << rng.randrange(8)
        return kind, bytes(out)
    if kind == "truncate":
        return kind, data[: rng.randrange(len(data))]
    return kind, data + bytes([rng.randrange(256)]) * rng.randint(1, 100)


def damage_entries(location: str, trials: int, seed: int = 0) -> Counter:
    """Damage one entry per trial, then call the function through the cache."""
    rng = random.Random(seed)
    tally: Counter = Counter()
    mems = {
        mode: Memory(location, verbose=0, mmap_mode=mode, backend_options={"durable": False})
        for mode in (None, "r")
    }
    funcs = {(k, m): mems[m].cache(f) for k, f in FUNCS.items() for m in mems}
    for k in FUNCS:
        for i in range(3):
            funcs[k, None](i)
    store = mems[None].store
    assert store is not None
    for _ in range(trials):
        kind_f, i, mode = rng.choice(list(FUNCS)), rng.randrange(3), rng.choice([None, "r"])
        f = funcs[kind_f, mode]
        name = f._name((i,), {})
        path = store.local_path(name)  # type: ignore[attr-defined]
        good = Path(path).read_bytes()
        how, bad = _damage(good, rng, _meaningful(good))
        Path(path).write_bytes(bad)
        before = COUNTS[kind_f]["n"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = f(i)
        ours = [w for w in caught if issubclass(w.category, CacheWarning)]
        tally["trials"] += 1
        tally[f"damage: {how}"] += 1
        tally["detected"] += len(ours) == 1
        tally["recomputed"] += COUNTS[kind_f]["n"] == before + 1
        tally["wrong"] += not _same(value, REFERENCE[kind_f](i))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = f(i)  # the overwritten entry: a silent hit
        tally["overwritten"] += COUNTS[kind_f]["n"] == before + 1 and _same(again, value)
    # nothing damaged is left behind
    assert [e.name for e in store.list() if is_entry(e.name)]
    assert mems[None].verify() == []
    return tally


class Squares(CachedDataset):
    def __init__(self, n: int, **kw):
        self.n = n
        super().__init__(**kw)

    def load_source(self):
        CALLS["pack build"] += 1
        for s in range(self.n):
            yield {"x": np.arange(s % 9 + 1, dtype=np.int32) * s, "s": s, "name": f"s{s}"}


def _pack_right(ds: CachedDataset) -> bool:
    return (
        all(
            ds[s]["s"] == s
            and ds[s]["name"] == f"s{s}"
            and np.array_equal(ds[s]["x"], np.arange(s % 9 + 1, dtype=np.int32) * s)
            for s in range(len(ds))
        )
        and len(ds) == 60
    )


def damage_packs(cache_dir: str, trials: int, seed: int = 0) -> Counter:
    """Damage the pack per trial, then read every sample through CachedDataset."""
    rng = random.Random(seed)
    tally: Counter = Counter()
    ds = Squares(60, cache_dir=cache_dir, progress=False)
    path = ds.pack_path
    for _ in range(trials):
        good = Path(path).read_bytes()
        how, bad = _damage(good, rng, [range(len(good))])
        Path(path).write_bytes(bad)
        before = CALLS["pack build"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fresh = Squares(60, cache_dir=cache_dir, progress=False)
            right = _pack_right(fresh)
        tally["trials"] += 1
        tally[f"damage: {how}"] += 1
        tally["wrong"] += not right
        if any(issubclass(w.category, CacheWarning) for w in caught):
            tally["detected"] += 1
            tally["detected by a read"] += 1
            tally["rebuilt"] += CALLS["pack build"] == before + 1
            continue
        # bytes that no sample read touches (alignment padding): the values were
        # right; verify() (`mlcache verify`) finds the damage, and a rebuild mends it
        try:
            fresh.packed.verify()
        except PackCorrupted:
            tally["detected"] += 1
            tally["detected by verify"] += 1
            Squares(60, cache_dir=cache_dir, progress=False, force_recache=True)
            tally["rebuilt"] += CALLS["pack build"] == before + 1
    return tally


def _check(tally: Counter, done: str) -> None:
    print(f"\n{', '.join(f'{k}: {v}' for k, v in sorted(tally.items()))}")
    n = tally["trials"]
    assert tally["wrong"] == 0
    assert tally["detected"] == n and tally[done] == n


def test_damaged_entries_are_misses_recomputed_and_overwritten(tmp_path):
    _check(damage_entries(str(tmp_path / "c"), 300), "overwritten")


def test_damaged_packs_are_noticed_and_rebuilt(tmp_path):
    _check(damage_packs(str(tmp_path / "d"), 60), "rebuilt")


@pytest.mark.slow
def test_damaged_entries_many_trials(tmp_path):
    trials = int(os.environ.get("MLCACHE_CORRUPTION_TRIALS", "1500"))
    _check(damage_entries(str(tmp_path / "c"), trials, seed=1), "overwritten")


@pytest.mark.slow
def test_damaged_packs_many_trials(tmp_path):
    trials = int(os.environ.get("MLCACHE_CORRUPTION_TRIALS", "1500")) // 3
    _check(damage_packs(str(tmp_path / "d"), trials, seed=1), "rebuilt")


def test_an_entry_of_a_newer_mlcache_is_kept_never_removed_nor_overwritten(tmp_path):
    """Two mlcache versions sharing a cache (a cluster mid-upgrade): this one meets
    an entry of a newer entry format. Each call computes the right value and
    returns it unstored (one warning, saying to upgrade); the newer entry stays
    byte for byte, through verify(), `verify --fix` and prune's size scan."""
    from mlcache.admin import prune, verify

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(plain_result)
    f(1)
    name = f._name((1,), {})
    path = Path(mem.store.local_path(name))  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[8:10] = (2).to_bytes(2, "little")  # written by a newer mlcache...
    data[12:64] = bytes(range(52))  # ... whose header reads otherwise
    newer = bytes(data)
    path.write_bytes(newer)

    older = Memory(tmp_path, verbose=0).cache(plain_result)  # the other version's process
    before = PLAIN_CALLS["n"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [older(1) for _ in range(3)] == [_plain(1)] * 3
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "newer mlcache" in ours[0] and "damaged" not in ours[0]
    assert PLAIN_CALLS["n"] == before + 3  # three computed calls
    assert not older.check_call_in_cache(1)  # not a result this version can load
    assert older.call_and_shelve(1).get() == _plain(1)
    assert path.read_bytes() == newer

    assert mem.verify() == []
    found = verify(mem, str(tmp_path), fix=True)
    assert [(d.name, d.unreadable, d.removed) for d in found] == [(name, True, False)]
    assert "newer mlcache" in found[0].reason
    prune(mem, max_size=10**9)
    assert path.read_bytes() == newer
