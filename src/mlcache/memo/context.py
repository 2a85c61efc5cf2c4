"""What a :class:`~mlcache.Memory` resolves once and hands to every function it
memoizes: :class:`MemoContext`.

A memoized function, a shelved result and the housekeeping around them read
their settings and their helpers from this one frozen object, never from the
``Memory``'s private state. The store's optional powers (:mod:`mlcache.store`'s
Protocols) are resolved here once, with ``isinstance``: a runtime Protocol check
costs microseconds, so it is never made on the hit path.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field
from typing import Any

from .._audit import AuditPolicy
from ..codecs.compression import Compression
from ..entry.signing import Signer
from ..errors import warn, warn_at_user
from ..store import LocalFolders, Locking, ReadOnly, Shared, SharedCounters, Store
from .eviction import SizeGuard
from .usage import UsageLog

__all__ = ["MemoContext", "WriteGate", "store_powers"]

logger = logging.getLogger("mlcache")


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
    Each refusal is said once (not once per call).

    On a :class:`~mlcache.store.Shared` store, writes are also refused (quietly:
    the store said it) while its server cannot be reached, and (with one
    warning) when the store's entries are signed with another key than
    ``key_id`` (the hex id of this process's key, None when it does not sign):
    two keys on one cache would recompute and overwrite each other's entries
    forever. The first write records ``key_id`` as the cache's key when none is.
    """

    def __init__(
        self,
        location: str | None,
        read_only: bool,
        *,
        shared: Shared | None = None,
        key_id: str | None = None,
        key_source: str = "",
    ) -> None:
        self.read_only = read_only
        self._location = location
        self._said = False
        self._shared = shared
        self._key_id = key_id
        self._key_source = key_source
        self._other_key: bool | None = None  # None: not asked yet

    def refuses_writes(self) -> bool:
        """True when nothing can be stored here; the first time, one warning says so."""
        if not self.read_only:
            shared = self._shared
            if shared is None:
                return False
            if not shared.reachable:
                return True  # the store said so once
            if self._other_key is None:
                self._other_key = self._ask_signer(shared)
            return self._other_key
        if not self._said:
            self._said = True
            warn(
                f"mlcache: the cache at {self._location} is read-only: its results are "
                "read, and what is computed is returned without being stored",
                stacklevel=5,
            )
        return True

    def _ask_signer(self, shared: Shared) -> bool:
        """True (with one warning) when the shared cache's entries are signed with
        another key than this process's."""
        try:
            recorded = shared.claim_signer(self._key_id)
        except OSError as exc:  # unreachable (said by the store), or refused
            logger.debug("mlcache: cannot read the signing key of %s: %s", self._location, exc)
            return not shared.reachable
        if recorded is None or recorded == self._key_id:
            return False
        ours = (
            f"key id {self._key_id}, {self._key_source}"
            if self._key_id is not None
            else "signing off: secret=False"
        )
        warn(
            f"mlcache: the shared cache at {self._location} is signed with another key "
            f"(key id {recorded}) than this process's ({ours}): results are computed and "
            "returned without being stored, so as not to overwrite the entries of the "
            "processes that share it. Give every machine the same secret (set "
            "MLCACHE_SECRET, or pass Memory(secret=...)); to change a team's key, set "
            "the new one everywhere and clear the cache once (mlcache clear <url>)",
            stacklevel=5,
        )
        return True

    def clearing(self) -> _Clearing:
        """Around a clear's removals: a cache that became read-only since it was
        opened (remounted, a team's entries of another user) says so once, naming
        the cause, and keeps its results (still valid), as :meth:`cannot_clear`."""
        return _Clearing(str(self._location))

    def forget_signer(self) -> None:
        """After a clear forgot the shared cache's key: the next write records ours."""
        self._other_key = None

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


#: what a file system says when it refuses a removal (read-only, not ours)
_REFUSED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class _Clearing:
    """:meth:`WriteGate.clearing` (a class, not a generator: the warning is shown at
    the user's line, the first frame outside mlcache)."""

    def __init__(self, location: str) -> None:
        self._location = location

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, OSError) or exc.errno not in _REFUSED:
            return False
        warn_at_user(
            f"mlcache: the cache at {self._location} was not cleared ({exc.strerror}: "
            f"{exc.filename or exc}); its results stay"
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
    #: the store seen as :class:`~mlcache.store.Shared` (other machines use it), or None
    shared: Shared | None = None
    #: how its functions check their hits (None: they do not)
    audit: AuditPolicy | None = None
    owner: Any = field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.owner is None:
            raise TypeError("a MemoContext pickles as the Memory that made it; this one has none")
        return (getattr, (self.owner, "context"))
