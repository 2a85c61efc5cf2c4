"""The codec conformance suite: what every codec must do, for any codec to run.

A codec's tests subclass :class:`CodecTests`, set ``codec`` (an instance,
registered with :func:`mlcache.register_codec` before the tests run, since
entries are decoded through the registry) and give the values it stores; every
test then runs once per sample (a pytest class: collect it as ``Test...``)::

    import fractions
    from mlcache import register_codec
    from mlcache.testing.codecs import CodecTests

    register_codec(FractionCodec())

    class TestFractionCodec(CodecTests):
        codec = FractionCodec()

        def samples(self):
            return {"third": fractions.Fraction(1, 3), "big": fractions.Fraction(10**30, 7)}

        def refused(self):  # optional: values it must leave to other codecs
            return {"float": 0.5, "subclass": MyFraction(1, 2)}

        def array_sample(self):  # optional: a value holding numpy arrays
            return None  # (this codec stores none: the mapping tests are skipped)

What it checks, for each sample:

- **claims**: ``can_encode`` is True (a strict structural check, not
  try-and-see), and the codec is the registered one under its name;
- **buffers and segments**: the layout survives JSON, every segment is a
  bytes-like object or a contiguous array, encoding leaves the value unchanged,
  and decoding uses only the :class:`~mlcache.codecs.Segments` protocol
  (``len``, ``buffer``, ``array``);
- **round trips**: exact value and type (floats bit for bit) through a real
  entry file, read into memory, memory-mapped (``"r"``, ``"c"``, ``"r+"``),
  from a file object and compressed;
- **safety**: a ``safe`` codec decodes with pickle disabled and never calls
  ``pickle.loads``; an unsafe one is refused when pickle is disabled and keeps
  segment 0 (what signed entries cover in full); a damaged layout is an
  :class:`~mlcache.errors.EntryCorrupted` (a miss), never another error;
- **refusals**: every value of :meth:`CodecTests.refused` is refused by
  ``can_encode``;
- **arrays** (with :meth:`CodecTests.array_sample`): memory-mapped read-only
  under ``"r"``, writable copies without a map, private under ``"c"``.

A test a codec cannot pass by its nature is overridden in the subclass, saying
why. :func:`assert_same`, :func:`write` and :func:`read` are the helpers the
suite uses, for a codec's own extra tests.
"""

from __future__ import annotations

import io
import json
import mmap
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ..codecs import Codec, Encoded, codecs
from ..codecs.compression import Compression
from ..entry import EntryReader, decode, write_entry
from ..errors import EntryCorrupted, UnsupportedValue
from ..keys.hashing import hash_value

__all__ = [
    "CodecTests",
    "MemorySegments",
    "assert_same",
    "base_chain",
    "is_mapped",
    "read",
    "write",
]


def write(codec: Codec, value: Any, path: Path, compression: Compression | None = None) -> None:
    """Store ``value`` with ``codec`` as the entry file ``path``."""
    encoded = codec.encode(value)
    with open(path, "wb") as f:
        write_entry(f, codec.name, encoded, {"test": True}, compression)


def read(codec: Codec, path: Path | io.BytesIO, mmap_mode: str | None = None) -> Any:
    """The value in the entry ``path`` (a file, or its bytes), decoded by ``codec``."""
    source = str(path) if isinstance(path, Path) else path
    reader = EntryReader(source, mmap_mode)
    assert reader.codec == codec.name, f"the entry holds {reader.codec!r}, not {codec.name!r}"
    return codec.decode(reader.codec_layout, reader)


class MemorySegments:
    """The :class:`~mlcache.codecs.Segments` of an :class:`~mlcache.codecs.Encoded`,
    without an entry file: a codec decoded from it uses the protocol only."""

    def __init__(self, encoded: Encoded) -> None:
        self._segments = [_as_bytes(s) for s in encoded.segments]

    def __len__(self) -> int:
        return len(self._segments)

    def buffer(self, index: int) -> memoryview:
        return memoryview(self._segments[index])

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        flat = np.frombuffer(self._segments[index], dtype=dtype)
        # a private copy in the order asked for (a reader's arrays are its own)
        return flat.reshape(shape, order="F" if order == "F" else "C").copy(order="K")


def _as_bytes(seg: Any) -> bytes:
    if isinstance(seg, np.ndarray):
        a = seg if seg.flags.c_contiguous else seg.T  # F-ordered: its transpose is C
        return a.reshape(-1).view(np.uint8).tobytes()
    return memoryview(seg).tobytes()


def base_chain(a: Any) -> list[Any]:
    """``a``, its base, its base's base, ... through memoryviews too."""
    chain = []
    while a is not None:
        chain.append(a)
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return chain


