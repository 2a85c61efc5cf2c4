"""How a :class:`~mlcache.data.CachedDataset` finds its pack or builds it: the
pack's name (code, attributes, source, state), one builder at a time (an
``flock`` here, a lease for a remote folder), what a build learns (module-level
values it changes are state), and the housekeeping after it.

:class:`PackBuilder` is a base of ``CachedDataset``: these are its methods,
kept apart from what a user subclasses and from the reading path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from .._atomic import open_folder, open_regular, write_bytes_atomic
from ..errors import PackCorrupted, warn
from ..keys.code_version import code_version
from ..keys.hashing import hash_value
from ..keys.state import learnable, watched_digests
from ..store.local import mark_cache_folder
from .fetch import publish, remote_lease
from .reader import PackedDataset
from .sources import (
    GRACE_SECONDS,
    DeclaredSource,
    read_state,
    remove_older_versions,
    warn_if_new_every_run,
    write_state,
)
from .workers import refuse_in_bootstrap
from .writer import write_pack

__all__ = ["PackBuilder"]

logger = logging.getLogger("mlcache")


class PackBuilder:
    """The building half of :class:`~mlcache.data.CachedDataset` (see the module
    docstring); ``CachedDataset.__init__`` sets the attributes below."""

    cache_on: ClassVar[tuple[str, ...] | None]
    cache_ignore: ClassVar[tuple[str, ...]]
    pack_path: str
    _root: str
    _folder: str
    _key_names: list[str]
    _args_id: str
    _args_id_full: str
    _source: Any
    _state: frozenset[str]
    _shape: str
    _watched: tuple[tuple[str, Any], ...]
    _allow_pickle: bool
    _remote: tuple[str, dict[str, Any] | None] | None
    _declared: DeclaredSource | None

    def load_source(self) -> Any:
        raise NotImplementedError  # CachedDataset's

    def _open_or_build(
        self, force: bool, progress: bool, damaged: tuple[int, int] | None = None
    ) -> PackedDataset:
        """Open the pack, building it first if it is missing, damaged or ``force``.

        ``damaged`` is the ``file_id`` of a pack found damaged while reading: it is
        rebuilt unless another process already replaced it.
        """
        folder = os.path.dirname(self.pack_path)
        # the pack's folder is reached without following a link planted in place of
        # it (one warning; a real folder is made), so a build never writes elsewhere
        mark_cache_folder(self._root)
        os.makedirs(self._root, mode=0o700, exist_ok=True)
        os.close(open_folder(self._root, os.path.relpath(folder, self._root)))
        lock: Callable[[], contextlib.AbstractContextManager[None]]
        if self._remote is None:
            # a pack found damaged is not looked at before the lock: under it,
            # another process may have replaced it
            look_first, build = damaged is None, self._build_here
            look, lock = self._try_open, self._local_lock
        else:
            look_first, build = True, self._build_and_publish
            look, lock = self._fetch_remote, self._remote_lease
        return self._build_under_lock(look, lock, build, force, progress, damaged, look_first)

    def _build_under_lock(
        self,
        look: Callable[[bool], PackedDataset | None],
        lock: Callable[[], contextlib.AbstractContextManager[None]],
        build: Callable[[bool], PackedDataset],
        force: bool,
        progress: bool,
        damaged: tuple[int, int] | None,
        look_first: bool,
    ) -> PackedDataset:
        """The one open-or-build routine, for a pack here (an ``flock``) and in a
        remote folder (a lease): the pack if ``look(False)`` finds it; else, holding
        ``lock()``, the pack ``look(True)`` finds (another process may have built it
        while this one waited), else ``build(progress)``. A pack whose ``file_id``
        is ``damaged`` counts as not found."""
        if look_first and not force:
            opened = look(False)
            if opened is not None and opened.file_id != damaged:
                return opened
        # before the lock: a spawned child re-running the script must not wait for
        # a lock its parent holds
        refuse_in_bootstrap(type(self))
        with lock():
            if not force:
                opened = look(True)
                if opened is not None and opened.file_id != damaged:
                    return opened
            return build(progress)

    @contextlib.contextmanager
    def _local_lock(self) -> Iterator[None]:
        """One builder of the pack at a time on this machine: an ``flock`` on
        ``<pack>.lock``. A lock held by a killed process is released by the kernel,
        so it can never block for ever."""
        lock_fd = open_regular(self.pack_path + ".lock", os.O_RDWR | os.O_CREAT)
        with open(lock_fd, "r+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _build_here(self, progress: bool) -> PackedDataset:
        built = self._build(progress)
        self._after_build()
        return built

    def _key_attributes(self) -> list[str]:
        """The names of the attributes that make the key: ``cache_on`` (or every
        attribute set so far), less ``cache_ignore``."""
        cls = type(self)
        for what in ("cache_on", "cache_ignore"):
            names = getattr(cls, what)
            if names is None and what == "cache_on":
                continue
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise TypeError(
                    f"{cls.__qualname__}.{what} must be a tuple of attribute names, got {names!r}"
                )
        ignored = set(cls.cache_ignore)
        names = cls.cache_on if cls.cache_on is not None else sorted(vars(self))
        return [n for n in names if n not in ignored]

    def _name_pack(self) -> str:
        """The pack's path for the code, attributes and source as they are now:
        ``<folder of the class>/<attributes>-<version>.pack``."""
        cls = type(self)
        code = code_version(cls, state=self._state)
        #: mutable module-level values the code reads: by their content now (the
        #: walk is cached per process; a notebook may have changed one since)
        self._watched: tuple[tuple[str, Any], ...] = code.watched
        version = hash_value(
            (
                f"{cls.__module__}.{cls.__qualname__}",
                code.digest,
                self._args_id_full,
                self._source,
                {k: v for k, v in watched_digests(code.watched).items() if k not in self._state},
            )
        )
        # a rebuild removes the older versions of the same attributes (after a
        # while), and packs of other attributes once unused for long
        return os.path.join(self._folder, f"{self._args_id}-{version[:16]}.pack")

    def _build(self, progress: bool) -> PackedDataset:
        """Build the pack; a module-level value the build changed (a memo the
        loading code fills) is state from now on, and the pack is named for it."""
        logger.info("mlcache: building %s", self.pack_path)
        before = watched_digests(self._watched)
        built = write_pack(
            self.load_source(),
            self.pack_path,
            progress=progress,
            allow_pickle=self._allow_pickle,
            desc=type(self).__qualname__,  # not the pack's hash name
        )
        after = watched_digests(self._watched)
        # as for functions: a dict's key or an object's attribute the build writes,
        # or an accumulator, is state; the keys it only reads stay input, and an
        # object that changes whole (a generator) keeps counting
        changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
        changed &= learnable(self._watched, expanded=False)
        if not changed:
            return built
        logger.info(
            "mlcache: building %s changes %s: state, not input; left out of its key from now on",
            type(self).__qualname__,
            ", ".join(sorted(changed)),
        )
        self._state = read_state(self._folder, self._shape) | self._state | changed
        named = self._name_pack()
        if named != self.pack_path:  # first: a process told the state finds the pack
            os.replace(self.pack_path, named)
        write_state(self._root, self._folder, self._shape, self._state)
        if named == self.pack_path:
            return built
        self.pack_path = named
        return PackedDataset(named, allow_pickle=self._allow_pickle)

    def _after_build(self) -> None:
        """Housekeeping after a local build (never fails it): record the digests
        of the attributes, say if one is new at every run, remove unused packs."""
        try:
            mine = {n: hash_value(getattr(self, n))[:16] for n in self._key_names}
            write_bytes_atomic(
                os.path.join(self._folder, f".{self._args_id}.args"),
                json.dumps({"attrs": mine, "pid": os.getpid()}).encode(),
                durable=False,
                root=self._root,
            )
            warn_if_new_every_run(type(self), self._folder, self._args_id, mine)
        except Exception as exc:  # housekeeping: never fail the build for it
            logger.debug("mlcache: could not record the attributes of %s: %s", self.pack_path, exc)
        remove_older_versions(self.pack_path, self._args_id)

    def _remote_name(self) -> str:
        """The pack's name under the remote folder."""
        folder, name = os.path.split(self.pack_path)
        return f"{os.path.basename(folder)}/{name}"

    def _fetch_remote(self, again: bool) -> PackedDataset | None:
        """The pack in the remote folder, through this machine's copy, or None."""
        assert self._remote is not None
        root, options = self._remote
        try:
            return PackedDataset(
                f"{root}/{self._remote_name()}",
                allow_pickle=self._allow_pickle,
                storage_options=options,
                local_cache_dir=os.path.dirname(self.pack_path),
            )
        except FileNotFoundError:
            return None
        except PackCorrupted as exc:
            warn(f"mlcache: {exc}; rebuilding it", stacklevel=5)
            return None

    def _remote_lease(self) -> contextlib.AbstractContextManager[None]:
        """One builder of the pack among every machine (see :func:`fetch.remote_lease`)."""
        assert self._remote is not None
        leases = os.path.join(os.path.dirname(self.pack_path), ".leases")
        return remote_lease(*self._remote, self._remote_name(), leases)

    def _build_and_publish(self, progress: bool) -> PackedDataset:
        """Build the pack here, then upload it to the remote folder."""
        assert self._remote is not None
        root, options = self._remote
        built = self._build(progress)
        publish(self.pack_path, f"{root}/{self._remote_name()}", options)
        return built

    def _try_open(self, again: bool) -> PackedDataset | None:
        """The pack here, or None (missing, or damaged: a warning). ``again``, under
        the build lock: first learn what another process's build learned changes
        (its state), which renames the pack."""
        if again:
            learned = read_state(self._folder, self._shape)
            if learned != self._state:
                self._state = learned
                self.pack_path = self._name_pack()
        try:
            opened = PackedDataset(self.pack_path, allow_pickle=self._allow_pickle)
            if time.time() - os.stat(self.pack_path).st_mtime > GRACE_SECONDS:
                # in use: a rebuild of another version leaves it alone a while, and
                # `mlcache prune --older-than` sees its use even where atime is off
                with contextlib.suppress(OSError):
                    os.utime(self.pack_path, follow_symlinks=False)
            return opened
        except FileNotFoundError:
            return None
        except PackCorrupted as exc:
            warn(f"mlcache: {exc}; rebuilding it", stacklevel=5)
            return None
