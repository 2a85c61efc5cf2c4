"""MemoContext: what a Memory resolves once for its functions, and the one lock
loop (memo/locking.py) that plain and async functions share."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
import time
from pathlib import Path

import pytest

from mlcache import CacheWarning, Memory
from mlcache.memo.context import MemoContext


def _double(x: int) -> int:
    return 2 * x


def test_the_local_stores_powers_are_resolved_once(tmp_path):
    mem = Memory(tmp_path, verbose=0, bytes_limit="1MB")
    ctx = mem.context
    assert isinstance(ctx, MemoContext)
    assert ctx.store is mem.store
    assert ctx.local is mem.store and ctx.locking is mem.store and ctx.counters is mem.store
    assert ctx.guard is not None and ctx.bytes_limit == 1 << 20
    assert not ctx.writes.read_only and ctx.signer is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.allow_pickle = False  # type: ignore[misc]


def test_a_store_without_local_files_has_no_local_power(tmp_path):
    ctx = Memory(f"mem-{tmp_path.name}", backend="memory", verbose=0).context
    assert ctx is not None and ctx.local is None and ctx.guard is None


def test_no_store_no_context():
    assert Memory(None).context is None


def test_a_function_and_its_results_read_the_context(tmp_path):
    mem = Memory(tmp_path, verbose=0, allow_pickle=False, secret=False)
    f = mem.cache(_double)
    shelved = f.call_and_shelve(2)
    assert shelved.context is mem.context and shelved.get() == 4
    # a result pickles as its Memory, rebuilt where it is unpickled
    again = pickle.loads(pickle.dumps(shelved))
    assert again.get() == 4 and again.context.allow_pickle is False
    assert again.context.signer is None


def test_flush_usage_and_remove_function_are_the_faces_way_in(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(_double)
    f(1), f(1)
    mem.flush_usage()
    assert f.stats().hits == 1
    mem.remove_function(f.stats().folder)
    assert not f.check_call_in_cache(1)


def _logged_double(x: int, log: str) -> int:
    # counted in a file: a list the function appended to would be learned as state
    with open(log, "a") as f:
        f.write("call\n")
    return 2 * x


async def _async_logged_double(x: int, log: str) -> int:
    return _logged_double(x, log)


def _wait_and_store(mem, f, log, run) -> list[int]:
    """Hold the key's lock here, ``run`` the memoized call in a thread (it waits),
    and store the result meanwhile with f.call (which does not lock): the waiter
    looks between two tries of the lock and finds it. What the thread got."""
    name = f._name((3, log), {})
    got: list[int] = []
    with mem.store.lock(name, 5) as held:
        assert held
        t = threading.Thread(target=lambda: got.append(run()))
        t.start()
        time.sleep(0.05)
        out = f.call(3, log)
        assert (asyncio.run(out) if asyncio.iscoroutine(out) else out)[0] == 6
        t.join(5)
        assert not t.is_alive()
    return got


def test_a_waiting_call_returns_what_another_stored_meanwhile(tmp_path):
    mem, log = Memory(tmp_path / "c", verbose=0), str(tmp_path / "log")
    f = mem.cache(_logged_double, ignore=["log"])
    assert _wait_and_store(mem, f, log, lambda: f(3, log)) == [6]
    assert Path(log).read_text().count("call") == 1  # only f.call computed it


def test_an_async_waiting_call_returns_what_another_stored_meanwhile(tmp_path):
    mem, log = Memory(tmp_path / "c", verbose=0), str(tmp_path / "log")
    f = mem.cache(_async_logged_double, ignore=["log"])
    assert _wait_and_store(mem, f, log, lambda: asyncio.run(f(3, log))) == [6]
    assert Path(log).read_text().count("call") == 1


class TaggedMemory(Memory):
    """A subclass whose own state (set after the base's __init__) is in its pickle."""

    def __init__(self, location, tag, **kw):
        super().__init__(location, **kw)
        self.tag = tag

    def __reduce__(self):
        return (TaggedMemory, (self.location, self.tag), {"verbose": 0})

    def __setstate__(self, state):
        pass


def test_a_memory_subclass_with_its_own_pickle_makes_and_pickles_contexts(tmp_path):
    mem = TaggedMemory(tmp_path, "exp1", verbose=0)  # __reduce__ reads .tag: set after init
    shelved = mem.cache(_double).call_and_shelve(21)
    back = pickle.loads(pickle.dumps(shelved))
    assert back.get() == 42
    assert isinstance(back.context.owner, TaggedMemory) and back.context.owner.tag == "exp1"
    assert pickle.loads(pickle.dumps(mem.context)).store.location == mem.store.location


def _store_backend(monkeypatch, cls):
    """Register ``cls`` as a backend for this test only; return its name."""
    from mlcache import register_store_backend
    from mlcache.store import stores

    monkeypatch.setattr(stores, "_entries", dict(stores._entries))
    register_store_backend(cls.__name__.lower(), cls)
    return cls.__name__.lower()


def _plain_store():
    from mlcache.store.memory import MemoryStore

    class PlainStore:  # the Store protocol, by delegation, and no powers of its own
        def __init__(self, location):
            self.location = location
            self._inner = MemoryStore(location)
            self.lock = threading.RLock()  # the store's own mutex, not the Locking power

        def open(self, name):
            return self._inner.open(name)

        def write(self, name):
            return self._inner.write(name)

        def exists(self, name):
            return self._inner.exists(name)

        def delete(self, name):
            return self._inner.delete(name)

        def list(self, prefix=""):
            return self._inner.list(prefix)

        def touch(self, names):
            return self._inner.touch(names)

    return PlainStore


def test_a_stores_own_lock_attribute_is_not_the_locking_power(tmp_path, monkeypatch):
    name = _store_backend(monkeypatch, _plain_store())
    mem = Memory(f"plain-{tmp_path.name}", backend=name, verbose=0)
    assert mem.context.locking is None
    f = mem.cache(_double)
    assert f(2) == 4 and f(2) == 4
    assert f.check_call_in_cache(2)


def test_errors_of_a_stores_lock_and_touch_never_fail_the_call(tmp_path, monkeypatch):
    from mlcache.store.memory import MemoryStore

    class Broken(MemoryStore):
        def lock(self, name, timeout):
            raise RuntimeError("lock service down")

        def touch(self, names):
            raise RuntimeError("touch service down")

    name = _store_backend(monkeypatch, Broken)
    mem = Memory(f"broken-{tmp_path.name}", backend=name, verbose=0)
    f = mem.cache(_double)
    with pytest.warns(CacheWarning, match="lock raised RuntimeError: lock service down"):
        assert f(3) == 6
    assert f(3) == 6  # a hit, even though recording its use fails
    mem.flush_usage()  # the touch raises: advisory, nothing escapes


FIXTURES = Path(__file__).parent / "fixtures"


def test_objects_pickled_by_mlcache_0_1_still_load(tmp_path):
    """A Memory, a shelved result and a memoized function pickled by the flat
    layout of mlcache 0.1 (made by fixtures/make_v01_pickles.py): their module
    names moved, and they load and work (a shelved result inside a cached value
    would otherwise be 'damaged' and recomputed)."""
    import tarfile

    cache = tmp_path / "cache"
    with tarfile.open(FIXTURES / "v01_cache.tar.gz") as archive:
        archive.extractall(cache, filter="data")
    data = (FIXTURES / "v01_objects.pkl").read_bytes()
    assert b"cmlcache.memory\n" in data and b"cmlcache.results\n" in data
    objects = pickle.loads(data.replace(b"/mlcache-v01-fixture/cache", str(cache).encode()))
    mem, shelved, func = objects["memory"], objects["result"], objects["func"]
    assert isinstance(mem, Memory) and mem.location == str(cache)
    assert shelved.get() == 42 and shelved.memory is shelved.context.owner
    # the call's key moved with HASH_SCHEME 6: the function works, its 0.1 entry is not a hit
    assert func(-42) == 42 and func.check_call_in_cache(-42)
