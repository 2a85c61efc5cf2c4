"""A store backend written for joblib registers with mlcache as it is (the adapter
of :mod:`mlcache.store.joblib_adapter`): users with their own backend switch too."""

from __future__ import annotations

import io
import os

import pytest

joblib_backends = pytest.importorskip("joblib._store_backends")

from mlcache import Memory, errors, register_store_backend  # noqa: E402
from mlcache.store import stores  # noqa: E402


class SubclassedFS(joblib_backends.FileSystemStoreBackend):
    """What a user's backend often is: joblib's file system one, customised."""

    configured: dict | None = None

    def configure(self, location, verbose=1, backend_options=None):
        type(self).configured = dict(backend_options or {})
        super().configure(location, verbose=verbose, backend_options=backend_options)


class BlobBackend(joblib_backends.StoreBackendBase, joblib_backends.StoreBackendMixin):
    """A remote-like backend: blobs in a dict, no folders, and nothing listed."""

    blobs: dict[str, bytes] = {}  # noqa: RUF012

    class _Blob(io.BytesIO):
        def __init__(self, blobs, path):
            super().__init__()
            self._blobs, self._path = blobs, path

        def close(self):
            self._blobs[self._path] = self.getvalue()
            super().close()

    def _open_item(self, f, mode):
        if mode == "rb":
            return io.BytesIO(self.blobs[f])
        return self._Blob(self.blobs, f)

    def _item_exists(self, location):
        return any(p == location or p.startswith(location + "/") for p in self.blobs)

    def _move_item(self, src, dst):
        self.blobs[dst] = self.blobs.pop(src)

    def create_location(self, location):
        pass  # blobs need no folders

    def clear_location(self, location):
        for p in [p for p in self.blobs if p == location or p.startswith(location + "/")]:
            del self.blobs[p]

    def get_items(self):
        return []

    def configure(self, location, verbose=0, backend_options=None):
        self.location = location


class Incomplete(joblib_backends.StoreBackendBase):
    pass


@pytest.fixture
def registered():
    names = []

    def register(name, cls):
        register_store_backend(name, cls)
        names.append(name)
        return name

    yield register
    for name in names:
        stores._entries.pop(name, None)


def counted(mem, calls):
    def square(x):
        calls.append(x)
        return x * x

    return mem.cache(square)


def test_a_subclass_of_joblibs_file_system_backend_caches(tmp_path, registered):
    name = registered("joblib-fs-test", SubclassedFS)
    mem = Memory(tmp_path, backend=name, verbose=0, backend_options={"extra": 1})
    assert isinstance(mem.store.backend, SubclassedFS)  # type: ignore[union-attr]
    # configured as joblib configures it: its options and joblib's two
    assert SubclassedFS.configured == {"compress": False, "mmap_mode": None, "extra": 1}
    calls: list[int] = []
    square = counted(mem, calls)
    assert [square(2), square(2), square(3), square(3)] == [4, 4, 9, 9]
    assert calls == [2, 3]
    # laid out as joblib lays out its calls: one folder per entry, its output.pkl
    outputs = [f for _, _, files in os.walk(tmp_path) for f in files if f == "output.pkl"]
    assert len(outputs) >= 2
    # a new Memory (a new process) finds them
    again = counted(Memory(tmp_path, backend=name, verbose=0), calls)
    assert again(2) == 4 and calls == [2, 3]
    assert again.call_and_shelve(3).get() == 9 and again.check_call_in_cache(3)


def test_what_joblibs_get_items_lists_is_cleared_and_limited(tmp_path, registered):
    name = registered("joblib-fs-test", SubclassedFS)
    mem = Memory(tmp_path, backend=name, verbose=0)
    calls: list[int] = []
    square = counted(mem, calls)
    for x in range(3):
        square(x)
    assert sum(1 for _ in mem.store.list()) == 3  # type: ignore[union-attr]
    mem.reduce_size(items_limit=1)
    assert sum(1 for _ in mem.store.list()) == 1  # type: ignore[union-attr]
    mem.clear()
    assert list(mem.store.list()) == []  # type: ignore[union-attr]
    square(0)
    assert calls == [0, 1, 2, 0]  # cleared: computed again


def test_a_backend_that_lists_nothing_still_caches(tmp_path, registered):
    name = registered("joblib-blob-test", BlobBackend)
    BlobBackend.blobs.clear()
    calls: list[int] = []
    square = counted(Memory("bucket/cache", backend=name, verbose=0), calls)
    assert [square(4), square(4)] == [16, 16] and calls == [4]
    assert any(p.startswith("bucket/cache/") for p in BlobBackend.blobs)
    assert not any(".output.pkl." in p or p.endswith(".tmp") for p in BlobBackend.blobs)
    square.clear()  # a function's folder is removed by name, listing or not
    assert square(4) == 16 and calls == [4, 4]


def test_a_failed_write_publishes_nothing(registered):
    name = registered("joblib-blob-test", BlobBackend)
    BlobBackend.blobs.clear()
    store = Memory("bucket/w", backend=name, verbose=0).store
    with pytest.raises(RuntimeError), store.write("f/0/k") as f:  # type: ignore[union-attr]
        f.write(b"half")
        raise RuntimeError("the writer failed")
    assert BlobBackend.blobs == {}
    with store.write("f/0/k") as f:  # type: ignore[union-attr]
        f.write(b"whole")
    assert store.open("f/0/k").read() == b"whole"  # type: ignore[union-attr]
    with pytest.raises(errors.EntryNotFound):
        store.open("f/0/other")  # type: ignore[union-attr]


def test_an_incomplete_joblib_backend_fails_as_in_joblib(tmp_path, registered):
    # joblib registers it, and its instantiation raises Python's TypeError
    name = registered("joblib-incomplete-test", Incomplete)
    with pytest.raises(TypeError, match="Can't instantiate abstract class Incomplete"):
        Memory(tmp_path, backend=name)


def test_registering_the_same_joblib_class_again_replaces_it(registered):
    name = registered("joblib-fs-test", SubclassedFS)
    register_store_backend(name, SubclassedFS)  # a notebook cell run again
    assert stores[name].backend_class is SubclassedFS  # type: ignore[attr-defined]
    with pytest.raises(errors.InvalidRegistration, match="replace=True"):
        register_store_backend(name, BlobBackend)
