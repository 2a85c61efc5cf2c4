"""The one atomic-write primitive: write to a temporary name, flush, fsync, rename.

A reader sees either the whole previous file, the whole new file, or nothing;
never a partial one. Temporary files are named ``.<name>.tmp-<random>`` in the
destination folder (same file system, so ``os.replace`` is atomic) and are
removed when the write fails. A crash can leave one behind: its writer holds an
``flock`` on it while writing, which the kernel releases when the writer dies,
even by SIGKILL, so :func:`remove_if_dead` tells a dead writer's leftover from a
file still being written, at any age.

Nothing outside a cache is ever written or removed through it. Whoever can write
in a shared cache folder can plant a symbolic link there, to any file or folder
of the user's; so every file mlcache writes in a cache is opened here, without
following a link (``O_NOFOLLOW``, then ``fstat``: a regular file), in a folder
reached from the cache's root one component at a time, none followed either
(:func:`open_folder`). A link (or a fifo, a device) found where mlcache keeps a
file or a folder is a damaged name: one :class:`~mlcache.CacheWarning`, and it
is removed and made anew, or passed over, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import BinaryIO

from .errors import warn

TMP_MARK = ".tmp-"
#: an unlocked temporary younger than this is left alone: its writer may be
#: between creating it and locking it
DEAD_MIN_AGE = 10.0


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: how often a damaged name is removed and made anew before giving up (someone
#: planting links as fast as they are removed)
_RETRIES = 4


def _planted(shown: str, what: str, removed: bool) -> None:
    """Say, once per name met, that a link was found where mlcache keeps a file."""
    warn(
        f"mlcache: {shown} is {what}, not what mlcache keeps there (planted?); "
        + ("removed it: it is made anew" if removed else "left it alone: it is not used"),
        stacklevel=4,
    )


def _kind(mode: int) -> str:
    return "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"


def open_regular(
    name: str,
    flags: int,
    mode: int = 0o600,
    *,
    dir_fd: int | None = None,
    shown: str | None = None,
    remove: bool = False,
) -> int:
    """``os.open(name, flags, mode)`` that never follows a symbolic link at ``name``
    and returns only a regular file's descriptor.

    A link (or a fifo, socket, device, folder) at ``name`` is a damaged file: one
    warning; with ``os.O_CREAT`` in ``flags`` it is removed (the link, never what
    it points to) and the file is created anew, else ``FileNotFoundError`` is
    raised, as if it were missing (after removing it too, with ``remove``).
    ``shown`` is the path the warning names (``name`` by default).

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> fd = open_regular(os.path.join(d, "x"), os.O_RDWR | os.O_CREAT)
    >>> os.fstat(fd).st_size
    0
    >>> os.close(fd)
    """
    shown = shown or name
    # O_NONBLOCK: opening a planted fifo must not hang; it changes nothing for a file
    safe = flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK
    for _ in range(_RETRIES):
        try:
            fd = os.open(name, safe, mode, dir_fd=dir_fd)
        except OSError as exc:
            # EEXIST: O_EXCL met a name, which may be a link (never followed then)
            if exc.errno not in (
                errno.ELOOP,
                errno.EISDIR,
                errno.ENXIO,
                errno.EMLINK,
                errno.EEXIST,
            ):
                raise
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile: try again
            if stat.S_ISREG(st.st_mode) or (exc.errno == errno.EEXIST and stat.S_ISDIR(st.st_mode)):
                raise
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                if not flags & _NONBLOCK:
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
                return fd
            os.close(fd)
        _remove_damaged(name, st.st_mode, dir_fd, shown, remove=remove or bool(flags & os.O_CREAT))
        if not flags & os.O_CREAT:
            raise FileNotFoundError(errno.ENOENT, f"{shown} is damaged (see the warning)")
    raise OSError(errno.ELOOP, f"{shown} keeps being replaced by a link; not written")


def _remove_damaged(name: str, mode: int, dir_fd: int | None, shown: str, *, remove: bool) -> None:
    """Warn about the damaged name ``name``; remove it (a link itself, or an empty
    folder) when ``remove``."""
    if not remove:
        _planted(shown, _kind(mode), removed=False)
        return
    try:
        if stat.S_ISDIR(mode):
            os.rmdir(name, dir_fd=dir_fd)  # only an empty one: never a user's files
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, f"{shown} is {_kind(mode)} and cannot be removed") from exc
    _planted(shown, _kind(mode), removed=True)


def open_folder(root: str, rel: str = "", *, create: bool = True, mode: int = 0o700) -> int:
    """A descriptor of the folder ``rel`` (``"a/b"``) under ``root``, reached one
    component at a time without following a symbolic link below ``root`` (``root``
    itself may be one: the user chose it).

    With ``create``, missing folders are made (``mode``) and a link (or a file) in
    the way is a damaged name: one warning, the link is removed and a real folder
    made in its place. Without, a missing or damaged component raises
    ``FileNotFoundError`` (a damaged one after its warning, the link removed: it
    is nothing mlcache keeps). Close the descriptor after use.
    """
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    shown = root
    try:
        for part in [p for p in rel.replace(os.sep, "/").split("/") if p not in ("", ".")]:
            if part == "..":
                raise ValueError(f"invalid folder name {rel!r}")
            shown = os.path.join(shown, part)
            for _ in range(_RETRIES):
                try:
                    nfd = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
                    break
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, mode, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    try:
                        st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if not stat.S_ISLNK(st.st_mode):
                        raise  # a file where a folder belongs: an error, not a link
                    _remove_damaged(part, st.st_mode, fd, shown, remove=True)
                    if not create:
                        raise FileNotFoundError(
                            errno.ENOENT, f"{shown} was a symbolic link (removed)"
                        ) from None
            else:
                raise OSError(errno.ELOOP, f"{shown} keeps being replaced by a link")
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def remove_tree(name: str, dir_fd: int) -> None:
    """Remove the folder ``name`` of ``dir_fd`` and all it holds, following no link
    (a link inside is removed, never what it points to); errors are ignored."""
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, ignore_errors=True, dir_fd=dir_fd)
        return
    # before 3.11 rmtree takes no dir_fd: go through /proc's view of the folder
    # descriptor where there is one (still no link followed below it)
    base = f"/proc/self/fd/{dir_fd}"
    shutil.rmtree(os.path.join(base if os.path.isdir(base) else ".", name), ignore_errors=True)


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


def remove_if_dead(path: str, min_age: float = DEAD_MIN_AGE, *, dir_fd: int | None = None) -> bool:
    """Remove the temporary file or folder ``path`` (of folder ``dir_fd``, if given)
    if no writer holds it (its writer died) and it is at least ``min_age`` seconds
    old; return whether it was removed. A link is never followed (nor removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=dir_fd)
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
        now = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False  # the name was replaced meanwhile (a lock file made anew)
        if stat.S_ISDIR(st.st_mode):
            if dir_fd is None:
                shutil.rmtree(path)
            else:
                remove_tree(path, dir_fd)
        elif stat.S_ISREG(st.st_mode):
            os.unlink(path, dir_fd=dir_fd)
        else:
            return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def temporary_folder(folder: str, name: str) -> Iterator[str]:
    """A scratch folder ``.<name>.tmp-<random>`` in ``folder``, locked while in use
    (so :func:`remove_if_dead` removes it if its user dies) and removed after."""
    path = tempfile.mkdtemp(prefix=f".{name}{TMP_MARK}", dir=folder)  # made, never followed
    fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def sweep_dead(folder: str, name: str | None, min_age: float = DEAD_MIN_AGE) -> int:
    """Remove the dead writers' temporaries of ``name`` in ``folder`` (of any name
    with None: a killed build of another pack, or of a shard with a random name,
    left them); return how many. A temporary whose writer lives holds its lock and
    is left alone."""
    try:
        found = [
            n
            for n in os.listdir(folder)
            if (is_temporary(n) if name is None else n.startswith(f".{name}{TMP_MARK}"))
        ]
    except OSError:
        return 0
    return sum(remove_if_dead(os.path.join(folder, n), min_age) for n in found)


