"""store/cached.py: LocalCopies, the one local copy of remote objects (CachedStore's
conformance runs in test_store.py), and the leases' local writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlcache.store.cached import LocalCopies
from mlcache.store.leases import Leases


def _everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_failed_copy_leaves_nothing(tmp_path):
    copies = LocalCopies(tmp_path / "c", limit=None)

    def fill(tmp: str) -> None:
        Path(tmp).write_bytes(b"half")
        raise ConnectionError("network gone")

    with pytest.raises(ConnectionError):
        copies.get("f/v/k", fill)
    assert not os.path.exists(copies.path("f/v/k"))
    assert _everything(tmp_path / "c") == ["f", "f/v"]  # no temporary left behind


def test_a_copy_is_made_once_and_replaced_whole(tmp_path):
    copies = LocalCopies(tmp_path / "c", limit=None)
    calls = []
    fill = lambda tmp: calls.append(Path(tmp).write_bytes(b"v1"))  # noqa: E731
    path = copies.get("a.pack", fill)
    assert copies.get("a.pack", fill) == path and len(calls) == 1
    with open(path, "rb") as old:
        with copies.replacing("a.pack") as tmp:
            Path(tmp).write_bytes(b"v2")
        assert old.read() == b"v1"  # a reader of the old copy keeps it
    assert Path(path).read_bytes() == b"v2"


def test_trim_keeps_the_limit_and_spares_copies_being_made(tmp_path):
    copies = LocalCopies(tmp_path / "c", limit=3000)
    for i in range(6):
        copies.get(f"f/{i}", lambda tmp: Path(tmp).write_bytes(bytes(1000)))
        t = 1e9 + i
        os.utime(copies.path(f"f/{i}"), (t, t))
    with copies.replacing("f/new") as tmp:
        Path(tmp).write_bytes(bytes(5000))
        copies.trim()
        assert Path(tmp).exists()  # a copy being written is not a copy yet
    assert copies.trim() > 0
    assert sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file()) <= 3000


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "a/", "./a", "a/./b", "..", "a/..", "../x"])
def test_names_cannot_leave_the_folder(tmp_path, bad):
    with pytest.raises(ValueError):
        LocalCopies(tmp_path / "c").path(bad)


def test_local_leases_are_made_and_renewed_whole(tmp_path):
    import fsspec

    leases = Leases(fsspec.filesystem("file"), seconds=60, local=True)
    base = str(tmp_path / "f" / "k.lease")
    assert leases.create(f"{base}.1", b'{"expires": 0}')
    assert not leases.create(f"{base}.1", b"again")
    leases.renew(f"{base}.1", leases.body("me"))
    assert leases.expires(f"{base}.1") > 0
    assert leases.numbers(base) == (1,)
    assert _everything(tmp_path / "f") == ["k.lease.1"]  # no temporary left
    with pytest.raises(OSError):
        leases.renew(str(tmp_path / "missing" / "k.lease.1"), b"x")
    assert not (tmp_path / "missing").exists()


def test_a_clear_reaches_the_copies_of_a_cached_store_on_another_machine(tmp_path):
    """CachedStore over any store: two machines (two local folders) share one
    space; a clear (a function's whole folder removed) on one stops the other
    serving its copy, at once when made after the clear, within
    revalidate_after when running."""
    from mlcache.store.cached import GENERATION_NAME, CachedStore
    from mlcache.store.memory import MemoryStore
    from mlcache.testing.stores import put

    space = f"shared-{tmp_path.name}"
    a = CachedStore(MemoryStore(space), tmp_path / "a")
    running = CachedStore(MemoryStore(space), tmp_path / "b", revalidate_after=0)
    waiting = CachedStore(MemoryStore(space), tmp_path / "c", revalidate_after=3600)
    put(a, "f/v/k", b"old")
    for machine in (running, waiting):
        assert Path(machine.local_path("f/v/k")).read_bytes() == b"old"
    assert a.delete("f")  # a clear
    assert GENERATION_NAME not in {e.name for e in a.list()}
    with pytest.raises(FileNotFoundError):
        running.local_path("f/v/k")  # looked again: its copy is not served
    with pytest.raises(FileNotFoundError):
        CachedStore(MemoryStore(space), tmp_path / "d").local_path("f/v/k")  # made after
    assert Path(waiting.local_path("f/v/k")).read_bytes() == b"old"  # until it looks
    put(a, "f/v/k", b"new")
    assert Path(running.local_path("f/v/k")).read_bytes() == b"new"
