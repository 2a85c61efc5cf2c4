"""Packs on a remote store: ``PackedDataset("s3://bucket/train.pack")`` reads a
local copy, fetched once.

By default a pack is copied whole into a local folder (default:
``<mlcache cache>/remote-packs/<slug of its folder's URL>``) and memory-mapped
from there; DataLoader workers on the machine share that copy. The copy
records the remote object's size and ETag (or modification time): when the
remote pack is replaced, the next open fetches it again; otherwise an open
costs one metadata request.

With ``fetch="ranges"`` only what is read is fetched: the local copy is a sparse
file of the pack's size holding its header and index, and each checksummed
block is fetched with a range request the first time a read touches it (a
block whose local bytes already match its checksum is not fetched again), so a
worker reading a few samples of a large remote pack fetches a few blocks.

:func:`uploading` is the other way: ``pack(samples, "s3://bucket/x.pack")`` writes
the pack into the local copy's place, uploads it (one PUT), and then it is this
machine's copy of the remote pack (reading it fetches nothing).

Copies are made by :class:`mlcache.store.cached.LocalCopies`, as the function
cache's copies of remote entries are (with no size limit here: a pack is opened
by path, and removing it under a reader would lose nothing but time).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from .._atomic import open_regular, write_bytes_atomic
from .._util import slug
from ..errors import warn
from ..store.cached import LocalCopies
from ..store.local import default_location

__all__ = [
    "RangeFetcher",
    "filesystem",
    "is_url",
    "local_copy",
    "publish",
    "remote_lease",
    "sparse_copy",
    "uploading",
]


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path


def filesystem(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it (fsspec is an extra)."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {url} needs fsspec: pip install 'mlcache[s3]'") from None
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, path


def _ident(info: dict[str, Any]) -> dict[str, Any]:
    """What tells one version of a remote object from another."""
    return {
        "size": int(info.get("size") or 0),
        "version": str(
            info.get("ETag")
            or info.get("etag")
            or info.get("LastModified")
            or info.get("mtime")
            or info.get("created")  # memory://
        ),
    }


def publish(local: str, url: str, storage_options: dict[str, Any] | None = None) -> None:
    """Upload the pack file ``local`` to ``url`` (one PUT on an object store) and
    record that ``local`` is the copy of what is there now."""
    fs, path = filesystem(url, storage_options)
    fs.put_file(local, path)
    write_bytes_atomic(local + ".source.json", json.dumps(_ident(fs.info(path))).encode())


@contextlib.contextmanager
def remote_lease(
    root: str, storage_options: dict[str, Any] | None, name: str, leases_dir: str
) -> Iterator[None]:
    """One builder of the pack ``name`` of the remote folder ``root`` among every
    machine: its lease there (local bookkeeping in ``leases_dir``). Without a
    lease (read-only credentials...), or after an hour of another machine's
    build, it is built here too, with a warning."""
    from ..store.fsspec import FsspecStore

    url = f"{root}/{name}"
    store = FsspecStore(root, local_cache_dir=leases_dir, **(storage_options or {}))
    with contextlib.ExitStack() as stack:
        # stacklevel: the caller of CachedDataset.__init__, as for a local build
        try:
            held = stack.enter_context(store.lock(name, timeout=3600))
        except OSError as exc:  # no lease can be made (read-only credentials...)
            warn(f"mlcache: cannot lease {url} ({exc}); building it unlocked", stacklevel=6)
            held = True
        if not held:
            warn(
                f"mlcache: another machine has been building {url} for an hour; "
                "building it here too",
                stacklevel=6,
            )
        yield


def _copies(url: str, local_dir: str | None) -> LocalCopies:
    """The folder of this machine's copies of the packs in ``url``'s folder."""
    return LocalCopies(
        local_dir or os.path.join(default_location(), "remote-packs", slug(url.rsplit("/", 1)[0]))
    )


@contextlib.contextmanager
def uploading(
    url: str, storage_options: dict[str, Any] | None = None, local_dir: str | None = None
) -> Iterator[str]:
    """A local path to write the pack for ``url`` to. When the block ends without
    error, the file is uploaded to ``url`` (one PUT on an object store) and becomes
    this machine's copy of it (as :func:`local_copy` would have fetched it); on an
    error nothing is uploaded and the previous copy, if any, is left as it was."""
    fs, path = filesystem(url, storage_options)
    copies = _copies(url, local_dir)
    name = os.path.basename(path)
    record = copies.path(name) + ".source.json"
    with copies.replacing(name) as tmp:
        yield tmp
        fs.put_file(tmp, path)
        ident = _ident(fs.info(path))
        # the old record must never describe the new file: gone before the rename
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record)
    write_bytes_atomic(record, json.dumps(ident).encode())


def _copy(
    url: str,
    storage_options: dict[str, Any] | None,
    local_dir: str | None,
    suffix: str,
    fill: Callable[[Any, str, int, str], None],
) -> str:
    """The local file ``<pack name><suffix>`` for the pack at ``url``, made anew
    by ``fill(fs, path, size, tmp)`` when missing or when the remote object
    changed (its size or version differ from the copy's record)."""
    fs, path = filesystem(url, storage_options)
    try:
        ident = _ident(fs.info(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"no pack file at {url}") from None
    copies = _copies(url, local_dir)
    name = os.path.basename(path) + suffix
    local = copies.path(name)
    record = local + ".source.json"
    with contextlib.suppress(OSError, ValueError), open(record) as f:
        if json.load(f) == ident and os.path.getsize(local) == ident["size"]:
            copies.touch(name)
            return local
    with copies.replacing(name) as tmp:  # a reader of the old copy keeps its map
        fill(fs, path, ident["size"], tmp)
    write_bytes_atomic(record, json.dumps(ident).encode())  # never through a planted link
    return local


def local_copy(
    url: str, storage_options: dict[str, Any] | None = None, local_dir: str | None = None
) -> str:
    """The local path of the pack at ``url``, fetched whole if missing or changed."""
    return _copy(
        url, storage_options, local_dir, "", lambda fs, path, _, tmp: fs.get_file(path, tmp)
    )


class RangeFetcher:
    """Fills bytes of a sparse local copy from the remote pack, on demand."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, local: str) -> None:
        self._fs, self._path = filesystem(url, storage_options)
        self._local = local
        self.requests = 0

    def __call__(self, start: int, stop: int) -> None:
        data = self._fs.cat_file(self._path, start=start, end=stop)
        fd = open_regular(self._local, os.O_WRONLY)
        try:
            os.pwrite(fd, data, start)  # seen at once through the read-only map
        finally:
            os.close(fd)
        self.requests += 1


def _fill_sparse(fs: Any, path: str, size: int, tmp: str) -> None:
    """A sparse file of the pack's size with only its header and index written."""
    from .format import HEADER, read_header

    fd = os.open(tmp, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)  # sparse: no block is written yet
        head = fs.cat_file(path, start=0, end=HEADER.size)
        _n, i_off, _i_len, _sum = read_header(head, size, path)
        os.pwrite(fd, head, 0)
        os.pwrite(fd, fs.cat_file(path, start=i_off, end=size), i_off)
    finally:
        os.close(fd)


def sparse_copy(
    url: str, storage_options: dict[str, Any] | None = None, local_dir: str | None = None
) -> tuple[str, RangeFetcher]:
    """A sparse local file for the pack at ``url`` (header and index filled in),
    and the fetcher that fills the rest as it is read."""
    local = _copy(url, storage_options, local_dir, ".sparse", _fill_sparse)
    return local, RangeFetcher(url, storage_options, local)