@contextlib.contextmanager
def atomic_file(
    path: str,
    *,
    durable: bool = True,
    mode: int = 0o600,
    root: str | None = None,
    folder_mode: int = 0o700,
) -> Iterator[BinaryIO]:
    """Open a temporary file that replaces ``path`` atomically when the block succeeds.

    The temporary is created exclusively (never through a link) and renamed over
    ``path`` (a link there is replaced, not followed). With ``root`` (a folder
    holding ``path``), the folders between them are reached without following
    links and made if missing (``folder_mode``; see :func:`open_folder`), so a
    link planted in place of one of them cannot send the file elsewhere.

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
    if root is None:
        dfd = os.open(folder or ".", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    else:
        dfd = open_folder(root, os.path.relpath(folder, root), mode=folder_mode)
    try:
        tmp = f".{name}{TMP_MARK}{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dfd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: "a writer is alive"
            with os.fdopen(fd, "wb", buffering=0) as f:
                yield f
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            with contextlib.suppress(OSError):
                os.fsync(dfd)
    finally:
        os.close(dfd)


def write_bytes_atomic(
    path: str, data: bytes, *, durable: bool = True, root: str | None = None
) -> None:
    """Write ``data`` to ``path`` atomically (``root``: see :func:`atomic_file`)."""
    with atomic_file(path, durable=durable, root=root) as f:
        f.write(data)
