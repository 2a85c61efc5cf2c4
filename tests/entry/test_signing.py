"""Signed entries: the key, where it comes from, and what a reader refuses."""

from __future__ import annotations

import hashlib
import hmac
import multiprocessing
import os
import pickle
import stat
import warnings

import numpy as np
import pytest

from mlcache import CacheWarning, ConfigError, EntryCorrupted, EntrySignatureError, Memory
from mlcache.codecs import codecs
from mlcache.entry import CODE_SIGNED, SIGNED, EntryReader, write_entry
from mlcache.entry.signing import _LABEL, Signer, _key_from_file, default_key_file, resolve_signer


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    """A fresh key file path (not yet created) for this test alone."""
    path = tmp_path / "config" / "mlcache" / "key"
    monkeypatch.setenv("MLCACHE_KEY_FILE", str(path))
    _key_from_file.cache_clear()
    yield path
    _key_from_file.cache_clear()


def _write(path, value, signer, codec_name=None, name="f/0/k"):
    codec = codecs[codec_name or ("npy" if codecs["npy"].can_encode(value) else "pickle")]
    with open(path, "wb") as fh:
        write_entry(fh, codec.name, codec.encode(value), {"func": "f"}, None, signer, name)


def test_signer_is_hmac_sha256_of_a_derived_key():
    secret, msg = b"s3cret", os.urandom(1000)
    key = hashlib.sha256(_LABEL + secret).digest()
    signer = Signer(secret)
    assert signer.sign(msg) == hmac.digest(key, msg, "sha256")
    assert signer.verify(hmac.digest(key, msg, "sha256"), msg)
    assert not signer.verify(bytes(32), msg)
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(signer)


def test_the_per_user_key_file_is_created_private_and_reused(key_file, tmp_path):
    signer = resolve_signer(None, str(tmp_path / "cache"))
    assert signer is not None and default_key_file() == str(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert len(key_file.read_bytes().strip()) == 64
    first = key_file.read_bytes()
    _key_from_file.cache_clear()
    again = resolve_signer(None, str(tmp_path / "cache"))
    assert key_file.read_bytes() == first
    assert again is not None and again.sign(b"x") == signer.sign(b"x")
    assert not [p for p in key_file.parent.iterdir() if p.name != "key"]  # no temporaries


def test_a_key_write_that_fails_leaves_no_file_behind(key_file, monkeypatch):
    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.warns(CacheWarning, match="No space left"):
        assert resolve_signer(None, None) is None
    assert list(key_file.parent.iterdir()) == []  # neither the key nor a temporary


def test_a_key_made_first_by_another_process_is_kept(key_file, monkeypatch):
    from mlcache.entry import signing

    theirs = b"their key, made first: 0123456789abcdef\n"
    real_link = os.link

    def late(src, dst):  # another process published its key meanwhile
        key_file.write_bytes(theirs)
        key_file.chmod(0o600)
        real_link(src, dst)

    monkeypatch.setattr(signing.os, "link", late)
    signer = resolve_signer(None, None)
    assert key_file.read_bytes() == theirs
    assert signer is not None and signer.sign(b"x") == Signer(theirs.strip()).sign(b"x")
    assert [p.name for p in key_file.parent.iterdir()] == ["key"]


def _make_key(path):
    os.environ["MLCACHE_KEY_FILE"] = path
    return resolve_signer(None, None).sign(b"probe")  # type: ignore[union-attr]


def test_processes_creating_the_key_at_once_agree(tmp_path):
    path = str(tmp_path / "k" / "key")
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        macs = pool.map(_make_key, [path] * 12)
    assert len(set(macs)) == 1


def test_a_key_file_others_can_read_is_refused(key_file, tmp_path):
    resolve_signer(None, None)
    key_file.chmod(0o644)
    _key_from_file.cache_clear()
    with pytest.raises(ConfigError, match="chmod 600"):
        Memory(tmp_path / "cache")


def test_a_key_file_inside_the_cache_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCACHE_KEY_FILE", str(tmp_path / "cache" / "key"))
    with pytest.raises(ConfigError, match="inside the cache folder"):
        Memory(tmp_path / "cache")


def test_a_key_file_that_cannot_be_made_leaves_signing_off_with_a_warning(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("MLCACHE_KEY_FILE", str(tmp_path / "a-file" / "key"))
    with pytest.warns(CacheWarning, match="not signed"):
        mem = Memory(tmp_path / "cache", verbose=0)
    assert mem.context.signer is None
    assert mem.cache(lambda x: x + 1)(1) == 2


@pytest.mark.parametrize("bad", ["", b""])
def test_an_empty_secret_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="empty"):
        Memory(tmp_path, secret=bad)


def test_a_secret_of_another_type_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="secret"):
        Memory(tmp_path, secret=3)  # type: ignore[arg-type]