def is_mapped(a: np.ndarray) -> bool:
    """``a``'s memory is a memory map (of an entry file)."""
    return any(isinstance(b, (np.memmap, mmap.mmap)) for b in base_chain(a))


def assert_same(got: Any, want: Any, path: str = "value") -> None:
    """Equal value and equal type, recursively; floats bit-exact (nan, -0.0); an
    array may come back as a :class:`numpy.memmap` of the same dtype, shape and
    order."""
    if isinstance(want, np.ndarray) and type(want) is np.ndarray:
        assert isinstance(got, np.ndarray), f"{path}: {type(got)}"
        assert type(got) in (np.ndarray, np.memmap), f"{path}: {type(got)}"
        assert got.dtype == want.dtype, f"{path}: {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: {got.shape} != {want.shape}"
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), path
        if want.flags.f_contiguous and not want.flags.c_contiguous:
            assert got.flags.f_contiguous, f"{path}: F order lost"
        return
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, np.generic):
        assert got.dtype == want.dtype, path
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), path
    elif isinstance(want, (float, complex)):
        assert repr(got) == repr(want), f"{path}: {got!r} != {want!r}"
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert len(got) == len(want), path
        for i, ((gk, gv), (wk, wv)) in enumerate(zip(got.items(), want.items())):
            assert_same(gk, wk, f"{path}.key{i}")
            assert_same(gv, wv, f"{path}[{wk!r}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def _garbled(layout: Any) -> Iterator[Any]:
    """Layouts damaged one place at a time: each value replaced by others of the
    wrong type or range, each key of a dict dropped (at most 200 of them)."""
    made = 0
    for place, value in _places(layout, ()):
        bad: Any
        for bad in (None, -1, 2**70, "x", [], {}, [-1], 1.5):
            if made >= 200:
                return
            if bad == value and type(bad) is type(value):
                continue
            made += 1
            yield _replace(layout, place, bad)


def _places(node: Any, at: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield at, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _places(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _places(v, (*at, i))


def _replace(node: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    head, rest = at[0], at[1:]
    if isinstance(node, dict):
        return {k: _replace(v, rest, new) if k == head else v for k, v in node.items()}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(node)]


class _Forged:
    """An entry reader whose layout was replaced (what a damaged entry whose
    checksums were forged to match would hand the codec)."""

    def __init__(self, reader: EntryReader, layout: Any) -> None:
        self._reader = reader
        self.codec = reader.codec
        self.codec_layout = layout
        self.path = reader.path

    def __len__(self) -> int:
        return len(self._reader)

    def buffer(self, index: int) -> memoryview:
        return self._reader.buffer(index)

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
        return self._reader.array(index, dtype, shape, order)


class CodecTests:
    """What every codec must do. Subclasses set :attr:`codec` and implement
    :meth:`samples` (and :meth:`refused`, :meth:`array_sample`, :meth:`arrays_of`
    when they apply). See the module docstring."""

    #: the codec under test (an instance, registered under its name)
    codec: ClassVar[Codec]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Run every test that takes ``sample`` once per value of :meth:`samples`."""
        if "sample" in metafunc.fixturenames:
            samples = self.samples()
            metafunc.parametrize("sample", list(samples.values()), ids=list(samples))

    def samples(self) -> dict[str, Any]:
        """Values the codec claims (``can_encode``) and must round-trip exactly, by
        test id."""
        raise NotImplementedError(f"{type(self).__name__} must implement samples()")

    def refused(self) -> dict[str, Any]:
        """Values the codec must not claim (other codecs' values, subclasses,
        what it cannot fully represent), by test id."""
        return {}

    def array_sample(self) -> Any:
        """A value with numpy arrays inside, to check memory mapping; None (the
        default) skips those tests."""
        return None

    def arrays_of(self, value: Any) -> list[np.ndarray]:
        """The arrays inside a value shaped like :meth:`array_sample`'s (default:
        found in lists, tuples and dict values)."""
        if isinstance(value, np.ndarray):
            return [value]
        if isinstance(value, dict):
            return [a for v in value.values() for a in self.arrays_of(v)]
        if isinstance(value, (list, tuple)):
            return [a for v in value for a in self.arrays_of(v)]
        return []

    def _array_sample(self) -> Any:
        value = self.array_sample()
        if value is None:
            pytest.skip(f"{type(self).__name__} gives no array_sample()")
        return value

    # -- claims ---------------------------------------------------------------------
    def test_is_a_registered_codec(self) -> None:
        assert isinstance(self.codec, Codec)
        assert isinstance(self.codec.name, str) and isinstance(self.codec.safe, bool)
        assert self.codec.name in codecs, f"register_codec({type(self.codec).__name__}())"
        assert type(codecs[self.codec.name]) is type(self.codec)

    def test_claims_the_sample(self, sample: Any) -> None:
        assert self.codec.can_encode(sample) is True

    def test_refuses_what_it_cannot_fully_represent(self) -> None:
        claimed = [k for k, v in self.refused().items() if self.codec.can_encode(v) is not False]
        assert not claimed, f"{self.codec.name} claims {claimed}"

    # -- buffers and segments ----------------------------------------------------------
    def test_layout_is_json_and_segments_are_buffers(self, sample: Any) -> None:
        encoded = self.codec.encode(sample)
        assert isinstance(encoded, Encoded)
        assert json.loads(json.dumps(encoded.layout)) == encoded.layout
        for seg in encoded.segments:  # bytes-like, or contiguous arrays
            if isinstance(seg, np.ndarray):
                assert seg.flags.c_contiguous or seg.flags.f_contiguous
            else:
                memoryview(seg)

    def test_encode_leaves_the_value_unchanged(self, sample: Any) -> None:
        before = hash_value(sample)
        self.codec.encode(sample)
        assert hash_value(sample) == before

    def test_decodes_through_the_segments_protocol_alone(self, sample: Any) -> None:
        encoded = self.codec.encode(sample)
        layout = json.loads(json.dumps(encoded.layout))
        assert_same(self.codec.decode(layout, MemorySegments(encoded)), sample)

    # -- round trips -----------------------------------------------------------------
    @pytest.mark.parametrize("mmap_mode", [None, "r", "c", "r+"])
    def test_round_trip(self, sample: Any, mmap_mode: str | None, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, sample, path)
        assert_same(read(self.codec, path, mmap_mode), sample)
        # and once more: reading does not change the entry
        assert_same(read(self.codec, path, None), sample)

    def test_round_trip_from_a_file_object(self, sample: Any, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, sample, path)
        assert_same(read(self.codec, io.BytesIO(path.read_bytes()), "r"), sample)

    def test_round_trip_compressed(self, sample: Any, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, sample, path, Compression("zlib", 1))
        assert_same(read(self.codec, path, "r"), sample)

    # -- safety ------------------------------------------------------------------------
    def test_safety(self, sample: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "entry"
        write(self.codec, sample, path)
        reader = EntryReader(str(path))
        if not self.codec.safe:
            # signed entries cover segment 0 in full: a codec that runs code keeps it there
            assert len(self.codec.encode(sample).segments) >= 1
            with pytest.raises(UnsupportedValue, match="pickle is disabled"):
                decode(reader, allow_pickle=False)
            return

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"the safe codec {self.codec.name!r} unpickled")

        for name in ("loads", "load", "Unpickler"):
            monkeypatch.setattr(pickle, name, refuse)
        assert_same(decode(reader, allow_pickle=False), sample)

    def test_a_damaged_layout_is_a_corrupted_entry(self, sample: Any, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, sample, path)
        reader = EntryReader(str(path))
        for layout in _garbled(reader.codec_layout):
            try:
                decode(_Forged(reader, layout), allow_pickle=not self.codec.safe)  # type: ignore[arg-type]
            except EntryCorrupted:
                pass  # a miss: recomputed

    # -- arrays ------------------------------------------------------------------------
    def test_arrays_are_memory_mapped_and_read_only_under_r(self, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        value = self._array_sample()
        write(self.codec, value, path)
        arrays = self.arrays_of(read(self.codec, path, "r"))
        assert arrays
        for a in arrays:
            assert is_mapped(a)
            assert any(isinstance(b, np.memmap) for b in base_chain(a)), "no np.memmap base"
            assert not a.flags.writeable
            with pytest.raises(ValueError):
                a[...] = 0

    def test_arrays_are_writable_copies_without_mmap(self, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, self._array_sample(), path)
        before = path.read_bytes()
        for a in self.arrays_of(read(self.codec, path, None)):
            assert not is_mapped(a)
            assert a.flags.writeable
            a[...] = 0
        assert path.read_bytes() == before

    def test_copy_on_write_mapping_leaves_the_file_alone(self, tmp_path: Path) -> None:
        path = tmp_path / "entry"
        write(self.codec, self._array_sample(), path)
        before = path.read_bytes()
        arrays = self.arrays_of(read(self.codec, path, "c"))
        for a in arrays:
            assert is_mapped(a) and a.flags.writeable
            a[...] = 0
        assert path.read_bytes() == before
        for got, want in zip(
            self.arrays_of(read(self.codec, path, None)), self.arrays_of(self._array_sample())
        ):
            assert_same(got, want)
