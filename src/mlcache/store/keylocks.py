"""Key locks of the local store: one process (or thread) computes a key while the
others wait for its result.

On Linux a key's lock is a one-byte open-file-description record lock
(``F_OFD_SETLK``) in one hidden file per folder, :data:`KEYS_FILE`, at an offset
drawn from the key's name. Taking it opens a file that is already there and
makes one ``fcntl``; giving it back is the ``close``. Before, each key had a file
of its own, made at the lock and removed at the release: two changes to the
folder per miss, which were a third of a small function's miss.

Open-file-description locks behave as ``flock`` does where it matters: two
descriptors conflict even in one process (threads waiting on a key wait), and
the kernel releases the lock when its holder dies, even by SIGKILL (a dead
holder never blocks anyone). Where they are missing (another system, a file
system that refuses record locks), the key's own file is ``flock``-ed as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import struct
import sys
from collections.abc import Iterator

from .._atomic import open_regular
from .._util import backoff

__all__ = ["KEYS_FILE", "LOCK_SUFFIX", "hold_key"]

LOCK_SUFFIX = ".lock"
#: the file of a folder's key locks (kept: it is never removed while in use)
KEYS_FILE = f".keys{LOCK_SUFFIX}"
#: ``struct flock`` of 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (+ padding)
_FLOCK = struct.Struct("hhqqi4x")
_OFD_SETLK: int | None = (
    getattr(fcntl, "F_OFD_SETLK", None)
    if sys.platform == "linux" and struct.calcsize("P") == 8
    else None
)
#: errors that say "held by another", not "record locks do not work here"
_HELD = (errno.EAGAIN, errno.EACCES)


def _offset(base: str) -> int:
    """The byte of :data:`KEYS_FILE` that stands for key ``base`` (62 bits of its
    hash: two keys of one folder meet only by a collision of those)."""
    digest = hashlib.blake2b(base.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _set_record(fd: int, offset: int, kind: int) -> None:
    """Set the record lock of byte ``offset`` of ``fd`` to ``kind`` (write, unlock)."""
    assert _OFD_SETLK is not None
    fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))


def _try_record(fd: int, offset: int) -> bool:
    """Take the write lock of byte ``offset`` of ``fd`` at once, or return False."""
    try:
        _set_record(fd, offset, fcntl.F_WRLCK)
    except OSError as exc:
        if exc.errno in _HELD:
            return False
        raise
    return True


@contextlib.contextmanager
def hold_key(dir_fd: int, base: str, folder: str, timeout: float) -> Iterator[bool]:
    """Hold the lock of key ``base`` of the folder ``dir_fd`` (shown as
    ``folder`` in warnings) for the block; yield False when it could not be had
    within ``timeout`` seconds (polled every 2 ms, doubling up to 100 ms)."""
    fd = _record_lock(dir_fd, base, folder, timeout) if _OFD_SETLK is not None else -1
    if fd == -1:  # no record locks here: the key's own file
        with _file_lock(dir_fd, base, folder, timeout) as held:
            yield held
        return
    try:
        yield fd is not None
    finally:
        if fd is not None:
            # unlocked before the close: a child forked meanwhile (a Pool, DataLoader
            # workers) shares the descriptor's lock, which a close alone leaves held
            with contextlib.suppress(OSError):
                _set_record(fd, _offset(base), fcntl.F_UNLCK)
            os.close(fd)


def _record_lock(dir_fd: int, base: str, folder: str, timeout: float) -> int | None:
    """A descriptor of :data:`KEYS_FILE` holding key ``base``'s byte, None after
    ``timeout`` seconds, or -1 when this file system has no record locks."""
    offset = _offset(base)
    shown = os.path.join(folder, KEYS_FILE)
    for _ in backoff(timeout, first=0.002, most=0.1, factor=2.0):
        fd = open_regular(KEYS_FILE, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, shown=shown)
        try:
            if _try_record(fd, offset):
                return fd
        except OSError:  # EINVAL, ENOLCK, EOPNOTSUPP: record locks refused here
            os.close(fd)
            return -1
        os.close(fd)
    return None


@contextlib.contextmanager
def _file_lock(dir_fd: int, base: str, folder: str, timeout: float) -> Iterator[bool]:
    """The key's own hidden file, ``flock``-ed, removed by its holder when done; a
    waiter that locked a file removed meanwhile notices (another inode) and tries
    again."""
    lock = f".{base}{LOCK_SUFFIX}"
    fd = _lock_file(lock, dir_fd, os.path.join(folder, lock), timeout)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(lock, dir_fd=dir_fd)  # while still holding it: see above
            os.close(fd)


def _lock_file(name: str, dir_fd: int, shown: str, timeout: float) -> int | None:
    """An open, ``flock``-ed descriptor of the file ``name`` of folder ``dir_fd``
    (never a link's target), or None after ``timeout`` s (polled every 2 ms,
    doubling up to 100 ms)."""
    for _ in backoff(timeout, first=0.002, most=0.1, factor=2.0):
        while True:
            fd = open_regular(name, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, shown=shown)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                break  # held: wait, then try again
            try:
                current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                return fd
            os.close(fd)  # its holder removed it after we opened it: lock the new one
    return None
