"""entry/: the entry file format byte by byte (format.py, writer.py), its checks
and every way of reading a file (reader.py's EntryReader), the committed fixtures.
Reading an entry of a store is tests/entry/test_reader.py's."""

from __future__ import annotations

import collections
import io
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlcache import entry
from mlcache.codecs import Encoded
from mlcache.codecs.compression import Compression
from mlcache.codecs.npy import NumpyCodec
from mlcache.codecs.pickle import PickleCodec
from mlcache.entry import (
    FORMAT_VERSION,
    MAGIC,
    EntryReader,
    read_info,
    reader,
    verify_file,
    write_entry,
    writer,
)
from mlcache.errors import EntryCorrupted, UnknownFormat

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = struct.Struct("<8sHHIII QQQQQ")
NPY = NumpyCodec()
PICKLE = PickleCodec()


def write(path: Path, value: Any, codec: Any = NPY, info: Any = None, compression=None) -> int:
    with open(path, "wb") as f:
        return write_entry(
            f, codec.name, codec.encode(value), {"k": 1} if info is None else info, compression
        )


def read(path: Path, mmap_mode: str | None = None, codec: Any = NPY) -> Any:
    reader = EntryReader(str(path), mmap_mode)
    return codec.decode(reader.codec_layout, reader)


def fields(data: bytes) -> dict[str, Any]:
    names = ("magic", "version", "flags", "L", "I", "nseg", "P", "N", "psum", "hsum", "reserved")
    return dict(zip(names, HEADER.unpack_from(data)))


def sample() -> dict[str, Any]:
    return {
        "x": np.arange(10.0),
        "f": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "b": b"payload bytes",
        "meta": (1, "two", None),
    }


# -- the format, byte by byte ----------------------------------------------------------
def test_header_follows_the_specification(tmp_path):
    path = tmp_path / "e"
    size = write(path, sample(), info={"func": "f", "n": 3})
    data = path.read_bytes()
    h = fields(data)
    assert size == len(data)
    assert data[:8] == MAGIC == b"\x93MLCACHE"
    assert h["version"] == FORMAT_VERSION == 1
    assert h["flags"] == 0 and h["reserved"] == 0
    meta_end = 64 + h["L"] + h["I"]
    layout = json.loads(data[64 : 64 + h["L"]])
    assert json.loads(data[64 + h["L"] : meta_end]) == {"func": "f", "n": 3}
    assert set(layout) == {"codec", "c", "seg", "z", "raw"}
    assert layout["codec"] == "npy" and layout["z"] is None
    assert h["nseg"] == len(layout["seg"]) == len(layout["raw"]) == 3
    assert h["P"] % 64 == 0 and meta_end <= h["P"] < meta_end + 64
    assert data[meta_end : h["P"]] == bytes(h["P"] - meta_end)  # zero padding
    assert len(data) == h["P"] + h["N"]
    # the two checksums, exactly as documented
    assert h["psum"] == xxhash.xxh3_64_intdigest(data[h["P"] :])
    seed = xxhash.xxh3_64_intdigest(data[:48])
    assert h["hsum"] == xxhash.xxh3_64_intdigest(data[64:meta_end], seed=seed)


@pytest.mark.parametrize("info_len", [0, 1, 17, 63, 64, 65, 130])
def test_every_segment_is_64_byte_aligned(tmp_path, info_len):
    path = tmp_path / "e"
    segments = [b"a", np.arange(7, dtype=np.uint8), b"b" * 63, np.arange(65.0), b"", b"c" * 64]
    value = list(segments)
    write(path, value, info={"pad": "x" * info_len})
    data = path.read_bytes()
    h = fields(data)
    layout = json.loads(data[64 : 64 + h["L"]])
    seg_table = layout["seg"]
    assert len(seg_table) == len(segments)
    for (off, n), seg in zip(seg_table, segments):
        assert off % 64 == 0 and (h["P"] + off) % 64 == 0
        raw = bytes(memoryview(seg).cast("B")) if not isinstance(seg, bytes) else seg
        assert n == len(raw)
        assert data[h["P"] + off : h["P"] + off + n] == raw
        end = h["P"] + off + n
        pad_end = h["P"] + off + n + (-n % 64)
        assert data[end:pad_end] == bytes(pad_end - end)
    # mapped arrays start on aligned addresses (zero-copy, SIMD friendly)
    out = read(path, "r")
    for a in out:
        if isinstance(a, np.ndarray) and a.size:
            assert a.ctypes.data % 64 == 0


