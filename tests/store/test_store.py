"""store/: one conformance suite every store passes, LocalStore specifics, user backends."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import io
import os
import pickle
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np
import pytest

from mlcache import (
    CacheWarning,
    EntryNotFound,
    Memory,
    RegistryError,
    StoreError,
    expires_after,
    register_store_backend,
)
from mlcache._atomic import DEAD_MIN_AGE
from mlcache.memo.layout import is_entry
from mlcache.store import EntryStat, LocalPaths, Store, check_name, stores
from mlcache.store.local import LocalStore

INVALID_NAMES = ["../x", "/abs", "", "a/../b", "a//b", "./a", "a/", ".hidden", "a\\b", "a/.."]


def put(store: Store, name: str, data: bytes) -> None:
    with store.write(name) as f:
        f.write(data)


def get(store: Store, name: str) -> bytes:
    with store.open(name) as f:
        return f.read()


def names(store: Store, prefix: str = "") -> set[str]:
    return {e.name for e in store.list(prefix)}


class StoreConformance:
    """What every store must do. Subclasses implement ``make_store`` and ``age``."""

    @pytest.fixture
    def store(self, tmp_path) -> Store:
        return self.make_store(tmp_path)

    def make_store(self, tmp_path: Path) -> Store:
        raise NotImplementedError

    def age(self, store: Store, name: str, seconds: float) -> None:
        """Make ``name`` look last used ``seconds`` ago."""
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


# -- LocalStore ---------------------------------------------------------------------
class TestLocalStore(StoreConformance):
    def make_store(self, tmp_path: Path) -> Store:
        return LocalStore(tmp_path / "cache")

    def age(self, store: Store, name: str, seconds: float) -> None:
        path = os.path.join(store.location, name)
        t = os.stat(path).st_mtime - seconds
        os.utime(path, (t, t))

    def test_no_temporary_files_left_after_a_failed_write(self, store):
        with pytest.raises(RuntimeError), store.write("f/v/k") as f:
            f.write(b"x")
            raise RuntimeError
        leftovers = [n for _, _, files in os.walk(store.location) for n in files]
        assert sorted(leftovers) == [".gitignore", "CACHEDIR.TAG"]

    def test_gives_local_paths(self, store):
        assert isinstance(store, LocalPaths)
        put(store, "f/v/k", b"abc")
        path = store.local_path("f/v/k")
        assert Path(path).read_bytes() == b"abc"
        assert Path(path).resolve().is_relative_to(Path(store.location).resolve())

    def test_folders_are_private(self, tmp_path):
        old = os.umask(0o022)
        try:
            store = LocalStore(tmp_path / "deep" / "cache")
            put(store, "f/v/k", b"x")
        finally:
            os.umask(old)
        root = Path(store.location)
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert stat.S_IMODE((root / "f").stat().st_mode) == 0o700
        assert stat.S_IMODE((root / "f" / "v").stat().st_mode) == 0o700
        assert stat.S_IMODE((root / "f" / "v" / "k").stat().st_mode) == 0o600

    def test_gitignore_is_created_and_listed_nowhere(self, tmp_path):
        store = LocalStore(tmp_path / "cache")
        text = (tmp_path / "cache" / ".gitignore").read_text()
        assert "*" in text.splitlines()
        assert names(store) == set()

    def test_existing_gitignore_is_kept(self, tmp_path):
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / ".gitignore").write_text("mine\n")
        LocalStore(tmp_path / "cache")
        assert (tmp_path / "cache" / ".gitignore").read_text() == "mine\n"

    def test_existing_folder_with_content_is_reused(self, tmp_path):
        first = LocalStore(tmp_path / "cache")
        put(first, "f/v/k", b"x")
        second = LocalStore(str(tmp_path / "cache"))
        assert get(second, "f/v/k") == b"x"

    def test_location_under_a_regular_file_is_a_store_error(self, tmp_path):
        blocker = tmp_path / "file"
        blocker.write_text("x")
        for location in (blocker / "cache", blocker):
            with pytest.raises(StoreError) as info:
                LocalStore(location)
            assert isinstance(info.value, OSError)
            assert str(blocker) in str(info.value)

    def test_folder_that_cannot_be_written_is_read_only(self, tmp_path):
        """An existing folder this user cannot write is opened read-only (its
        entries can be read: issue 12); one that cannot be created is an error."""
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        code = (
            "import sys\n"
            "from mlcache.errors import StoreError\n"
            "from mlcache.store.local import LocalStore\n"
            "assert LocalStore(sys.argv[1]).read_only\n"
            "try:\n"
            "    LocalStore(sys.argv[1] + '/cache')\n"
            "except StoreError as exc:\n"
            "    assert 'create' in str(exc), exc\n"
            "else:\n"
            "    raise SystemExit('no StoreError for a folder that cannot be made')\n"
        )
        # root ignores permission bits unless it drops the capability to
        prefix: list[str] = []
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "running as root needs util-linux's setpriv for this test"
            prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
        res = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(ro)], capture_output=True, text=True
        )
        ro.chmod(0o700)
        assert res.returncode == 0, res.stderr

    def test_dead_writers_temporaries_are_removed_by_list(self, store):
        """A temporary is removed when no writer holds its lock (the kernel drops
        it when the writer dies) and it is older than DEAD_MIN_AGE; one still
        locked is kept at any age, and a fresh one may be about to be locked."""
        put(store, "f/v/k", b"x")
        folder = Path(store.location) / "f" / "v"
        dead = folder / ".dead.tmp-0123456789ab"
        fresh = folder / ".new.tmp-ba9876543210"
        live = folder / ".live.tmp-cccccccccccc"
        top_dead = Path(store.location) / ".x.tmp-aaaaaaaaaaaa"
        for p in (dead, fresh, live, top_dead):
            p.write_bytes(b"partial")
        old = time.time() - DEAD_MIN_AGE - 60
        for p in (dead, top_dead, live):
            os.utime(p, (old, old))
        with open(live, "rb") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a writer still busy with it
            assert names(store) == {"f/v/k"}  # temporaries are never listed
            assert not dead.exists() and not top_dead.exists()
            assert fresh.exists() and live.exists()
        assert names(store) == {"f/v/k"}
        assert not live.exists()  # its writer is gone now

    def test_delete_does_not_follow_symlinks(self, store, tmp_path):
        target = tmp_path / "elsewhere"
        target.mkdir()
        (target / "keep").write_bytes(b"x")
        put(store, "f/v/k", b"x")
        os.symlink(target, Path(store.location) / "f" / "link")
        assert store.delete("f/link") is True
        assert (target / "keep").read_bytes() == b"x"
        assert store.delete("f") is True
        assert (target / "keep").exists()

    def test_pickles_by_location(self, store):
        put(store, "f/v/k", b"x")
        copy = pickle.loads(pickle.dumps(store))
        assert isinstance(copy, LocalStore) and copy.location == store.location
        assert get(copy, "f/v/k") == b"x"

    def test_not_durable_writes_work_too(self, tmp_path):
        store = LocalStore(tmp_path / "cache", durable=False)
        put(store, "f/v/k", b"x")
        assert get(store, "f/v/k") == b"x"


# -- a user backend: objects in a dict, no local files ---------------------------------
class DictStore:
    """A store held in memory, shared by location; implements the Store protocol."""

    spaces: ClassVar[dict[str, dict[str, list[Any]]]] = {}

    def __init__(self, location: str) -> None:
        self.location = location
        self.objects = DictStore.spaces.setdefault(location, {})  # name -> [bytes, last used]

    def _under(self, name: str) -> list[str]:
        return [n for n in self.objects if n == name or n.startswith(name + "/")]

    def open(self, name: str) -> BinaryIO:
        check_name(name)
        try:
            return io.BytesIO(self.objects[name][0])
        except KeyError:
            raise EntryNotFound(name) from None

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        check_name(name)
        buf = io.BytesIO()
        yield buf
        self.objects[name] = [buf.getvalue(), time.time()]

    def exists(self, name: str) -> bool:
        check_name(name)
        return bool(self._under(name))

    def delete(self, name: str) -> bool:
        check_name(name)
        found = self._under(name)
        for n in found:
            del self.objects[n]
        return bool(found)

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        if prefix:
            check_name(prefix)
        for n, (data, used) in list(self.objects.items()):
            if not prefix or n.startswith(prefix + "/"):
                yield EntryStat(n, len(data), used)

    def touch(self, names: Iterable[str]) -> None:
        now = time.time()
        for n in names:
            check_name(n)
            if n in self.objects:
                self.objects[n][1] = now


class TestDictStore(StoreConformance):
    """The test backend passes the same suite, so the end-to-end test below means something."""

    def make_store(self, tmp_path: Path) -> Store:
        return DictStore(str(tmp_path))

    def age(self, store: Store, name: str, seconds: float) -> None:
        store.objects[name][1] -= seconds


@pytest.fixture
def scratch_stores(monkeypatch):
    """Backends registered by a test are forgotten after it."""
    monkeypatch.setattr(stores, "_entries", dict(stores._entries))
    monkeypatch.setattr(DictStore, "spaces", {})


@pytest.fixture
def dict_backend(scratch_stores) -> str:
    name = f"dict-{uuid.uuid4().hex[:8]}"
    register_store_backend(name, DictStore)
    return name


CALLS: list[Any] = []


def compute(n: int) -> dict[str, Any]:
    CALLS.append(n)
    return {"a": np.arange(n, dtype=np.float32), "meta": (n, "x", None)}


def compute_ordered(n: int) -> collections.OrderedDict[str, Any]:
    CALLS.append(n)
    return collections.OrderedDict(b=np.ones(n), a=n)


def test_a_registered_backend_works_end_to_end(dict_backend):
    CALLS.clear()
    mem = Memory("team-space", backend=dict_backend, verbose=0)
    assert isinstance(mem.store, DictStore) and not isinstance(mem.store, LocalPaths)
    f = mem.cache(compute)
    first = f(5)
    second = f(5)
    assert CALLS == [5]
    assert type(second["a"]) is np.ndarray and second["a"].flags.writeable
    np.testing.assert_array_equal(second["a"], np.arange(5, dtype=np.float32))
    assert second["meta"] == first["meta"] == (5, "x", None)
    assert f.check_call_in_cache(5) and not f.check_call_in_cache(6)
    assert sum(map(is_entry, mem.store.objects)) == 1  # one result (and its code manifest)
    # another Memory on the same location finds the result
    other = Memory("team-space", backend=dict_backend, verbose=0, mmap_mode="r")
    g = other.cache(compute)
    out = g(5)
    assert CALLS == [5]
    assert type(out["a"]) is np.ndarray  # nothing to map: read into memory
    # pickled values, shelving
    h = mem.cache(compute_ordered)
    h(3)
    assert type(h(3)) is collections.OrderedDict and CALLS == [5, 3]
    shelved = f.call_and_shelve(7)
    assert CALLS == [5, 3, 7]
    np.testing.assert_array_equal(shelved.get()["a"], np.arange(7, dtype=np.float32))
    shelved.clear()
    with pytest.raises(KeyError):
        shelved.get()
    assert mem.verify() == []
    f.clear(warn=False)
    assert not f.check_call_in_cache(5)
    mem.clear(warn=False)
    assert list(mem.store.list()) == []


def test_a_registered_backend_with_validation_callback(dict_backend):
    CALLS.clear()
    mem = Memory("space", backend=dict_backend, verbose=0)
    f = mem.cache(compute, cache_validation_callback=expires_after(days=1))
    f(2)
    f(2)
    assert CALLS == [2]
    assert f.check_call_in_cache(2)
    g = mem.cache(compute, cache_validation_callback=lambda info: False)
    assert not g.check_call_in_cache(2)
    g(2)
    assert CALLS == [2, 2]


def test_a_registered_backend_damaged_entry_is_a_miss(dict_backend):
    CALLS.clear()
    mem = Memory("space", backend=dict_backend, verbose=0)
    f = mem.cache(compute)
    f(4)
    (name,) = [n for n in mem.store.objects if is_entry(n)]
    data = bytearray(mem.store.objects[name][0])
    data[-3] ^= 0xFF
    mem.store.objects[name][0] = bytes(data)
    assert mem.verify() == [name]
    with pytest.warns(CacheWarning, match="damaged"):
        np.testing.assert_array_equal(f(4)["a"], np.arange(4, dtype=np.float32))
    assert CALLS == [4, 4]
    assert mem.verify() == []
    mem.store.objects[name][0] = mem.store.objects[name][0][:-1]
    assert mem.verify(fix=True) == [name]
    assert not [e for e in mem.store.list() if is_entry(e.name)]


class NotAStore:
    def open(self, name):
        return None

    def write(self, name):
        return None


# any one-line str is a backend name, as joblib takes ("GCS", "my store"): see
# tests/compat/test_joblib_api.py; what is not a str, or is empty or multiline, is refused
@pytest.mark.parametrize("bad", ["", "two\nlines", None, 5])
def test_register_store_backend_rejects_bad_names(bad, scratch_stores):
    with pytest.raises(RegistryError):
        register_store_backend(bad, DictStore)


@pytest.mark.parametrize(
    "bad", [NotAStore, int, object, DictStore("x")], ids=["partial", "int", "object", "instance"]
)
def test_register_store_backend_rejects_what_is_not_a_store_class(bad, scratch_stores):
    with pytest.raises(RegistryError):
        register_store_backend("bad-backend", bad)
    assert "bad-backend" not in stores


def test_register_store_backend_names_what_is_missing(scratch_stores):
    with pytest.raises(RegistryError, match="exists.*delete.*list.*touch"):
        register_store_backend("half", NotAStore)


def test_register_store_backend_refuses_to_shadow_unless_asked(scratch_stores):
    with pytest.raises(RegistryError, match="already registered"):
        register_store_backend("local", DictStore)
    register_store_backend("local", DictStore, replace=True)
    assert stores["local"] is DictStore


def test_unknown_backend_is_a_registry_error(tmp_path):
    with pytest.raises(RegistryError, match="unknown store backend 'nope'.*local"):
        Memory(tmp_path, backend="nope")
