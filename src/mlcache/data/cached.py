"""``CachedDataset``: write ``load_source()`` once, read a pack ever after.

Subclass it, set your attributes, call ``super().__init__(...)``::

    class PatientSeries(CachedDataset):
        def __init__(self, root, **kw):
            self.root = root
            super().__init__(**kw)

        def source_files(self):
            return sorted(Path(self.root).glob("*.csv"))

        def load_source(self):
            for path in self.source_files():
                yield read_patient(path)

What the pack is keyed by (any change is a rebuild; so is ``force_recache=True``):

- the class: its qualified name and its code version, by the function cache's
  rule (:func:`mlcache.keys.code_version.code_version`): the code of its methods and of the
  user code they reach, and the module-level values that code reads (``cols =
  [1, 2]`` edited to ``[1, 2, 30]`` is a rebuild). A module-level value that a
  build *changes* (a memo its ``load_item`` fills) is state, not input: it is
  compared before and after each build, and once seen changing its name is
  remembered in the class's folder of packs (``.state``) and it counts by type
  only, so the next open does not rebuild;
- the attributes set before ``super().__init__`` (or only those in
  ``cache_on``), less those in ``cache_ignore``, by value
  (:func:`mlcache.keys.hashing.hash_value`, at every open: a large attribute that
  does not change the samples, such as a lookup table or an output folder,
  belongs in ``cache_ignore``);
- the source fingerprint (:meth:`CachedDataset.source_fingerprint`): the paths,
  sizes and modification times of ``source_files()`` and of the items of
  ``source_items()`` that are paths of existing files, the value of the other
  items; or whatever your ``source_fingerprint()`` returns.

Several processes opening the same dataset at once: one builds (holding a lock
on ``<pack>.lock``), the others wait and open its result. A damaged pack is
logged and rebuilt, whether the damage shows when it is opened or when a read
meets a block whose checksum fails.

Building in parallel (``num_workers=``, with ``source_items()`` and
``load_item()``): on Linux the workers are forked, so nothing is run again (no
script without a main guard re-run, no import of the dataset's module while it
is being imported); the dataset reaches each worker once, then only chunks of
items travel. With other threads running (fork would be unsafe) the workers are
spawned when the main script has an ``if __name__ == "__main__":`` guard;
without one the build runs in this process with a warning. A spawned child that
re-runs a script and reaches a build raises a clear error; workers that die make
the build finish in this process: a build never hangs.

Which packs are kept (a pack is ``<folder of the class>/<attributes>-<version>.pack``):
the older versions of the same attributes (code or source changed) go when a
newer one is built, once 10 minutes old; packs of other attributes go when a
pack of the class is built and they have not been opened for
:data:`mlcache.memo.func.OLD_VERSIONS_KEPT_FOR` (30 days, as function results of
an old code version); ``mlcache clear`` removes any. When the last three builds
of a class, by three runs within an hour, each had a new value of the same
attribute (``self.out_dir = mkdtemp()``), a warning names it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import multiprocessing
import os
import re
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import xxhash

from .._atomic import open_folder, open_regular, write_bytes_atomic
from ..errors import PackCorrupted, warn
from ..keys.code_version import code_version, learnable, watched_digests
from ..keys.hashing import hash_value
from ..keys.identity import slug
from ..store.local import cache_folder, default_location, mark_cache_folder
from .fetch import is_url, publish
from .reader import PackedDataset, spawning_worker
from .writer import write_pack

__all__ = ["CachedDataset", "remove_pack"]

logger = logging.getLogger("mlcache")


#: an older version of a pack is removed once it has not been rebuilt for this long
_GRACE_SECONDS = 600.0
#: builds of one class by this many runs, within this many seconds, each with a new
#: value of the same attribute, make a warning naming it (see cache_ignore)
_EVERY_RUN_BUILDS = 3
_EVERY_RUN_WINDOW = 3600.0
_WARNED_EVERY_RUN: set[tuple[type, frozenset[str]]] = set()
#: a parallel build first loads up to this many items (or this many seconds of
#: them) in the building process, and stays there when the rest would take less
#: than _SERIAL_BELOW seconds (2,000 tiny JSON files: 0.25 s serial, 0.37 s in 2
#: forked workers on a 2-core machine)
_PROBE_ITEMS = 32
_PROBE_SECONDS = 0.2
_SERIAL_BELOW = 1.0
#: the file, in a class's folder of packs, naming the module-level values its builds
#: change (state: counted by type, not content)
_STATE_FILE = ".state"


def remove_pack(path: str) -> None:
    """Delete a pack (a reader that has it mapped keeps its map). Its lock file
    stays: a builder may hold it, and a new lock file would let a second build in."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class CachedDataset(Sequence[Any]):
    """A dataset whose samples are loaded once from their source, then read from a pack.

    Parameters
    ----------
    cache_dir:
        Folder of the packs (default: ``<mlcache default location>/datasets``).
        A folder holding files mlcache did not write keeps them in its
        ``mlcache`` subfolder instead (see :func:`mlcache.store.local.cache_folder`).
    force_recache:
        Rebuild the pack even if a valid one exists.
    transform:
        Applied to each sample when it is read (not cached).
    progress:
        Show a progress bar while building.
    allow_pickle:
        Allow fields that need pickle.
    num_workers:
        Load the source with this many processes when the class defines
        ``source_items()`` and ``load_item(item)`` (instead of ``load_source()``);
        samples keep the order of ``source_items()``. Forked on Linux (no main
        guard needed); see the module docstring for when it is spawn or serial.
    storage_options:
        fsspec options when ``cache_dir`` is a URL (``s3://bucket/datasets``):
        then the pack lives there, shared by every machine; each machine reads
        a local copy (fetched once), and one machine builds it while the others
        wait (a lease, as for function results), then upload it.
    """

    #: names of the attributes that identify the data; None means every attribute
    #: set before ``CachedDataset.__init__``
    cache_on: ClassVar[tuple[str, ...] | None] = None
    #: names of attributes that do not change the samples (an output folder, a
    #: logger, a large table only ``load_item`` looks things up in): left out of
    #: the key, so they neither rebuild the pack nor cost a hash at each open
    cache_ignore: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        force_recache: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        progress: bool = True,
        allow_pickle: bool = False,
        num_workers: int = 0,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
        names = self._key_attributes()
        try:
            identity = {name: getattr(self, name) for name in names}
            args_key = hash_value(identity)
        except (AttributeError, TypeError) as exc:
            raise TypeError(
                f"{type(self).__qualname__}: cannot key the dataset by its attributes ({exc}); "
                "set cache_on = ('attr', ...) to the attributes that identify the data, "
                "or cache_ignore = ('attr', ...) to those that do not"
            ) from None
        root = (
            os.fspath(cache_dir)
            if cache_dir is not None
            else os.path.join(default_location(), "datasets")
        )
        #: the remote folder of the packs, when cache_dir is a URL (then root is
        #: this machine's folder of their local copies)
        self._remote: tuple[str, dict[str, Any] | None] | None = None
        if is_url(root):
            self._remote = (root.rstrip("/"), storage_options)
            root = os.path.join(default_location(), "remote-datasets", slug(root))
        elif cache_dir is not None:
            # a folder of the user's files keeps the packs in its mlcache subfolder,
            # as Memory does (the same rule: one function decides both)
            root = cache_folder(root)
        cls = type(self)
        self._key_names = names
        self._args_id, self._args_id_full = args_key[:16], args_key
        self._root = os.path.abspath(root)
        self._folder = os.path.join(self._root, slug(f"{cls.__module__}.{cls.__qualname__}"))
        self._source = self.source_fingerprint()
        # what builds change is recorded by the code's shape (its version with
        # mutable values by type): editing the code learns anew
        self._shape = code_version(cls).shape[:16]
        self._state = _read_state(self._folder, self._shape)
        self.pack_path = self._name_pack()
        self.transform = transform
        self._allow_pickle = allow_pickle
        self._num_workers = num_workers
        self._pack: PackedDataset | None = None
        self._pack = self._open_or_build(force_recache, progress)

    # -- to override ---------------------------------------------------------------
    def load_source(self) -> Iterable[Mapping[str, Any]]:
        """Yield the samples, one dict of fields each. Override this, or both
        ``source_items()`` and ``load_item()`` (which can run in several processes)."""
        if type(self).load_item is CachedDataset.load_item:
            raise NotImplementedError(
                f"{type(self).__qualname__} must define load_source(), or source_items() "
                "and load_item()"
            )
        items = list(self.source_items())
        # a DataLoader worker (a daemon) rebuilding the pack cannot have children
        if self._num_workers <= 1 or multiprocessing.current_process().daemon or len(items) < 2:
            return _Counted(map(self.load_item, items), len(items))
        return _Counted(self._parallel(items), len(items))

    def _parallel(self, items: list[Any]) -> Iterator[Mapping[str, Any]]:
        """``load_item`` over ``items`` in ``num_workers`` processes, in order.

        The first items are loaded here, timed: when the rest would take less
        than :data:`_SERIAL_BELOW` seconds in this process, workers would cost
        more than they save (starting them, sending items and samples), and the
        build stays here. Otherwise the dataset reaches each worker once
        (inherited under fork, pickled once under spawn); then only chunks of
        items go out and lists of samples come back, a bounded number of chunks
        in flight. Workers that cannot start (a spawned child that fails while
        re-importing the main script) make the rest of the build run in this
        process, with a warning: it never waits for ever.
        """
        from concurrent.futures import Future, ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        spent, probe = 0.0, min(len(items), _PROBE_ITEMS)
        for i, item in enumerate(items[:probe]):
            t0 = time.perf_counter()
            sample = self.load_item(item)
            spent += time.perf_counter() - t0
            yield sample
            if spent > _PROBE_SECONDS:  # slow items: no need to time more of them
                probe = i + 1
                break
        items = items[probe:]
        if not items:
            return
        method = None
        if spent / probe * len(items) >= _SERIAL_BELOW:
            method = _start_method(type(self).__qualname__)
        if method is None:
            yield from map(self.load_item, items)
            return
        workers = self._num_workers
        size = _chunk_size(len(items), workers)
        chunks = deque(items[i : i + size] for i in range(0, len(items), size))
        done = 0  # items yielded so far
        pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context(method),
            initializer=_worker_start,
            initargs=(self,),
        )
        try:
            pending: deque[Future[list[Mapping[str, Any]]]] = deque()
            while chunks or pending:
                while chunks and len(pending) < 4 * workers:
                    pending.append(pool.submit(_worker_load, chunks.popleft()))
                for sample in pending.popleft().result():
                    yield sample
                    done += 1
        except BrokenProcessPool as exc:
            warn(
                f"mlcache: the {workers} {method} workers building {type(self).__qualname__} "
                f"stopped ({exc}); loading the remaining {len(items) - done} items in this "
                "process",
                stacklevel=3,
            )
            yield from map(self.load_item, items[done:])
        finally:
            # a build stopped early (a sample that does not fit) does not wait for
            # the chunks still queued
            pool.shutdown(wait=True, cancel_futures=True)

    def source_items(self) -> Iterable[Any]:
        """What ``load_item`` turns into samples (default: ``source_files()``)."""
        return self.source_files() or ()

    def load_item(self, item: Any) -> Mapping[str, Any]:
        """One sample from one source item (a file path, a row id...)."""
        raise NotImplementedError

    def source_files(self) -> Iterable[str | os.PathLike[str]] | None:
        """The files the samples come from (optional): their paths, sizes and
        modification times make the default source fingerprint."""
        return None

    def source_fingerprint(self) -> str:
        """A string that changes when the source data changes.

        The default combines the files of ``source_files()`` (path, size and
        modification time of each) and, when the class defines ``source_items()``,
        its items: by value (:func:`mlcache.keys.hashing.hash_value`: the list, its
        order and count), and each existing file or folder they name by its path,
        size and modification time: an item that is a path, a tuple or list
        holding paths (``(path, label)``), or a name relative to a folder the
        dataset holds as an attribute (``os.listdir(self.root)``); a folder by
        every file in it. Opening then costs one ``stat`` per file: override this with
        something cheaper (a data version, a manifest's checksum) when that is
        too slow.
        """
        files = self.source_files()
        found = "" if files is None else _files_digest(files)
        if type(self).source_items is CachedDataset.source_items:
            return found  # the items are source_files(): counted above
        bases = [
            os.fspath(v)
            for v in vars(self).values()
            if isinstance(v, (str, os.PathLike)) and os.path.isdir(v)
        ][:4]
        return hash_value(("items", found, _items_digest(self.source_items(), bases)))

    # -- building --------------------------------------------------------------------
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
        if self._remote is not None:
            return self._open_or_build_remote(force, progress, damaged)
        if not force and damaged is None:
            opened = self._try_open()
            if opened is not None:
                return opened
        _refuse_in_bootstrap(type(self))
        lock_fd = open_regular(self.pack_path + ".lock", os.O_RDWR | os.O_CREAT)
        with open(lock_fd, "r+b") as lock:
            # one builder at a time; a lock held by a killed process is released by
            # the kernel, so it can never block for ever
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                if not force:  # someone else may have built it while we waited
                    learned = _read_state(self._folder, self._shape)
                    if learned != self._state:  # ...and learned what its build changes
                        self._state = learned
                        self.pack_path = self._name_pack()
                    opened = self._try_open()
                    if opened is not None and opened.file_id != damaged:
                        return opened
                built = self._build(progress)
                self._after_build()
                return built
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

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
            self.load_source(), self.pack_path, progress=progress, allow_pickle=self._allow_pickle
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
        self._state = _read_state(self._folder, self._shape) | self._state | changed
        _write_state(self._root, self._folder, self._shape, self._state)
        named = self._name_pack()
        if named == self.pack_path:
            return built
        os.replace(self.pack_path, named)
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
            self._warn_if_new_every_run(mine)
        except Exception as exc:  # housekeeping: never fail the build for it
            logger.debug("mlcache: could not record the attributes of %s: %s", self.pack_path, exc)
        self._remove_older_versions()

    def _remote_name(self) -> str:
        """The pack's name under the remote folder."""
        folder, name = os.path.split(self.pack_path)
        return f"{os.path.basename(folder)}/{name}"

    def _open_or_build_remote(
        self, force: bool, progress: bool, damaged: tuple[int, int] | None
    ) -> PackedDataset:
        """The pack in the remote folder, through this machine's copy; built here,
        under the key's lease, when it is not there (or damaged, or ``force``)."""
        from ..store.fsspec import FsspecStore

        assert self._remote is not None
        root, options = self._remote
        url = f"{root}/{self._remote_name()}"
        folder = os.path.dirname(self.pack_path)

        def fetched() -> PackedDataset | None:
            try:
                opened = PackedDataset(
                    url,
                    allow_pickle=self._allow_pickle,
                    storage_options=options,
                    local_cache_dir=folder,
                )
            except FileNotFoundError:
                return None
            except PackCorrupted as exc:
                warn(f"mlcache: {exc}; rebuilding it", stacklevel=5)
                return None
            return None if opened.file_id == damaged else opened

        if not force:
            opened = fetched()
            if opened is not None:
                return opened
        store = FsspecStore(
            root, local_cache_dir=os.path.join(folder, ".leases"), **(options or {})
        )
        with contextlib.ExitStack() as stack:
            try:
                held = stack.enter_context(store.lock(self._remote_name(), timeout=3600))
            except OSError as exc:  # no lease can be made (read-only credentials...)
                warn(f"mlcache: cannot lease {url} ({exc}); building it unlocked", stacklevel=4)
                held = True
            if not held:
                warn(
                    f"mlcache: another machine has been building {url} for an hour; "
                    "building it here too",
                    stacklevel=4,
                )
            if not force:  # another machine may have built it while we waited
                opened = fetched()
                if opened is not None:
                    return opened
            _refuse_in_bootstrap(type(self))
            built = self._build(progress)
            publish(self.pack_path, f"{root}/{self._remote_name()}", options)
            return built

    def _remove_older_versions(self) -> None:
        """Delete the packs this one replaces (same attributes, older code or
        source) once they are :data:`_GRACE_SECONDS` old, and the packs of other
        attributes not opened for :data:`~mlcache.memo.versions.OLD_VERSIONS_KEPT_FOR`
        (as the function cache does with code versions); a process still reading
        one keeps its map (the file goes when it closes)."""
        from ..memo.versions import OLD_VERSIONS_KEPT_FOR

        folder, mine = os.path.split(self.pack_path)
        now = time.time()
        for name in os.listdir(folder):
            ours = name.startswith(self._args_id + "-")
            sidecar = name.startswith(".") and name.endswith(".args")
            if not (name.endswith(".pack") or sidecar) or name == mine:
                continue
            if sidecar and name == f".{self._args_id}.args":
                continue
            path = os.path.join(folder, name)
            try:
                age = now - os.stat(path, follow_symlinks=False).st_mtime
                if age < (_GRACE_SECONDS if ours else OLD_VERSIONS_KEPT_FOR):
                    continue  # maybe another job's current version: leave it a while
                if sidecar:
                    os.unlink(path)
                    continue
                remove_pack(path)
            except OSError as exc:  # housekeeping: never fail the build for it
                logger.debug("mlcache: could not remove %s: %s", name, exc)
            else:
                logger.info("mlcache: removed the %s pack %s", "older" if ours else "unused", name)

    def _warn_if_new_every_run(self, mine: dict[str, str]) -> None:
        """One warning when the last builds of this class, by other processes in
        the last hour, each had a new value of the same attributes and the same
        value of every other one: such an attribute (a temporary folder, a time)
        makes a new pack at every run."""
        now, others = time.time(), []
        for name in os.listdir(self._folder):
            if not (name.startswith(".") and name.endswith(".args")):
                continue
            if name == f".{self._args_id}.args":
                continue
            path = os.path.join(self._folder, name)
            with contextlib.suppress(OSError, ValueError):
                when = os.stat(path, follow_symlinks=False).st_mtime
                if now - when < _EVERY_RUN_WINDOW:
                    with open(path, "rb") as f:
                        data = json.loads(f.read())
                    if data.get("pid") != os.getpid() and isinstance(data.get("attrs"), dict):
                        others.append((when, data["attrs"]))
        if len(others) < _EVERY_RUN_BUILDS - 1:
            return
        last = [a for _, a in sorted(others, key=lambda o: o[0])[-(_EVERY_RUN_BUILDS - 1) :]]
        differ = {n for n in mine if any(a.get(n) != mine[n] for a in last)}
        runs = [mine, *last]
        if not differ or any(set(a) != set(mine) for a in last):
            return
        same = all(a[n] == mine[n] for a in last for n in mine if n not in differ)
        new_each_time = all(len({r[n] for r in runs}) == len(runs) for n in differ)
        key = (type(self), frozenset(differ))
        if same and new_each_time and key not in _WARNED_EVERY_RUN:
            _WARNED_EVERY_RUN.add(key)
            names = ", ".join(repr(n) for n in sorted(differ))
            plural = "s" if len(differ) > 1 else ""
            warn(
                f"mlcache: {type(self).__qualname__}: the attribute{plural} {names} had a new "
                f"value in each of the last {len(runs)} runs, so each built a new pack (unused "
                "packs are removed after 30 days); if it does not change the samples, leave it "
                f"out of the key: cache_ignore = ({names},)",
                stacklevel=6,
            )

    def _try_open(self) -> PackedDataset | None:
        try:
            opened = PackedDataset(self.pack_path, allow_pickle=self._allow_pickle)
            if time.time() - os.stat(self.pack_path).st_mtime > _GRACE_SECONDS:
                # in use: a rebuild of another version leaves it alone a while, and
                # `mlcache prune --older-than` sees its use even where atime is off
                with contextlib.suppress(OSError):
                    os.utime(self.pack_path, follow_symlinks=False)
            return opened
        except FileNotFoundError:
            return None
        except PackCorrupted as exc:
            warn(f"mlcache: {exc}; rebuilding it", stacklevel=4)
            return None

    # -- reading ----------------------------------------------------------------------
    def __mlcache_token__(self) -> tuple[Any, ...]:
        """Passed to a memoized function, it is keyed by its pack's fingerprint and
        its transform (by code), never by reading its samples."""
        return (self.packed.__mlcache_token__(), self.transform)

    @property
    def packed(self) -> PackedDataset:
        """The underlying :class:`PackedDataset` (opened on first use in a new process)."""
        if self._pack is None:
            try:
                self._pack = PackedDataset(self.pack_path, allow_pickle=self._allow_pickle)
            except FileNotFoundError:  # removed since (clear, prune): build it again
                self._pack = self._open_or_build(False, False)
        return self._pack

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        try:
            sample = self.packed[i]
        except PackCorrupted as exc:
            sample = self._rebuilt(exc)[i]
        return self.transform(sample) if self.transform is not None else sample

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """See :meth:`PackedDataset.get_batch` (``transform`` is not applied)."""
        try:
            return self.packed.get_batch(indices)
        except PackCorrupted as exc:
            return self._rebuilt(exc).get_batch(indices)

    def _rebuilt(self, exc: PackCorrupted) -> PackedDataset:
        """Damage found while reading: log it, rebuild the pack (or open the one
        another process rebuilt meanwhile) and read from that."""
        warn(f"mlcache: {exc}; rebuilding it", stacklevel=4)
        damaged = self._pack.file_id if self._pack is not None else None
        self._pack = self._open_or_build(False, False, damaged=damaged)
        return self._pack

    def __getstate__(self) -> dict[str, Any]:
        # to a DataLoader worker: the path and settings, never the samples; the
        # worker maps the pack itself
        state = self.__dict__.copy()
        # a DataLoader worker being started reads the very file this dataset opened
        # (see PackedDataset.__reduce__), even if the pack was rebuilt since
        state["_pack"] = self._pack if spawning_worker() else None
        state["_watched"] = ()  # module-level values, met through the class's code
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # the pack is mapped on first use


