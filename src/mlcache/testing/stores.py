"""The store conformance suite: what every store must do, for any backend to run.

A backend's tests subclass :class:`StoreTests` and say how to make a store;
every test then runs against it (a pytest class: collect it as ``Test...``)::

    import pytest
    from mlcache.testing.stores import StoreTests

    class TestMyStore(StoreTests):
        def make_store(self, tmp_path):
            return MyStore(str(tmp_path / "cache"))

        def age(self, store, name, seconds):  # optional: the touch test needs it
            store.set_last_used(name, time.time() - seconds)

It covers the :class:`~mlcache.store.Store` protocol (write then open, atomic
and failed writes, names, folders, listing, delete, touch) and each optional
power the store has (checked with ``isinstance``, as the function cache does):
:class:`~mlcache.store.LocalPaths`, :class:`~mlcache.store.Locking`,
:class:`~mlcache.store.SharedCounters`, :class:`~mlcache.store.ReadOnly`. A test
a store cannot pass by its nature is overridden in the subclass, saying why
(an object store cannot touch an object: see mlcache's own tests).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ..errors import EntryNotFound
from ..store import (
    EntryStat,
    LocalPaths,
    Locking,
    ReadOnly,
    SharedCounter,
    SharedCounters,
    Store,
    check_name,
)

__all__ = ["INVALID_NAMES", "StoreTests", "get", "names", "put"]

#: names every store refuses (``ValueError``), in every method
INVALID_NAMES = ["../x", "/abs", "", "a/../b", "a//b", "./a", "a/", ".hidden", "a\\b", "a/.."]


def put(store: Store, name: str, data: bytes) -> None:
    """Write ``data`` as entry ``name``."""
    with store.write(name) as f:
        f.write(data)


def get(store: Store, name: str) -> bytes:
    """The bytes of entry ``name``."""
    with store.open(name) as f:
        return f.read()


def names(store: Store, prefix: str = "") -> set[str]:
    """The names the store lists under ``prefix``."""
    return {e.name for e in store.list(prefix)}


class StoreTests:
    """What every store must do. Subclasses implement :meth:`make_store` (and
    :meth:`age`, for the touch test)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        """A new, empty store (made by :meth:`make_store`)."""
        return self.make_store(tmp_path)

    def make_store(self, tmp_path: Path) -> Store:
        """A new, empty store; ``tmp_path`` is a fresh folder it may use."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_store(tmp_path)")

    def age(self, store: Store, name: str, seconds: float) -> None:
        """Make entry ``name`` look last used ``seconds`` earlier than it was."""
        raise NotImplementedError

    def test_is_a_store(self, store):
        assert isinstance(store, Store)
        assert isinstance(store.location, str)

    def test_write_then_open(self, store):
        put(store, "f/v/k1", b"hello")
        assert get(store, "f/v/k1") == b"hello"
        put(store, "top", b"")
        assert get(store, "top") == b""

    def test_write_replaces(self, store):
        put(store, "a/k", b"old content")
        put(store, "a/k", b"new")
        assert get(store, "a/k") == b"new"

    def test_written_file_is_seekable(self, store):
        with store.write("a/k") as f:
            f.write(b"........payload")
            f.seek(0)
            f.write(b"HEAD")
        assert get(store, "a/k") == b"HEAD....payload"

    def test_large_write(self, store):
        data = os.urandom(3 << 20)
        put(store, "big/k", data)
        assert get(store, "big/k") == data

    def test_open_missing_is_entry_not_found(self, store):
        with pytest.raises(EntryNotFound) as info:
            store.open("f/v/nope")
        assert isinstance(info.value, KeyError)

    def test_write_is_atomic(self, store):
        put(store, "a/old", b"old")
        with store.write("a/new") as f:
            f.write(b"partial")
            assert not store.exists("a/new")
            assert names(store) == {"a/old"}
        with store.write("a/old") as f:
            f.write(b"replacement")
            assert get(store, "a/old") == b"old"
        assert get(store, "a/new") == b"partial"
        assert get(store, "a/old") == b"replacement"

    def test_failed_write_publishes_nothing(self, store):
        put(store, "a/kept", b"old")
        with pytest.raises(RuntimeError, match="midway"), store.write("a/kept") as f:
            f.write(b"half of it")
            raise RuntimeError("midway")
        with pytest.raises(RuntimeError, match="midway"), store.write("a/fresh") as f:
            f.write(b"half of it")
            raise RuntimeError("midway")
        assert get(store, "a/kept") == b"old"
        assert not store.exists("a/fresh")
        assert names(store) == {"a/kept"}  # no temporary left in sight

    def test_exists_for_files_and_folders(self, store):
        assert not store.exists("f")
        put(store, "f/v/k", b"x")
        assert store.exists("f/v/k") and store.exists("f/v") and store.exists("f")
        assert not store.exists("f/v/other") and not store.exists("g")

    def test_delete_files(self, store):
        put(store, "f/v/k", b"x")
        put(store, "f/v/j", b"y")
        assert store.delete("f/v/k") is True
        assert not store.exists("f/v/k") and store.exists("f/v/j")
        assert store.delete("f/v/k") is False
        with pytest.raises(EntryNotFound):
            store.open("f/v/k")

    def test_delete_folders(self, store):
        for name in ("f/v1/a", "f/v1/b", "f/v2/c", "fg/v/d", "g/h"):
            put(store, name, b"x")
        assert store.delete("f/v1") is True
        assert names(store) == {"f/v2/c", "fg/v/d", "g/h"}
        assert store.delete("f") is True
        assert names(store) == {"fg/v/d", "g/h"}  # a name sharing the prefix stays
        assert store.delete("f") is False

    def test_list_names_sizes_and_prefixes(self, store):
        assert list(store.list()) == []
        put(store, "f/v/a", b"12345")
        put(store, "f/v/b", b"")
        put(store, "f/w/c", b"1")
        put(store, "fx/v/d", b"123")
        put(store, "top", b"12")
        stats = {e.name: e for e in store.list()}
        assert set(stats) == {"f/v/a", "f/v/b", "f/w/c", "fx/v/d", "top"}
        assert all(isinstance(e, EntryStat) for e in stats.values())
        assert {n: e.size for n, e in stats.items()} == {
            "f/v/a": 5,
            "f/v/b": 0,
            "f/w/c": 1,
            "fx/v/d": 3,
            "top": 2,
        }
        assert all(isinstance(e.last_used, float) for e in stats.values())
        assert names(store, "f") == {"f/v/a", "f/v/b", "f/w/c"}
        assert names(store, "f/v") == {"f/v/a", "f/v/b"}
        assert names(store, "nope") == set()

    def test_touch_updates_last_used(self, store):
        if type(self).age is StoreTests.age:
            pytest.skip(f"{type(self).__name__} does not say how to age an entry (age())")
        put(store, "f/v/a", b"x")
        put(store, "f/v/b", b"y")
        self.age(store, "f/v/a", 1000)
        self.age(store, "f/v/b", 1000)
        before = {e.name: e.last_used for e in store.list()}
        store.touch(["f/v/a", "f/v/missing"])
        after = {e.name: e.last_used for e in store.list()}
        assert after["f/v/a"] - before["f/v/a"] > 900
        assert after["f/v/b"] == before["f/v/b"]
        assert get(store, "f/v/a") == b"x"  # touching does not change the content

    def test_names_are_checked(self):
        for bad in INVALID_NAMES:
            with pytest.raises(ValueError):
                check_name(bad)
        for good in ("a", "a/b/c", "pkg.mod.f-1a2b3c4d/0123abcd/ff", "_x/y-z+w"):
            assert check_name(good) == good

    def test_invalid_names_are_rejected_by_every_method(self, store, tmp_path):
        outside = tmp_path / "outside"
        outside.write_bytes(b"secret")
        os.utime(outside, (1e9, 1e9))
        accepted = []
        for bad in [*INVALID_NAMES, "../outside"]:
            calls = {
                "open": lambda bad=bad: store.open(bad).close(),
                "write": lambda bad=bad: store.write(bad).__enter__(),
                "exists": lambda bad=bad: store.exists(bad),
                "delete": lambda bad=bad: store.delete(bad),
                "touch": lambda bad=bad: store.touch([bad]),
            }
            if bad:  # "" is the whole store for list()
                calls["list"] = lambda bad=bad: list(store.list(bad))
            if isinstance(store, LocalPaths):
                calls["local_path"] = lambda bad=bad: store.local_path(bad)
            for method, call in calls.items():
                try:
                    call()
                except ValueError:
                    continue
                except (OSError, KeyError):
                    pass
                accepted.append((method, bad))
        assert not accepted, f"invalid names accepted: {accepted}"
        assert outside.read_bytes() == b"secret"
        assert outside.stat().st_mtime == 1e9

    # -- optional powers: tested when the store has them ----------------------------------
    def test_local_paths_hold_the_entry(self, store):
        if not isinstance(store, LocalPaths):
            pytest.skip("no LocalPaths")
        put(store, "f/v/k", b"abc")
        with open(store.local_path("f/v/k"), "rb") as f:
            assert f.read() == b"abc"
        put(store, "f/v/new", b"fresh")  # what was just written, as well
        with open(store.local_path("f/v/new"), "rb") as f:
            assert f.read() == b"fresh"
        try:
            missing = store.local_path("f/v/missing")
        except FileNotFoundError:
            pass
        else:
            assert not os.path.exists(missing)

    def test_locking_holds_one_at_a_time(self, store: Store) -> None:
        if not isinstance(store, Locking):
            pytest.skip("no Locking")
        seen: list[bool] = []

        def other() -> None:
            with store.lock("f/v/k", 0.2) as held:
                seen.append(held)

        with store.lock("f/v/k", 5.0) as held:
            assert held is True
            t = threading.Thread(target=other)
            t.start()
            t.join()
            with store.lock("f/v/other", 5.0) as also:
                assert also is True  # another key is free
        assert seen == [False]
        other()
        assert seen == [False, True]

    def test_shared_counters_keep_their_value(self, store):
        if not isinstance(store, SharedCounters):
            pytest.skip("no SharedCounters")
        with store.shared_counter("size") as counter:
            assert isinstance(counter, SharedCounter)
            start = counter.value
            counter.value += 5
            counter.stamp = 1234.5
        with store.shared_counter("size") as counter:
            assert counter is not None
            assert (counter.value, counter.stamp) == (start + 5, 1234.5)
        assert "size" not in names(store)  # a counter is no entry

    def test_read_only_says_so(self, store):
        if not isinstance(store, ReadOnly):
            pytest.skip("no ReadOnly")
        assert isinstance(store.read_only, bool)