def test_info_is_read_on_demand_and_from_the_header_alone(tmp_path):
    path = tmp_path / "e"
    write(path, np.arange(3), info={"func": "f", "time": 1.5, "args": {"x": "1"}})
    assert EntryReader(str(path)).info == {"func": "f", "time": 1.5, "args": {"x": "1"}}
    assert read_info(str(path)) == {"func": "f", "time": 1.5, "args": {"x": "1"}}
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # payload damage does not concern read_info
    path.write_bytes(bytes(data))
    assert read_info(str(path))["func"] == "f"


def test_info_that_is_not_a_dict_reads_as_empty(tmp_path):
    path = tmp_path / "e"
    write(path, 1, info=[1, 2])
    assert EntryReader(str(path)).info == {}
    assert read_info(str(path)) == {}


def test_long_layouts_are_read_whole(tmp_path):
    # more layout than the reader's first read: 6000 segments
    path = tmp_path / "e"
    value = [bytes([i % 256]) * (i % 3) for i in range(6000)]
    write(path, value, info={"k": "v"})
    assert fields(path.read_bytes())["L"] > reader.FIRST_READ
    assert read(path) == value
    assert read(path, "r") == value
    assert EntryReader(str(path)).info == {"k": "v"}
    verify_file(str(path))
    assert read_info(str(path)) == {"k": "v"}


def test_large_payloads_are_read_in_full(tmp_path):
    path = tmp_path / "e"
    big = np.random.default_rng(0).random(300_000)
    write(path, {"big": big, "small": b"x"})
    for mode in (None, "r", "c"):
        out = read(path, mode)
        np.testing.assert_array_equal(out["big"], big)
        assert out["small"] == b"x"


def test_write_entry_to_any_seekable_file():
    buf = io.BytesIO()
    size = write_entry(buf, "npy", NPY.encode({"a": np.arange(4)}), {"x": 1})
    assert size == len(buf.getvalue())
    buf.seek(0)
    reader = EntryReader(buf, "r")  # no file descriptor: read into memory
    out = NPY.decode(reader.codec_layout, reader)
    assert type(out["a"]) is np.ndarray
    np.testing.assert_array_equal(out["a"], np.arange(4))


# -- memory-mapping modes -------------------------------------------------------------
def test_mode_r_gives_read_only_memmaps(tmp_path):
    path = tmp_path / "e"
    write(path, {"x": np.arange(100.0)})
    x = read(path, "r")["x"]
    assert isinstance(x, np.memmap)
    assert x.mode == "r" and Path(x.filename) == path.resolve() and x.offset % 64 == 0
    assert not x.flags.writeable
    with pytest.raises(ValueError):
        x[0] = 1


def test_mode_c_is_writable_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "e"
    write(path, {"x": np.arange(100.0)})
    before = path.read_bytes()
    x = read(path, "c")["x"]
    assert isinstance(x, np.memmap) and x.mode == "c" and x.flags.writeable
    x[:] = -1
    x.flush()
    del x
    assert path.read_bytes() == before
    np.testing.assert_array_equal(read(path)["x"], np.arange(100.0))


def test_mode_r_plus_writes_through_to_the_file(tmp_path):
    path = tmp_path / "e"
    write(path, {"x": np.arange(100.0)})
    before = path.read_bytes()
    h = fields(before)
    x = read(path, "r+")["x"]
    assert isinstance(x, np.memmap) and x.mode == "r+" and x.flags.writeable
    x[0] = 1234.5
    x.flush()
    after = path.read_bytes()
    assert after != before and len(after) == len(before)
    assert x.offset >= h["P"]
    assert np.frombuffer(after, dtype=np.float64, count=1, offset=x.offset)[0] == 1234.5


def test_mode_none_gives_private_writable_arrays(tmp_path):
    path = tmp_path / "e"
    write(path, {"x": np.arange(10.0), "big": np.zeros(100_000)})
    before = path.read_bytes()
    out = read(path, None)
    for a in out.values():
        assert type(a) is np.ndarray and a.flags.writeable
        a[:] = 7
    assert path.read_bytes() == before