CALLS: list[int] = []


def double(x):
    CALLS.append(x)
    return x * 2


def test_the_environment_secret_is_shared_by_memories(tmp_path, monkeypatch, key_file):
    monkeypatch.setenv("MLCACHE_SECRET", "team secret")
    CALLS.clear()
    f = double
    assert Memory(tmp_path, verbose=0).cache(f)(3) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Memory(tmp_path, verbose=0, secret="team secret").cache(f)(3) == 6
    assert CALLS == [3]
    assert not key_file.exists()  # the environment's secret: no key file made


def test_signing_off_reads_signed_entries_and_signed_refuses_unsigned(tmp_path):
    CALLS.clear()
    Memory(tmp_path, verbose=0, secret="k").cache(double)(1)
    assert Memory(tmp_path, verbose=0, secret=False).cache(double)(1) == 2
    Memory(tmp_path, verbose=0, secret=False).cache(double)(2)  # unsigned entry
    with pytest.warns(CacheWarning, match="not signed"):
        assert Memory(tmp_path, verbose=0, secret="k").cache(double)(2) == 4
    assert CALLS == [1, 2, 2]


def test_an_explicit_secret_travels_with_a_pickled_memory(tmp_path):
    mem = Memory(tmp_path, verbose=0, secret="travels")
    other = pickle.loads(pickle.dumps(mem))
    assert other.context.signer is not None
    assert other.context.signer.sign(b"x") == mem.context.signer.sign(b"x")
    off = pickle.loads(pickle.dumps(Memory(tmp_path, secret=False)))
    assert off.context.signer is None


class Model:
    def __init__(self, w):
        self.w = w


def fit(n):
    CALLS.append(n)
    return Model(np.arange(n, dtype=np.float64))


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_pickled_results_are_signed_in_full_and_hit(tmp_path, mmap_mode):
    CALLS.clear()
    f = Memory(tmp_path, verbose=0, mmap_mode=mmap_mode, secret="k").cache(fit)
    f(100_000)
    got = f(100_000)
    assert CALLS == [100_000]
    np.testing.assert_array_equal(got.w, np.arange(100_000, dtype=np.float64))


def test_flags_say_what_the_signature_covers(tmp_path):
    signer = Signer(b"k")
    _write(tmp_path / "a", np.arange(10), signer)
    _write(tmp_path / "p", {1, 2}, signer)
    _write(tmp_path / "u", np.arange(10), None)
    flags = {n: int.from_bytes((tmp_path / n).read_bytes()[10:12], "little") for n in "apu"}
    assert flags == {"a": SIGNED, "p": SIGNED | CODE_SIGNED, "u": 0}
    for n in "ap":
        EntryReader(str(tmp_path / n), None, signer, "f/0/k")
    with pytest.raises(EntrySignatureError, match="not signed"):
        EntryReader(str(tmp_path / "u"), None, signer)
    EntryReader(str(tmp_path / "u"))  # readable without a signer


def _flip(path, pos):
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("value", [np.arange(64), {1, 2, 3}], ids=["npy", "pickle"])
def test_every_flipped_byte_of_a_signed_entry_is_refused(tmp_path, value):
    """A signed entry with any one meaningful bit changed (all but the zero padding
    before the payload, which nothing reads) never reads with the signer."""
    from mlcache.entry import HEADER

    signer = Signer(b"k")
    path = tmp_path / "e"
    _write(path, value, signer)
    good = path.read_bytes()
    fields = HEADER.unpack_from(good)
    mac_end, p_off = 64 + fields[3] + fields[4] + 40, fields[6]
    for pos in [*range(mac_end), *range(p_off, len(good))]:
        path.write_bytes(good)
        _flip(path, pos)
        with pytest.raises(EntryCorrupted):
            EntryReader(str(path), None, signer, "f/0/k")


