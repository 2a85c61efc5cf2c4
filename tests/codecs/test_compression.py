"""codecs/compression.py: methods through the one Registry; values and errors
are those of ``Memory(compress=...)`` (parsing is tested in tests/memo/test_config.py)."""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache.codecs import codecs
from mlcache.codecs.compression import Compression, compressors, register_compressor
from mlcache.entry import EntryReader, decode, write_entry
from mlcache.errors import ConfigError, EntryCorrupted, InvalidRegistration, UnknownFormat


class RawDeflate:
    """A user method: deflate without zlib's header and checksum."""

    def compress(self, data: Any, level: int) -> bytes:
        return zlib.compress(data, level, wbits=-15)

    def decompress(self, data: Any) -> bytes:
        return zlib.decompress(data, wbits=-15)


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(compressors, "_entries", dict(compressors._entries))


def test_the_builtin_methods_are_registered_in_order():
    assert list(compressors) == ["zlib", "gzip", "bz2", "lzma", "xz", "lz4"]


def test_a_registered_method_is_used_by_entries(scratch):
    register_compressor("rawdeflate", RawDeflate())
    value = {"a": np.arange(1000.0), "b": b"x" * 500}
    f = io.BytesIO()
    npy = codecs["npy"]
    write_entry(f, "npy", npy.encode(value), {}, Compression("rawdeflate", 6))
    assert f.tell() < 9000 + 500  # compressed
    f.seek(0)
    out = decode(EntryReader(f), allow_pickle=False)
    np.testing.assert_array_equal(out["a"], value["a"])
    assert out["b"] == value["b"]


def test_an_unknown_method_is_a_config_error_naming_the_known_ones(scratch):
    with pytest.raises(ConfigError, match="unknown compression 'rawdeflate'; expected one of zlib"):
        Compression("rawdeflate", 3)
    register_compressor("rawdeflate", RawDeflate())
    assert Compression("rawdeflate", 3).level == 3
    with pytest.raises(ConfigError, match=r"expected one of .*lz4, rawdeflate"):
        Compression("nope", 3)


def test_an_entry_of_a_method_this_process_lacks_is_unknown_not_corrupted(scratch, monkeypatch):
    register_compressor("rawdeflate", RawDeflate())
    f = io.BytesIO()
    write_entry(f, "npy", codecs["npy"].encode(b"data" * 100), {}, Compression("rawdeflate", 1))
    without = {k: v for k, v in compressors._entries.items() if k != "rawdeflate"}
    monkeypatch.setattr(compressors, "_entries", without)
    f.seek(0)
    with pytest.raises(UnknownFormat, match="register_compressor") as got:
        EntryReader(f)
    assert not isinstance(got.value, EntryCorrupted)  # not damaged: others can read it


@pytest.mark.parametrize(
    "bad",
    [object(), RawDeflate, 3, "zlib"],
    ids=["no-methods", "a-class-not-an-instance", "int", "str"],
)
def test_register_compressor_refuses_non_compressors(bad, scratch):
    with pytest.raises(InvalidRegistration, match="not a compressor"):
        register_compressor("mine", bad)


def test_register_compressor_refuses_bad_and_taken_names(scratch):
    with pytest.raises(InvalidRegistration, match="invalid compression name"):
        register_compressor("Has Space", RawDeflate())
    with pytest.raises(InvalidRegistration, match="already registered"):
        register_compressor("zlib", RawDeflate())
    register_compressor("zlib", RawDeflate(), replace=True)
    assert isinstance(compressors["zlib"], RawDeflate)


def test_lz4_without_the_package_says_what_to_install():
    try:
        import lz4  # noqa: F401
    except ImportError:
        c = Compression("lz4", 3)  # valid as a setting: the write says what is missing
        with pytest.raises(ConfigError, match="pip install lz4"):
            c.compress(b"x")
    else:
        c = Compression("lz4", 3)
        assert c.decompress(c.compress(b"x" * 100)) == b"x" * 100


SCRIPT = """
import sys, warnings, zlib, mlcache

class RawDeflate:
    def compress(self, data, level):
        return zlib.compress(data, level, wbits=-15)

    def decompress(self, data):
        return zlib.decompress(data, wbits=-15)

writer = sys.argv[2] == "write"
if writer:
    mlcache.register_compressor("rawdeflate", RawDeflate())
mem = mlcache.Memory(sys.argv[1], verbose=0, compress=("rawdeflate", 3) if writer else None)

@mem.cache
def f(x):
    print("computed")
    return list(range(x))

with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    print("damaged:", mem.verify())
    assert f(1000) == list(range(1000))
print("warned:", " | ".join(str(w.message) for w in got))
"""


def test_an_entry_with_a_compression_not_registered_here_is_a_miss_not_damage(tmp_path):
    """A process that has not registered a compressor cannot read what another
    wrote with it: a miss with a warning naming register_compressor, never
    "damaged" (which removes it, in a cache others share)."""
    import subprocess
    import sys

    cache, script = str(tmp_path / "c"), tmp_path / "job.py"
    script.write_text(SCRIPT)

    def run(mode):
        return subprocess.run(
            [sys.executable, str(script), cache, mode],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        ).stdout

    assert "computed" in run("write")
    assert "computed" not in run("write")  # a hit for who registered it
    # the next run's record holds the value decoded (mlcache/memo/record.py): served
    # right without the compressor; the entry file's own reading is what is tested
    records = list(Path(cache).rglob("record"))
    assert records
    for record in records:
        record.unlink()
    out = run("read")
    assert "damaged: []" in out
    assert "computed" in out
    warned = out.split("warned:")[1]
    assert "register_compressor" in warned and "damaged" not in warned


LZ4_MISSING = """
import sys
sys.modules["lz4"] = None  # as if lz4 were not installed: importing it raises ImportError
import mlcache
from mlcache.errors import ConfigError

try:
    mlcache.Memory(sys.argv[1], verbose=0, compress=("lz4", 3))
except ConfigError as exc:
    print("refused:", isinstance(exc, ValueError), exc)
else:
    print("accepted")
mem = mlcache.Memory(sys.argv[1], verbose=0, compress=("zlib", 3))  # others still work
print("zlib:", mem.cache(lambda x: x * 2)(21))
"""


def test_lz4_without_the_package_is_refused_when_the_memory_is_made(tmp_path):
    """``compress=("lz4", 3)`` without lz4 would warn at every call and store
    nothing: the constructor refuses it, naming the pip install (a real missing
    module: the child process cannot import lz4, whether it is installed or not)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", LZ4_MISSING, str(tmp_path / "c")],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert "refused: True" in out and "pip install lz4" in out, out
    assert "zlib: 42" in out
