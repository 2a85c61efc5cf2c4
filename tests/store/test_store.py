"""store/: one conformance suite every store passes, LocalStore specifics, user backends."""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import io
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import threading
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
from mlcache.store import (
    EntryStat,
    LocalFolders,
    LocalPaths,
    Store,
    backend_for,
    check_name,
    keylocks,
    register_url_scheme,
    schemes,
    stores,
)
from mlcache.store.cached import CachedStore
from mlcache.store.local import LocalStore
from mlcache.store.memory import MemoryStore
from mlcache.testing.stores import StoreTests, get, names, put


class TestMemoryStore(StoreTests):
    """The in-memory backend ("memory") passes the suite it ships with."""

    def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore(str(tmp_path))

    def age(self, store: Store, name: str, seconds: float) -> None:
        data, used = store._space.objects[name]
        store._space.objects[name] = (data, used - seconds)

    def test_is_the_memory_backend(self, tmp_path):
        mem = Memory(str(tmp_path), backend="memory", verbose=0)
        assert isinstance(mem.store, MemoryStore)
        f = mem.cache(compute)
        CALLS.clear()
        f(3)
        again = Memory(str(tmp_path), backend="memory", verbose=0).cache(compute)
        np.testing.assert_array_equal(again(3)["a"], np.arange(3, dtype=np.float32))
        assert CALLS == [3]  # one location, one space


class TestCachedStore(StoreTests):
    """Any store wrapped for local copies: LocalPaths, the rest its own."""

    def make_store(self, tmp_path: Path) -> Store:
        return CachedStore(MemoryStore(str(tmp_path)), tmp_path / "copies", "1MB")

    def age(self, store: Store, name: str, seconds: float) -> None:
        TestMemoryStore().age(store.store, name, seconds)

    def test_copies_once_and_keeps_its_limit(self, tmp_path):
        remote = MemoryStore(str(tmp_path))
        store = CachedStore(remote, tmp_path / "copies", 10_000)
        for i in range(20):
            put(remote, f"f/v/{i}", bytes(1000))
        opened = []
        real = remote.open
        remote.open = lambda name: opened.append(name) or real(name)  # type: ignore[method-assign]
        first = store.local_path("f/v/0")
        assert store.local_path("f/v/0") == first and opened == ["f/v/0"]
        for i in range(20):
            store.local_path(f"f/v/{i}")
        store.trim_local()
        total = sum(p.stat().st_size for p in (tmp_path / "copies").rglob("*") if p.is_file())
        assert total <= 10_000
        with pytest.raises(FileNotFoundError):
            store.local_path("f/v/missing")
        assert not [p for p in (tmp_path / "copies").rglob("*") if p.name.startswith(".")]

    def test_a_reader_of_an_old_copy_keeps_its_map(self, tmp_path):
        remote = MemoryStore(str(tmp_path))
        store = CachedStore(remote, tmp_path / "copies")
        put(store, "f/v/k", b"old!")
        with open(store.local_path("f/v/k"), "rb") as held:
            put(store, "f/v/k", b"new!")
            assert held.read() == b"old!"
        assert Path(store.local_path("f/v/k")).read_bytes() == b"new!"
        assert get(remote, "f/v/k") == b"new!"
        store.delete("f/v")
        assert not (tmp_path / "copies" / "f" / "v").exists() and not remote.exists("f/v/k")


# -- LocalStore ---------------------------------------------------------------------
def _another_thread_gets(store: Store, name: str) -> bool:
    """Whether another thread gets the lock of ``name`` at once."""
    seen: list[bool] = []

    def other() -> None:
        with store.lock(name, 0) as held:
            seen.append(held)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return seen[0]