class _Counted(Iterable[Mapping[str, Any]]):
    """An iterator that knows its length, so that the progress bar shows a total."""

    def __init__(self, samples: Iterator[Mapping[str, Any]], n: int) -> None:
        self._samples, self._n = samples, n

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return self._samples

    def __len__(self) -> int:
        return self._n


# -- source fingerprints ----------------------------------------------------------------
def _files_digest(files: Iterable[str | os.PathLike[str]]) -> str:
    """Paths, sizes and modification times of ``files`` (which must exist)."""
    paths, stats = [], array("q")
    for f in files:  # the one cost that grows with the dataset when opening it
        path = os.fspath(f)
        if not os.path.isabs(path):
            path = os.path.abspath(path)
        st = os.stat(path)
        paths.append(path)
        stats.extend((st.st_size, st.st_mtime_ns))
    digest = xxhash.xxh3_128("\0".join(paths).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    return digest.hexdigest()


def _items_digest(items: Iterable[Any], bases: Sequence[str] = ()) -> str:
    """The items of ``source_items()``: by value (their order and count too), and
    every existing file or folder they name by its path, size and modification
    time: an item that is a path, or a tuple or list holding paths (``(path,
    label)``), or a name relative to one of ``bases`` (the dataset's own folder
    attributes, for ``os.listdir(self.root)``). A folder counts by every file in
    it (editing ``p0/a.txt`` changes nothing of ``p0`` itself)."""
    items = list(items)
    paths, stats = [], array("q")
    for item in items:
        for part in item if isinstance(item, (tuple, list)) else (item,):
            path = _existing_path(part, bases)
            if path is None:
                continue
            paths.append(path)
            _add_stats(path, paths, stats)
    digest = xxhash.xxh3_128("\0".join(paths).encode("utf-8", "surrogateescape"))
    digest.update(stats.tobytes())
    digest.update(hash_value(items).encode())
    return digest.hexdigest()


def _existing_path(part: Any, bases: Sequence[str]) -> str | None:
    """``part`` as the absolute path of an existing file or folder, or None."""
    if not isinstance(part, (str, os.PathLike)):
        return None
    try:
        name = os.fsdecode(os.fspath(part))
        if not name or "\0" in name:
            return None
        for candidate in (name, *(os.path.join(b, name) for b in bases)):
            if os.path.exists(candidate):
                return os.path.abspath(candidate)
    except (OSError, ValueError, TypeError):
        return None
    return None


def _add_stats(path: str, paths: list[str], stats: array) -> None:
    """Size and modification time of ``path``; of a folder, of each file in it too."""
    st = os.stat(path)
    stats.extend((st.st_size, st.st_mtime_ns))
    if not os.path.isdir(path):
        return
    for folder, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            inner = os.path.join(folder, name)
            try:
                st = os.stat(inner)
            except OSError:  # removed meanwhile: its absence counts
                continue
            paths.append(inner)
            stats.extend((st.st_size, st.st_mtime_ns))


# -- state: module-level values a build changes ------------------------------------
def _read_state(folder: str, shape: str) -> frozenset[str]:
    """The names of the module-level values (or their parts: see
    :func:`mlcache.keys.code_version.state_parts`) that builds of this class, with code of this
    shape, change."""
    try:
        with open(os.path.join(folder, f"{_STATE_FILE}-{shape}"), "rb") as f:
            names = json.loads(f.read()).get("globals", [])
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError, AttributeError) as exc:  # unreadable: learned again
        logger.debug("mlcache: could not read %s: %s", _STATE_FILE, exc)
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str))


