"""config.py and compression.py: settings are parsed once, and errors say what was wrong."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from mlcache import ConfigError
from mlcache._util import parse_bytes, parse_duration
from mlcache.codecs.compression import Compression, parse_compress
from mlcache.memo.config import MemoryConfig, check_mmap_mode


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0, 0),
        (10_000, 10_000),
        ("10", 10),
        ("10b", 10),
        ("10K", 10 * 1024),
        ("10kb", 10 * 1024),
        ("10 KiB", 10 * 1024),
        ("1.5GB", int(1.5 * 2**30)),
        ("2GiB", 2 * 2**30),
        ("3m", 3 * 2**20),
        (" 1T ", 2**40),
    ],
)
def test_parse_bytes(value, expected):
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", [-1, "-1K", "ten", "10 X", "10KK", "1e9", "", True, 1.5, [10]])
def test_parse_bytes_errors_name_the_value(value):
    with pytest.raises(ConfigError) as info:
        parse_bytes(value)
    assert isinstance(info.value, ValueError)
    assert repr(value) in str(info.value) or str(value) in str(info.value)
    assert "10GB" in str(info.value) or "negative" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0, 0.0),
        (90, 90.0),
        (1.5, 1.5),
        (datetime.timedelta(hours=2), 7200.0),
        ("10s", 10.0),
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("7d", 604800.0),
        ("2w", 1209600.0),
        (" 1.5h ", 5400.0),
    ],
)
def test_parse_duration(value, expected):
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value",
    ["7x", "d", "-1d", "1 day", "", True, [1], -5, datetime.timedelta(seconds=-1), float("nan")],
)
def test_parse_duration_errors_name_the_value(value):
    with pytest.raises(ConfigError) as info:
        parse_duration(value)
    assert isinstance(info.value, ValueError)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (False, None),
        (0, None),
        (True, Compression("zlib", 3)),
        (1, Compression("zlib", 1)),
        (9, Compression("zlib", 9)),
        ("gzip", Compression("gzip", 3)),
        (("bz2", 5), Compression("bz2", 5)),
        (("lzma", 0), None),
        (("xz", 2), Compression("xz", 2)),
    ],
)
def test_parse_compress(value, expected):
    assert parse_compress(value) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (("nope", 3), "unknown compression 'nope'; expected one of zlib, gzip"),
        ("nope", "unknown compression 'nope'"),
        (10, "level must be in 0..9, got 10"),
        (-1, "level must be in 0..9, got -1"),
        (("zlib", 12), "level must be in 0..9, got 12"),
        (("zlib",), r"\(name, level\) tuple; got \('zlib',\)"),
        (("zlib", 3, 4), "got"),
        (("zlib", True), "got"),
        (("zlib", "3"), "got"),
        ((3, "zlib"), "got"),
        (3.5, "got 3.5"),
        (["zlib", 3], "got"),
    ],
)
def test_parse_compress_errors(value, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_compress(value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("method", ["zlib", "gzip", "bz2", "lzma", "xz"])
def test_compression_round_trips(method):
    data = b"mlcache " * 1000
    c = Compression(method, 6)
    packed = c.compress(data)
    assert len(packed) < len(data) / 10
    assert c.decompress(packed) == data
    assert c.decompress(memoryview(packed)) == data
    assert c.compress(data) == packed  # deterministic (gzip without a timestamp)


def test_compression_is_a_frozen_value():
    c = Compression("zlib", 3)
    assert c == Compression("zlib", 3) and hash(c) == hash(Compression("zlib", 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.level = 4  # type: ignore[misc]


def test_check_mmap_mode():
    for mode in (None, "r", "r+", "c"):
        assert check_mmap_mode(mode) == mode
    with pytest.raises(ConfigError, match="'w\\+' would truncate"):
        check_mmap_mode("w+")
    with pytest.raises(ConfigError, match="got 'x'"):
        check_mmap_mode("x")


def test_memory_config_is_validated_frozen_and_keyword_only(tmp_path):
    cfg = MemoryConfig.make(tmp_path, "local", "r", ("zlib", 2), None, "1K", None, False)
    assert cfg.location == str(tmp_path)
    assert cfg.compress == Compression("zlib", 2)
    assert cfg.bytes_limit == 1024 and cfg.verbose == 0 and cfg.backend_options == {}
    assert cfg.allow_pickle is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.verbose = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        MemoryConfig(str(tmp_path))  # type: ignore[misc]
    with pytest.raises(ConfigError, match="mmap_mode"):
        MemoryConfig(location=None, mmap_mode="w")
    with pytest.raises(TypeError, match="location"):
        MemoryConfig.make(42, "local", None, False, 0, None, None, True)
    with pytest.raises(TypeError, match="backend"):
        MemoryConfig(location=None, backend=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="backend_options"):
        MemoryConfig(location=None, backend_options=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        MemoryConfig.make(None, "local", None, False, 0, "lots", None, True)