class TestLocalStore(StoreTests):
    def make_store(self, tmp_path: Path) -> Store:
        return LocalStore(tmp_path / "cache")

    def age(self, store: Store, name: str, seconds: float) -> None:
        path = os.path.join(store.location, name)
        t = os.stat(path).st_mtime - seconds
        os.utime(path, (t, t))

    def test_a_removed_cache_folder_is_made_again_by_the_next_write(self, tmp_path):
        """The folder removed while the store is in use: a write, a lock and a
        counter make it again, marked as a cache; a read is only a miss."""
        for use in ("write", "lock", "counter"):
            root = tmp_path / use
            store = LocalStore(root)
            put(store, "f/v/k", b"x")
            shutil.rmtree(root)
            assert not store.exists("f/v/k") and list(store.list()) == []
            with pytest.raises(EntryNotFound):
                store.open("f/v/k")
            assert not root.exists()  # reading makes nothing
            if use == "write":
                put(store, "f/v/k", b"y")
                assert get(store, "f/v/k") == b"y"
            elif use == "lock":
                with store.lock("f/v/k", 1.0) as held:
                    assert held
            else:
                with store.shared_counter("size") as counter:
                    assert counter is not None and counter.value == 0
            assert (root / "CACHEDIR.TAG").is_file() and (root / ".gitignore").is_file()
            assert stat.S_IMODE(root.stat().st_mode) == 0o700

    def test_no_temporary_files_left_after_a_failed_write(self, store):
        with pytest.raises(RuntimeError), store.write("f/v/k") as f:
            f.write(b"x")
            raise RuntimeError
        leftovers = [n for _, _, files in os.walk(store.location) for n in files]
        assert sorted(leftovers) == [".gitignore", "CACHEDIR.TAG"]

    def test_gives_local_paths(self, store):
        assert isinstance(store, LocalPaths) and isinstance(store, LocalFolders)
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

    def test_a_key_lock_makes_no_file_of_its_own_and_survives_a_sweep(self, store):
        """A key's lock is a record lock in the folder's one ``.keys.lock``: no
        file is made and removed per key (two folder changes a miss, before),
        and a listing that sweeps dead writers' debris never takes that file."""
        put(store, "f/v/k", b"x")
        folder = Path(store.location) / "f" / "v"
        with store.lock("f/v/k", 1.0) as held:
            assert held
            assert sorted(p.name for p in folder.iterdir()) == [".keys.lock", "k"]
            old = time.time() - DEAD_MIN_AGE - 60
            os.utime(folder / ".keys.lock", (old, old))
            assert names(store) == {"f/v/k"}  # the sweep
            assert (folder / ".keys.lock").exists()
            assert _another_thread_gets(store, "f/v/k") is False  # taken: another waits
        assert _another_thread_gets(store, "f/v/k") is True

    def test_a_key_lock_is_given_back_though_a_forked_child_outlives_its_holder(self, store):
        """A computation that forks a child living on (a Pool, DataLoader workers):
        the child shares the lock's descriptor, and the key is free all the same
        once its holder is done (a close alone would leave it locked)."""
        with store.lock("f/v/k", 1.0) as held:
            assert held
            child = os.fork()
            if child == 0:  # pragma: no cover (the child only waits)
                time.sleep(30)
                os._exit(0)
        try:
            with store.lock("f/v/k", 0) as again:
                assert again
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)

    @pytest.mark.parametrize("why", ["no record locks", "refused by the file system"])
    def test_without_record_locks_each_key_has_a_file_of_its_own(self, store, monkeypatch, why):
        """Another system, or a file system that refuses record locks: the key's own
        hidden file is ``flock``-ed, and removed by its holder."""
        if why == "no record locks":
            monkeypatch.setattr(keylocks, "_OFD_SETLK", None)
        else:

            def refuse(fd: int, offset: int) -> bool:
                raise OSError(errno.ENOLCK, "No locks available")

            monkeypatch.setattr(keylocks, "_try_record", refuse)
        put(store, "f/v/k", b"x")
        folder = Path(store.location) / "f" / "v"
        with store.lock("f/v/k", 1.0) as held:
            assert held and (folder / ".k.lock").is_file()
            assert _another_thread_gets(store, "f/v/k") is False  # taken: another waits
        assert not (folder / ".k.lock").exists()
        assert _another_thread_gets(store, "f/v/k") is True

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


class TestDictStore(StoreTests):
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


@pytest.mark.parametrize(
    ("location", "backend", "expected"),
    [
        ("/some/folder", "local", "local"),
        ("s3://bucket/c", "local", "fsspec"),
        ("MEMORY://x", "local", "fsspec"),
        ("weird+proto://x", "local", "fsspec"),  # unknown schemes: fsspec knows more
        ("s3://bucket/c", "mine", "mine"),  # a named backend wins
    ],
)
def test_urls_map_to_backends_by_scheme(location, backend, expected):
    assert backend_for(location, backend) == expected


def test_a_scheme_can_name_a_registered_backend(dict_backend, monkeypatch):
    monkeypatch.setattr(schemes, "_entries", dict(schemes._entries))
    register_url_scheme("dictstore", dict_backend)
    assert backend_for("dictstore://space", "local") == dict_backend
    mem = Memory("dictstore://space", verbose=0)
    assert isinstance(mem.store, DictStore)
    with pytest.raises(RegistryError, match="already registered"):
        register_url_scheme("s3", dict_backend)


def test_remote_copies_are_local_paths_but_not_local_folders(tmp_path):
    store = CachedStore(MemoryStore(str(tmp_path)), tmp_path / "copies")
    assert isinstance(store, LocalPaths) and not isinstance(store, LocalFolders)
    assert not isinstance(MemoryStore("x"), LocalPaths)
