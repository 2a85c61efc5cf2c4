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

The pack's key combines the class (qualified name and the code of its methods),
the attributes set before ``super().__init__`` (or only those named in
``cache_on``), and the source fingerprint (paths, sizes and modification times
of ``source_files()``, or whatever ``source_fingerprint()`` returns). Any change
is a rebuild; so is ``force_recache=True``. Several processes opening the same
dataset at once: one builds (holding a lock on ``<pack>.lock``), the others wait
and open its result. A damaged pack is logged and rebuilt, whether the damage
shows when it is opened or when a read meets a block whose checksum fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import xxhash

from .._atomic import open_folder, open_regular
from .._default import default_location
from ..deps import code_version
from ..errors import warn
from ..fingerprint import slug
from ..hashing import hash_value
from ..store.local import cache_folder, mark_cache_folder
from .format import PackCorrupted
from .reader import PackedDataset
from .remote import is_url, publish
from .writer import pack

__all__ = ["CachedDataset", "remove_pack"]

logger = logging.getLogger("mlcache")


#: an older version of a pack is removed once it has not been rebuilt for this long
_GRACE_SECONDS = 600.0


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
        samples keep the order of ``source_items()``.
    storage_options:
        fsspec options when ``cache_dir`` is a URL (``s3://bucket/datasets``):
        then the pack lives there, shared by every machine; each machine reads
        a local copy (fetched once), and one machine builds it while the others
        wait (a lease, as for function results), then upload it.
    """

    #: names of the attributes that identify the data; None means every attribute
    #: set before ``CachedDataset.__init__``
    cache_on: ClassVar[tuple[str, ...] | None] = None

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
        names = self.cache_on if self.cache_on is not None else sorted(vars(self))
        try:
            identity = {name: getattr(self, name) for name in names}
            args_key = hash_value(identity)
        except (AttributeError, TypeError) as exc:
            raise TypeError(
                f"{type(self).__qualname__}: cannot key the dataset by its attributes ({exc}); "
                "set cache_on = ('attr', ...) to the attributes that identify the data"
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
        version = hash_value(
            (
                f"{cls.__module__}.{cls.__qualname__}",
                code_version(cls).digest,
                args_key,
                self.source_fingerprint(),
            )
        )
        # <what>-<which version>.pack: a rebuild removes the older versions of the
        # same dataset, never the packs of other arguments
        self._args_id = args_key[:16]
        self._root = os.path.abspath(root)
        self.pack_path = os.path.join(
            self._root,
            slug(f"{cls.__module__}.{cls.__qualname__}"),
            f"{self._args_id}-{version[:16]}.pack",
        )
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
        import multiprocessing

        # a DataLoader worker (a daemon) rebuilding the pack cannot have children
        if self._num_workers <= 1 or multiprocessing.current_process().daemon:
            return _Counted(map(self.load_item, items), len(items))
        return _Counted(self._parallel(items), len(items))

    def _parallel(self, items: list[Any]) -> Iterator[Mapping[str, Any]]:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(self._num_workers) as pool:
            chunk = max(1, min(64, len(items) // (4 * self._num_workers) or 1))
            yield from pool.imap(self.load_item, items, chunksize=chunk)

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
        """A string that changes when the source data changes."""
        files = self.source_files()
        if files is None:
            return ""
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
        lock_fd = open_regular(self.pack_path + ".lock", os.O_RDWR | os.O_CREAT)
        with open(lock_fd, "r+b") as lock:
            # one builder at a time; a lock held by a killed process is released by
            # the kernel, so it can never block for ever
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                if not force:  # someone else may have built it while we waited
                    opened = self._try_open()
                    if opened is not None and opened.file_id != damaged:
                        return opened
                logger.info("mlcache: building %s", self.pack_path)
                built = pack(
                    self.load_source(),
                    self.pack_path,
                    progress=progress,
                    allow_pickle=self._allow_pickle,
                )
                self._remove_older_versions()
                return built
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _remote_name(self) -> str:
        """The pack's name under the remote folder."""
        folder, name = os.path.split(self.pack_path)
        return f"{os.path.basename(folder)}/{name}"

    def _open_or_build_remote(
        self, force: bool, progress: bool, damaged: tuple[int, int] | None
    ) -> PackedDataset:
        """The pack in the remote folder, through this machine's copy; built here,
        under the key's lease, when it is not there (or damaged, or ``force``)."""
        from ..store.remote import FsspecStore

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
            logger.info("mlcache: building %s", url)
            built = pack(
                self.load_source(),
                self.pack_path,
                progress=progress,
                allow_pickle=self._allow_pickle,
            )
            publish(self.pack_path, url, options)
            return built

    def _remove_older_versions(self) -> None:
        """Delete the packs this one replaces (same arguments, older code or source);
        a process still reading one keeps its map (the file goes when it closes)."""
        folder, mine = os.path.split(self.pack_path)
        now = time.time()
        for name in os.listdir(folder):
            if name.startswith(self._args_id + "-") and name.endswith(".pack") and name != mine:
                path = os.path.join(folder, name)
                try:
                    if now - os.stat(path).st_mtime < _GRACE_SECONDS:
                        continue  # maybe another job's current version: leave it a while
                    remove_pack(path)
                except OSError as exc:  # housekeeping: never fail the build for it
                    logger.debug("mlcache: could not remove %s: %s", name, exc)
                else:
                    logger.info("mlcache: removed the older pack %s", name)

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
        state["_pack"] = None
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