def _write_state(root: str, folder: str, shape: str, names: frozenset[str]) -> None:
    try:
        data = json.dumps({"globals": sorted(names)}).encode()
        path = os.path.join(folder, f"{_STATE_FILE}-{shape}")
        write_bytes_atomic(path, data, durable=False, root=root)
    except OSError as exc:  # learned again by the next build
        logger.debug("mlcache: could not record what building changes: %s", exc)


# -- worker processes ---------------------------------------------------------------
#: the dataset a build's worker process loads items of (set once per worker)
_WORKER_DATASET: Any = None


def _worker_start(dataset: CachedDataset) -> None:
    global _WORKER_DATASET
    _WORKER_DATASET = dataset
    torch = sys.modules.get("torch")
    if torch is not None:
        # a forked child of a process whose OpenMP pool ran (any torch op) hangs
        # at its first parallel region; one thread per worker, as PyTorch's own
        # DataLoader workers do (the workers are the parallelism here)
        with contextlib.suppress(Exception):
            torch.set_num_threads(1)


def _worker_load(items: list[Any]) -> list[Mapping[str, Any]]:
    return [_WORKER_DATASET.load_item(item) for item in items]


def _chunk_size(n: int, workers: int) -> int:
    """Items per task: enough that a tiny item's sample is not outweighed by the
    round trip of a task (about 0.2 ms), small enough that every worker gets
    several tasks and the first samples come back early."""
    return max(1, min(256, n // (8 * workers)))


_GUARD = re.compile(
    r"""^if\s+(__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__)""", re.M
)


def _main_is_guarded() -> bool:
    """Whether a spawned child can import the main module without re-running the
    user's work: it has no file (an interactive session, ``python -c``, a
    notebook), or its source has an ``if __name__ == "__main__":`` guard."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return _GUARD.search(f.read()) is not None
    except OSError:
        return False


def _other_threads() -> int:
    """Threads other than this one, except two kinds of helpers that sleep and
    that a forked worker never needs: mlcache's hashing threads (forgotten by a
    forked child: see mlcache.keys.hashing) and tqdm's monitor (started by the first
    progress bar on a terminal, ours included; it wakes every 10 s)."""
    me = threading.current_thread()
    return sum(
        1
        for t in threading.enumerate()
        if t is not me
        and t.is_alive()
        and not t.name.startswith("mlcache-hash")
        and type(t).__name__ != "TMonitor"
    )


def _start_method(what: str) -> str | None:
    """How to start a build's workers, or None to build in this process.

    fork (on Linux) runs nothing again: no script re-run, no import of the
    dataset's module, so no main guard is needed. With other threads running, a
    forked child may inherit a lock one of them held and hang, so then spawn,
    when the main module has a guard (spawn, like forkserver, imports it again
    in each worker); otherwise the build runs in this process, with a warning.
    """
    threads = _other_threads()
    if sys.platform.startswith("linux") and threads == 0:
        return "fork"
    importing = _module_being_imported()
    if importing is not None:
        # spawn workers would import that module again to unpickle the dataset,
        # and so build it again each: never workers then
        warn(
            f"mlcache: building {what} in this process, not in workers: it is built "
            f"while the module {importing!r} is being imported, which spawn workers "
            "would import (and build) again; build it in a function, or under the "
            'main script\'s `if __name__ == "__main__":` guard, to use num_workers',
            stacklevel=5,
        )
        return None
    if _main_is_guarded():
        return "spawn"
    why = (
        f"{threads} other thread{'s are' if threads > 1 else ' is'} running (fork is unsafe)"
        if sys.platform.startswith("linux")
        else "fork is not available here"
    )
    warn(
        f"mlcache: building {what} in this process, not in workers: {why}, and spawn "
        'would re-run the main script, which has no `if __name__ == "__main__":` guard; '
        "add one to use num_workers (threads: "
        f"{', '.join(sorted(t.name for t in threading.enumerate()))})",
        stacklevel=5,
    )
    return None


def _module_being_imported() -> str | None:
    """The name of a module (not the main script) whose import is running this
    code: a dataset built at the top level of a module, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name not in ("__main__", "__mp_main__"):
            module = sys.modules.get(name)
            spec = vars(module).get("__spec__") if module is not None else None
            if getattr(spec, "_initializing", False) and not name.startswith("mlcache"):
                return name
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _refuse_in_bootstrap(cls: type) -> None:
    """Raise when a build would start while this process is a spawned child still
    importing the main script (it re-runs the script's top level: the parent may
    hold the build's lock, and a child cannot start workers)."""
    # set by multiprocessing while a spawned child imports the main module and
    # unpickles its process object (parent_process() is not known yet then)
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    # while a spawned child prepares, __main__ may not have its __file__ yet; argv has
    # the parent's
    main = getattr(sys.modules.get("__main__"), "__file__", None) or (
        sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "the main module"
    )
    raise RuntimeError(
        f"mlcache: {cls.__qualname__} would be built in a child process that "
        f"multiprocessing spawned while it is re-running {main} (spawn imports the main "
        "script again in each child). Put the script's work under "
        '`if __name__ == "__main__":` (or build the dataset there) so that children '
        "only import it."
    )
