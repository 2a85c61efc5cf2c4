"""Nothing a function, a module or a dataset class is called can place a file
outside the cache folder."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlcache import CacheWarning, Memory
from mlcache.data import CachedDataset
from mlcache.memo.layout import is_entry

HOSTILE = [
    "../../escape",
    "/abs/olute",
    "..",
    "a/../../b",
    "\x00nul",
    "C:\\windows\\evil",
    "~/.ssh/x",
    ".hidden",
    "é" * 300,
    "a" * 5000,
]


def _files_under(root):
    return {os.path.realpath(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_function_and_module_names_stay_inside(tmp_path, hostile):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = tmp_path / "inside" / "cache"

    def f(x):
        return x * 2

    f.__module__ = hostile
    f.__qualname__ = hostile
    f.__name__ = hostile
    mem = Memory(cache, verbose=0)
    g = mem.cache(f)
    assert np.array_equal(g(np.arange(3)), np.arange(3) * 2)
    assert np.array_equal(g(np.arange(3)), np.arange(3) * 2)
    mem.stats()
    root = os.path.realpath(cache)
    written = _files_under(tmp_path)
    assert written and all(p.startswith(root + os.sep) for p in written)
    assert not any(outside.iterdir())


@pytest.mark.parametrize("hostile", HOSTILE[:6])
def test_hostile_dataset_class_names_stay_inside(tmp_path, hostile):
    class Hostile(CachedDataset):
        def load_source(self):
            yield from ({"x": np.arange(i + 1)} for i in range(3))

    Hostile.__module__ = hostile
    Hostile.__qualname__ = hostile
    cache = tmp_path / "inside"
    ds = Hostile(cache_dir=cache, progress=False)
    assert len(ds) == 3
    root = os.path.realpath(cache)
    assert os.path.realpath(ds.pack_path).startswith(root + os.sep)
    assert all(p.startswith(root + os.sep) for p in _files_under(tmp_path))


class _Planted:
    """Unpickling this creates a folder: a stand-in for any code a pickle can run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def innocent(x):
    return {"x": x}


def _plant(path, marker, signer=None):
    """Overwrite the entry at ``path`` with a well-formed entry whose pickle creates
    ``marker`` when loaded: what an attacker with write access could do (signed
    with ``signer``: an attacker holding some key, not ours)."""
    from mlcache.codecs import codecs
    from mlcache.entry import write_entry

    codec = codecs["pickle"]
    with open(path, "wb") as fh:
        write_entry(
            fh, codec.name, codec.encode(_Planted(str(marker))), {"func": "x"}, None, signer
        )


def _entry_path(cache):
    store = Memory(cache, secret=False).store
    [entry] = [e for e in store.list() if is_entry(e.name)]
    return store.local_path(entry.name)


def test_a_planted_malicious_pickle_is_never_loaded_without_pickle(tmp_path):
    """An attacker who can write in the cache folder replaces a result with a
    pickle that would create a file when loaded. With allow_pickle=False it is
    never unpickled (even with signing off): the call recomputes, and the file
    is never created."""
    marker = tmp_path / "pwned"
    cache = tmp_path / "cache"
    safe = Memory(cache, verbose=0, allow_pickle=False, secret=False).cache(innocent)
    assert safe(1) == {"x": 1}  # stored without pickle
    path = _entry_path(cache)
    _plant(path, marker)
    assert safe(1) == {"x": 1}  # a miss: recomputed, the planted entry replaced
    assert not marker.exists()
    # the test has teeth: the same planted entry, loaded where pickle is allowed
    # and nothing is signed, runs the attacker's code
    _plant(path, marker)
    unsafe = Memory(cache, verbose=0, allow_pickle=True, secret=False).cache(innocent)
    unsafe(1)
    assert marker.exists()


def _forge_key_id(path, key_id):
    """Put our (public) key id on an entry signed with another key."""
    from mlcache.entry import HEADER

    data = bytearray(Path(path).read_bytes())
    f = HEADER.unpack_from(data)
    at = 64 + f[3] + f[4]
    data[at : at + len(key_id)] = key_id
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize(
    "attack, message",
    [
        ("unsigned", "not signed"),
        ("other key", "signed with another key"),
        ("forged key id", "possible tampering"),
    ],
)
def test_a_planted_malicious_pickle_is_never_loaded_when_signed(tmp_path, caplog, attack, message):
    """Signing on (the default) and pickle allowed: a planted entry, unsigned,
    signed with a key that is not ours, or carrying our key's (public) id with a
    MAC it cannot make, is refused before it is decoded, logged, and recomputed;
    the attacker's code never runs."""
    from mlcache.entry.signing import Signer

    marker = tmp_path / "pwned"
    cache = tmp_path / "cache"
    mem = Memory(cache, verbose=0)  # default: the per-user key
    f = mem.cache(innocent)
    assert f(1) == {"x": 1}
    path = _entry_path(cache)
    attacker = None if attack == "unsigned" else Signer(b"another key")
    _plant(path, marker, attacker)
    if attack == "forged key id":
        _forge_key_id(path, mem.context.signer.key_id)
    with pytest.warns(CacheWarning, match=message):
        assert f(1) == {"x": 1}
    assert not marker.exists()
    assert any(message in r.getMessage() for r in caplog.records)
    assert f.check_call_in_cache(1)  # overwritten by a signed entry
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1) == {"x": 1}  # which is a plain hit
    # the same planted entry, read with signing off, runs the code
    _plant(path, marker, attacker)
    Memory(cache, verbose=0, secret=False).cache(innocent)(1)
    assert marker.exists()
