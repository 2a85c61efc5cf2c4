"""Sharded packs: one dataset as several pack files and a small manifest, so that
a worker reading part of a remote dataset fetches only the shards it reads, and
so that workers can build the shards in parallel.

A sharded pack is named ``<name>.shards`` (the manifest); its shards sit beside
it as ``<name>-<build>-00000.pack``, ``<name>-<build>-00001.pack``..., where
``<build>`` (12 hex digits, random) names one build. The manifest is JSON::

    {"format": "mlcache-shards", "version": 1, "n": <samples>,
     "shards": [{"name": "<name>-<build>-00000.pack", "n": <samples>,
                 "size": <bytes>, "index_sum": <the shard's index checksum>}, ...],
     "sum": <xxh3-64 of the canonical JSON of the other keys>}

A sharded pack is replaced as atomically as a plain one: a build writes new
shard names, then the manifest, last, by one rename. So a reader never sees a
manifest naming a shard that is not there, a build that fails half way leaves
the previous version whole, and a reader keeps reading the version it opened
while another is built. Each shard's index checksum (which covers the
checksum of every block) is in the manifest and is checked when the shard is
opened: a shard replaced by hand is refused, never read as part of another
version.

Old versions go once no reader can use them. A local build holds a lock file,
``<name>-<build>.lock``: its builder, and every process that opened the
manifest naming it (a shared ``flock``, taken when the manifest is opened or a
pickled dataset is reopened, and released when the dataset is freed or its
process ends, even killed). After writing its manifest, a build removes the
shards of every other build of ``<name>`` whose lock nobody holds (a build
killed half way, a version nobody reads any more), and shards of the old
unversioned names that its manifest does not name. On an fsspec URL there are
no locks: the shards of older builds stay until removed by hand.
:func:`mlcache.data.open_pack` (or ``ShardedDataset("x.shards")``, a path or a
URL) opens a sharded pack; ``PackedDataset`` refuses a manifest.

A sharded pack is built on plain packs: this module writes and reads each shard
with :mod:`mlcache.data.writer` and :mod:`mlcache.data.reader`, which never
import it.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import xxhash

from .._atomic import write_bytes_atomic
from .._util import parse_bytes
from ..errors import PackChanged, PackCorrupted
from .fetch import is_url, local_copy
from .format import MAGIC
from .reader import SHARDS_SUFFIX, PackedDataset
from .sequence import Many, Pack, sample_index, sample_indices
from .writer import write_pack

__all__ = ["SHARDS_SUFFIX", "ShardedDataset", "pack_sharded", "pack_with_dask"]

logger = logging.getLogger("mlcache")


def _base(manifest: str) -> str:
    return manifest.rstrip("/").rsplit("/", 1)[-1][: -len(SHARDS_SUFFIX)]


def _shard_name(manifest: str, build: str, k: int) -> str:
    return f"{_base(manifest)}-{build}-{k:05d}.pack"


def _new_build() -> str:
    return secrets.token_hex(6)


def _build_of(manifest: str, shard: str) -> str | None:
    """The build id in a shard's name (None for the old unversioned names)."""
    m = re.fullmatch(re.escape(_base(manifest)) + r"-([0-9a-f]{12})-\d{5}\.pack", shard)
    return m.group(1) if m else None


def _lock_path(manifest: str, build: str) -> str:
    return os.path.join(os.path.dirname(manifest), f"{_base(manifest)}-{build}.lock")


