"""The local-directory store (the default): one file per entry, published by rename.

Nothing outside the cache folder is ever written or removed through it: every
file is opened, and every folder below the cache's root reached, without
following a symbolic link (:func:`mlcache._atomic.open_folder`,
:func:`mlcache._atomic.open_regular`). A link planted where the cache keeps a
file or a folder is damaged: one warning, and it is removed (the link, not what
it points to) and made anew, or passed over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, TypeVar

from .._atomic import (
    TMP_MARK,
    atomic_file,
    is_temporary,
    open_folder,
    open_regular,
    remove_if_dead,
    remove_tree,
)
from .._util import backoff
from ..errors import EntryNotFound, StoreError, warn
from . import EntryStat, SharedCounter, check_name
from .keylocks import KEYS_FILE, LOCK_SUFFIX, hold_key

__all__ = ["MARKER", "SUBFOLDER", "LocalStore", "cache_folder", "mark_cache_folder"]

_GITIGNORE = "# created by mlcache: this folder is a cache, never commit it\n*\n"
#: the file that marks a folder as an mlcache cache: a cache directory tag
#: (https://bford.info/cachedir/), so that backup tools leave the folder out too
MARKER = "CACHEDIR.TAG"
_MARKER_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by mlcache: this folder is a cache\n"
    "# (everything in it can be computed again). See https://bford.info/cachedir/\n"
)
#: where the cache goes inside a location that holds a user's files (joblib: "joblib")
SUBFOLDER = "mlcache"
#: what an older mlcache (before the marker) keeps at the top of a cache folder:
#: function folders and pack folders (slugs: text, "-", 8 hex digits), the
#: folders of the default location's packs and local copies
_SLUG = re.compile(r"[^.].*-[0-9a-f]{8}")
_OWN_FOLDERS = frozenset({"datasets", "remote-datasets", "remote-packs", "remote"})
#: marks a folder being removed (renamed first, then deleted)
TOMB_MARK = ".removing-"
_COUNTER = struct.Struct("<qd")  # value, time it was set
logger = logging.getLogger("mlcache")
_T = TypeVar("_T")
#: one thread at a time per counter file in this process (the file lock is per process)
_COUNTER_LOCKS: dict[str, threading.Lock] = {}
_COUNTER_LOCKS_GUARD = threading.Lock()


#: errors that say a disk or quota has no room left: transient, not a bad location
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


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
        A folder this user cannot write (a read-only mount, a team's shared
        cache) is opened read-only: see :attr:`read_only`. Removed while in use,
        it is made again (marked) by the next write, lock or counter.
    durable:
        fsync each entry and its folder before publishing, so that a result
        survives a power cut (default False: a write torn or lost by one is caught
        by the entry's checksum, a miss and never a wrong value, and the fsyncs
        were most of a small miss's time).
    mode:
        Permission bits for the folders mlcache creates (default 0o700: only the
        owner can read cached values).
    """

    def __init__(
        self, location: str | os.PathLike[str], *, durable: bool = False, mode: int = 0o700
    ) -> None:
        root = cache_folder(location)
        self.location = root
        #: the folder whose files are the entries (:class:`~mlcache.store.LocalFolders`)
        self.local_root = root
        self.durable = durable
        self.mode = mode
        #: True when nothing can be written here (a read-only file system, or a
        #: folder of someone else's): entries are read, and every write, lock or
        #: counter raises ``StoreError`` (an ``OSError``) at once
        self.read_only = False
        #: the folder could not be made or marked for want of room (a full disk,
        #: a quota): each write says so, and the first to succeed marks it
        self._unmarked = False
        try:
            os.makedirs(root, mode=mode, exist_ok=True)
        except OSError as exc:
            if exc.errno == errno.EROFS and not os.path.exists(root):
                # on a read-only mount: a cache with nothing in it, that stores nothing
                self.read_only = True
                return
            if exc.errno in _NO_ROOM:  # not the user's mistake: made at the next write
                self._unmarked = True
                return
            if os.path.lexists(root) and not os.path.isdir(root):  # not "File exists"
                raise StoreError(f"the cache location {root!r} exists and is not a folder") from exc
            raise StoreError(f"cannot create the cache folder {root!r}: {exc.strerror}") from exc
        if not os.path.isdir(root):
            raise StoreError(f"the cache location {root!r} exists and is not a folder")
        if not os.access(root, os.W_OK | os.X_OK):
            self.read_only = True
            return
        try:
            _write_marker(root)  # first: a folder with our .gitignore is one we made
            _write_gitignore(root)
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                self.read_only = True  # allowed by the mode bits, refused all the same
                return
            if exc.errno in _NO_ROOM:  # a full disk must not stop the script at import
                self._unmarked = True
                return
            raise StoreError(f"cannot write in the cache folder {root!r}: {exc.strerror}") from exc

    def _remaking(self, make: Callable[[], _T]) -> _T:
        """``make()``, once more after making the cache folder again when it failed
        because the folder was removed (see :meth:`_make_again`)."""
        try:
            return make()
        except FileNotFoundError:
            if not self._make_again():
                raise
            return make()

    def _make_again(self) -> bool:
        """Make the cache folder again, marked, when it was removed while this store
        was in use (``rm -rf cache/`` beside a notebook holding a ``Memory``), as
        joblib does at its next write; return whether it was missing. What lives
        below it (function folders, counters, locks, statistics) is made as each
        is next written, as for a new cache."""
        if os.path.isdir(self.location):
            return False  # there: what was missing is something else, said by the caller
        try:
            os.makedirs(self.location, mode=self.mode, exist_ok=True)
            _write_marker(self.location)
            _write_gitignore(self.location)
        except OSError as exc:
            raise StoreError(
                exc.errno,
                f"the cache folder {self.location} was removed and cannot be made "
                f"again ({exc.strerror})",
            ) from exc
        logger.info("mlcache: the cache folder %s was removed; made it again", self.location)
        return True

    def _refuse(self) -> None:
        """Raise for a write to a read-only store."""
        raise StoreError(errno.EROFS, f"the cache folder {self.location} is read-only")

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.location, self.durable, self.mode))

    def local_path(self, name: str) -> str:
        return os.path.join(self.location, check_name(name))

    def open(self, name: str) -> BinaryIO:
        """Open entry ``name`` for reading; a link in its place is not followed (a
        damaged entry: one warning, and it is missing)."""
        folder, base = os.path.split(check_name(name))
        try:
            dfd = open_folder(self.location, folder, create=False)
            try:
                fd = open_regular(
                    base, os.O_RDONLY, dir_fd=dfd, shown=os.path.join(self.location, name)
                )
            finally:
                os.close(dfd)
        except (FileNotFoundError, NotADirectoryError):
            raise EntryNotFound(name) from None
        return os.fdopen(fd, "rb")

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = os.path.join(self.location, check_name(name))
        if self.read_only:
            self._refuse()
        if self._unmarked:  # room again, maybe: mark it first (else this write says why)
            with contextlib.suppress(OSError):
                os.makedirs(self.location, mode=self.mode, exist_ok=True)
                _write_marker(self.location)
                _write_gitignore(self.location)
                self._unmarked = False
        with contextlib.ExitStack() as stack:
            yield self._remaking(
                lambda: stack.enter_context(
                    atomic_file(
                        path, durable=self.durable, root=self.location, folder_mode=self.mode
                    )
                )
            )

    def exists(self, name: str) -> bool:
        """Whether ``name`` is an entry (or a folder) here; a link is not one."""
        folder, base = os.path.split(check_name(name))
        try:
            dfd = open_folder(self.location, folder, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            mode = os.stat(base, dir_fd=dfd, follow_symlinks=False).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return False
        finally:
            os.close(dfd)
        return stat.S_ISREG(mode) or stat.S_ISDIR(mode)

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Hold the lock of entry ``name`` for the block: one process (or thread)
        computes a key while the others wait. Yields False when the lock could not
        be had within ``timeout`` seconds (the caller then goes on unlocked).

        The kernel releases the lock when its holder dies, even by SIGKILL: a dead
        holder never blocks anyone (see :mod:`mlcache.store.keylocks`).
        """
        folder, base = os.path.split(check_name(name))
        if self.read_only:  # nothing is computed into it: no one to wait for
            self._refuse()
        dfd = self._remaking(lambda: open_folder(self.location, folder, mode=self.mode))
        try:
            with hold_key(dfd, base, os.path.join(self.location, folder), timeout) as held:
                yield held
        finally:
            os.close(dfd)

    def delete(self, name: str) -> bool:
        """Remove entry or folder ``name``. Nothing is followed: a link is removed
        itself, and a folder reached through a link is not removed at all."""
        parent, base = os.path.split(check_name(name))
        try:
            dfd = open_folder(self.location, parent, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            try:
                os.unlink(base, dir_fd=dfd)  # an entry (or a link)
                return True
            except FileNotFoundError:
                return False
            except (IsADirectoryError, PermissionError):  # EISDIR, or EPERM on macOS
                st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise
            # a folder: move it out of the way in one rename, then remove it at
            # leisure. Writers racing with us fail cleanly (and warn) instead of
            # making rmtree fail halfway; readers holding memory maps keep them.
            tomb = f".{base}{TOMB_MARK}{secrets.token_hex(6)}"
            try:
                os.rename(base, tomb, src_dir_fd=dfd, dst_dir_fd=dfd)
            except FileNotFoundError:
                return False
            remove_tree(tomb, dfd)
            return True
        finally:
            os.close(dfd)

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        """Entries under ``prefix``. Skipped: hidden files and folders (``.gitignore``,
        temporaries, removed folders, a Finder's ``.DS_Store``), the cache's marker
        (:data:`MARKER`), names that are not valid entry names, and folders this
        user cannot read (logged)."""
        # folders are reached without following links (a link to a folder is
        # listed as a name, never walked into), each opened afresh from the root
        stack = [check_name(prefix) if prefix else ""]
        while stack:
            folder = stack.pop()
            try:
                fd = open_folder(self.location, folder, create=False)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except PermissionError as exc:
                shown = os.path.join(self.location, folder)
                warn(f"mlcache: cannot list {shown} ({exc.strerror}); skipped", stacklevel=3)
                continue
            try:
                found = []
                with os.scandir(fd) as it:
                    for e in it:
                        if e.name.startswith("."):
                            self._sweep(e, fd)
                            continue
                        if not folder and e.name == MARKER:
                            continue  # the cache's own, as its .gitignore
                        try:
                            if e.is_dir(follow_symlinks=False):
                                stack.append(f"{folder}/{e.name}" if folder else e.name)
                                continue
                            st = e.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # removed meanwhile
                        found.append((e.name, st))
            except PermissionError as exc:
                shown = os.path.join(self.location, folder)
                warn(f"mlcache: cannot list {shown} ({exc.strerror}); skipped", stacklevel=3)
                continue
            finally:
                os.close(fd)
            for base, st in found:
                rel = f"{folder}/{base}" if folder else base
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
        if self.read_only:
            self._refuse()
        with _counter_lock(path):
            fd = self._remaking(lambda: open_regular(path, os.O_RDWR | os.O_CREAT))
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
    def _sweep(e: os.DirEntry[str], dir_fd: int) -> None:
        """Remove what a crashed writer or an interrupted removal left behind (in
        the folder ``dir_fd``; links are removed themselves, never followed)."""
        if TOMB_MARK in e.name:
            if e.is_dir(follow_symlinks=False):
                remove_tree(e.name, dir_fd)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(e.name, dir_fd=dir_fd)
        elif e.name == KEYS_FILE:
            pass  # record locks, never an flock: in use or not, it stays
        elif is_temporary(e.name) or e.name.endswith(LOCK_SUFFIX):
            # a key lock left by a killed holder goes too: a waiter that opened it
            # meanwhile sees another inode and locks a new one (see _lock_file)
            remove_if_dead(e.name, dir_fd=dir_fd)

    def touch(self, names: Iterable[str]) -> None:
        # last use is the file's mtime: atime is unreliable (noatime, relatime);
        # never through a link, whose target may be anything of the user's
        if self.read_only:
            return
        now = time.time()
        by_folder: dict[str, list[str]] = {}
        for name in names:
            folder, base = os.path.split(check_name(name))
            by_folder.setdefault(folder, []).append(base)
        for folder, bases in by_folder.items():
            try:
                dfd = open_folder(self.location, folder, create=False)
            except OSError:
                continue
            try:
                for base in bases:
                    with contextlib.suppress(OSError):
                        os.utime(base, (now, now), dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)


def _lockf(fd: int, timeout: float) -> bool:
    """Take a POSIX write lock on ``fd`` within ``timeout`` seconds (polled every
    millisecond, doubling up to 50 ms)."""
    for _ in backoff(timeout, first=0.001, most=0.05, factor=2.0):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pass
    return False


def cache_folder(location: str | os.PathLike[str]) -> str:
    """The folder that holds the cache at ``location`` (absolute): ``location``
    itself, or its subfolder ``mlcache`` when it holds a user's files.

    A location never takes over a user's folder: ``Memory(".")`` in a repository
    root must not write a ``.gitignore`` of ``*`` there (hiding the project from
    git), nor let ``clear`` take a user's folders for cache folders. The rule
    reads only what is there, so every run, and every process, decides alike:

    - ``location`` is a cache already (it holds mlcache's marker,
      :data:`MARKER`, or only what an older mlcache wrote: its ``.gitignore``,
      hidden counters and locks, function and pack folders): itself;
    - it does not exist yet, or is empty: itself (it becomes a cache, marked);
    - anything else (a file or folder mlcache did not write): ``<location>/mlcache``.

    Both the function cache (:class:`~mlcache.Memory`) and the dataset cache
    (``CachedDataset(cache_dir=...)``, :func:`mlcache.default_location`) use it.
    ``""`` names no folder and is refused (``ValueError``).

    Examples
    --------
    >>> import tempfile, os
    >>> project = tempfile.mkdtemp()
    >>> cache_folder(project) == project  # empty: the cache itself
    True
    >>> _ = open(os.path.join(project, "train.py"), "w").write("...")
    >>> os.path.basename(cache_folder(project))
    'mlcache'
    """
    path = os.fspath(location)
    if not isinstance(path, str):
        raise TypeError(f"a cache location must be a str or os.PathLike, got {location!r}")
    if not path:
        raise ValueError(
            "the cache location is an empty string, which names no folder; give a folder "
            "(Memory('.') keeps the cache in ./mlcache when the current folder holds other "
            "files) or None to turn caching off"
        )
    root = os.path.abspath(path)
    return root if _is_cache(root) else os.path.join(root, SUBFOLDER)


def _is_cache(root: str) -> bool:
    """Whether the folder ``root`` is, or can become, a cache of its own (see
    :func:`cache_folder`)."""
    if _has_marker(root):
        return True
    try:
        found = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return True  # new; or not a folder, or unreadable: the store says so itself
    return all(_written_by_mlcache(root, e) for e in found)


def _has_marker(root: str) -> bool:
    """``root`` holds mlcache's marker (another tool's cache tag is not ours)."""
    try:  # a link planted in its place is removed (it is nothing of ours)
        fd = open_regular(os.path.join(root, MARKER), os.O_RDONLY, remove=True)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return b"created by mlcache" in f.read(512)


def _written_by_mlcache(root: str, e: os.DirEntry[str]) -> bool:
    """The name ``e`` at the top of ``root`` is one mlcache writes there."""
    name = e.name
    try:
        if e.is_symlink():
            # a link planted at a name of ours is damage the store repairs (one
            # warning, the link replaced), not a sign of a user's folder: else one
            # planted link would move the whole cache to ./mlcache
            return name in (MARKER, ".gitignore") or (
                name.startswith(".") and name.endswith((".counter", LOCK_SUFFIX))
            )
        if name == MARKER:  # put there since _is_cache looked for it: read it again
            return _has_marker(root)
        if name == ".gitignore":
            with open(e.path, "rb") as f:
                return f.read(64).startswith(b"# created by mlcache")
        if name.startswith("."):
            return (
                name.endswith((".counter", LOCK_SUFFIX)) or is_temporary(name) or TOMB_MARK in name
            )
        return e.is_dir() and (name in _OWN_FOLDERS or _SLUG.fullmatch(name) is not None)
    except OSError:
        return False


def mark_cache_folder(root: str) -> None:
    """Make ``root`` (a folder :func:`cache_folder` chose) and mark it as a cache:
    the marker, and a ``.gitignore`` so that it is never committed. Best effort:
    a folder that cannot be written (read-only) is left as it is."""
    with contextlib.suppress(OSError):
        os.makedirs(root, mode=0o700, exist_ok=True)
        _write_marker(root)
        _write_gitignore(root)


def _write_marker(root: str) -> None:
    """Mark ``root`` as an mlcache cache (:data:`MARKER`), unless it is marked."""
    _create_whole(root, MARKER, _MARKER_TEXT)


def _write_gitignore(root: str) -> None:
    """Add the ``.gitignore`` that keeps the cache folder ``root`` out of git, unless
    one is there (ours, or the user's: left as it is)."""
    _create_whole(root, ".gitignore", _GITIGNORE)


def _create_whole(root: str, name: str, text: str) -> None:
    """Create ``root/name`` holding ``text``, unless it exists, so that no one ever
    sees it empty or half written: written aside, then hard-linked into place (a
    link fails if the name exists). Another process deciding what ``root`` is
    (:func:`cache_folder`) meanwhile must find the marker whole, or not at all."""
    path = os.path.join(root, name)
    if os.path.lexists(path):
        if not os.path.islink(path):
            return
        with contextlib.suppress(OSError):  # a planted link: warned, removed
            os.close(open_regular(path, os.O_RDONLY, remove=True))
    tmp = os.path.join(root, f".{name}{TMP_MARK}{secrets.token_hex(6)}")
    fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _rebuild(location: str, durable: bool, mode: int) -> LocalStore:
    return LocalStore(location, durable=durable, mode=mode)


def default_location() -> str:
    """The default cache folder (absolute): ``$MLCACHE_DIR``, else the platform's
    per-user cache folder plus ``mlcache``; its ``mlcache`` subfolder when that
    folder holds a user's files (see :func:`mlcache.store.local.cache_folder`).
    Function results and dataset packs (``datasets/``) both live there."""
    env = os.environ.get("MLCACHE_DIR")
    if env:
        return cache_folder(os.path.expanduser(env))
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
        return cache_folder(os.path.join(base, "mlcache", "Cache"))
    if sys.platform == "darwin":
        return cache_folder(os.path.expanduser("~/Library/Caches/mlcache"))
    return cache_folder(
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mlcache")
    )
