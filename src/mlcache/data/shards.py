"""Sharded packs: one dataset as several pack files and a small manifest, so that
a worker reading part of a remote dataset fetches only the shards it reads, and
so that workers can build the shards in parallel.

A sharded pack is named ``<name>.shards`` (the manifest); its shards sit beside
it as ``<name>-00000.pack``, ``<name>-00001.pack``... The manifest is JSON::

    {"format": "mlcache-shards", "version": 1, "n": <samples>,
     "shards": [{"name": "<name>-00000.pack", "n": <samples>, "size": <bytes>,
                 "index_sum": <the shard's index checksum>}, ...],
     "sum": <xxh3-64 of the canonical JSON of the other keys>}

It is written last (after every shard is complete), so a reader never sees a
manifest naming a shard that is not there. Each shard's index checksum (which
covers the checksum of every block) is in the manifest and is checked when the
shard is opened: a shard rebuilt since, or left by a rebuild that failed half
way, is refused, never read as part of another version of the dataset.
``PackedDataset("x.shards")`` (a path or a URL) returns a :class:`ShardedDataset`.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from .._atomic import write_bytes_atomic
from ..config import parse_bytes
from .format import PackCorrupted
from .remote import is_url, local_copy

__all__ = ["SHARDS_SUFFIX", "ShardedDataset", "pack_sharded", "pack_with_dask"]

SHARDS_SUFFIX = ".shards"


def _shard_name(manifest: str, k: int) -> str:
    base = os.path.basename(manifest)[: -len(SHARDS_SUFFIX)]
    return f"{base}-{k:05d}.pack"


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
    from .writer import pack

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
    shards: list[dict[str, Any]] = []

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

    while carry is not None:
        name = _shard_name(path, len(shards))
        shard_path = os.path.join(os.path.dirname(path), name)
        done = pack(chunk(), shard_path, **pack_options)
        shards.append(_shard_info(name, done, shard_path))
    total = sum(s["n"] for s in shards)
    write_bytes_atomic(path, _manifest_bytes(total, shards))
    return ShardedDataset(path, allow_pickle=pack_options.get("allow_pickle", False))


def _shard_info(name: str, done: Any, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "n": len(done),
        "size": os.path.getsize(path),
        "index_sum": done._index_sum,
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

    from .remote import publish
    from .writer import pack

    with tempfile.TemporaryDirectory(prefix="mlcache-shard-") as tmp:
        local = target if not is_url(target) else os.path.join(tmp, target.rsplit("/", 1)[1])
        done = pack(_load_chunk(items, load_item), local, progress=False, allow_pickle=allow_pickle)
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
    targets = [_sibling(path, _shard_name(path, k)) for k in range(len(chunks))]
    futures = client.map(
        _pack_shard,
        chunks,
        targets,
        load_item=load_item,
        storage_options=storage_options,
        allow_pickle=allow_pickle,
        pure=False,
    )
    shards = client.gather(futures)
    manifest = _manifest_bytes(sum(s["n"] for s in shards), shards)
    if is_url(path):
        from .remote import _fs

        fs, remote = _fs(path, storage_options)
        fs.pipe_file(remote, manifest)  # last: the shards are all there
    else:
        write_bytes_atomic(path, manifest)
    return ShardedDataset(path, allow_pickle=allow_pickle, storage_options=storage_options)


class ShardedDataset(Sequence[dict[str, Any]]):
    """A sharded pack read as one dataset: ``len(ds)``, ``ds[i]``,
    ``ds.get_batch(indices)``. Shards are opened (and, for a URL, fetched) the
    first time a sample in them is read."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_pickle: bool = False,
        storage_options: dict[str, Any] | None = None,
        local_cache_dir: str | None = None,
        fetch: str = "whole",
    ) -> None:
        self.path = str(path) if is_url(str(path)) else os.path.abspath(os.fspath(path))
        self.allow_pickle = allow_pickle
        self._options = (storage_options, local_cache_dir, fetch)  # for each shard
        where = (
            local_copy(self.path, storage_options, local_cache_dir)
            if is_url(self.path)
            else self.path
        )
        try:
            with open(where, "rb") as f:
                manifest = json.loads(f.read())
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
        except FileNotFoundError:
            raise FileNotFoundError(f"no sharded pack at {self.path}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PackCorrupted(f"{self.path}: bad shard manifest ({exc})") from None
        if any(os.path.basename(n) != n or not n.endswith(".pack") for n in names):
            raise PackCorrupted(f"{self.path}: a shard name points elsewhere")
        self._names, self._counts, self._sums = names, counts, sums
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        self._n = self._starts[-1]
        self._sum = manifest["sum"]
        self._open: dict[int, Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.path, self.allow_pickle, *self._options))

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"ShardedDataset({self.path!r}, samples={self._n}, shards={len(self._names)})"

    def __mlcache_token__(self) -> tuple[Any, ...]:
        """Keyed by every shard's index checksum (which covers all its blocks)."""
        return ("shards", self._n, tuple(self._sums))

    @property
    def shards_opened(self) -> int:
        """How many shards this dataset has opened (fetched, for a URL)."""
        return len(self._open)

    def _shard(self, k: int) -> Any:
        ds = self._open.get(k)
        if ds is None:
            from .reader import PackedDataset

            options, local, fetch = self._options
            ds = PackedDataset(
                _sibling(self.path, self._names[k]),
                allow_pickle=self.allow_pickle,
                storage_options=options,
                local_cache_dir=local,
                fetch=fetch,
            )
            if ds._index_sum != self._sums[k] or len(ds) != self._counts[k]:
                raise PackCorrupted(
                    f"{self.path}: shard {self._names[k]} is not the one the manifest names "
                    "(rebuilt since, or left by a rebuild that failed)"
                )
            self._open[k] = ds
        return ds

    def _locate(self, i: int) -> tuple[int, int]:
        from .reader import sample_index

        j = sample_index(i, self._n)
        k = bisect.bisect_right(self._starts, j) - 1
        return k, j - self._starts[k]

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        k, j = self._locate(i)
        return self._shard(k)[j]

    def get_batch(self, indices: Sequence[int]) -> dict[str, Any]:
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


def _reopen(
    path: str, allow_pickle: bool, options: dict[str, Any] | None, local: str | None, fetch: str
) -> ShardedDataset:
    return ShardedDataset(
        path, allow_pickle=allow_pickle, storage_options=options, local_cache_dir=local, fetch=fetch
    )
