"""joblib's store backends as mlcache stores: users with their own backend switch too.

``mlcache.register_store_backend("mine", MyBackend)`` takes a subclass of
joblib's ``StoreBackendBase`` (a backend written for
``joblib.register_store_backend``): :func:`adapt` makes it a :class:`~mlcache.store.Store`
class that drives the backend through joblib's own primitives. It is tried by
the registration (see :data:`mlcache.store.adapters`) and imports nothing:
a joblib backend class exists only once joblib is imported.

The backend is made as joblib makes it: ``MyBackend()``, then
``configure(location, verbose=0, backend_options={"compress": False,
"mmap_mode": None, **backend_options})``; so an incomplete one (abstract
methods left) fails in ``Memory(...)`` with joblib's own ``TypeError`` ("Can't
instantiate abstract class ..."). What joblib's interface can say is used:

==========================  ===================================================
``open(name)``              ``_item_exists`` + ``_open_item(path, "rb")``
``write(name)``             buffered; ``create_location``, ``_open_item(tmp,
                            "wb")`` and ``_move_item(tmp, path)`` when the
                            block ends without error (atomic where the move is)
``exists(name)``            ``_item_exists``
``delete(name)``            ``clear_location``
``list(prefix)``            ``get_items()``: what the backend reports
``touch(names)``            nothing (joblib's backends keep their own times)
==========================  ===================================================

Entries are laid out as joblib lays out its calls: the entry ``a/b/key`` is
the file ``<location>/a/b/key/output.pkl`` (its bytes are mlcache's entry
format). A backend whose ``get_items`` finds joblib's call folders (its
folders named by 32 hex digits, as joblib's ``FileSystemStoreBackend``) thus
lists mlcache's results too, which ``clear``, ``bytes_limit`` and statistics
use; a backend that lists nothing keeps working, without them. It has no
locks, local paths or memory-mapping (a result is read into memory).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, ClassVar

from ..errors import EntryNotFound
from . import EntryStat, check_name

__all__ = ["JoblibStore", "adapt"]

#: the file holding an entry's bytes inside its folder (joblib's name for a result)
ITEM_FILE = "output.pkl"
#: a write larger than this is buffered in a temporary file rather than in memory
SPOOL_BYTES = 64 << 20


class JoblibStore:
    """A :class:`~mlcache.store.Store` over a joblib ``StoreBackendBase`` object.

    :func:`adapt` makes one subclass per backend class (its ``backend_class``);
    ``backend`` is the joblib backend object, configured as joblib configures it.
    """

    backend_class: ClassVar[type]

    def __init__(self, location: str, **backend_options: Any) -> None:
        # joblib's factory: an instance, then configure (an abstract backend
        # fails here, with Python's error, as it does in joblib)
        self.backend = self.backend_class()
        options = {"compress": False, "mmap_mode": None, **backend_options}
        self.backend.configure(location, verbose=0, backend_options=options)
        configured = getattr(self.backend, "location", None)
        self.location = configured if isinstance(configured, str) else str(location)

    def __repr__(self) -> str:
        return f"JoblibStore({self.backend!r})"

    def _folder(self, name: str) -> str:
        return os.path.join(self.location, *check_name(name).split("/"))

    def _file(self, name: str) -> str:
        return os.path.join(self._folder(name), ITEM_FILE)

    # -- the Store protocol -------------------------------------------------------------
    def open(self, name: str) -> BinaryIO:
        path = self._file(name)
        if not self.backend._item_exists(path):
            raise EntryNotFound(name)
        try:
            f = self.backend._open_item(path, "rb")
        except FileNotFoundError:  # removed since
            raise EntryNotFound(name) from None
        seekable = getattr(f, "seekable", None)
        if callable(seekable) and seekable():
            return f
        with f:  # entries are read at offsets: a stream is read whole
            return io.BytesIO(f.read())

    @contextlib.contextmanager
    def write(self, name: str) -> Iterator[BinaryIO]:
        path = self._file(name)
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as buf:
            yield buf  # type: ignore[misc]
            # published only when the block ended without error: a temporary name
            # first, then joblib's move, as joblib writes its own results
            buf.seek(0)
            folder = os.path.dirname(path)
            if not self.backend._item_exists(folder):
                self.backend.create_location(folder)
            tmp = f"{path}.{uuid.uuid4().hex}-{os.getpid()}"
            try:
                with self.backend._open_item(tmp, "wb") as out:
                    shutil.copyfileobj(buf, out)
                self.backend._move_item(tmp, path)
            except BaseException:
                with contextlib.suppress(Exception):
                    if self.backend._item_exists(tmp):
                        self.backend.clear_location(tmp)
                raise

    def exists(self, name: str) -> bool:
        # an entry's file, or a folder of entries (a function's, a version's)
        exists = self.backend._item_exists
        return bool(exists(self._file(name)) or exists(self._folder(name)))

    def delete(self, name: str) -> bool:
        folder = self._folder(name)
        if not self.backend._item_exists(folder):
            return False
        self.backend.clear_location(folder)
        return True

    def list(self, prefix: str = "") -> Iterator[EntryStat]:
        under = f"{check_name(prefix)}/" if prefix else ""
        for item in self.backend.get_items() or ():
            name = self._name_of(getattr(item, "path", item))
            if name is None or not name.startswith(under):
                continue
            used = getattr(item, "last_access", None)
            if isinstance(used, datetime.datetime):
                used = used.timestamp()
            size = getattr(item, "size", 0)
            yield EntryStat(name, int(size or 0), float(used or 0.0))

    def _name_of(self, path: Any) -> str | None:
        """The entry name of a path ``get_items`` reported; None for what is not one."""
        if not isinstance(path, str):
            return None
        rel = os.path.relpath(path, self.location)
        parts = rel.split(os.sep)
        if parts and parts[-1] == ITEM_FILE:
            parts.pop()
        name = "/".join(parts)
        try:
            return check_name(name)
        except ValueError:  # outside the location, a temporary, the location itself
            return None

    def touch(self, names: Iterable[str]) -> None:
        """joblib's backends have no way to record a use: reading is their record."""


def adapt(cls: type) -> type | None:
    """A :class:`JoblibStore` class for the joblib backend class ``cls``; None when
    ``cls`` is not one (joblib is not imported: no class can be one)."""
    base_module = sys.modules.get("joblib._store_backends")
    base = getattr(base_module, "StoreBackendBase", None)
    if base is None or not isinstance(cls, type) or not issubclass(cls, base):
        return None
    # named as the user's class: a registration again after a reload is the same
    # backend, and messages name what the user wrote
    return type(
        cls.__name__,
        (JoblibStore,),
        {"backend_class": cls, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
    )
