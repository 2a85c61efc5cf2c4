"""The local-directory store (the default): one file per entry, published by rename."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from .._atomic import atomic_file, is_temporary, remove_if_dead
from ..errors import EntryNotFound, StoreError, warn
from . import EntryStat, SharedCounter, check_name

__all__ = ["LocalStore"]

_GITIGNORE = "# created by mlcache: this folder is a cache, never commit it\n*\n"
#: marks a folder being removed (renamed first, then deleted)
TOMB_MARK = ".removing-"
_LOCK_SUFFIX = ".lock"
_COUNTER = struct.Struct("<qd")  # value, time it was set
logger = logging.getLogger("mlcache")
#: one thread at a time per counter file in this process (the file lock is per process)
_COUNTER_LOCKS: dict[str, threading.Lock] = {}
_COUNTER_LOCKS_GUARD = threading.Lock()


def _counter_lock(path: str) -> threading.Lock:
    with _COUNTER_LOCKS_GUARD:
        return _COUNTER_LOCKS.setdefault(path, threading.Lock())


def _forget_counter_locks() -> None:  # a forked child must not inherit a held lock
    global _COUNTER_LOCKS_GUARD
    _COUNTER_LOCKS.clear()
    _COUNTER_LOCKS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_counter_locks)


def _valid_name(name: str) -> bool:
    try:
        check_name(name)
    except ValueError:
        return False
    return True


class LocalStore:
    """Entries as files under a local folder.

    Parameters
    ----------
    location:
        The folder; created (mode 0o700) if missing. A ``.gitignore`` is added
        unless one exists, so a cache inside a repository is never committed.
    durable:
        fsync each entry and its folder before publishing (default True), so a
        power loss cannot leave a published but empty entry.
    mode:
        Permission bits for the folders mlcache creates (default 0o700: only the
        owner can read cached values).
    """

    def __init__(
        self, location: str | os.PathLike[str], *, durable: bool = True, mode: int = 0o700
    ) -> None:
        root = os.path.abspath(os.fspath(location))
        self.location = root
        self.durable = durable
        self.mode = mode
        try:
            os.makedirs(root, mode=mode, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the cache folder {root!r}: {exc.strerror}") from exc
        if not os.path.isdir(root):
            raise StoreError(f"the cache location {root!r} exists and is not a folder")
        if not os.access(root, os.W_OK | os.X_OK):
            raise StoreError(f"the cache folder {root!r} is not writable by this user")
        try:
            fd = os.open(
                os.path.join(root, ".gitignore"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
            )
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot write in the cache folder {root!r}: {exc.strerror}") from exc
        else:
            with os.fdopen(fd, "w") as f:
                f.write(_GITIGNORE)

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.location, self.durable, self.mode))

    def local_path(self, name: str) -> str:
        return os.path.join(self.location, check_name(name))

    def open(self, name: str) -> BinaryIO:
        try:
            return open(os.path.join(self.location, check_name(name)), "rb")
        except FileNotFoundError:
            raise EntryNotFound(name) from None

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = os.path.join(self.location, check_name(name))
        folder = self.location
        for part in name.split("/")[:-1]:
            folder = os.path.join(folder, part)
            try:
                os.mkdir(folder, self.mode)
            except FileExistsError:
                pass
        with atomic_file(path, durable=self.durable) as f:
            yield f

    def exists(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.location, check_name(name)))

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the lock of entry ``name`` for the block: one process (or thread)
        computes a key while the others wait. Yields False when the lock could not
        be had within ``timeout`` seconds (the caller then goes on unlocked).

        The lock is an ``flock`` on a hidden file beside the entry, so the kernel
        releases it when its holder dies, even by SIGKILL: a dead holder never
        blocks anyone. The holder removes the file when it is done; a waiter that
        locked a file removed meanwhile notices (another inode) and tries again.
        """
        folder, base = os.path.split(os.path.join(self.location, check_name(name)))
        path = os.path.join(folder, f".{base}{_LOCK_SUFFIX}")
        fd = _lock_file(path, folder, self.mode, timeout)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # while still holding it: see above
                os.close(fd)

    def delete(self, name: str) -> bool:
        path = os.path.join(self.location, check_name(name))
        try:
            os.unlink(path)  # an entry (or a link)
            return True
        except FileNotFoundError:
            return False
        except (IsADirectoryError, PermissionError):  # EISDIR, or EPERM on macOS
            if not os.path.isdir(path):
                raise
        # a folder: move it out of the way in one rename, then remove it at
        # leisure. Writers racing with us fail cleanly (and warn) instead of
        # making rmtree fail halfway; readers holding memory maps keep them.
        parent, base = os.path.split(path)
        tomb = os.path.join(parent, f".{base}{TOMB_MARK}{secrets.token_hex(6)}")
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return False
        shutil.rmtree(tomb, ignore_errors=True)
        return True

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        """Entries under ``prefix``. Skipped: hidden files and folders (``.gitignore``,
        temporaries, removed folders, a Finder's ``.DS_Store``), names that are not
        valid entry names, and folders this user cannot read (logged)."""
        start = os.path.join(self.location, check_name(prefix)) if prefix else self.location
        stack = [start]
        while stack:
            folder = stack.pop()
            try:
                it = os.scandir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except PermissionError as exc:
                warn(f"mlcache: cannot list {folder} ({exc.strerror}); skipped", stacklevel=3)
                continue
            with it:
                for e in it:
                    if e.name.startswith("."):
                        self._sweep(e)
                        continue
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                            continue
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    rel = os.path.relpath(e.path, self.location).replace(os.sep, "/")
                    if _valid_name(rel):
                        yield EntryStat(rel, st.st_size, st.st_mtime)

    @contextlib.contextmanager
    def shared_counter(self, name: str, timeout: float = 30.0) -> Iterator[SharedCounter | None]:
        """A number that every process and thread using this store reads and changes
        one at a time, for the block (a 16-byte hidden file under a POSIX record
        lock: released by the kernel when its holder dies, and not inherited by a
        child forked meanwhile, unlike ``flock``). Yields None when it could not
        be had within ``timeout`` seconds (a holder stopped, not dead)."""
        path = os.path.join(self.location, f".{check_name(name)}.counter")
        with _counter_lock(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if not _lockf(fd, timeout):
                    yield None
                    return
                raw = os.pread(fd, _COUNTER.size, 0)
                value, stamp = _COUNTER.unpack(raw) if len(raw) == _COUNTER.size else (0, 0.0)
                counter = SharedCounter(value, stamp)
                yield counter
                if (counter.value, counter.stamp) != (value, stamp):
                    os.pwrite(fd, _COUNTER.pack(counter.value, counter.stamp), 0)
            finally:
                os.close(fd)  # releases the record lock

    @staticmethod
    def _sweep(e: os.DirEntry[str]) -> None:
        """Remove what a crashed writer or an interrupted removal left behind."""
        if TOMB_MARK in e.name:
            shutil.rmtree(e.path, ignore_errors=True)
        elif is_temporary(e.name) or e.name.endswith(_LOCK_SUFFIX):
            # a key lock left by a killed holder goes too: a waiter that opened it
            # meanwhile sees another inode and locks a new one (see _lock_file)
            remove_if_dead(e.path)

    def touch(self, names: Iterable[str]) -> None:
        # last use is the file's mtime: atime is unreliable (noatime, relatime)
        now = time.time()
        for name in names:
            check_name(name)
            with contextlib.suppress(OSError):
                os.utime(os.path.join(self.location, name), (now, now))


def _lockf(fd: int, timeout: float) -> bool:
    """Take a POSIX write lock on ``fd`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _lock_file(path: str, folder: str, mode: int, timeout: float) -> int | None:
    """An open, ``flock``-ed descriptor of ``path``, or None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # the entry's folder does not exist yet
            os.makedirs(folder, mode=mode, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
            continue
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # its holder removed it after we opened it: lock the new one


def _rebuild(location: str, durable: bool, mode: int) -> LocalStore:
    return LocalStore(location, durable=durable, mode=mode)
