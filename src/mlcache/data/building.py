"""How a :class:`~mlcache.data.CachedDataset` finds its pack or builds it: the
pack's name (code, attributes, source, state), one builder at a time (an
``flock`` here, a lease for a remote folder), what a build learns, and the
housekeeping after it.

What a build changes of module-level values is judged by the function cache's
rules (:mod:`mlcache.keys.learned`): only an int it raises or a container it only
grows is bookkeeping, counted in the pack's name by its baseline; anything else
it changes (``CFG["scale"] = fitted``, ``ctx.model.eval()``) stays in the name by
value. What is learned belongs to the dataset class and its code shape
(``.learned-<shape>`` beside its packs).

:class:`PackBuilder` is a base of ``CachedDataset``: these are its methods,
kept apart from what a user subclasses and from the reading path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from .._atomic import open_folder, open_regular, write_bytes_atomic
from .._util import progress as _progress
from ..errors import NewerFormat, PackCorrupted, warn
from ..keys.code_version import code_version
from ..keys.hashing import hash_value
from ..keys.learned import Watch, keyed_digest
from ..store.local import mark_cache_folder
from .audit import LoadTimer, read_load_seconds, write_load_seconds
from .fetch import publish, remote_lease
from .filling import Filler
from .folders import folder_runs
from .format import is_newer_pack
from .holdings import note_open, record_build_time
from .items import same_items, table_digest
from .learning import BuildLearning, write_state
from .reader import PackedDataset
from .records import remove_redundant_records
from .replaced import own_beside, write_code_tag
from .sources import (
    GRACE_SECONDS,
    DeclaredSource,
    SourceRecord,
    remove_older_versions,
    warn_if_new_every_run,
)
from .workers import load_in_workers, refuse_in_bootstrap
from .writer import write_pack

__all__ = ["PackBuilder"]

logger = logging.getLogger("mlcache")


class PackBuilder(BuildLearning):
    """The building half of :class:`~mlcache.data.CachedDataset` (see the module
    docstring); ``CachedDataset.__init__`` sets the attributes below."""

    cache_on: ClassVar[tuple[str, ...] | None]
    cache_ignore: ClassVar[tuple[str, ...]]
    pack_path: str
    _root: str
    _chosen: str  # the folder the user chose (see CachedDataset.__init__)
    _folder: str
    _key_names: list[str]
    _args_id: str
    _args_id_full: str
    _code_id: str
    _source: Any
    _state: dict[str, str]  # what builds were learned to change: name -> kind
    _shape: str
    _watched: tuple[tuple[str, Any], ...]
    _allow_pickle: bool
    _remote: tuple[str, dict[str, Any] | None] | None
    _declared: DeclaredSource | None
    _record: SourceRecord
    _fill: str
    _num_workers: int
    _pack: PackedDataset | None

    def load_source(self) -> Any:
        raise NotImplementedError  # CachedDataset's

    def source_fingerprint(self) -> str:
        raise NotImplementedError  # CachedDataset's

    def _open_whole(self, recorded: str | None, force: bool, progress: bool) -> str | None:
        """Open (or build) the pack of ``load_source()``, named by the source's
        fingerprint: ``recorded`` by the last open (returned when its pack is
        there), or taken now (then None is returned)."""
        self._source = recorded if recorded is not None else self.source_fingerprint()
        self.pack_path = self._name_pack()
        if recorded is not None:
            self._pack = self._try_open(False)
            if self._pack is None:  # no pack of the recorded source: fingerprint it now
                recorded, self._source = None, self.source_fingerprint()
                self.pack_path = self._name_pack()
        if self._pack is None:
            self._pack = self._open_or_build(force, progress)
        return recorded

    def _open_or_build(
        self, force: bool, progress: bool, damaged: tuple[int, int] | None = None
    ) -> PackedDataset:
        """Open the pack, building it first if it is missing, damaged or ``force``.

        ``damaged`` is the ``file_id`` of a pack found damaged while reading: it is
        rebuilt unless another process already replaced it.
        """
        self._make_folder()
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

    def _make_folder(self) -> None:
        """The pack's folder, reached without following a link planted in place of
        it (one warning; a real folder is made), so a build never writes elsewhere."""
        folder = os.path.dirname(self.pack_path)
        mark_cache_folder(self._root)
        os.makedirs(self._root, mode=0o700, exist_ok=True)
        os.close(open_folder(self._root, os.path.relpath(folder, self._root)))

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
        # as the code is now: the open walked it (CachedDataset.__init__); walked
        # again for learned state, which is another walk
        code = code_version(cls, state=self._state, fresh=bool(self._state))
        self._watched: tuple[tuple[str, Any], ...] = code.watched  # mutable, module-level
        self._bindings = code.bindings  # a name rebound since: data/filling.Rebound
        made_by = (f"{cls.__module__}.{cls.__qualname__}", code.digest, self._args_id_full)
        watched = keyed_digest(code.watched, self._state)  # a learned part by its baseline
        self._code_key = (code.digest, watched)  # a copy unpickled elsewhere: data/copies.py
        version = hash_value((*made_by, self._source, watched))
        #: everything of the name but the source: packs of one code replace each
        #: other as the source changes; packs of other code are kept side by side
        self._code_id = hash_value((*made_by, watched))
        # a rebuild removes the older versions of the same attributes (after a
        # while), and packs of other attributes once unused for long
        path = os.path.join(self._folder, f"{self._args_id}-{version[:16]}.pack")
        return own_beside(path) if is_newer_pack(path) else path

    def _build(
        self,
        progress: bool,
        samples: Iterable[Mapping[str, Any]] | None = None,
        items: bytes | None = None,
        watch: Watch | None = None,
    ) -> PackedDataset:
        """Build the pack (of ``load_source()``, or of ``samples`` with their item
        table ``items``); what the build did to module-level values since
        ``watch`` was made (when the loading began; default: now) is judged, and
        the pack is named for what that teaches (see the module docstring)."""
        logger.info("mlcache: building %s", self.pack_path)
        if watch is None:
            watch = Watch(self._watched)
        started = time.perf_counter()
        try:
            built = write_pack(
                self.load_source() if samples is None else samples,
                self.pack_path,
                progress=progress,
                allow_pickle=self._allow_pickle,
                desc=type(self).__qualname__,  # not the pack's hash name
                items=items,
            )
        except BaseException:
            watch.abandon()
            raise
        elapsed = time.perf_counter() - started
        named = self._learned(watch)
        if samples is None:  # a filled pack's cost was its loading, spread over its reads
            record_build_time(named or self.pack_path, elapsed, self._root)
        if named is None:
            write_code_tag(self.pack_path, self._code_id, self._root)
            return built
        if named != self.pack_path:  # first: a process told the state finds the pack
            os.replace(self.pack_path, named)
        write_state(self._root, self._folder, self._shape, self._state)
        write_code_tag(named, self._code_id, self._root)
        if named == self.pack_path:
            return built
        self.pack_path = named
        return PackedDataset(named, allow_pickle=self._allow_pickle)

    def _after_build(self) -> None:
        """Housekeeping after a local build (never fails it): record the digests
        of the attributes, say if one is new at every run, remove unused packs."""
        self._record_attributes()
        remove_older_versions(self.pack_path, self._args_id)

    def _record_attributes(self) -> None:
        """Record the digests of the attributes (a new pack is started); say if one
        is new at every run."""
        try:
            mine = {n: hash_value(getattr(self, n))[:16] for n in self._key_names}
            path = os.path.join(self._folder, f".{self._args_id}.args")
            # the folder attributes' files of the last builds of these attributes: an
            # output folder that training writes into changes at every run
            runs = folder_runs(path, getattr(self, "_folder_digests", {}), type(self))
            write_bytes_atomic(
                path,
                json.dumps({"attrs": mine, "pid": os.getpid(), "folders": runs}).encode(),
                durable=False,
                root=self._root,
            )
            warn_if_new_every_run(type(self), self._folder, self._args_id, mine)
        except Exception as exc:  # housekeeping: never fail the build for it
            logger.debug("mlcache: could not record the attributes of %s: %s", self.pack_path, exc)

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
        except NewerFormat:  # a newer mlcache's: this version's own pack is beside it
            path, self.pack_path = self.pack_path, own_beside(self.pack_path)
            return None if self.pack_path == path else self._fetch_remote(again)
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
            learned = self._read_learned()
            if learned != self._state:
                self._state = learned
                self.pack_path = self._name_pack()
        try:
            opened = PackedDataset(self.pack_path, allow_pickle=self._allow_pickle)
            note_open(self.pack_path, self._chosen)  # a hit: what the pack saved (mlcache ls)
            if time.time() - os.stat(self.pack_path).st_mtime > GRACE_SECONDS:
                # in use: a rebuild of another version leaves it alone a while, and
                # `mlcache prune --older-than` sees its use even where atime is off
                with contextlib.suppress(OSError):
                    os.utime(self.pack_path, follow_symlinks=False)
            return opened
        except FileNotFoundError:
            return None
        except NewerFormat:  # written since the name was chosen: named beside it
            path, self.pack_path = self.pack_path, own_beside(self.pack_path)
            return None if self.pack_path == path else self._try_open(again)
        except PackCorrupted as exc:
            warn(f"mlcache: {exc}; rebuilding it", stacklevel=5)
            return None

    def _open_again(self) -> PackedDataset:
        """The pack opened again by its name: built again when it was removed since
        (clear, prune); beside it when a newer mlcache's pack took the name since
        (that one kept, said once: :func:`~mlcache.data.replaced.own_beside`)."""
        try:
            return PackedDataset(self.pack_path, allow_pickle=self._allow_pickle)
        except FileNotFoundError:
            pass
        except NewerFormat:
            self.pack_path = own_beside(self.pack_path)
        return self._open_or_build(False, False)

    # -- filling: source_items() and load_item() (see mlcache.data.filling) ---------------
    def _items_now(self) -> tuple[list[Any], np.ndarray]:
        raise NotImplementedError  # CachedDataset's

    def load_item(self, item: Any) -> Mapping[str, Any]:
        raise NotImplementedError  # CachedDataset's

    def _open_filled(
        self,
        force: bool,
        progress: bool,
        check: str,
        damaged: tuple[int, int] | None = None,
    ) -> PackedDataset | None:
        """The sealed pack of the items as they are now; or None, and
        ``self._filler`` serves the samples, filling the pack as they are read.

        A pack whose items all match is opened as is (with ``check`` ``"never"``,
        or ``"background"`` checking in a thread, without listing them first).
        Otherwise its unchanged samples are kept, and the rest are loaded now
        (all of them for ``fill="up-front"``, or with ``num_workers``; a handful,
        at most 1% of them, after an edit: the pack is sealed again at once) or
        as they are read. ``damaged``: the ``file_id`` of the pack found damaged
        while reading, removed (unless another process replaced it already) and
        filled again."""
        try:
            self._make_folder()
        except OSError as exc:  # a read-only place: the samples are loaded, unstored
            logger.debug("mlcache: cannot make the folder of %s: %s", self.pack_path, exc)
        self._filler: Filler | None = None
        #: module-level values before any load, to judge what filling changes (not
        #: counted as a computation in flight: the user may never read it through)
        self._watched_before = Watch(self._watched, counted=False)
        if self._remote is not None:
            return self._fill_remote(force, progress)
        if damaged is not None:
            with self._local_lock(), contextlib.suppress(OSError):
                st = os.stat(self.pack_path)
                if (st.st_dev, st.st_ino) == damaged:
                    os.unlink(self.pack_path)  # its readers keep their maps
        base = None if force else self._try_open(False)
        if base is not None and check != "open":
            try:
                opened = table_digest(base.item_table())
            except PackCorrupted:
                opened = ""
            # "background": the pack of the items the last open (or check) listed
            if opened and (check == "never" or self._record.read() == opened):
                if check == "background":
                    self._record.check_in_background(
                        self, opened, lambda: table_digest(self._items_now()[1])
                    )
                return base
        items, table = self._items_now()
        self._record.write(table_digest(table))
        if base is not None and same_items(base, table):
            remove_redundant_records(self.pack_path + ".fill", table)  # a seal killed
            return base
        # a spawned child re-running the script must not fill (nor, with
        # force_recache, remove the records of) the pack its parent fills
        refuse_in_bootstrap(type(self))
        ignore = damaged
        if force:  # records of earlier runs are not used either, nor the sealed pack
            shutil.rmtree(self.pack_path + ".fill", ignore_errors=True)
            with contextlib.suppress(OSError):
                st = os.stat(self.pack_path)
                ignore = (st.st_dev, st.st_ino)
        filler = self._filler_of(items, table, base, ignore)
        if filler.sealed is not None:
            return filler.sealed
        if not filler.present:
            self._record_attributes()  # a new pack
        missing = len(filler.missing)
        few = filler.present > 0 and missing <= max(8, filler.n // 100)
        eager = self._fill == "up-front" or (self._fill == "auto" and self._num_workers > 0)
        if not missing or eager:
            return self._fill_now(filler, progress)
        if few:  # an edit: load it now and seal again, unless loading it fails
            try:
                return self._fill_now(filler, progress)
            except Exception as exc:  # the user's error: raised by the read, as in epoch 1
                logger.info(
                    "mlcache: %s: %s; the rest is filled as it is read", self.pack_path, exc
                )
        logger.info(
            "mlcache: %s fills %s as it is read (%d of %d samples to load)",
            type(self).__qualname__,
            self.pack_path,
            missing,
            filler.n,
        )
        self._filler = filler
        return None

    def _filling(self) -> bool:
        """Whether a pack being filled serves the reads now (the audit leaves a
        filling pass, and the pass after it, alone: see :mod:`mlcache.data.audit`)."""
        filler = self._filler
        return filler is not None and filler.sealed is None

    def _fill_anew(self, i: int) -> Any:
        """An audit found the pack stale (see :mod:`mlcache.data.audit`): under the
        build lock, the pack read (unless another process replaced it since) and
        the records of a filling under way go, so that no open serves them; the
        pack is filled anew as it is read (not up front: this is the middle of an
        epoch). Returns sample ``i``, read from it."""
        read, filler = self._pack, self._filler
        if read is None and filler is not None:
            read = filler.sealed if filler.sealed is not None else filler.base
        gone = False
        try:
            with self._local_lock():
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(self.pack_path)
                    if read is None or (st.st_dev, st.st_ino) == read.file_id:
                        os.unlink(self.pack_path)  # its readers keep their maps
                gone = True  # (or another process's pack: filled anew since)
                shutil.rmtree(self.pack_path + ".fill", ignore_errors=True)
        except OSError as exc:  # a read-only folder: no pack there is used (force)
            logger.debug("mlcache: cannot remove the stale %s: %s", self.pack_path, exc)
        fill, self._fill = self._fill, "as-read"
        try:
            self._pack = self._open_filled(not gone, False, "open")
        finally:
            self._fill = fill
        if self._pack is not None:  # another process's pack, filled anew already
            return self._pack[i]
        assert self._filler is not None
        return self._filler[i]

    def _fill_now(self, filler: Filler, progress: bool) -> PackedDataset | None:
        """Load every missing item now (in ``num_workers`` processes), then seal;
        or None when the pack cannot be written (one warning): then
        ``self._filler`` serves the samples, from the records or loaded."""
        missing = filler.missing
        if missing:
            refuse_in_bootstrap(type(self))
            items = [filler.items[i] for i in missing]
            # in this process when workers would not pay (or cannot: a daemon)
            samples = load_in_workers(self, items, self._num_workers)
            desc = type(self).__qualname__
            shown = _progress(samples, desc, total=len(items), unit=" samples", enabled=progress)
            t0 = time.perf_counter()  # in workers: per item, less than a load (audits fewer)
            filler.fill(zip(missing, shown, strict=True))
            filler.own_rebound()  # by load_item itself, in this process
            self._timed_load().add(time.perf_counter() - t0, len(items))
        sealed = filler.try_seal()
        if sealed is None:
            self._filler = filler
        return sealed

    def _fill_remote(self, force: bool, progress: bool) -> PackedDataset | None:
        """A pack in a remote folder is filled up front, on one machine at a time,
        and published when sealed."""
        base = None if force else self._fetch_remote(False)
        items, table = self._items_now()
        if base is not None and same_items(base, table):
            return base
        refuse_in_bootstrap(type(self))
        with self._remote_lease():
            if not force:
                base = self._fetch_remote(True) or base
                if base is not None and same_items(base, table):
                    return base
            return self._fill_now(self._filler_of(items, table, base), progress)

    def _filler_of(
        self,
        items: list[Any],
        table: np.ndarray,
        base: PackedDataset | None,
        ignore: tuple[int, int] | None = None,
    ) -> Filler:
        """The filler of this dataset's pack (see :class:`~mlcache.data.filling.Filler`)."""
        return Filler(
            self.pack_path,
            items,
            table,
            base,
            self._timed_load(),
            self._local_lock,
            self._seal_filled,
            self._allow_pickle,
            self._learn_while_filling,
            ignore=ignore,
            moved=self._filled_beside,
            bindings=getattr(self, "_bindings", ()),  # (none in a spawned worker)
        )

    def _filled_beside(self, path: str) -> None:
        """A newer mlcache's pack took the name of the pack being filled: this
        version's is sealed (and opened again) at ``path``, beside it."""
        self.pack_path = path

    def _timed_load(self) -> LoadTimer:
        """``load_item``, timed (a pack being filled loads through it)."""
        timer: LoadTimer | None = getattr(self, "_timer", None)
        if timer is None:
            timer = self._timer = LoadTimer(self.load_item)
        return timer

    def _load_seconds(self) -> float | None:
        """What a load of an item takes (the audit's budget: see
        :mod:`mlcache.data.audit`): as this process timed it, else as recorded when
        the pack was sealed, else None."""
        mean = self._timed_load().mean
        if mean is None:
            mean = read_load_seconds(os.path.join(self._folder, f".{self._args_id}.loads"))
        return mean

    def _seal_filled(self, samples: Iterable[Mapping[str, Any]], items: bytes) -> PackedDataset:
        """Write the sealed pack (published, for a remote folder); what filling
        changed of module-level values since the open is state; what a load took
        (as this process timed it) is recorded beside it, for the audit."""
        built = self._build(False, samples, items, getattr(self, "_watched_before", None))
        mean = self._timed_load().mean
        if mean is not None:
            loads = os.path.join(self._folder, f".{self._args_id}.loads")
            write_load_seconds(loads, mean, self._root)
        else:  # loaded by other processes (DataLoader workers): as they recorded it
            mean = self._load_seconds()
        if mean is not None:
            # the pack's cost is its loads, spread over the reads that filled it:
            # what evicting it would cost (mlcache ls, prune), not the seal's copy
            record_build_time(self.pack_path, mean * len(built), self._root)
        if self._remote is None:
            remove_older_versions(self.pack_path, self._args_id)
        else:
            root, options = self._remote
            publish(self.pack_path, f"{root}/{self._remote_name()}", options)
        return built
