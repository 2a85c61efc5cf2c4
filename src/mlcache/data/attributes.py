"""What a dataset's attributes and items give the checks of an open: the folders
among its attributes (items may name files there, and their files no item names
count: :mod:`mlcache.data.folders`), and the items of the open with their keys,
listed once however many checks ask (the folder attributes' names check, the
check of each item as first read, a fill). A base of
:class:`~mlcache.data.cached.CachedDataset`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

from .checking import LISTING_SUFFIX
from .items import item_keys
from .sources import SourceRecord

__all__ = ["OpenItems"]


class OpenItems:
    """The folder attributes and the items of an open; the dataset sets the
    attributes below."""

    _root: str
    _record: SourceRecord
    #: the items of the open and their keys (None before they are listed, or
    #: outside an open: each check then lists them as they are now)
    _listed: tuple[list[Any], bytes] | None = None
    _listing_once: bool = False

    def source_items(self) -> Iterable[Any]:  # the dataset's (overridden there)
        raise NotImplementedError

    @contextlib.contextmanager
    def _items_once(self) -> Iterator[None]:
        """Within it (the open), :meth:`_open_items` lists the items once."""
        self._listing_once = True
        try:
            yield
        finally:
            self._listing_once, self._listed = False, None

    def _open_items(self) -> tuple[list[Any], bytes]:
        """The items, ``list(source_items())``, and their keys in the item table
        (:func:`~mlcache.data.items.item_keys`): listed once in
        an open (a user's listing of 20,000 files costs ~10 ms), as they are now
        outside one."""
        listed = self._listed
        if listed is None:
            items = list(self.source_items())
            listed = (items, item_keys(items))
            if self._listing_once:
                self._listed = listed
        return listed

    def _folder_attributes(self) -> list[str]:
        """The dataset's attributes that are folders (items may name files in
        them), the cache's own folder left out."""
        root = getattr(self, "_root", None)
        inside = os.path.join(root, "") if root else None
        found = []
        # a copy: the background check reads them while the open sets others
        for v in list(vars(self).values()):
            if isinstance(v, (str, os.PathLike)) and os.path.isdir(v):
                path = os.path.abspath(v)
                if inside is None or not os.path.join(path, "").startswith(inside):
                    found.append(os.fspath(v))
        return found[:4]

    def _listing_path(self) -> str:
        """Where the listing of a declared folder is recorded (beside its ``.source``)."""
        return self._record.path.removesuffix(".source") + LISTING_SUFFIX