def test_a_pickle_payload_altered_with_its_checksum_fixed_is_refused(tmp_path):
    """The attack a checksum cannot stop: change the pickle, recompute every
    xxh3 in the header. Only the signature catches it."""
    import xxhash

    from mlcache.entry import HEADER
    from mlcache.entry.format import header_sum

    signer = Signer(b"k")
    path = tmp_path / "e"
    _write(path, {"a": "b"}, signer, "pickle")
    data = bytearray(path.read_bytes())
    fields = list(HEADER.unpack_from(data))
    p_off, p_len = fields[6], fields[7]
    i = bytes(data).index(b"\x8c\x01a", p_off)  # the short string 'a' in the pickle
    data[i + 2] = ord("c")
    fields[8] = xxhash.xxh3_64_intdigest(bytes(data[p_off : p_off + p_len]))
    head = HEADER.pack(*fields[:9], 0, 0)
    lay_n, info_n = fields[3], fields[4]
    fields[9] = header_sum(head[:48], bytes(data[64 : 64 + lay_n + info_n]))
    data[:64] = HEADER.pack(*fields)
    path.write_bytes(bytes(data))
    reader = EntryReader(str(path))  # checksums all agree: without a signer it reads
    assert codecs["pickle"].decode(reader.codec_layout, reader) == {"c": "b"}
    with pytest.raises(EntrySignatureError, match="does not verify"):
        EntryReader(str(path), None, signer, "f/0/k")


def test_an_entry_moved_to_another_name_is_refused(tmp_path):
    """Copying a valid signed entry over another key's (is_admin("root") over
    is_admin("mallory")) does not make it the other call's result."""
    signer = Signer(b"k")
    _write(tmp_path / "e", True, signer, name="auth.is_admin/0123/aaaa")
    EntryReader(str(tmp_path / "e"), None, signer, "auth.is_admin/0123/aaaa")
    with pytest.raises(EntrySignatureError, match="moved") as info:
        EntryReader(str(tmp_path / "e"), None, signer, "auth.is_admin/0123/bbbb")
    assert info.value.reason == "mismatch"


def is_admin(user):
    return user == "root"


def test_copying_an_entry_over_another_call_is_caught_by_memory(tmp_path):
    import shutil

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(is_admin)
    assert f("root") is True and f("mallory") is False
    root, mallory = (mem.store.local_path(f._name((u,), {})) for u in ("root", "mallory"))
    shutil.copyfile(root, mallory)
    with pytest.warns(CacheWarning, match="possible tampering"):
        assert f("mallory") is False


@pytest.mark.parametrize("mode", ["r", "c"])
def test_the_pickle_decoded_is_the_copy_that_was_checked(tmp_path, mode):
    """The file changes after the signature check (the same inode, rewritten in
    place): what is unpickled is still the checked copy, never the new bytes."""
    signer = Signer(b"k")
    path = tmp_path / "e"
    _write(path, {"who": "good"}, signer, "pickle")
    reader = EntryReader(str(path), mode, signer, "f/0/k")
    data = path.read_bytes()
    i = data.index(b"good")
    with open(path, "r+b") as fh:  # an attacker racing the reader
        fh.seek(i)
        fh.write(b"evil")
    assert codecs["pickle"].decode(reader.codec_layout, reader) == {"who": "good"}


class Holder:
    def __init__(self, w):
        self.w = w


def holder(n):
    CALLS.append(n)
    return Holder(np.zeros(n))


def test_r_plus_edits_to_pickled_arrays_persist_with_signing(tmp_path):
    """mmap_mode="r+" writes through, as in joblib: edits to the arrays inside a
    pickled result are kept, not taken for tampering (only the pickle stream is
    signed in full)."""
    CALLS.clear()
    f = Memory(tmp_path, verbose=0, mmap_mode="r+").cache(holder)
    f(1000)
    got = f(1000)
    got.w[:] = 42.0  # a shared map: the file sees it
    del got
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = f(1000)
    assert float(again.w[0]) == 42.0 and CALLS == [1000]


def test_entries_of_another_key_are_recomputed_with_one_warning_per_function(tmp_path):
    CALLS.clear()
    Memory(tmp_path, verbose=0, secret="a").cache(double)(1)
    Memory(tmp_path, verbose=0, secret="a").cache(double)(2)
    g = Memory(tmp_path, verbose=0, secret="b").cache(double)
    with pytest.warns(CacheWarning, match="signed with another key") as record:
        g(1)
        g(2)
    assert len([w for w in record if "another key" in str(w.message)]) == 1
    assert CALLS == [1, 2, 1, 2]
