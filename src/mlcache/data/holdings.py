"""The dataset packs under a cache folder, as the byte budget counts them.

A :class:`~mlcache.data.CachedDataset` pack is, for eviction, an entry like a
function result: its cost is the time its build took (recorded beside it at the
build, ``.<pack name>.built``; each open that finds it counts a hit in
``.<pack name>.opens``), its size its bytes, its last use the time it
was last opened (an open refreshes its modification time). A pack a process
has open is counted in the budget and never removed (:func:`in_use`, the
shared ``flock`` every reader holds); a pack written by :func:`~mlcache.data.pack`
is the user's data, which mlcache cannot make again: it is not the cache's to
count or remove (``mlcache prune --all-packs`` is the user's call).

:func:`held` is the ``"packs"`` holder of :mod:`mlcache.store.holdings` (registered
there by name, imported at the first eviction that counts it), which the function
cache's eviction reads.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

from .._atomic import write_bytes_atomic
from ..store.holdings import Held
from .format import is_newer_pack
from .replaced import in_use
from .sources import remove_pack

__all__ = [
    "build_time",
    "dataset_class",
    "held",
    "note_open",
    "pack_paths",
    "pack_usage",
    "record_build_time",
]

#: opens counted per pack at most (one byte each)
MAX_OPENS = 1 << 20
#: how deep under the location dataset packs are looked for
PACK_DEPTH = 4

# A CachedDataset names its packs <folder of the class>/<attributes>-<version>.pack
# (mlcache.data.cached): the folder is the class's slug (its module.qualname, a dash
# and 8 hex digits), the pack 16 hex digits, a dash and 16 more, and each build
# records its attributes beside them (.<attributes>.args). All three must hold: a
# pack taken for the user's is only kept, one taken for cache could be removed.
_CLASS_FOLDER = re.compile(r"(?P<cls>[^/]+)-[0-9a-f]{8}")
_DATASET_PACK = re.compile(r"(?P<args>[0-9a-f]{16})-[0-9a-f]{16}\.pack")


def pack_paths(location: str) -> Iterator[str]:
    """The paths of the ``.pack`` files under the local folder ``location`` (not
    in hidden folders, at most :data:`PACK_DEPTH` folders down)."""
    if "://" in location:  # a remote cache's packs are not walked (nor a local "s3:" folder)
        return
    base = os.path.abspath(location)
    for root, dirs, files in os.walk(base):
        depth = root[len(base) :].count(os.sep)
        dirs[:] = [d for d in dirs if not d.startswith(".") and depth < PACK_DEPTH]
        for f in files:
            if f.endswith(".pack") and not f.startswith("."):
                yield os.path.join(root, f)


def dataset_class(path: str) -> str:
    """The class (``module.qualname``) of the CachedDataset that built the pack
    at ``path``, or "" when a CachedDataset did not (``pack()`` wrote it)."""
    folder, name = os.path.split(os.path.abspath(path))
    pack_name = _DATASET_PACK.fullmatch(name)
    cls = _CLASS_FOLDER.fullmatch(os.path.basename(folder))
    if pack_name is None or cls is None:
        return ""
    if not os.path.isfile(os.path.join(folder, f".{pack_name['args']}.args")):
        return ""
    return cls["cls"]


def _built_path(pack_path: str) -> str:
    folder, name = os.path.split(pack_path)
    return os.path.join(folder, f".{name}.built")


def _builds(pack_path: str) -> dict[str, float]:
    try:
        with open(_built_path(pack_path), "rb") as f:
            record = json.loads(f.read(4096))
        found = {k: float(record[k]) for k in ("seconds", "builds", "computed")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return found if all(v >= 0 for v in found.values()) else {}


def record_build_time(pack_path: str, seconds: float, root: str | None = None) -> None:
    """Record that building ``pack_path`` took ``seconds`` (what evicting it would
    cost), in ``.<pack name>.built`` beside it with the count and total of its
    builds. Never raises: a lost record only makes the pack's worth a guess."""
    try:
        before = _builds(pack_path)
        record = {
            "seconds": float(seconds),
            "builds": before.get("builds", 0) + 1,
            "computed": before.get("computed", 0.0) + float(seconds),
        }
        data = json.dumps(record).encode()
        write_bytes_atomic(_built_path(pack_path), data, durable=False, root=root)
    except Exception:  # advisory, as last-use times
        pass


def build_time(pack_path: str) -> float | None:
    """The seconds the (last) build of ``pack_path`` took, or None when not recorded."""
    return _builds(pack_path).get("seconds")


def note_open(pack_path: str, root: str) -> None:
    """An open found ``pack_path`` built (a hit): one byte appended to
    ``.<pack name>.opens``, so that what the pack saved can be told. An open is
    not a function-cache hit (a dataset is opened once per run and worker pool);
    never raises, and writes nothing when a link below ``root`` (the folder the
    user chose) leads the pack's folder out of it: a count is not worth a write
    through a planted link, nor a repair of the folder an open reads."""
    folder, name = os.path.split(pack_path)
    try:
        if not os.path.realpath(folder).startswith(os.path.join(os.path.realpath(root), "")):
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        fd = os.open(os.path.join(folder, f".{name}.opens"), flags, 0o600)
        try:
            if os.fstat(fd).st_size < MAX_OPENS:
                os.write(fd, b".")
        finally:
            os.close(fd)
    except OSError:  # a read-only cache folder: statistics only
        pass


def pack_usage(pack_path: str) -> dict[str, float]:
    """What the pack did: ``hits`` (opens that found it built), ``misses`` (its
    builds), ``computed`` (seconds its builds took), ``saved`` (hits times its
    build time); zeros where nothing was recorded."""
    builds = _builds(pack_path)
    folder, name = os.path.split(pack_path)
    try:
        hits = os.stat(os.path.join(folder, f".{name}.opens"), follow_symlinks=False).st_size
    except OSError:
        hits = 0
    return {
        "hits": hits,
        "misses": int(builds.get("builds", 0)),
        "computed": builds.get("computed", 0.0),
        "saved": hits * builds.get("seconds", 0.0),
    }


def held(location: str) -> list[Held]:
    """The packs under ``location`` that mlcache can make again (a CachedDataset
    built them), as the byte budget counts them."""
    found = []
    for path in pack_paths(location):
        if not dataset_class(path):
            continue
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if is_newer_pack(path):  # a newer mlcache's: not this one's to evict
            continue
        found.append(
            Held(
                name=os.path.relpath(path, location),
                size=st.st_size,
                last_used=max(st.st_atime, st.st_mtime),
                cost=build_time(path),
                in_use=in_use(path),
                remove=lambda path=path: remove_pack(path),  # type: ignore[misc]
            )
        )
    return found
