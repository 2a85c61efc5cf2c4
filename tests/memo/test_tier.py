"""The in-process tier of small verified entries (mlcache.memo.tier): a repeated
small hit is one stat and a decode, and never a stale, shared or forged value."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

from mlcache import Memory
from mlcache.entry.reader import SETTLED_NS
from mlcache.memo.tier import HitTier, tier

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the tier is on on POSIX only")

CALLS: list[int] = []


def small(a: int, b: int) -> dict:
    CALLS.append(a)
    return {"a": a, "b": b, "sum": a + b, "items": [a, b], "arr": np.arange(a + b)}


def _settle() -> None:
    """Past the time a freshly written file must wait to be kept."""
    time.sleep(SETTLED_NS / 1e9 + 0.02)


@pytest.fixture
def f(tmp_path):
    tier.clear()
    CALLS.clear()
    return Memory(tmp_path / "cache", verbose=0, secret="k" * 32).cache(small)


def _path(f, *args) -> str:
    name = f._name(args, {})
    return f._path(name)


def _hit_kept(f) -> str:
    f(1, 2)
    _settle()
    f(1, 2)  # read (verified) and kept
    path = _path(f, 1, 2)
    assert path in tier._kept
    return path


def test_a_repeated_small_hit_is_kept_and_served(f):
    _hit_kept(f)
    for _ in range(3):
        assert f(1, 2)["sum"] == 3
    assert CALLS == [1]


def test_returned_values_are_independent_objects(f):
    _hit_kept(f)
    first = f(1, 2)
    first["sum"] = -1
    first["items"].append(99)
    first["arr"][:] = 7
    second = f(1, 2)
    assert second["sum"] == 3 and second["items"] == [1, 2]
    assert second["arr"].tolist() == [0, 1, 2] and second["arr"].flags.writeable
    assert second is not first and second["arr"] is not first["arr"]


def test_the_value_returned_when_filling_is_independent_too(f):
    f(1, 2)
    _settle()
    got = f(1, 2)  # this hit fills the tier
    assert _path(f, 1, 2) in tier._kept
    got["arr"][:] = 9
    got["items"].clear()
    again = f(1, 2)
    assert again["arr"].tolist() == [0, 1, 2] and again["items"] == [1, 2]


def test_clear_is_a_miss_at_once(f):
    _hit_kept(f)
    f.clear(warn=False)
    assert f(1, 2)["sum"] == 3
    assert CALLS == [1, 1]


def test_another_entry_replaced_onto_it_is_seen_at_the_next_hit(f):
    path = _hit_kept(f)
    f(5, 6)
    other = _path(f, 5, 6)
    os.replace(other, path)  # another (validly signed) entry under this name
    with pytest.warns(Warning, match="tampering|signature"):
        got = f(1, 2)
    # signed entries are bound to their name: refused, recomputed, right value
    assert got["sum"] == 3
    assert CALLS == [1, 5, 1]


def test_another_process_rewriting_the_entry_is_seen(f, tmp_path):
    path = _hit_kept(f)
    before = os.stat(path)
    # another process recomputes and republishes the entry (a new file by rename)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_tier import small
        from mlcache import Memory
        f = Memory({str(tmp_path / "cache")!r}, verbose=0, secret="k" * 32).cache(small)
        f.call(1, 2)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert os.stat(path).st_ino != before.st_ino
    assert f(1, 2)["sum"] == 3
    # the new file was read and verified again: what is kept is its identity
    st = os.stat(path)
    kept = tier._kept.get(path)
    assert kept is None or kept.ident == (
        st.st_ino,
        st.st_dev,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )
    assert kept is None or kept.ident != (
        before.st_ino,
        before.st_dev,
        before.st_size,
        before.st_mtime_ns,
        before.st_ctime_ns,
    )


def test_a_tampered_file_with_its_mtime_restored_is_caught(f):
    path = _hit_kept(f)
    st = os.stat(path)
    with open(path, "r+b") as fh:  # same size, one byte of the info changed
        data = bytearray(fh.read())
        i = data.index(b'"func"')
        data[i + 1] ^= 0x20
        fh.seek(0)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert after.st_size == st.st_size and after.st_mtime_ns == st.st_mtime_ns
    assert after.st_ctime_ns != st.st_ctime_ns  # what a user cannot restore
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(1, 2)
    assert got["sum"] == 3 and CALLS == [1, 1]
    assert any("damaged" in str(w.message) or "tampering" in str(w.message) for w in caught)


def test_mmap_mode_and_large_entries_go_the_old_way(tmp_path):
    tier.clear()
    big = Memory(tmp_path / "c", verbose=0).cache(np.ones)
    big(100_000)
    mapped = Memory(tmp_path / "c", verbose=0, mmap_mode="r").cache(np.zeros)
    mapped(10)
    _settle()
    assert big(100_000).sum() == 100_000 and isinstance(mapped(10), np.memmap)
    assert len(tier) == 0


def pure(a: int, b: int) -> dict:
    return {"a": a, "b": b, "sum": a + b}


def test_unsigned_and_signed_readers_do_not_share_a_kept_entry(tmp_path):
    tier.clear()
    # a function that changes nothing: the signed reader's key is the same (what
    # a function learns is read only from a record signed with the reader's key)
    plain = Memory(tmp_path / "c", verbose=0, secret=False).cache(pure)
    plain(1, 2)
    _settle()
    plain(1, 2)
    plain(1, 2)
    assert len(tier) == 1
    signed = Memory(tmp_path / "c", verbose=0, secret="k" * 32).cache(pure)
    with pytest.warns(Warning, match="not signed"):
        signed(1, 2)  # the unsigned entry is refused, not served from the tier


def test_the_budget_and_lru_bound_it(tmp_path):
    t = HitTier(max_entry=1 << 16, budget=3000)
    m = Memory(tmp_path / "c", verbose=0)
    f = m.cache(small)
    for a in range(8):
        f(a, 0)
    _settle()
    sizes = []
    for a in range(8):
        name = f._name((a, 0), {})
        path = f._path(name)
        sizes.append(os.stat(path).st_size)
        got = t.read(path, name, m.context.signer, True)  # read by the tier and kept
        assert got is not None and got[0]["sum"] == a and path in t._kept
    assert t._bytes <= 3000 and 0 < len(t) < 8
    assert list(t._kept)[-1] == path  # the most recent is kept


class Box:
    def __init__(self, v: int) -> None:
        self.v = v


def boxed(v: int) -> Box:
    return Box(v)


def test_a_pickled_entry_kept_for_one_memory_is_refused_to_one_without_pickle(tmp_path):
    tier.clear()
    loose = Memory(tmp_path / "c", verbose=0).cache(boxed)
    loose(3)
    _settle()
    loose(3)
    assert loose(3).v == 3 and len(tier) == 1
    strict = Memory(tmp_path / "c", verbose=0, allow_pickle=False).cache(boxed)
    with pytest.raises(Exception, match="pickle"):
        strict(3)


def test_a_disabled_tier_reads_the_ordinary_way(f, monkeypatch):
    monkeypatch.setattr(tier, "enabled", False)
    f(1, 2)
    _settle()
    assert f(1, 2)["sum"] == 3 and len(tier) == 0


def test_threads_hitting_while_the_tier_is_cleared_get_right_values(f):
    _hit_kept(f)
    errors: list[object] = []
    stop = threading.Event()

    def hit() -> None:
        for _ in range(300):
            got = f(1, 2)
            if got["sum"] != 3 or got["items"] != [1, 2]:
                errors.append(got)
            got["items"].append(0)  # each thread mutates its own copy

    def churn() -> None:
        while not stop.is_set():
            tier.clear()
            time.sleep(0.0005)

    threads = [threading.Thread(target=hit) for _ in range(4)]
    cleaner = threading.Thread(target=churn)
    cleaner.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    cleaner.join()
    assert errors == [] and CALLS == [1]


def test_a_key_hit_once_is_kept_and_read_again_once_changed(f):
    f(1, 2)
    assert f(1, 2)["sum"] == 3
    assert len(tier) == 0  # changed too recently to be kept: read at each hit
    _settle()
    assert f(1, 2)["sum"] == 3
    path = _path(f, 1, 2)
    assert list(tier._kept) == [path]  # its first read since settled keeps it
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # changed since
    assert f(1, 2)["sum"] == 3
    assert len(tier) == 0  # read again: changed too recently to be kept
    _settle()
    assert f(1, 2)["sum"] == 3
    assert tier._kept[path].ident[3] == st.st_mtime_ns - 10**9  # kept as it is now
    assert CALLS == [1]


def test_settled_is_judged_at_the_files_stat_not_after_the_read(f, monkeypatch):
    """A thread held up between the stat of a fresh entry and the judgement (here:
    the clock jumps 10 s once the entry's file is opened and identified) must not
    keep it: a change made meanwhile in the same clock tick would look old, and be
    served stale."""
    from mlcache.memo import tier as tier_module

    f(1, 2)  # written just now: not settled
    real, made = time.time_ns, []

    class HeldUp(tier_module.EntryReader):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)  # its fstat is done

    monkeypatch.setattr(tier_module, "EntryReader", HeldUp)
    monkeypatch.setattr(time, "time_ns", lambda: real() + (10_000_000_000 if made else 0))
    assert f(1, 2)["sum"] == 3
    monkeypatch.undo()
    assert made and _path(f, 1, 2) not in tier._kept
