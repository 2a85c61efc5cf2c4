"""_atomic.py: the one write-to-temporary-then-rename primitive."""

from __future__ import annotations

import os
import stat

import pytest

from mlcache._atomic import TMP_MARK, atomic_file, fsync_dir, is_temporary, write_bytes_atomic


def test_atomic_file_publishes_on_success(tmp_path):
    target = tmp_path / "x"
    with atomic_file(str(target)) as f:
        f.write(b"hello")
        assert not target.exists()
        (tmp,) = [p for p in tmp_path.iterdir()]
        assert is_temporary(tmp.name) and tmp.name.startswith(".x" + TMP_MARK)
    assert target.read_bytes() == b"hello"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_file_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "x"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_file(str(target), durable=False) as f:
        f.write(b"new but unfinished")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    with atomic_file(str(target), mode=0o644) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_write_bytes_atomic(tmp_path):
    write_bytes_atomic(str(tmp_path / "y"), b"data", durable=False)
    write_bytes_atomic(str(tmp_path / "y"), b"more data")
    assert (tmp_path / "y").read_bytes() == b"more data"


def test_temporaries_are_recognised():
    assert is_temporary(".key.tmp-0123456789ab")
    assert not is_temporary("key.tmp-0123456789ab")  # not hidden: not ours
    assert not is_temporary(".gitignore")
    assert not is_temporary("0123abcd")


def test_fsync_dir_syncs_the_folder_and_is_best_effort(tmp_path, monkeypatch):
    synced, opened = [], {}
    real_open, real_fsync = os.open, os.fsync

    def spy_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = os.fspath(path)
        return fd

    def spy_fsync(fd):
        synced.append(opened.get(fd))
        return real_fsync(fd)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    fsync_dir(str(tmp_path))
    assert synced == [str(tmp_path)]  # the folder itself, whose entries a rename changed
    fsync_dir(str(tmp_path / "missing"))  # no error, nothing synced
    assert synced == [str(tmp_path)]

    def refuse(fd):
        raise OSError(22, "fsync of a folder not supported here")

    monkeypatch.setattr(os, "fsync", refuse)
    before = len(os.listdir("/proc/self/fd"))
    fsync_dir(str(tmp_path))  # a file system that cannot sync folders: no error
    assert len(os.listdir("/proc/self/fd")) == before  # and the folder's fd was closed