def test_the_mapping_outlives_the_reader(tmp_path):
    path = tmp_path / "e"
    write(path, np.arange(1000.0))
    x = read(path, "r")
    import gc

    gc.collect()
    assert x.sum() == np.arange(1000.0).sum()


# -- compression -----------------------------------------------------------------------
METHODS = ["zlib", "gzip", "bz2", "lzma", "xz"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("level", [1, 9])
def test_compressed_entries_round_trip(tmp_path, method, level):
    path = tmp_path / "e"
    value = {"zeros": np.zeros(50_000), "x": np.arange(12.0).reshape(3, 4), "b": b"ab" * 500}
    size = write(path, value, compression=Compression(method, level))
    assert size < value["zeros"].nbytes / 10
    layout = EntryReader(str(path)).codec_layout
    assert layout  # decodable
    z = json.loads(path.read_bytes()[64 : 64 + fields(path.read_bytes())["L"]])["z"]
    assert z == [method, level]
    for mode in (None, "r", "c", "r+"):
        out = read(path, mode)
        for k in ("zeros", "x"):
            # compressed entries cannot be mapped: private, writable arrays
            assert type(out[k]) is np.ndarray and out[k].flags.writeable
            np.testing.assert_array_equal(out[k], value[k])
        assert out["b"] == value["b"]
    verify_file(str(path))


def test_compressed_pickled_objects_give_writable_arrays(tmp_path):
    path = tmp_path / "e"
    value = collections.OrderedDict(a=np.arange(1000.0))
    for method in METHODS:
        write(path, value, codec=PICKLE, compression=Compression(method, 3))
        for mode in (None, "r"):
            out = read(path, mode, codec=PICKLE)
            assert type(out) is collections.OrderedDict
            np.testing.assert_array_equal(out["a"], value["a"])
            # as from a fresh compute, or an uncompressed read into memory
            assert out["a"].flags.writeable, (method, mode)


# -- damage detection ---------------------------------------------------------------
def damaged_copies(data: bytes, positions: range | list[int]):
    for i in positions:
        b = bytearray(data)
        b[i] ^= 0xFF
        yield i, bytes(b)


def checked_positions(data: bytes) -> list[int]:
    """Every byte of the header, layout, info and payload (not the zero padding
    between the info and the payload, which no reader ever looks at)."""
    h = fields(data)
    meta_end = 64 + h["L"] + h["I"]
    return list(range(meta_end)) + list(range(h["P"], len(data)))


@pytest.mark.parametrize("mmap_mode", [None, "r"])
@pytest.mark.parametrize("codec", [NPY, PICKLE], ids=["npy", "pickle"])
def test_any_flipped_byte_is_detected(tmp_path, mmap_mode, codec):
    path = tmp_path / "e"
    write(path, sample(), codec=codec)
    data = path.read_bytes()
    missed = []
    for i, bad in damaged_copies(data, [i for i in checked_positions(data) if not 56 <= i < 64]):
        path.write_bytes(bad)
        try:
            EntryReader(str(path), mmap_mode)
        except EntryCorrupted:
            continue
        missed.append(i)
    assert not missed


def test_flipped_reserved_header_bytes_are_detected(tmp_path):
    # the reserved field is specified as zero; a reader that accepts anything
    # there cannot tell a damaged header from a good one
    path = tmp_path / "e"
    write(path, sample())
    data = path.read_bytes()
    missed = []
    for i, bad in damaged_copies(data, range(56, 64)):
        path.write_bytes(bad)
        try:
            EntryReader(str(path))
        except EntryCorrupted:
            continue
        missed.append(i)
    assert not missed


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_truncated_or_extended_files_are_detected(tmp_path, mmap_mode):
    path = tmp_path / "e"
    write(path, sample())
    data = path.read_bytes()
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(EntryCorrupted):
            EntryReader(str(path), mmap_mode)
        with pytest.raises(EntryCorrupted):
            verify_file(str(path))
    for extra in (b"\x00", b"x" * 64):
        path.write_bytes(data + extra)
        with pytest.raises(EntryCorrupted):
            EntryReader(str(path), mmap_mode)


@pytest.fixture
def small_blocks(monkeypatch):
    """Entries of 1 KiB and more get a block table of 4 KiB blocks."""
    monkeypatch.setattr(writer, "BLOCK_TABLE_MIN", 1024)
    monkeypatch.setattr(writer, "BLOCK_SIZE", 4096)


def table_end(data: bytes) -> int:
    """Where the layout, info and block table (if any) end."""
    h = fields(data)
    end = 64 + h["L"] + h["I"]
    if h["flags"] & entry.BLOCK_SUMS:
        (block,) = struct.unpack_from("<Q", data, end)
        end += 8 + 8 * -(-h["N"] // block)
    return end


def test_large_payloads_carry_a_block_table_as_specified(tmp_path, small_blocks):
    path = tmp_path / "e"
    write(path, {"x": np.arange(2000.0), "b": b"tail"}, info={"func": "f"})
    data = path.read_bytes()
    h = fields(data)
    assert h["version"] == 1 and h["flags"] == entry.BLOCK_SUMS
    end = 64 + h["L"] + h["I"]
    (block,) = struct.unpack_from("<Q", data, end)
    n = -(-h["N"] // block)
    assert block == 4096 and n == 4
    payload = data[h["P"] :]
    sums = struct.unpack_from(f"<{n}Q", data, end + 8)
    assert list(sums) == [
        xxhash.xxh3_64_intdigest(payload[i : i + block]) for i in range(0, len(payload), block)
    ]
    table = data[end : end + 8 + 8 * n]
    assert h["psum"] == xxhash.xxh3_64_intdigest(table)  # the payload checksum is the table's
    seed = xxhash.xxh3_64_intdigest(data[:48])
    assert h["hsum"] == xxhash.xxh3_64_intdigest(data[64 : end + len(table)], seed=seed)
    assert data[end + len(table) : h["P"]] == bytes(h["P"] - end - len(table))
    for mode in (None, "r", "c", "r+"):
        np.testing.assert_array_equal(read(path, mode)["x"], np.arange(2000.0))
    verify_file(str(path))
    # below the threshold: no table, the bytes of version 1 as before
    write(path, np.arange(10.0))
    assert fields(path.read_bytes())["flags"] == 0


@pytest.mark.parametrize("mmap_mode", [None, "r", "c"])
@pytest.mark.parametrize("codec", [NPY, PICKLE], ids=["npy", "pickle"])
def test_any_flipped_byte_of_an_entry_with_a_block_table_is_detected(
    tmp_path, small_blocks, mmap_mode, codec
):
    path = tmp_path / "e"
    write(path, {"x": np.arange(700.0), "s": b"x" * 100}, codec=codec)
    data = path.read_bytes()
    h = fields(data)
    assert h["flags"] & entry.BLOCK_SUMS
    checked = [i for i in range(table_end(data)) if not 56 <= i < 64]
    checked += list(range(h["P"], len(data), 7))
    missed = []
    for i, bad in damaged_copies(data, checked):
        path.write_bytes(bad)
        try:
            EntryReader(str(path), mmap_mode)
        except EntryCorrupted:
            continue
        missed.append(i)
    assert not missed


def test_mapped_payloads_of_any_size_are_checked_at_load(tmp_path, small_blocks):
    path = tmp_path / "e"
    write(path, np.arange(1000.0))  # 8000 bytes: a block table
    data = path.read_bytes()
    h = fields(data)
    bad = bytearray(data)
    bad[h["P"] + 5000] ^= 0xFF
    path.write_bytes(bytes(bad))
    for mode in ("r", "c", None):
        with pytest.raises(EntryCorrupted, match="checksum"):
            EntryReader(str(path), mode)
    with pytest.raises(EntryCorrupted, match="checksum"):
        verify_file(str(path))
    EntryReader(str(path), "r+")  # the caller's to change: not checked (joblib's r+)


def test_block_tables_of_other_block_sizes_are_read(tmp_path, small_blocks, monkeypatch):
    path = tmp_path / "e"
    value = {"x": np.arange(3000.0)}
    for block in (64, 1 << 16, 1 << 24):  # one block larger than the payload
        monkeypatch.setattr(writer, "BLOCK_SIZE", block)
        write(path, value)
        for mode in (None, "r"):
            np.testing.assert_array_equal(read(path, mode)["x"], value["x"])


@pytest.mark.parametrize("block", [0, 32, 100, 4097, 1 << 41])
def test_bad_block_sizes_are_refused(tmp_path, small_blocks, block):
    path = tmp_path / "e"
    write(path, np.arange(1000.0))
    data = bytearray(path.read_bytes())
    h = fields(bytes(data))
    struct.pack_into("<Q", data, 64 + h["L"] + h["I"], block)
    path.write_bytes(bytes(data))
    for call in (lambda: EntryReader(str(path), "r"), lambda: read_info(str(path))):
        with pytest.raises(EntryCorrupted):
            call()


def test_a_block_table_beyond_the_first_read(tmp_path, small_blocks):
    # layout and info longer than the reader's first read, then the table
    path = tmp_path / "e"
    value = [np.arange(300.0), *(bytes([i % 256]) * (i % 3) for i in range(6000))]
    write(path, value, info={"k": "v"})
    data = path.read_bytes()
    assert fields(data)["flags"] & entry.BLOCK_SUMS
    assert 64 + fields(data)["L"] > reader.FIRST_READ
    for mode in (None, "r"):
        out = read(path, mode)
        np.testing.assert_array_equal(out[0], value[0])
        assert out[1:] == value[1:]
    assert read_info(str(path)) == {"k": "v"}


def test_small_mapped_payloads_are_checked_at_load(tmp_path):
    path = tmp_path / "e"
    write(path, np.arange(1000.0))
    data = bytearray(path.read_bytes())
    data[-8] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(EntryCorrupted, match="checksum"):
        EntryReader(str(path), "r")


def test_other_versions_and_files_are_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "e"
    write(path, 1)
    data = bytearray(path.read_bytes())
    data[8:10] = struct.pack("<H", 2)
    path.write_bytes(bytes(data))
    with pytest.raises(EntryCorrupted, match="version 2"):
        EntryReader(str(path))
    path.write_bytes(b"\x93NUMPY" + bytes(200))
    with pytest.raises(EntryCorrupted, match="magic"):
        EntryReader(str(path))
    path.write_bytes(b"")
    with pytest.raises(EntryCorrupted, match="truncated"):
        EntryReader(str(path), "r")


# -- hypothesis: random bytes in, only EntryCorrupted out ------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "e"


def read_everything(path: Path, mmap_mode: str | None) -> None:
    """Everything a caller may do with an entry; only EntryCorrupted may escape."""
    reader = EntryReader(str(path), mmap_mode)
    reader.info  # noqa: B018
    for i in range(len(reader)):
        reader.buffer(i)


def only_entry_corrupted(path: Path) -> None:
    for call in (
        lambda: read_everything(path, None),
        lambda: read_everything(path, "r"),
        lambda: read_info(str(path)),
        lambda: verify_file(str(path)),
    ):
        try:
            call()
        except EntryCorrupted:
            pass
        except UnknownFormat:  # a well-formed name of a compressor not registered here
            pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600) | st.binary(max_size=600).map(lambda b: MAGIC + b))
def test_property_random_files_only_raise_entry_corrupted(scratch, data):
    scratch.write_bytes(data)
    only_entry_corrupted(scratch)


_VALID = {}


def valid_entry() -> bytes:
    if not _VALID:
        buf = io.BytesIO()
        write_entry(buf, "npy", NPY.encode(sample()), {"k": 1})
        _VALID["npy"] = buf.getvalue()
    return _VALID["npy"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10_000) | st.none(),
)
def test_property_damaged_entries_only_raise_entry_corrupted(scratch, edits, cut):
    data = bytearray(valid_entry())
    for pos, value in edits:
        data[pos % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    assume(bytes(data) != valid_entry())
    scratch.write_bytes(bytes(data))
    only_entry_corrupted(scratch)


def valid_blocked_entry() -> bytes:
    """A valid entry with a block table of 256-byte blocks (made once)."""
    if "blocks" not in _VALID:
        saved = writer.BLOCK_TABLE_MIN, writer.BLOCK_SIZE
        writer.BLOCK_TABLE_MIN, writer.BLOCK_SIZE = 512, 256
        try:
            buf = io.BytesIO()
            write_entry(buf, "npy", NPY.encode({**sample(), "y": np.arange(150.0)}), {"k": 1})
        finally:
            writer.BLOCK_TABLE_MIN, writer.BLOCK_SIZE = saved
        _VALID["blocks"] = buf.getvalue()
    return _VALID["blocks"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10_000) | st.none(),
)
def test_property_damaged_block_tables_only_raise_entry_corrupted(scratch, edits, cut):
    valid = valid_blocked_entry()
    assert fields(valid)["flags"] & entry.BLOCK_SUMS
    data = bytearray(valid)
    h = fields(valid)
    table = 64 + h["L"] + h["I"]
    for pos, value in edits:  # mostly the header and the table, where lengths live
        data[(table + pos % 80 - 40 if pos % 2 else pos) % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    assume(bytes(data) != valid)
    scratch.write_bytes(bytes(data))
    entry.forget_verified()
    only_entry_corrupted(scratch)


def craft(layout: Any, payload: bytes, nseg: int | None = None, info: bytes = b"{}") -> bytes:
    """An entry with correct checksums around an arbitrary layout and payload."""
    lay = json.dumps(layout).encode()
    if nseg is None:
        seg = layout.get("seg") if isinstance(layout, dict) else None
        nseg = len(seg) if isinstance(seg, list) else 0
    meta_end = 64 + len(lay) + len(info)
    p = meta_end + (-meta_end % 64)
    head = [MAGIC, FORMAT_VERSION, 0, len(lay), len(info), nseg, p, len(payload)]
    head.append(xxhash.xxh3_64_intdigest(payload))
    hsum = xxhash.xxh3_64_intdigest(
        lay + info, seed=xxhash.xxh3_64_intdigest(HEADER.pack(*head, 0, 0)[:48])
    )
    return HEADER.pack(*head, hsum, 0) + lay + info + bytes(p - meta_end) + payload


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
small_ints = st.integers(-5, 300)
layouts = st.fixed_dictionaries(
    {
        "codec": st.sampled_from(["npy", "pickle"]) | json_values,
        "c": json_values,
        "seg": st.lists(st.lists(small_ints, min_size=2, max_size=2), max_size=3)
        | st.lists(st.lists(small_ints | json_values, max_size=3), max_size=3)
        | json_values,
        "z": st.none() | st.just(["zlib", 1]) | st.lists(json_values, max_size=3),
        "raw": st.lists(small_ints, max_size=3) | json_values,
    }
)


@settings(max_examples=200, deadline=None)
@given(layouts | json_values, st.binary(max_size=200), st.none() | st.integers(0, 4))
def test_property_well_checksummed_garbage_only_raises_entry_corrupted(
    scratch, layout, payload, nseg
):
    scratch.write_bytes(craft(layout, payload, nseg))
    only_entry_corrupted(scratch)


def test_a_segment_table_that_disagrees_with_raw_lengths_is_corrupt(tmp_path):
    path = tmp_path / "e"
    layout = {
        "codec": "npy",
        "c": {"tree": {"a": 0, "dtype": "<f8", "shape": [100], "order": "C"}},
        "seg": [[0, 8]],
        "z": None,
        "raw": [800],
    }
    path.write_bytes(craft(layout, bytes(64)))
    for mode in (None, "r"):
        with pytest.raises(EntryCorrupted):
            read(path, mode)


# -- committed fixtures of released versions -------------------------------------------
FIXTURE_INFO = {
    "func": "fixtures.make",
    "time": 1700000000.0,
    "duration": 0.5,
    "input_args": {"n": "3"},
}


def check_fixture_npy(out: dict[Any, Any]) -> None:
    assert list(out) == [
        "name",
        "ints",
        "floats",
        "complex",
        "bytes",
        "arr",
        "farr",
        "scalar",
        7,
    ]
    assert out["name"] == "fixture"
    assert out["ints"] == [1, 2**60, -3, 2**70]
    f = out["floats"]
    assert type(f) is tuple and f[0] == 1.5 and math.isnan(f[1]) and f[3] == math.inf
    assert math.copysign(1.0, f[2]) == -1.0 and f[2] == 0.0
    assert out["complex"] == 1 + 2j
    assert out["bytes"] == b"\x00\xffmlcache"
    assert out["arr"].dtype == np.dtype("<f8")
    np.testing.assert_array_equal(out["arr"], np.arange(12.0).reshape(3, 4))
    assert out["farr"].dtype == np.dtype("<i4") and out["farr"].flags.f_contiguous
    np.testing.assert_array_equal(out["farr"], np.arange(6).reshape(2, 3))
    assert type(out["scalar"]) is np.float32 and out["scalar"] == 0.25
    assert out[7] is None


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_fixture_v1_npy_reads_back(mmap_mode):
    path = FIXTURES / "entry_v1_npy.mlc"
    assert fields(path.read_bytes())["version"] == 1
    reader = EntryReader(str(path), mmap_mode)
    assert reader.codec == "npy"
    assert reader.info == FIXTURE_INFO
    check_fixture_npy(NPY.decode(reader.codec_layout, reader))
    verify_file(str(path))
    assert read_info(str(path)) == FIXTURE_INFO


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_fixture_v1_pickle_reads_back(mmap_mode):
    path = FIXTURES / "entry_v1_pickle.mlc"
    assert fields(path.read_bytes())["version"] == 1
    reader = EntryReader(str(path), mmap_mode)
    assert reader.codec == "pickle"
    out = PICKLE.decode(reader.codec_layout, reader)
    assert type(out) is collections.OrderedDict
    assert list(out) == ["a", "b", "c"]
    np.testing.assert_array_equal(out["a"], np.arange(5))
    assert out["a"].dtype == np.dtype("<i8")
    assert out["b"] == {1, 2, 3} and out["c"] == frozenset({"x"})
    verify_file(str(path))


@pytest.mark.parametrize("mmap_mode", [None, "r", "c"])
def test_fixture_v1_block_table_reads_back(mmap_mode):
    path = FIXTURES / "entry_v1_blocks_npy.mlc"
    h = fields(path.read_bytes())
    assert h["version"] == 1 and h["flags"] == entry.BLOCK_SUMS
    reader = EntryReader(str(path), mmap_mode)
    assert reader.info == FIXTURE_INFO
    out = NPY.decode(reader.codec_layout, reader)
    np.testing.assert_array_equal(out.pop("big"), np.arange(2500, dtype="<f8"))
    check_fixture_npy(out)
    verify_file(str(path))


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_fixture_v1_signed_block_table_reads_back(mmap_mode):
    from mlcache.entry.signing import Signer

    path = FIXTURES / "entry_v1_blocks_signed_pickle.mlc"
    h = fields(path.read_bytes())
    assert h["flags"] == entry.BLOCK_SUMS | entry.SIGNED | entry.CODE_SIGNED
    signer = Signer(b"mlcache fixture key")
    reader = EntryReader(str(path), mmap_mode, signer, "fixtures/0/blocks")
    out = PICKLE.decode(reader.codec_layout, reader)
    assert list(out) == ["a", "b", "c", "big"]
    np.testing.assert_array_equal(out["big"], np.arange(2500, dtype="<f8"))
    verify_file(str(path), signer, "fixtures/0/blocks")
    with pytest.raises(EntryCorrupted):
        EntryReader(str(path), mmap_mode, signer, "fixtures/0/other")


def test_writer_still_produces_the_v1_fixture_bytes():
    # if this fails the writer changed the format: bump FORMAT_VERSION, keep
    # reading version 1, and commit new fixtures next to the old ones
    value = {
        "name": "fixture",
        "ints": [1, 2**60, -3, 2**70],
        "floats": (1.5, float("nan"), -0.0, float("inf")),
        "complex": 1 + 2j,
        "bytes": b"\x00\xffmlcache",
        "arr": np.arange(12, dtype="<f8").reshape(3, 4),
        "farr": np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3)),
        "scalar": np.float32(0.25),
        7: None,
    }
    buf = io.BytesIO()
    write_entry(buf, "npy", NPY.encode(value), FIXTURE_INFO)
    assert buf.getvalue() == (FIXTURES / "entry_v1_npy.mlc").read_bytes()


def test_an_empty_payload(tmp_path):
    path = tmp_path / "e"
    write(path, [np.empty((0, 3)), b""])
    assert fields(path.read_bytes())["N"] == 0
    for mode in (None, "r"):
        a, b = read(path, mode)
        assert a.shape == (0, 3) and b == b""


def test_encoded_with_no_segments(tmp_path):
    path = tmp_path / "e"
    with open(path, "wb") as f:
        write_entry(f, "npy", Encoded({"tree": [1, "a"]}, []), {})
    assert read(path) == [1, "a"]
    assert read(path, "r") == [1, "a"]
