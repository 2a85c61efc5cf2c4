"""The one atomic-write primitive: write to a temporary name, flush, fsync, rename.

A reader sees either the whole previous file, the whole new file, or nothing;
never a partial one. Temporary files are named ``.<name>.tmp-<random>`` in the
destination folder (same file system, so ``os.replace`` is atomic) and are
removed when the write fails. A crash can leave one behind: its writer holds an
``flock`` on it while writing, which the kernel releases when the writer dies,
even by SIGKILL, so :func:`remove_if_dead` tells a dead writer's leftover from a
file still being written, at any age.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from typing import BinaryIO

TMP_MARK = ".tmp-"
#: an unlocked temporary younger than this is left alone: its writer may be
#: between creating it and locking it
DEAD_MIN_AGE = 10.0


def is_temporary(name: str) -> bool:
    """True for a file name made by :func:`atomic_file` (possibly left by a crash)."""
    return name.startswith(".") and TMP_MARK in name


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort: not all systems allow it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_if_dead(path: str, min_age: float = DEAD_MIN_AGE) -> bool:
    """Remove the temporary file or folder ``path`` if no writer holds it (its
    writer died) and it is at least ``min_age`` seconds old; return whether it
    was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if time.time() - st.st_mtime < min_age:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its writer is alive
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False  # the name was replaced meanwhile (a lock file made anew)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def temporary_folder(folder: str, name: str) -> Iterator[str]:
    """A scratch folder ``.<name>.tmp-<random>`` in ``folder``, locked while in use
    (so :func:`remove_if_dead` removes it if its user dies) and removed after."""
    path = tempfile.mkdtemp(prefix=f".{name}{TMP_MARK}", dir=folder)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def sweep_dead(folder: str, name: str, min_age: float = DEAD_MIN_AGE) -> int:
    """Remove the dead writers' temporaries of ``name`` in ``folder``; return how many."""
    prefix = f".{name}{TMP_MARK}"
    try:
        found = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return 0
    return sum(remove_if_dead(os.path.join(folder, n), min_age) for n in found)


@contextlib.contextmanager
def atomic_file(path: str, *, durable: bool = True, mode: int = 0o600) -> Iterator[BinaryIO]:
    """Open a temporary file that replaces ``path`` atomically when the block succeeds.

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_file(os.path.join(d, "x")) as f:
    ...     _ = f.write(b"hello")
    >>> open(os.path.join(d, "x"), "rb").read()
    b'hello'
    """
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}{TMP_MARK}{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: "a writer is alive"
        with os.fdopen(fd, "wb", buffering=0) as f:
            yield f
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(folder)


def write_bytes_atomic(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_file(path, durable=durable) as f:
        f.write(data)
