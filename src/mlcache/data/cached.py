"""``CachedDataset``: say how one sample is loaded, read a pack ever after.

Subclass it, set your attributes, call ``super().__init__(...)``; the pack fills
itself as it is read::

    class PatientSeries(CachedDataset):
        source_glob = "*.csv"  # the source: the CSV files of source_dir

        def __init__(self, root, **kw):
            self.source_dir = root
            super().__init__(**kw)

        def load_item(self, path):  # one of source_items() (default: the files)
            return read_patient(path)

(or ``source_paths = [...]``, or your own ``source_items()``; or a generator of
every sample, ``load_source()``, for a pack built whole at the open).

Such a dataset opens after listing its items: the first epoch reads the source
(``ds[i]`` loads item ``i``, stores it and returns it; DataLoader workers too),
and the pack is sealed when every item is in, so the next epochs read the pack.
An edited, added or removed file costs its own load at the next open, nothing
else; a run killed half way keeps what it loaded (see
:mod:`mlcache.data.filling`). ``fill="up-front"`` (or ``num_workers``) loads
the missing items at the open instead.

What the pack is keyed by (any change is a rebuild; so is ``force_recache=True``):

- the class: its qualified name and its code version, by the function cache's
  rule (:func:`mlcache.keys.code_version.code_version`): the code of its methods and of the
  user code they reach, and the module-level values that code reads (``cols =
  [1, 2]`` edited to ``[1, 2, 30]`` is a rebuild). A module-level memo that a
  build only grows is state, not input (remembered in the class's folder of
  packs, ``.state``), so the next open does not rebuild;
- the attributes set before ``super().__init__`` (or only those in
  ``cache_on``), less those in ``cache_ignore``, by value
  (:func:`mlcache.keys.hashing.hash_value`, at every open: a large attribute that
  does not change the samples, such as a lookup table or an output folder,
  belongs in ``cache_ignore``);
- the source fingerprint (:meth:`CachedDataset.source_fingerprint`): the paths
  and ``stat`` (size, modification time, inode, ctime) of ``source_files()``, of
  the files the items of ``source_items()`` name (a path, or inside a tuple, a
  dict, a dataclass), of the files the key attributes name (``self.path =
  "table.npy"``) and under the folders they name (:mod:`mlcache.data.folders`),
  the value of the items; or your ``source_fingerprint()``. A
  dataset filled item by item is not rebuilt when an item changes: only the
  changed items (by :meth:`CachedDataset.item_fingerprint`) are loaded again.

Several processes opening the same dataset at once: one builds (holding a lock
on ``<pack>.lock``), the others wait and open its result. A damaged pack is
logged and rebuilt, whether the damage shows when it is opened or when a read
meets a block whose checksum fails.

Building in parallel (``num_workers=``, with ``source_items()`` and
``load_item()``): forked workers on Linux, spawned ones (with a main guard) when
other threads run, never a hang (see :mod:`mlcache.data.workers`).

Which packs are kept (a pack is ``<folder of the class>/<attributes>-<version>.pack``):
a pack of the same code and attributes built from an older source goes once no
process reads it (:mod:`mlcache.data.replaced`); packs of other code or
attributes (``train.py`` and ``eval.py`` each with a class of one name, sharing a
``cache_dir``) are kept side by side, by last use: one goes when a pack of the
class is built and it has not been opened for :data:`UNUSED_PACKS_KEPT_FOR` (30
days, as function results of an old code version); size limits, ``mlcache
prune`` and ``mlcache clear`` remove any. When the last three builds
of a class, by three runs within an hour, each had a new value of the same
attribute (``self.out_dir = mkdtemp()``), a warning names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .._util import slug
from ..errors import PackCorrupted, warn
from ..keys.code_version import code_version
from ..keys.hashing import hash_value
from ..store.local import cache_folder, default_location
from .attributes import OpenItems
from .audit import DatasetAuditor, dataset_auditor
from .building import PackBuilder
from .checking import ItemChanged, ItemCheck, folder_table, listed_folder
from .copies import Copies
from .fetch import is_url
from .filling import FILLS, Filler, Rebound
from .folders import attribute_source
from .items import default_fingerprint, item_table, say_unfingerprinted
from .names import Named, names_of
from .reader import PackedDataset, spawning_worker
from .replaced import remove_replaced
from .sequence import Many, describe
from .sources import (
    UNUSED_PACKS_KEPT_FOR,
    DeclaredSource,
    SourceRecord,
    attributes_first,
    check_mode,
    remove_pack,
    source_fingerprint,
)
from .workers import Counted, load_in_workers

__all__ = ["UNUSED_PACKS_KEPT_FOR", "CachedDataset", "remove_pack"]

logger = logging.getLogger("mlcache")


class CachedDataset(OpenItems, PackBuilder, Copies, Sequence[Any]):
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
    source_dir, source_glob, source_paths:
        The declared source (or attributes of these names, as in the module docstring,
        unless the class defines ``source_files()`` or ``source_items()``): the files
        of ``source_dir`` whose names match ``source_glob`` (default ``"*"``), sorted,
        or the list ``source_paths``. ``source_files()`` returns them; they are listed
        by one ``os.listdir`` and fingerprinted by one ``stat`` each, where
        ``sorted(Path(root).glob("*.csv"))`` costs three times that.
    fill:
        For a dataset that defines ``load_item()`` (and not ``load_source()``):
        ``"as-read"`` fills the pack as samples are read (the open only lists the
        items); ``"up-front"`` loads the missing ones at the open (with
        ``num_workers`` processes), a resumable build; ``"auto"`` (default) is
        ``"up-front"`` with ``num_workers`` or a remote ``cache_dir``, else
        ``"as-read"``. Either way a handful of changed items (at most 1% of
        them, or 8) are loaded at the open and the pack sealed again at once.
    check_source:
        When the source is checked for changes. ``"open"`` (default): at each open,
        before the pack is opened (a changed source is never served). ``"background"``:
        the pack of the last open's fingerprint is opened at once and the source
        is checked in a daemon thread; a change logs a warning, sets ``is_stale``
        and the next open rebuilds. ``"never"``: that pack is trusted until
        ``force_recache=True`` (like a hand-written pickle cache). Use ``"open"``
        on a local disk (a ``stat`` costs ~3 µs: 20,000 files ~60 ms), ``"background"``
        on a network file system (a ``stat`` costs 0.1-1 ms: 20,000 files take
        seconds) or when opening must be instant, ``"never"`` for a source that
        does not change (an archive). A first open (new code or attributes) and
        a remote ``cache_dir`` check at open whatever the mode.
    audit:
        For a dataset that defines ``load_item()``: from a process's second pass
        over the pack on, a few samples read are loaded again and compared, within
        2% of the load time the pack saved (:mod:`mlcache.data.audit`). ``False``
        turns it off (so does ``MLCACHE_AUDIT=0``); a share (``0.05``), a dict or an
        :class:`~mlcache.AuditPolicy` sets the budget and the float tolerance.
    """

    #: names of the attributes that identify the data; None means every attribute
    #: set before ``CachedDataset.__init__``
    cache_on: ClassVar[tuple[str, ...] | None] = None
    #: names of attributes that do not change the samples (an output folder, a
    #: logger, a large table only ``load_item`` looks things up in): left out of
    #: the key, so they neither rebuild the pack nor cost a hash at each open
    cache_ignore: ClassVar[tuple[str, ...]] = ()
    #: the declared source (see the parameters of the same names)
    source_dir: str | os.PathLike[str] | None = None
    source_glob: str | None = None
    source_paths: Sequence[str | os.PathLike[str]] | None = None
    #: the source changed since the pack served was built (``check_source="background"``)
    is_stale: bool = False

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
        source_dir: str | os.PathLike[str] | None = None,
        source_glob: str | None = None,
        source_paths: Sequence[str | os.PathLike[str]] | None = None,
        check_source: str = "open",
        fill: str = "auto",
        audit: Any = True,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
        if fill not in FILLS:
            choices = ", ".join(map(repr, FILLS))
            raise ValueError(f"fill must be one of {choices}, got {fill!r}")
        check_mode(check_source)
        cls, base = type(self), CachedDataset
        declared = DeclaredSource.of(
            (source_dir, source_glob, source_paths),
            (self.source_dir, self.source_glob, self.source_paths),
            cls.__qualname__,
            (cls.source_files is not base.source_files, cls.source_items is not base.source_items),
        )
        names = self._key_attributes()
        try:
            identity = {name: getattr(self, name) for name in names}
            args_key = hash_value(identity if declared is None else (identity, declared.token()))
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
        self._key_names, self._declared = names, declared  # the declaration: in the key
        self._args_id, self._args_id_full = args_key[:16], args_key
        self._root = os.path.abspath(root)
        #: the folder the user chose (datasets/ of the default location is mlcache's)
        chosen = self._root if cache_dir is not None and self._remote is None else None
        self._chosen = chosen or os.path.abspath(default_location())
        self._folder = os.path.join(self._root, slug(f"{cls.__module__}.{cls.__qualname__}"))
        self._record = SourceRecord(self._root, self._folder, self._args_id_full, self._declared)
        self.transform, self._allow_pickle, self._num_workers = transform, allow_pickle, num_workers
        self._pack: PackedDataset | None = None
        self._filler: Filler | None = None
        #: the pack while its items are checked as they are first read (see
        #: mlcache.data.checking), and the items of the open once they were rechecked
        self._checking: ItemCheck | None = None
        self._recheck_lock = threading.RLock()
        self._pinned: list[Any] | None = None
        by_item = cls.load_item is not base.load_item and cls.load_source is base.load_source
        self._fill = fill if by_item else ""
        # what builds change is recorded by the code's shape (its version with
        # mutable values by type): editing the code learns anew. Walked at each
        # open, not once a process: a value rebound since (a sweep's SIZE = s, a
        # notebook cell) is another pack, never the samples of the one before
        self._shape = code_version(cls, fresh=True).shape[:16]
        self._state = self._read_learned()
        trusted = check_source != "open" and not force_recache and self._remote is None
        recorded = self._record.read() if trusted and not self._fill else None
        # the user's methods run from here on; the items are listed once
        with attributes_first(self), self._items_once():
            if self._fill:  # per item: the source counts item by item
                own = cls.source_fingerprint is not base.source_fingerprint
                # and by the files its attributes name (the table.npy of rows):
                # one changed is a new pack (every row may have changed)
                never = check_source == "never" and not force_recache
                files = "" if own else self._attribute_files(never)
                items_source = ("by item", files) if files else "by item"
                self._source = self.source_fingerprint() if own else items_source
                self.pack_path = self._name_pack()
                if check_source == "open" and not force_recache and not own:
                    self._checking = self._checked_as_read()
                if self._checking is None:
                    self._pack = self._open_filled(force_recache, progress, check_source)
            else:
                recorded = self._open_whole(recorded, force_recache, progress)
        if self._remote is None:  # the versions it replaces, once nobody reads them
            remove_replaced(self.pack_path)
        if not self._fill:  # a filled dataset records its item table's digest
            self._record.write(self._source)
        if recorded is not None and check_source == "background":
            self._record.check_in_background(self, self._source)
        #: ds[i] counts its reads for it (a pack of load_item's, here)
        self._audit: DatasetAuditor | None = None
        if self._fill and self._remote is None:
            load = self.load_item  # named as the seal's probe names it
            hooks = (self.__len__, self._filling, self._load_seconds, self.source_items, load)
            name = getattr(load, "__qualname__", "load_item")
            self._audit = dataset_auditor(audit, name, hooks, allow_pickle, self._fill_anew)

    # -- to override ---------------------------------------------------------------
    def load_source(self) -> Iterable[Mapping[str, Any]]:
        """Yield the samples, one dict of fields each. Override this, or both
        ``source_items()`` and ``load_item()`` (which can run in several processes)."""
        if type(self).load_item is CachedDataset.load_item:
            what = f"{type(self).__qualname__} must define load_source()"
            raise NotImplementedError(f"{what}, or source_items() and load_item()")
        items = self._open_items()[0]
        # in this process when workers would not pay (or cannot: a DataLoader's daemon)
        return Counted(load_in_workers(self, items, self._num_workers), len(items))

    def source_items(self) -> Iterable[Any]:
        """What ``load_item`` turns into samples (default: ``source_files()``)."""
        return self.source_files() or ()

    def load_item(self, item: Any) -> Mapping[str, Any]:
        """One sample from one source item (a file path, a row id...)."""
        raise NotImplementedError

    def source_files(self) -> Iterable[str | os.PathLike[str]] | None:
        """The files the samples come from (default: the declared source's): their
        paths, sizes and modification times make the default source fingerprint."""
        declared = getattr(self, "_declared", None)
        return declared.files() if declared is not None else None

    def source_fingerprint(self) -> str:
        """A string that changes when the source data changes.

        The default combines the files of ``source_files()`` (path, size,
        modification time, inode and ctime of each: one ``stat``), the files the
        key attributes name (``self.path = "table.npy"``; under a folder, those no
        item names: :mod:`mlcache.data.folders`) and, when the class defines
        ``source_items()``, its items: by value (:func:`~mlcache.keys.hashing.hash_value`:
        the list, its order and count), and each existing file or folder they
        name: an item that is a path, any path inside it (a tuple or list, a dict's values, a
        dataclass's fields: ``(path, label)``, ``{"image": path}``), or a name
        relative to a folder the dataset holds as an attribute
        (``os.listdir(self.root)``); a folder by every file in it. Opening then
        costs one ``stat`` per file: override this with something cheaper (a
        data version, a manifest's checksum) when that is too slow; what it
        returns is then the whole source fingerprint.
        """
        plain = type(self).source_items is CachedDataset.source_items
        declared = getattr(self, "_declared", None)
        local = self._remote is None
        if plain and declared is not None:
            found = declared.digest(local)  # one listdir, one stat per file
        elif plain:  # the items are source_files()
            found = source_fingerprint(self.source_files(), None, local=local)
        else:
            items, bases = self.source_items, self._folder_attributes()
            found = source_fingerprint(self.source_files(), items, bases, local)
        files = self._attribute_files()
        return hash_value(("attributes", found, files)) if files else found

    def item_fingerprint(self, item: Any) -> Any:
        """What ``item`` holds now, compared by value at each open to tell which
        items changed (only those are loaded again). The default: a file's size,
        modification time, inode and ctime (one ``stat``); a folder's files'; the
        files any part of the item names (a tuple or list, a dict's values, a
        dataclass: ``(path, label)``, ``{"image": path, "label": y}``), or names
        relative to a folder the dataset holds as an attribute; nothing for any
        other item (its value is its identity: opening says so once). Override
        it for items whose content the default cannot see (a row id: its
        ``updated_at``; a URL: its ETag)."""
        return default_fingerprint(item, self._folder_attributes(), self._remote is None)

    def _attribute_files(self, never: bool = False) -> str:
        """The files the key attributes name and those under its folder attributes
        that no item names (:func:`~mlcache.data.folders.attribute_source`; with
        ``never``, as ``check_source="never"`` trusts: as last recorded)."""
        values = {n: getattr(self, n, None) for n in self._key_names}
        record = self._record.path.removesuffix(".source") if self._remote is None else None
        places = (self._root, self._chosen, getattr(self._declared, "folder", None))
        #: each folder attribute's digest (the build records them: an output folder)
        found, self._folder_digests = attribute_source(
            values, type(self), places, record, self._named_paths, self._remote is None, never
        )
        return found

    def _named_paths(self) -> Named:
        """The names the items give (asked when a folder attribute is walked or its
        record checked): the declared files too."""
        files = list(self.source_files() or ())
        if type(self).source_items is CachedDataset.source_items:
            return names_of(files)
        items, keys = self._open_items()
        return names_of(files, items, self._folder_attributes(), keys)

    def _checked_as_read(self) -> ItemCheck | None:
        """The pack of the items of the open, each checked as it is first read
        (:mod:`mlcache.data.checking`), or None: then the open checks them all."""
        cls, base, declared = type(self), CachedDataset, self._declared
        if cls.item_fingerprint is not base.item_fingerprint or self._remote is not None:
            return None  # the user's fingerprints are taken at the open, as they were
        if os.path.exists(self.pack_path + ".fill"):
            return None  # being filled, or records a killed seal left: the open sees to it
        pack = self._try_open(False)
        if pack is None:
            return None
        if cls.source_items is base.source_items and declared is not None:
            if declared.folder is not None:
                return ItemCheck.of_folder(pack, declared.folder, self._listing_path(), True)
            items: list[Any] = list(declared.paths or ())
            keys = None
        else:
            items, keys = self._open_items()
        return ItemCheck.of_items(pack, items, self._folder_attributes(), True, keys)

    def _items_now(self) -> tuple[list[Any], np.ndarray]:
        """The items as they are now (those of the open, once rechecked after one
        changed), and their table: the key and the fingerprint of each
        (:func:`mlcache.data.items.item_table`)."""
        cls, base, declared = type(self), CachedDataset, self._declared
        own = cls.item_fingerprint is not base.item_fingerprint
        local = self._remote is None
        if cls.source_items is not base.source_items or own:
            declared = None  # the items are the class's own, or their fingerprints
        pinned = self._pinned
        if pinned is not None and declared is not None and declared.folder is not None:
            return pinned, folder_table(pinned, local)
        if pinned is not None:
            return pinned, item_table(pinned, bases=self._folder_attributes(), local=local)
        if declared is not None and declared.folder is not None:
            # each file stat'ed once; the listing recorded for the next open
            return listed_folder(declared, self._listing_path(), self._root, local)
        items, keys = self._open_items()
        if own:
            return items, item_table(items, self.item_fingerprint, keys=keys)
        table = item_table(items, bases=self._folder_attributes(), local=local, keys=keys)
        if len(table) and not table[:, 2:].any():  # none names a file: said once
            own = type(self).source_fingerprint is not CachedDataset.source_fingerprint
            say_unfingerprinted(type(self), len(table), lambda: own or self._source != "by item")
        return items, table

    # -- reading ----------------------------------------------------------------------
    def __mlcache_token__(self) -> tuple[Any, ...]:
        """Passed to a memoized function, it is keyed by its pack's fingerprint and
        its transform (by code), never by reading its samples."""
        return (self.packed.__mlcache_token__(), self.transform)

    @property
    def packed(self) -> PackedDataset:
        """The underlying :class:`PackedDataset` (opened on first use in a new process;
        a pack being filled is completed first: its missing items are loaded now)."""
        if self._checking is not None:  # handed out whole: every item is checked now
            self._rechecked()
        filler = self._filler
        if self._pack is None and filler is not None:
            try:  # (at the open, what the open rebinds is the dataset's: no check)
                filler.check_bound()
                sealed = filler.sealed or self._fill_now(filler, False)
            except Rebound as exc:  # SIZE = 3 since the open: unstored loads
                return self._rebound(exc.args[0])  # type: ignore[return-value]
            if sealed is None:
                why = "cannot be written (see the warning), so there is no pack file to hand out"
                raise OSError(f"mlcache: the pack {self.pack_path} {why}; ds[i] reads every sample")
            self._pack, self._filler = sealed, None
        if self._pack is None:  # a copy sent to another process (pickled)
            self._pack = self._open_again()
        return self._pack

    def __len__(self) -> int:
        if self._pack is None and self._filler is not None:
            return len(self._filler)
        if self._pack is None and self._checking is not None:
            self._checking.pack.check_file()  # as a pack's len() does
            return self._checking.n
        return len(self.packed)

    def _reading(self) -> PackedDataset | Filler | ItemCheck:
        """What ``ds[i]`` reads when the pack is not open: the pack whose items are
        checked as they are read (the pack, once all are), or the pack being filled
        (the sealed one, once complete)."""
        checking = self._checking
        if checking is not None:
            if checking.left > 0 or not checking.done():
                return checking
            self._pack, self._checking = checking.pack, None
            return self._pack
        filler = self._filler
        if filler is None:
            return self.packed
        if filler.sealed is None:
            return filler
        self._pack, self._filler = filler.sealed, None
        return self._pack

    def __getitem__(self, i: int | Many) -> Any:
        try:  # the pack without the property's call: this is the training loop
            sample = (self._pack if self._pack is not None else self._reading())[i]
        except PackCorrupted as exc:
            sample = self._rebuilt(exc)[i]
        except ItemChanged:  # since the pack was filled: the samples that changed are loaded
            sample = self._rechecked()[i]
        except Rebound as exc:  # a name the code reads, since the open: unstored loads
            sample = self._rebound(exc.args[0])[i]
        audit = self._audit
        if audit is not None:  # a countdown and a comparison (see mlcache.data.audit)
            audit.left -= 1
            if audit.left < 0:
                sample = audit.read(i, sample)
        if self.transform is None:
            return sample
        if sample.__class__ is list:  # ds[2:4], ds[[1, 2]]: a list of samples
            return [self.transform(s) for s in sample]
        return self.transform(sample)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        pack, declared = self._pack or getattr(self._checking, "pack", None), self._declared
        filler = self._filler if pack is None else None
        if filler is not None:
            with contextlib.suppress(Exception):  # what other processes (workers) filled
                if filler.look_again():
                    pack, filler = filler.sealed, None
        try:  # a repr never builds, nor raises
            n, fields = (len(pack), pack.field_names) if pack is not None else (None, None)
        except PackCorrupted:
            n = fields = None
        if filler is not None:
            n = len(filler)
        if declared is not None:
            paths, folder = declared.paths, declared.folder
            source = f"{len(paths)} files" if paths is not None else f"{folder}/{declared.pattern}"
        elif type(self).load_item is CachedDataset.load_item:
            source = "load_source()"
        else:
            source = "load_item(source_items())"
        return describe(
            type(self).__qualname__,
            samples=n,
            fields=fields,
            pack=self.pack_path,
            remote=None if self._remote is None else f"{self._remote[0]}/{self._remote_name()}",
            source=source,
            filled=None if filler is None else f"{filler.present} of {filler.n} samples",
            stale=self.is_stale,
        )

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """See :meth:`PackedDataset.get_batch` (``transform`` is not applied). A pack
        being filled is completed first: every item not yet stored is loaded now
        (``ds[indices]`` reads only those samples)."""
        try:
            return self.packed.get_batch(indices)
        except PackCorrupted as exc:
            self._rebuilt(exc)
            return self.packed.get_batch(indices)

    def _rechecked(self) -> PackedDataset | Filler | ItemCheck:
        """An item changed since its sample was stored (or the pack is handed out
        whole): check every item of the open now, as an open does, and read from
        the pack of the items as they are (the changed ones loaded again)."""
        with self._recheck_lock:  # threads reading at once: one rechecks
            checking = self._checking
            if checking is None:  # another thread rechecked meanwhile
                return self._reading()
            self._pinned = checking.items()
            self._pack = self._open_filled(False, False, "open")
            # only now: until the new pack (or filler) is in place, the others read
            # through the check, never the old pack opened again unchecked
            self._checking = None
        return self._reading()

    def _rebuilt(self, exc: PackCorrupted) -> PackedDataset | Filler | ItemCheck:
        """Damage found while reading: log it, rebuild the pack (or open the one
        another process rebuilt meanwhile; or fill it again) and read from that."""
        warn(f"mlcache: {exc}; rebuilding it", stacklevel=4)
        checking, self._checking = self._checking, None
        if checking is not None:  # the items of the open are kept
            self._pinned, self._pack = checking.items(), checking.pack
        pack = self._pack or (self._filler.sealed if self._filler is not None else None)
        damaged = pack.file_id if pack is not None else None
        if self._fill:
            self._pack = self._open_filled(False, False, "open", damaged=damaged)
            return self._reading()
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
        # this process's: a snapshot, namespaces, a file, a thread, an open's items, locks
        for name in ("_watched_before", "_bindings", "_record", "_listed", "_listing_once"):
            state.pop(name, None)
        state.pop("_recheck_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # the pack is mapped on first use
        self._recheck_lock = threading.RLock()
        self._record = SourceRecord(self._root, self._folder, self._args_id_full, self._declared)
        self._read_elsewhere()  # its code reads other values here: data/copies.py
