"""Numbered leases on an fsspec file system: one holder per key across machines.

A lease on key ``k`` is a small object ``<k>.lease.<n>`` holding its owner and
its expiry (JSON), made by a conditional create (``If-None-Match: *``, fsspec's
``mode="create"``; on a local file system, a file written aside and hard-linked
into place, which fails if the name exists). The holder is the highest number:

* to take a key, a waiter creates ``n + 1`` once lease ``n`` has expired (or
  ``1`` when there is none); only one waiter can create a given number;
* the holder renews its own object by a heartbeat every third of the lease's
  duration, and stops when a higher number exists (it was taken over after it
  stopped beating for too long);
* the holder removes its lease when done; the one that took over an expired
  lease removes the expired ones.

So two holders never overlap, short of a holder that stops beating for longer
than the lease lasts. Waiters poll with backoff (:func:`mlcache._util.backoff`).

>>> import fsspec
>>> leases = Leases(fsspec.filesystem("memory"), seconds=60.0)
>>> with leases.hold("/doc-leases/f/v/k.lease", timeout=1.0) as held:
...     held
True
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._atomic import temporary_folder, write_bytes_atomic
from .._util import backoff

__all__ = ["LEASE", "Leases", "new_owner"]

logger = logging.getLogger("mlcache")
#: what a key's lease objects are named after: ``<key>.lease.<n>``
LEASE = ".lease"


def new_owner() -> str:
    """A lease owner unique to this call: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Leases:
    """The numbered leases of keys on the file system ``fs`` (see the module docstring).

    Parameters
    ----------
    fs:
        An fsspec file system.
    seconds:
        How long a lease lasts without its holder's heartbeat (read at each use:
        it can be changed on a live object).
    local:
        ``fs`` is the local file system: leases are made with ``os.link`` and
        renewed with a rename (a PUT replaces an object whole elsewhere).
    """

    def __init__(self, fs: Any, *, seconds: float = 60.0, local: bool = False) -> None:
        self.fs = fs
        self.seconds = float(seconds)
        self.local = local

    @contextlib.contextmanager
    def hold(self, base: str, timeout: float) -> Iterator[bool]:
        """Hold the lease ``base`` (a path: ``<key path>.lease``) for the block; yields
        False when it could not be had within ``timeout`` seconds. Errors of the
        file system (read-only credentials...) propagate."""
        owner = new_owner()
        mine = self.acquire(base, owner, timeout)
        if mine is None:
            yield False
            return
        with self.keep(base, mine, owner):
            yield True

    @contextlib.contextmanager
    def keep(self, base: str, mine: str, owner: str) -> Iterator[None]:
        """For the block, renew the lease ``mine`` (of ``base``, made for ``owner`` by
        :meth:`acquire`) by a heartbeat; remove it after."""
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat,
            args=(base, mine, owner, stop),
            daemon=True,
            name="mlcache-lease",
        )
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
            with contextlib.suppress(Exception):
                self.fs.rm(mine)

    def body(self, owner: str) -> bytes:
        """A lease's content: its owner and when it expires (epoch seconds)."""
        return json.dumps({"owner": owner, "expires": time.time() + self.seconds}).encode()

    def numbers(self, base: str) -> tuple[int, ...]:
        """The numbers of the leases of ``base`` that exist, in order."""
        self.fs.invalidate_cache(self.fs._parent(base))
        found = []
        for path in self.fs.glob(base + ".*"):
            with contextlib.suppress(ValueError):
                found.append(int(path.rpartition(".")[2]))
        return tuple(sorted(found))

    def create(self, path: str, body: bytes) -> bool:
        """Create ``path`` holding ``body`` only if it does not exist; False if it does."""
        if self.local:
            # written aside (in a locked scratch folder, removed after), then linked
            # to the name, which fails if the name exists: a reader never sees a
            # lease empty, which would read as expired
            local = self.fs._strip_protocol(path)
            folder = os.path.dirname(local)
            os.makedirs(folder, exist_ok=True)
            with temporary_folder(folder, "lease") as scratch:
                aside = os.path.join(scratch, "lease")
                write_bytes_atomic(aside, body, durable=False)
                try:
                    os.link(aside, local)
                except FileExistsError:
                    return False
            return True
        try:
            self.fs.pipe_file(path, body, mode="create")  # If-None-Match: *
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if "condition" in str(exc).lower():  # 412 Precondition Failed
                return False
            raise

    def renew(self, path: str, body: bytes) -> None:
        """Replace the lease ``path`` whole (a reader never sees it half written)."""
        if self.local:
            write_bytes_atomic(self.fs._strip_protocol(path), body, durable=False)
        else:
            self.fs.pipe_file(path, body)  # a PUT replaces an object whole

    def acquire(self, base: str, owner: str, timeout: float) -> str | None:
        """The path of the lease of ``base`` made for ``owner``, or None when another
        holder kept it for ``timeout`` seconds (polled every 50 ms, growing by half
        up to 1 s)."""
        for _ in backoff(timeout, first=0.05, most=1.0, factor=1.5):
            mine = self._take(base, owner)
            if mine is not None:
                return mine
        return None

    def _take(self, base: str, owner: str) -> str | None:
        """One look: the lease made for ``owner`` when there was none or it had
        expired, None when a live holder has it."""
        while True:
            numbers = self.numbers(base)
            top = numbers[-1] if numbers else 0
            expires = self.expires(f"{base}.{top}") if numbers else 0.0
            if expires is None:
                time.sleep(0.01)  # released while we looked: look again
                continue
            if expires >= time.time():
                return None
            mine = f"{base}.{top + 1}"
            if not self.create(mine, self.body(owner)):
                continue  # another waiter took it first: look again
            # a listing is not a snapshot: it can miss a lease made or removed
            # while it ran, and then our number is not the highest. The holder is
            # the highest number: if ours is not, give way.
            if any(n > top + 1 for n in self.numbers(base)):
                with contextlib.suppress(Exception):
                    self.fs.rm(mine)
                continue
            for n in numbers:  # the expired ones
                with contextlib.suppress(Exception):
                    self.fs.rm(f"{base}.{n}")
            return mine

    def expires(self, lease: str) -> float | None:
        """When ``lease`` expires (0 for garbage), or None if it is gone."""
        try:
            data = json.loads(self.fs.cat_file(lease))
        except FileNotFoundError:
            return None  # released meanwhile
        except ValueError:
            return 0.0  # garbage: expired
        if not isinstance(data, dict):
            return 0.0
        try:
            return float(data.get("expires", 0.0))
        except (TypeError, ValueError):
            return 0.0

    def _heartbeat(self, base: str, mine: str, owner: str, stop: threading.Event) -> None:
        number = int(mine.rpartition(".")[2])
        while not stop.wait(self.seconds / 3):
            try:
                if any(n > number for n in self.numbers(base)):
                    return  # taken over (we stopped beating too long): stop renewing
                self.renew(mine, self.body(owner))  # our own object only
            except Exception as exc:  # the next beat tries again
                logger.debug("mlcache: lease heartbeat failed: %s", exc)
