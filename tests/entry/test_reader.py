"""entry/reader.py: reading an entry of a store (open_entry, read_entry_info,
decode), whichever way the store gives its bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache.codecs import Encoded, codecs
from mlcache.entry import decode, local_file, open_entry, read_entry_info, write_entry
from mlcache.entry.signing import Signer
from mlcache.errors import EntryCorrupted, EntryNotFound, EntrySignatureError, UnsupportedValue
from mlcache.store import Store
from mlcache.store.cached import CachedStore
from mlcache.store.local import LocalStore
from mlcache.store.memory import MemoryStore

NAME = "pkg.f-0123abcd/0123456789abcdef/00112233445566778899aabbccddeeff"
VALUE = {"x": np.arange(12.0).reshape(3, 4), "meta": (1, "a")}


@pytest.fixture(params=["local", "memory", "cached"])
def store(request, tmp_path: Path) -> Any:
    """A store of each kind: local files, bytes only, a local copy of bytes."""
    if request.param == "local":
        return LocalStore(str(tmp_path / "cache"))
    space = MemoryStore(f"test-reader-{tmp_path.name}")
    if request.param == "memory":
        return space
    return CachedStore(space, tmp_path / "copies")


def put(store: Store, value: Any, *, codec: str = "npy", signer: Signer | None = None) -> None:
    encoded = codecs[codec].encode(value)
    with store.write(NAME) as f:
        write_entry(f, codec, encoded, {"func": "pkg.f", "time": 1.5}, None, signer, NAME)


def test_local_file_is_the_stores_own_path_or_none(store):
    put(store, VALUE)
    path = local_file(store, NAME)
    if isinstance(store, MemoryStore):
        assert path is None  # read through store.open
    else:
        assert path is not None and Path(path).read_bytes()[:8] == b"\x93MLCACHE"


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_open_entry_and_decode_read_every_kind_of_store(store, mmap_mode):
    put(store, VALUE)
    got = decode(open_entry(store, NAME, mmap_mode), allow_pickle=False)
    np.testing.assert_array_equal(got["x"], VALUE["x"])
    assert got["meta"] == VALUE["meta"]
    if mmap_mode and not isinstance(store, MemoryStore):
        assert isinstance(got["x"], np.memmap)  # mapped from the local file


def test_an_explicit_path_is_read_as_given(store, tmp_path):
    put(store, VALUE)
    other = tmp_path / "elsewhere"
    with open(other, "wb") as f:
        write_entry(f, "npy", codecs["npy"].encode([7]), {}, None, None, NAME)
    assert decode(open_entry(store, NAME, path=str(other)), allow_pickle=False) == [7]
    assert read_entry_info(store, NAME, path=str(other)) == {}


def test_read_entry_info_reads_the_metadata(store):
    put(store, VALUE)
    assert read_entry_info(store, NAME) == {"func": "pkg.f", "time": 1.5}


def test_a_missing_entry_or_a_folder_is_entry_not_found(store):
    put(store, VALUE)
    folder = NAME.rsplit("/", 1)[0]
    for name in (NAME + "0", folder):
        with pytest.raises(EntryNotFound):
            open_entry(store, name)
        with pytest.raises(EntryNotFound):
            read_entry_info(store, name)


def test_a_signer_requires_the_entrys_signature(store):
    put(store, VALUE)
    with pytest.raises(EntrySignatureError, match="not signed"):
        open_entry(store, NAME, signer=Signer(b"k" * 16))
    put(store, VALUE, signer=Signer(b"k" * 16))
    assert decode(open_entry(store, NAME, signer=Signer(b"k" * 16)), allow_pickle=False)


def test_decode_never_unpickles_when_pickle_is_off(store):
    put(store, {1, 2}, codec="pickle")
    with pytest.raises(UnsupportedValue, match="pickle is disabled"):
        decode(open_entry(store, NAME), allow_pickle=False)
    assert decode(open_entry(store, NAME), allow_pickle=True) == {1, 2}


class Broken:
    """A codec whose decode fails on what it wrote (a class since renamed, say)."""

    name = "broken-test"
    safe = True

    def can_encode(self, value: Any) -> bool:
        return False

    def encode(self, value: Any) -> Encoded:
        return Encoded({"v": 1}, [])

    def decode(self, layout: dict[str, Any], segments: Any) -> Any:
        raise LookupError("no such class")


def test_a_payload_the_codec_cannot_decode_is_corrupted(store, monkeypatch):
    monkeypatch.setattr(codecs, "_entries", {**codecs._entries, "broken-test": Broken()})
    with store.write(NAME) as f:
        write_entry(f, "broken-test", Encoded({"v": 1}, []), {}, None, None, NAME)
    with pytest.raises(
        EntryCorrupted, match=r"cannot decode the 'broken-test' payload \(LookupError"
    ):
        decode(open_entry(store, NAME), allow_pickle=False)


def _rewrite(store: Store, edit: Any) -> None:
    with store.open(NAME) as f:
        data = bytearray(f.read())
    edit(data)
    with store.write(NAME) as f:
        f.write(bytes(data))


def test_a_newer_format_version_is_newer_format_not_damage(store):
    """An entry a newer mlcache wrote (a higher version, and bytes after it that may
    mean anything) is NewerFormat, an UnknownFormat: a miss that keeps the entry.
    Our own entry whose version field alone was damaged is damage."""
    from mlcache.errors import NewerFormat, UnknownFormat

    def newer(data: bytearray) -> None:
        data[8:10] = (2).to_bytes(2, "little")
        data[12:64] = bytes(range(52))  # another header layout altogether

    put(store, VALUE)
    _rewrite(store, newer)
    for read in (
        lambda: open_entry(store, NAME),
        lambda: read_entry_info(store, NAME),
        lambda: open_entry(store, NAME, "r"),
    ):
        with pytest.raises(NewerFormat, match="newer mlcache.*version 2") as got:
            read()
        assert isinstance(got.value, UnknownFormat) and not isinstance(got.value, EntryCorrupted)

    def flipped(data: bytearray) -> None:
        data[9] ^= 0x10  # version 1 -> 4097, every other byte as written

    put(store, VALUE)
    _rewrite(store, flipped)
    with pytest.raises(EntryCorrupted, match="damaged format version 4097"):
        open_entry(store, NAME)
