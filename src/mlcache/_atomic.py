"""The one atomic-write primitive: write to a temporary name, flush, fsync, rename.

A reader sees either the whole previous file, the whole new file, or nothing;
never a partial one. Temporary files are named ``.<name>.tmp-<random>`` in the
destination folder (same file system, so ``os.replace`` is atomic) and are
removed when the write fails; a crash can leave one behind, which
:func:`is_temporary` recognises so that cleaners can remove it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import BinaryIO

TMP_MARK = ".tmp-"


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
