"""What a :class:`~mlcache.Memory` resolves once and hands to every function it
memoizes: :class:`MemoContext`.

A memoized function, a shelved result and the housekeeping around them read
their settings and their helpers from this one frozen object, never from the
``Memory``'s private state. The store's optional powers (:mod:`mlcache.store`'s
Protocols) are resolved here once, with ``isinstance``: a runtime Protocol check
costs microseconds, so it is never made on the hit path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..codecs.compression import Compression
from ..entry.signing import Signer
from ..errors import warn
from ..store import LocalFolders, Locking, ReadOnly, SharedCounters, Store
from .eviction import SizeGuard
from .usage import UsageLog

__all__ = ["MemoContext", "WriteGate", "store_powers"]


def store_powers(
    store: Store,
) -> tuple[LocalFolders | None, Locking | None, SharedCounters | None, bool]:
    """The optional powers of ``store``: (local folders, locking, shared counters,
    read-only), each None (False) when it lacks it. Local copies of a remote
    store's entries (:class:`~mlcache.store.LocalPaths` only) do not count as
    local folders: :mod:`mlcache.entry` reads through them by itself."""
    read_only = isinstance(store, ReadOnly) and store.read_only is True
    # a runtime Protocol check only asks that the name exists: a store holding a
    # ``self.lock = threading.RLock()`` is not Locking; its class must define it
    kind = type(store)
    locking = store if isinstance(store, Locking) else None
    counters = store if isinstance(store, SharedCounters) else None
    return (
        store if isinstance(store, LocalFolders) else None,
        locking if callable(getattr(kind, "lock", None)) else None,
        counters if callable(getattr(kind, "shared_counter", None)) else None,
        read_only,
    )


class WriteGate:
    """Whether a cache takes writes; a read-only one (the local store on a
    read-only mount) serves its hits, and what is computed is returned unstored.
    Each refusal is said once (not once per call)."""

    def __init__(self, location: str | None, read_only: bool) -> None:
        self.read_only = read_only
        self._location = location
        self._said = False

    def refuses_writes(self) -> bool:
        """True when nothing can be stored here; the first time, one warning says so."""
        if not self.read_only:
            return False
        if not self._said:
            self._said = True
            warn(
                f"mlcache: the cache at {self._location} is read-only: its results are "
                "read, and what is computed is returned without being stored",
                stacklevel=5,
            )
        return True

    def cannot_clear(self) -> bool:
        """True (with one warning) when nothing can be removed from the cache: clearing
        a read-only cache never fails a program for that."""
        if not self.read_only:
            return False
        warn(
            f"mlcache: the cache at {self._location} is read-only: nothing was cleared",
            stacklevel=4,
        )
        return True


@dataclass(frozen=True, kw_only=True)
class MemoContext:
    """Everything the functions of one :class:`~mlcache.Memory` share.

    ``local``, ``locking`` and ``counters`` are the store itself seen through the
    matching :mod:`mlcache.store` Protocol (``local``: :class:`~mlcache.store.LocalFolders`,
    its entries are the files under a local folder), or None when it lacks that
    power.
    ``owner`` is the ``Memory`` that made the context: a context pickles as its
    owner (however that pickles: a subclass's own ``__reduce__`` included) and is
    that Memory's context again where it is unpickled.
    """

    store: Store
    #: the location the Memory was given (for messages)
    location: str | None
    signer: Signer | None
    allow_pickle: bool
    compress: Compression | None
    #: the Memory's default ``mmap_mode`` (a function may override it)
    mmap_mode: str | None
    #: which code changes make results stale (``Memory(code=)``)
    code: str
    verbose: int
    bytes_limit: int | None
    usage: UsageLog
    guard: SizeGuard | None
    writes: WriteGate
    local: LocalFolders | None
    locking: Locking | None
    counters: SharedCounters | None
    owner: Any = field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.owner is None:
            raise TypeError("a MemoContext pickles as the Memory that made it; this one has none")
        return (getattr, (self.owner, "context"))
