"""entry/payload.py: a payload read into memory, block by block on all cores, is
the entry's bytes in fresh private memory, checked before use; a damaged block is
a miss with one warning, whichever thread read it."""

from __future__ import annotations

import mmap
import os
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from mlcache import CacheWarning, Memory
from mlcache.codecs.npy import NumpyCodec
from mlcache.entry import BLOCK_SUMS, EntryReader, payload, reader, write_entry, writer
from mlcache.errors import EntryCorrupted

HEADER = struct.Struct("<8sHHIII QQQQQ")
NPY = NumpyCodec()
CALLS: list[int] = []


def write(path: Path, value: Any) -> None:
    with open(path, "wb") as f:
        write_entry(f, NPY.name, NPY.encode(value), {"k": 1})


def read(path: Path) -> Any:
    r = EntryReader(str(path))
    return NPY.decode(r.codec_layout, r)


def blocked(monkeypatch, block: int) -> None:
    """Entries of 1 KiB and more get a block table of ``block``-byte blocks."""
    monkeypatch.setattr(writer, "BLOCK_TABLE_MIN", 1024)
    monkeypatch.setattr(writer, "BLOCK_SIZE", block)


def payload_at(path: Path) -> tuple[int, int, int]:
    """(offset, length, block size) of the entry's payload, as the format gives them."""
    data = path.read_bytes()
    _magic, _v, flags, n_layout, n_info, _s, off, length, *_ = HEADER.unpack_from(data)
    assert flags & BLOCK_SUMS
    (block,) = struct.unpack_from("<Q", data, 64 + n_layout + n_info)
    return off, length, block


def owns_its_memory(a: np.ndarray) -> bool:
    """No file map anywhere under ``a``."""
    base: Any = a
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return False
        base = getattr(base, "base", None)
    return True


# 4 KiB blocks: many blocks, each one chunk; 2 MiB blocks: each block read and
# hashed in several chunks. Neither payload is a whole number of blocks, and both
# are larger than the reader's first read, so they are read by read_payload.
@pytest.mark.parametrize("block, n", [(4096, 40_001), (1 << 21, 700_001)])
def test_a_payload_read_on_all_cores_is_the_entrys_bytes_in_private_memory(
    tmp_path, monkeypatch, block, n
):
    blocked(monkeypatch, block)
    path = tmp_path / "e"
    x = np.random.default_rng(0).random(n)
    write(path, x)
    _off, length, got_block = payload_at(path)
    assert got_block == block and length % block and length > reader.FIRST_READ
    assert length > 2 * block  # several blocks, so several threads
    out = read(path)
    np.testing.assert_array_equal(out, x)
    assert out.flags.writeable and owns_its_memory(out)
    before = path.read_bytes()
    out[:] = -1.0  # the caller's to change: the file stays as it was
    assert path.read_bytes() == before
    write(path, np.zeros(n))  # and a new entry under the name does not change it
    assert (out == -1.0).all()


def test_the_digests_are_the_entrys_on_all_cores_and_on_one(tmp_path, monkeypatch):
    blocked(monkeypatch, 1 << 16)
    path = tmp_path / "e"
    write(path, np.arange(100_003.0))
    off, length, block = payload_at(path)
    data = path.read_bytes()[off : off + length]
    want = [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, length, block)]
    fd = os.open(path, os.O_RDONLY)
    try:
        buf, digests = payload.read_payload(fd, None, off, length, block, "e")
        assert bytes(buf) == data and digests == want
        monkeypatch.setattr(payload, "hash_pool", lambda: None)  # a one-core machine
        buf, digests = payload.read_payload(fd, None, off, length, block, "e")
        assert bytes(buf) == data and digests == want
    finally:
        os.close(fd)


def test_a_file_that_ends_early_is_corrupted_on_all_cores(tmp_path, monkeypatch):
    blocked(monkeypatch, 4096)
    path = tmp_path / "e"
    write(path, np.arange(50_000.0))
    off, length, block = payload_at(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        # as if the file were cut while it is read: the last blocks read nothing
        with pytest.raises(EntryCorrupted, match="truncated"):
            payload.read_payload(fd, None, off, length + 5 * block, block, "e")
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_a_damaged_block_read_on_any_thread_is_detected(tmp_path, monkeypatch, where):
    blocked(monkeypatch, 4096)
    path = tmp_path / "e"
    write(path, np.arange(30_000.0))
    off, length, _block = payload_at(path)
    data = bytearray(path.read_bytes())
    data[off + int(where * (length - 1))] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(EntryCorrupted, match="checksum"):
        EntryReader(str(path))


def big(i: int) -> np.ndarray:
    CALLS.append(i)
    return np.arange(200_000.0) + i


def test_a_damaged_large_hit_is_a_miss_with_one_warning(tmp_path, monkeypatch):
    blocked(monkeypatch, 1 << 16)
    CALLS.clear()
    f = Memory(tmp_path / "cache", verbose=0).cache(big)
    np.testing.assert_array_equal(f(3), big(3))
    name = f.call_and_shelve(3).name
    path = Path(f.memory.store.local_path(name))  # type: ignore[attr-defined]
    off, length, block = payload_at(path)
    assert length > 4 * block
    data = bytearray(path.read_bytes())
    data[off + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    CALLS.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(f(3), np.arange(200_000.0) + 3)
    assert [w.category for w in seen] == [CacheWarning] and CALLS == [3]
    out = f(3)  # overwritten: a silent hit
    np.testing.assert_array_equal(out, np.arange(200_000.0) + 3)
    assert CALLS == [3] and owns_its_memory(out) and out.flags.writeable
