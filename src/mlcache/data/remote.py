"""Packs on a remote store: ``PackedDataset("s3://bucket/train.pack")`` reads a
local copy, fetched once.

A pack is one file, so it is copied whole into a local folder (default:
``<mlcache cache>/remote-packs/<slug of its folder's URL>``) and memory-mapped
from there; DataLoader workers on the machine share that copy. The copy
records the remote object's size and ETag (or modification time): when the
remote pack is replaced, the next open fetches it again; otherwise an open
costs one metadata request.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

__all__ = ["is_url", "local_copy", "publish"]


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path


def _fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
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
            info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
        ),
    }


def publish(local: str, url: str, storage_options: dict[str, Any] | None = None) -> None:
    """Upload the pack file ``local`` to ``url`` (one PUT on an object store) and
    record that ``local`` is the copy of what is there now."""
    fs, path = _fs(url, storage_options)
    fs.put_file(local, path)
    with open(local + ".source.json", "w") as f:
        json.dump(_ident(fs.info(path)), f)


def local_copy(
    url: str, storage_options: dict[str, Any] | None = None, local_dir: str | None = None
) -> str:
    """The local path of the pack at ``url``, fetched if missing or changed."""
    from .._default import default_location
    from ..fingerprint import slug

    fs, path = _fs(url, storage_options)
    try:
        ident = _ident(fs.info(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"no pack file at {url}") from None
    folder = local_dir or os.path.join(
        default_location(), "remote-packs", slug(url.rsplit("/", 1)[0])
    )
    os.makedirs(folder, mode=0o700, exist_ok=True)
    local = os.path.join(folder, os.path.basename(path))
    record = local + ".source.json"
    with contextlib.suppress(OSError, ValueError), open(record) as f:
        if json.load(f) == ident and os.path.getsize(local) == ident["size"]:
            os.utime(local)
            return local
    fd, tmp = tempfile.mkstemp(prefix=".mlcache-", dir=folder)
    os.close(fd)
    try:
        fs.get_file(path, tmp)
        os.replace(tmp, local)  # a reader of the old copy keeps its map
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with open(record, "w") as f:
        json.dump(ident, f)
    return local
