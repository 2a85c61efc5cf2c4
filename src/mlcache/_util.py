"""Base utilities every layer may use: byte sizes and durations as users write
them, safe folder names (:func:`slug`), waiting with backoff, progress bars, and
the threads that hash and check large buffers on all cores.

Nothing here imports another mlcache module except :mod:`mlcache.errors`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as _dt
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

import xxhash

from .errors import ConfigError

__all__ = [
    "KEEPS_TIMES",
    "backoff",
    "fs_type",
    "hash_pool",
    "parallel_map",
    "parse_bytes",
    "parse_duration",
    "progress",
    "sets_times",
    "slug",
]

_T = TypeVar("_T")

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_bytes(value: int | str | None) -> int | None:
    """``10_000``, ``"10K"``, ``"1.5GB"``, ``"2GiB"`` -> bytes (powers of 1024, as joblib)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"a byte size must be an int or a string like '10GB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"a byte size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _BYTES.match(value)
        if m:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(f"a byte size must be an int or a string like '10GB', got {value!r}")


def parse_duration(value: _dt.timedelta | str | float | None) -> float | None:
    """A timedelta, seconds, or ``"7d"``/``"12h"``/``"30m"``/``"10s"`` -> seconds."""
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.match(r"^\s*\d+(\.\d+)?\s*[smhdw]?\s*$", value):
        v = value.strip()
        unit = v[-1] if v[-1].isalpha() else "s"
        number = v[:-1] if v[-1].isalpha() else v
        seconds = float(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    else:
        raise ConfigError(f"a duration must be a timedelta, seconds or like '7d', got {value!r}")
    if not seconds >= 0:  # also nan
        raise ConfigError(f"a duration cannot be negative or nan, got {value!r}")
    return seconds


def backoff(
    timeout: float, first: float = 0.001, most: float = 0.05, factor: float = 2.0
) -> Iterator[int]:
    """Attempts of a retry loop: yields 0, 1, 2, ... and sleeps between them, from
    ``first`` seconds growing by ``factor`` up to ``most``, until ``timeout``
    seconds have passed since the first attempt; then it stops (the caller's
    ``for`` loop ends: give up there).

    >>> for attempt in backoff(0.1):  # doctest: +SKIP
    ...     if try_once():
    ...         break
    ... else:
    ...     give_up()
    """
    deadline = time.monotonic() + timeout
    delay = first
    attempt = 0
    while True:
        yield attempt
        attempt += 1
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(delay, left))
        delay = min(delay * factor, most)


def progress(
    iterable: Iterable[_T],
    desc: str,
    *,
    total: int | None = None,
    unit: str = " items",
    enabled: bool = True,
    leave: bool = True,
) -> Iterable[_T]:
    """``iterable`` with a progress bar (tqdm, when it is installed, ``enabled`` and
    the output is a terminal: ``disable=None``), else ``iterable`` itself."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    if total is None and isinstance(iterable, Sized):
        total = len(iterable)
    bar: Any = tqdm(
        iterable, desc=desc, total=total, unit=unit, mininterval=0.5, leave=leave, disable=None
    )
    return bar


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(name: str, *, max_len: int = 80) -> str:
    """A readable, safe folder name for ``name``: sanitised text plus a short hash.

    The result never contains a path separator or starts with a dot, so it can
    never leave the folder it is joined to.
    """
    clean = _UNSAFE.sub("_", name).strip(".-")[:max_len] or "x"
    return f"{clean}-{xxhash.xxh3_64_hexdigest(name.encode('utf-8', 'surrogatepass'))[:8]}"


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def hash_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """Threads for hashing blocks (xxhash releases the GIL); None on one core."""
    global _pool
    workers = min(os.cpu_count() or 1, 8)
    if workers < 2:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="mlcache-hash"
            )
        return _pool


def _forget_pool() -> None:  # a forked child inherits neither the threads nor a free lock
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def parallel_map(func: Callable[[memoryview], Any], blocks: list[memoryview]) -> list[Any]:
    """``[func(b) for b in blocks]``, run on the hashing threads (all cores) when
    there are several blocks; ``func`` should release the GIL, as xxhash's do.
    The entry reader checks large payloads' block tables with it."""
    pool = hash_pool() if len(blocks) > 1 else None
    return list(pool.map(func, blocks)) if pool else [func(b) for b in blocks]


# -- file systems -------------------------------------------------------------------
#: file systems whose files' and folders' modification and change times are set by
#: this machine's kernel at each change (a file's; for a folder, an entry added,
#: removed or renamed); network and FUSE file systems are left out: their times
#: come from elsewhere (NFS: a client's attribute cache), or do not move
KEEPS_TIMES = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "tmpfs",
        "ramfs",
        "f2fs",
        "zfs",
        "overlay",
        "bcachefs",
        "jfs",
        "nilfs2",
        "reiserfs",
    }
)

_FS_TYPES: dict[int, str] = {}


def fs_type(dev: int) -> str:
    """The type of the file system of device ``dev`` (``/proc/self/mountinfo``), or
    "" when it cannot be told (another OS, a device not mounted as such)."""
    found = _FS_TYPES.get(dev)
    if found is not None:
        return found
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split(" - ", 1)
            fields = parts[0].split()
            if len(parts) == 2 and len(fields) > 2 and fields[2] == want:
                found = parts[1].split()[0]
                break
    _FS_TYPES[dev] = found
    return found


def sets_times(dev: int) -> bool:
    """Whether the file system of device ``dev`` is one whose files' times this
    machine's kernel sets at each change, so that a ``stat`` shows a change made
    by any process: one on a block device (a local disk: major number not 0), or
    one of :data:`KEEPS_TIMES`. The mount table (~40 µs to read) is read only for
    the others (tmpfs, overlay, NFS, SMB, FUSE...), once per device."""
    if dev not in _FS_TYPES and os.major(dev) != 0:
        return True
    return fs_type(dev) in KEEPS_TIMES