def _hold(path: str, *, create: bool = False) -> int | None:
    """A shared flock on the build lock file ``path``, as an open descriptor, or
    None when there is no such file (the build was removed, or it is a copy made
    without its lock files)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDONLY
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:  # removed while we waited for it
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _in_use(manifest: str) -> set[str]:
    """The shard names, and their builds, that the manifest now at ``manifest``
    names (nothing if it is missing or unreadable)."""
    try:
        with open(manifest, "rb") as f:
            names = [str(s["name"]) for s in json.loads(f.read())["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return set(names) | {b for b in (_build_of(manifest, n) for n in names) if b}


def _remove_unused(manifest: str) -> None:
    """Delete the shards (and lock files) of the builds of ``manifest`` that the
    manifest does not name and no process holds, and old unversioned shards that
    it does not name."""
    keep = _in_use(manifest)
    folder, base = os.path.dirname(manifest), _base(manifest)
    shard = re.compile(re.escape(base) + r"-(?:([0-9a-f]{12})-)?\d{5}\.pack")
    lock = re.compile(re.escape(base) + r"-([0-9a-f]{12})\.lock")
    builds: dict[str | None, list[str]] = {}
    locks: set[str] = set()
    for name in os.listdir(folder):
        if (m := shard.fullmatch(name)) is not None:
            builds.setdefault(m.group(1), []).append(name)
        elif (m := lock.fullmatch(name)) is not None:
            locks.add(m.group(1))
    for build in (set(builds) | locks) - keep:
        names = [n for n in builds.get(build, []) if n not in keep]
        fd = None
        if build is not None:
            # looked up again, not taken from the listing (which may have missed a
            # lock made while it ran): a build's lock is made before its shards, so
            # a shard seen without a lock that exists now is debris of a removal
            try:
                fd = os.open(_lock_path(manifest, build), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.debug(
                    "mlcache: cannot open the lock of build %s of %s: %s", build, base, exc
                )
                continue
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:  # held: in use, or being built
                    os.close(fd)
                    if exc.errno != errno.EWOULDBLOCK:
                        logger.debug("mlcache: cannot lock build %s of %s: %s", build, base, exc)
                    continue
        try:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
            if fd is not None:  # last: a shard without its lock is debris of this
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_lock_path(manifest, str(build)))
            if names:
                logger.info("mlcache: removed %d shards of an older build of %s", len(names), base)
        except OSError as exc:  # housekeeping: never fail the build for it
            logger.debug("mlcache: could not remove a build of %s: %s", base, exc)
        finally:
            if fd is not None:
                os.close(fd)


def _sibling(manifest: str, name: str) -> str:
    return (
        manifest.rsplit("/", 1)[0] + "/" + name
        if is_url(manifest)
        else os.path.join(os.path.dirname(manifest), name)
    )


def _manifest_bytes(n: int, shards: list[dict[str, Any]]) -> bytes:
    body = {"format": "mlcache-shards", "version": 1, "n": n, "shards": shards}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "sum": xxhash.xxh3_64_intdigest(canon)}).encode()


def _sample_bytes(sample: Mapping[str, Any]) -> int:
    """About how many bytes a sample takes in a pack."""
    total = 0
    for v in sample.values():
        if isinstance(v, np.ndarray):
            total += v.nbytes + 8 * v.ndim
        elif isinstance(v, (bytes, str)):
            total += len(v) + 8
        else:
            total += 8
    return total


def pack_sharded(
    samples: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    shard_size: int | str,
    **pack_options: Any,
) -> ShardedDataset:
    """Write ``samples`` as shards of about ``shard_size`` bytes each, then the
    manifest ``path`` (which must end in ``.shards``); see :func:`mlcache.data.pack`
    for ``pack_options``."""
    if is_url(os.fspath(path)):  # else a local folder named "s3:" (see pack())
        raise ValueError(f"sharded packs are written to local paths only: got {path!r}")
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(SHARDS_SUFFIX):
        raise ValueError(f"a sharded pack's name ends in {SHARDS_SUFFIX}: got {path!r}")
    budget = parse_bytes(shard_size)
    if not budget or budget <= 0:
        raise ValueError(f"shard_size must be a positive size, got {shard_size!r}")
    source = iter(samples)
    carry = next(source, None)  # the next shard's first sample
    if carry is None:
        raise ValueError(f"no samples to pack into {path}: the source is empty")

    def chunk() -> Iterator[Mapping[str, Any]]:
        nonlocal carry
        used = 0
        while carry is not None:
            size = _sample_bytes(carry)
            if used and used + size > budget:
                return  # ``carry`` opens the next shard
            used += size
            sample, carry = carry, next(source, None)
            yield sample

    def write_shards(build: str) -> list[dict[str, Any]]:
        shards: list[dict[str, Any]] = []
        while carry is not None:
            name = _shard_name(path, build, len(shards))
            shard_path = os.path.join(os.path.dirname(path), name)
            done = write_pack(chunk(), shard_path, **pack_options)
            shards.append(_shard_info(name, done, shard_path))
            del done  # its map: the shard is opened again when read
        return shards

    return _build_version(path, write_shards, pack_options.get("allow_pickle", False), None)


def _build_version(
    path: str,
    write_shards: Callable[[str], list[dict[str, Any]]],
    allow_pickle: bool,
    storage_options: dict[str, Any] | None,
) -> ShardedDataset:
    """The one build of a new version of the sharded pack ``path``, serial or on a
    Dask cluster: ``write_shards(build)`` writes the shards of a new build id and
    returns their manifest entries, while (for a local path) this process holds
    the build's lock, so that no other build removes them; on failure they go
    and the previous version is untouched. Then the manifest, last, by one
    rename (one write for a URL), and the builds nobody holds go."""
    build = _new_build()
    local = not is_url(path)
    held = None
    if local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        held = _hold(_lock_path(path, build), create=True)  # our shards, while we write them
    try:
        try:
            shards = write_shards(build)
        except BaseException:
            if local:  # the previous version (manifest and shards) is untouched; ours go now
                folder = os.path.dirname(path)
                with contextlib.suppress(OSError):
                    for name in os.listdir(folder):
                        if _build_of(path, name) == build:
                            os.unlink(os.path.join(folder, name))
                    os.unlink(_lock_path(path, build))
            raise
        manifest = _manifest_bytes(sum(s["n"] for s in shards), shards)
        if local:
            write_bytes_atomic(path, manifest)  # last, by one rename
        else:
            from .fetch import filesystem

            fs, remote = filesystem(path, storage_options)
            fs.pipe_file(remote, manifest)  # last: the shards are all there
        opened = ShardedDataset(path, allow_pickle=allow_pickle, storage_options=storage_options)
        if local:
            _remove_unused(path)
        return opened
    finally:
        if held is not None:
            os.close(held)


def _shard_info(name: str, done: PackedDataset, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "n": len(done),
        "size": os.path.getsize(path),
        "index_sum": done.index_sum,
    }


def _load_chunk(items: list[Any], load_item: Callable[[Any], Mapping[str, Any]]) -> Iterator[Any]:
    for item in items:
        yield load_item(item)


def _pack_shard(
    items: list[Any],
    target: str,
    load_item: Callable[[Any], Mapping[str, Any]],
    storage_options: dict[str, Any] | None,
    allow_pickle: bool,
) -> dict[str, Any]:
    """On a worker: load ``items``, pack them, put the shard at ``target``."""
    import tempfile

    from .fetch import publish

    with tempfile.TemporaryDirectory(prefix="mlcache-shard-") as tmp:
        local = target if not is_url(target) else os.path.join(tmp, target.rsplit("/", 1)[1])
        done = write_pack(
            _load_chunk(items, load_item), local, progress=False, allow_pickle=allow_pickle
        )
        info = _shard_info(os.path.basename(local), done, local)
        if is_url(target):
            publish(local, target, storage_options)
        return info


def pack_with_dask(
    items: Sequence[Any],
    load_item: Callable[[Any], Mapping[str, Any]],
    path: str,
    client: Any,
    *,
    items_per_shard: int = 1000,
    storage_options: dict[str, Any] | None = None,
    allow_pickle: bool = False,
) -> ShardedDataset:
    """Build a sharded pack on a Dask cluster: each task loads ``items_per_shard``
    items with ``load_item`` (a picklable function) and writes them as one shard,
    next to the manifest ``path`` (a local path every worker can write, or a URL);
    the manifest is written last, by the caller."""
    if not str(path).endswith(SHARDS_SUFFIX):
        raise ValueError(f"a sharded pack's name ends in {SHARDS_SUFFIX}: got {path!r}")
    path = str(path) if is_url(str(path)) else os.path.abspath(os.fspath(path))
    chunks = [list(items[i : i + items_per_shard]) for i in range(0, len(items), items_per_shard)]
    if not chunks:
        raise ValueError(f"no items to pack into {path}")

    def write_shards(build: str) -> list[dict[str, Any]]:
        targets = [_sibling(path, _shard_name(path, build, k)) for k in range(len(chunks))]
        futures = client.map(
            _pack_shard,
            chunks,
            targets,
            load_item=load_item,
            storage_options=storage_options,
            allow_pickle=allow_pickle,
            pure=False,
        )
        shards: list[dict[str, Any]] = client.gather(futures)
        return shards

    return _build_version(path, write_shards, allow_pickle, storage_options)


class ShardedDataset(Pack):
    """A sharded pack read as one dataset: ``len(ds)``, ``ds[i]``,
    ``ds.get_batch(indices)``. Shards are opened (and, for a URL, fetched) the
    first time a sample in them is read. The parameters are those of
    :class:`~mlcache.data.PackedDataset`, for every shard.

    The dataset reads the build its manifest named when it was opened, whole,
    for as long as it lives (and so does a copy pickled to a worker), even while
    the pack is rebuilt under the same name: see the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_pickle: bool = False,
        storage_options: dict[str, Any] | None = None,
        local_cache_dir: str | None = None,
        fetch: str = "whole",
        writable: bool = True,
    ) -> None:
        self.path = str(path) if is_url(str(path)) else os.path.abspath(os.fspath(path))
        self.allow_pickle = allow_pickle
        self.writable = writable
        self._options = (storage_options, local_cache_dir, fetch)  # for each shard
        for _attempt in range(5):
            where = (
                local_copy(self.path, storage_options, local_cache_dir)
                if is_url(self.path)
                else self.path
            )
            try:
                with open(where, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise FileNotFoundError(f"no sharded pack at {self.path}") from None
            if data.startswith(MAGIC):
                raise ValueError(
                    f"{self.path} is a plain pack, not a sharded pack's manifest: open it "
                    "with PackedDataset or mlcache.data.open_pack"
                )
            try:
                manifest = json.loads(data)
                shards = manifest["shards"]
                body = {k: manifest[k] for k in ("format", "version", "n", "shards")}
                canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                if manifest["format"] != "mlcache-shards" or manifest[
                    "sum"
                ] != xxhash.xxh3_64_intdigest(canon):
                    raise ValueError("checksum mismatch")
                counts = [int(s["n"]) for s in shards]
                names = [str(s["name"]) for s in shards]
                sums = [int(s["index_sum"]) for s in shards]
            except (ValueError, KeyError, TypeError) as exc:
                raise PackCorrupted(f"{self.path}: bad shard manifest ({exc})") from None
            if self._take(names, counts, sums, manifest["sum"]):
                return
            # the build it names was removed between reading it and locking it: a
            # newer manifest replaced it meanwhile
        raise PackChanged(f"{self.path}: rebuilt again and again while being opened")

    def _take(self, names: list[str], counts: list[int], sums: list[int], total: int) -> bool:
        """Use this manifest's shards, holding their build's lock (so that no
        build removes them while this dataset lives); False if the build is gone."""
        if any(os.path.basename(n) != n or not n.endswith(".pack") for n in names):
            raise PackCorrupted(f"{self.path}: a shard name points elsewhere")
        if not names or len(counts) != len(names) or len(sums) != len(names):
            raise PackCorrupted(f"{self.path}: bad shard manifest (no shards)")
        self._names, self._counts, self._sums = names, counts, sums
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        self._n = self._starts[-1]
        self._sum = total
        self._open: dict[int, PackedDataset] = {}
        build = _build_of(self.path, names[0])
        if is_url(self.path) or build is None:
            return True  # no locks on a URL, nor on the old unversioned names
        lock = _lock_path(self.path, build)
        fd = _hold(lock)
        if fd is None:
            # no lock file: the build was removed (the manifest changed since it was
            # read), or its folder was copied without lock files (the shards are there)
            return os.path.exists(os.path.join(os.path.dirname(self.path), names[0]))
        weakref.finalize(self, os.close, fd)
        return True

    @classmethod
    def _of_build(
        cls,
        path: str,
        allow_pickle: bool,
        options: tuple[dict[str, Any] | None, str | None, str],
        manifest: tuple[list[str], list[int], list[int], int],
        writable: bool,
    ) -> ShardedDataset:
        """The build that ``manifest`` (as a dataset read it) names; PackChanged if
        it has been removed since."""
        ds: ShardedDataset = object.__new__(cls)
        ds.path, ds.allow_pickle, ds._options, ds.writable = path, allow_pickle, options, writable
        if not ds._take(*manifest):
            raise PackChanged(
                f"{path}: the build this dataset was opened on has been removed since "
                "(rebuilt, and nobody held it): open it again to read the new one"
            )
        return ds

    def __reduce__(self) -> tuple[Any, ...]:
        # the manifest as read (the name may hold a newer build by the time the
        # copy is opened): the copy reads the same build, or refuses if it is gone
        manifest = (self._names, self._counts, self._sums, self._sum)
        args = (self.path, self.allow_pickle, *self._options, manifest, self.writable)
        return (_reopen_build, args)

    def __len__(self) -> int:
        self.check_file()  # the start of an epoch: see PackedDataset
        return self._n

    def check_file(self) -> None:
        """Check the file of every shard opened so far (see
        :meth:`PackedDataset.check_file`)."""
        for shard in self._open.values():
            shard.check_file()

    @property
    def field_names(self) -> list[str]:
        """The fields of every sample (those of the first shard, opened for it)."""
        return self._shard(0).field_names

    def __repr__(self) -> str:
        return f"ShardedDataset({self.path!r}, samples={self._n}, shards={len(self._names)})"

    def __mlcache_token__(self) -> tuple[Any, ...]:
        """Keyed by every shard's index checksum (which covers all its blocks)."""
        return ("shards", self._n, tuple(self._sums))

    @property
    def shards_opened(self) -> int:
        """How many shards this dataset has opened (fetched, for a URL)."""
        return len(self._open)

    def _shard(self, k: int) -> PackedDataset:
        ds = self._open.get(k)
        if ds is None:
            options, local, fetch = self._options
            ds = PackedDataset(
                _sibling(self.path, self._names[k]),
                allow_pickle=self.allow_pickle,
                storage_options=options,
                local_cache_dir=local,
                fetch=fetch,
                writable=self.writable,
            )
            if ds.index_sum != self._sums[k] or len(ds) != self._counts[k]:
                raise PackCorrupted(
                    f"{self.path}: shard {self._names[k]} is not the one the manifest names "
                    "(rebuilt since, or left by a rebuild that failed)"
                )
            self._open[k] = ds
        return ds

    def _locate(self, i: Any) -> tuple[int, int]:
        j = sample_index(i, self._n)
        k = bisect.bisect_right(self._starts, j) - 1
        return k, j - self._starts[k]

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: Many) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, (int, np.integer)):  # ds[2:4], ds[[1, 2]]
            return [self[j] for j in sample_indices(i, self._n) or ()]
        k, j = self._locate(i)
        return self._shard(k)[j]

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``indices`` as one dict: arrays of one shape stacked, other
        fields as lists."""
        rows = [self[i] for i in indices]
        if not rows:
            return {}
        out: dict[str, Any] = {}
        for name in rows[0]:
            values = [r[name] for r in rows]
            arrays = all(isinstance(v, np.ndarray) for v in values)
            same = arrays and len({v.shape for v in values}) == 1
            out[name] = np.stack(values) if same else values
        return out


def _reopen(  # what ShardedDatasets pickled before issue 13 name
    path: str, allow_pickle: bool, options: dict[str, Any] | None, local: str | None, fetch: str
) -> ShardedDataset:
    return ShardedDataset(
        path, allow_pickle=allow_pickle, storage_options=options, local_cache_dir=local, fetch=fetch
    )


def _reopen_build(
    path: str,
    allow_pickle: bool,
    options: dict[str, Any] | None,
    local: str | None,
    fetch: str,
    manifest: tuple[list[str], list[int], list[int], int],
    writable: bool = True,
) -> ShardedDataset:
    """A pickled ShardedDataset: the build it had opened, whatever the manifest
    names now; PackChanged if that build has been removed since."""
    return ShardedDataset._of_build(path, allow_pickle, (options, local, fetch), manifest, writable)
