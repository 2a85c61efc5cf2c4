"""Signed entries: HMAC-SHA256 over what decides how an entry is decoded.

With a key, every entry the function cache writes carries a 32-byte HMAC-SHA256
(``docs/format.md``), and a reader holding the key refuses an entry whose
signature is missing or wrong before decoding anything. Where the key comes
from (:func:`resolve_signer`)::

    secret=False                  no signing
    secret="..." / b"..."         that secret
    secret=None (the default)     $MLCACHE_SECRET if set, else the per-user key
                                  file: $MLCACHE_KEY_FILE, else
                                  $XDG_CONFIG_HOME/mlcache/key (~/.config/...),
                                  created on first use with 32 random bytes,
                                  mode 0o600, in a 0o700 folder

**A cache shared between machines** (``s3://...``, any remote store) needs one
secret on every machine that uses it, given as ``$MLCACHE_SECRET`` (from the
team's secret manager, a CI secret, a Kubernetes secret...) or as
``Memory(secret=...)``; ``$MLCACHE_KEY_FILE`` pointing at a copy of one key
file works too. The per-user key file is made on each machine, so two machines
left to it have two keys. A shared store records the id of the key its entries
are first signed with (:mod:`mlcache.store.fsspec`); a process with another key
(or with signing off) then computes and returns its results without storing
them, with one warning that names this fix, instead of recomputing and
overwriting the others' entries forever. To change the team's key, set the new
secret everywhere and clear the cache once (``mlcache clear <url>``).

A key file that others can read (or that another user owns) is refused: whoever
can read it can forge entries. The key must not live inside the cache folder it
protects. The secret is not used as is: the signing key is SHA-256 of a
domain-separation label and the secret, so the same secret used elsewhere
signs nothing of ours.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import os
import secrets
from typing import Any

from .._atomic import TMP_MARK, atomic_file
from ..errors import ConfigError, warn

__all__ = [
    "KEY_ID_SIZE",
    "MAC_SIZE",
    "Signer",
    "default_key_file",
    "key_source",
    "resolve_signer",
]

MAC_SIZE = 32
KEY_ID_SIZE = 8
_LABEL = b"mlcache entry signature v1\0"


class Signer:
    """HMAC-SHA256 with a fixed key, its pads hashed once (RFC 2104): signing a
    few hundred bytes then costs two hash-state copies and two short updates."""

    __slots__ = ("_inner", "_outer", "key_id")

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ConfigError("the signing secret is empty")
        key = hashlib.sha256(_LABEL + secret).digest()
        #: names the key (not secret): an entry signed with another key is told
        #: apart from an altered one
        self.key_id = hashlib.sha256(b"mlcache key id\0" + key).digest()[:KEY_ID_SIZE]
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def sign(self, message: Any) -> bytes:
        """The MAC of ``message`` (bytes-like: one buffer, one hash update)."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def verify(self, mac: Any, message: Any) -> bool:
        """``mac`` (bytes-like) is the MAC of ``message`` (compared in constant time)."""
        return hmac.compare_digest(self.sign(message), mac)

    def __reduce__(self) -> Any:
        raise TypeError("a Signer holds a secret and is not pickled")


def default_key_file() -> str:
    """Where the per-user key lives (see the module docstring)."""
    path = os.environ.get("MLCACHE_KEY_FILE")
    if path:
        return os.path.abspath(os.path.expanduser(path))
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.abspath(os.path.join(config, "mlcache", "key"))


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _read_key_file(path: str) -> bytes:
    """The key in ``path``, refusing a file that others could read or write."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise ConfigError(f"the mlcache key file {path} belongs to another user")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the mlcache key file {path} can be read or written by others "
                f"(mode {st.st_mode & 0o777:o}): anyone who reads it can forge cache "
                f"entries; run `chmod 600 {path}` or delete it to have a new one made"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    key = data.strip()
    if len(key) < 16:
        raise ConfigError(f"the mlcache key file {path} holds fewer than 16 bytes")
    return key


def _create_key_file(path: str) -> None:
    """Write a new random key to ``path`` without ever showing a partial file, and
    without replacing a key another process made first (then that key is used).

    :func:`mlcache._atomic.atomic_file` writes the key to a private staged file
    (mode 0o600, created exclusively, never through a link, fsynced, removed if
    the write fails); one ``link`` publishes it only where no key exists yet: a
    rename would replace a key that other processes already sign with.
    """
    folder, name = os.path.split(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    staged = os.path.join(folder, f".{name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with atomic_file(staged, mode=0o600) as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
        with contextlib.suppress(FileExistsError):
            os.link(staged, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)


@functools.lru_cache(maxsize=8)
def _key_from_file(path: str) -> bytes:
    try:
        return _read_key_file(path)
    except FileNotFoundError:
        _create_key_file(path)
        return _read_key_file(path)


@functools.lru_cache(maxsize=8)
def _signer_for(secret: bytes) -> Signer:
    return Signer(secret)


def key_source(secret: Any) -> str:
    """Where :func:`resolve_signer` takes the key for ``secret`` from, in words
    (for messages; never the key itself)."""
    if secret is False:
        return "signing off (secret=False)"
    if isinstance(secret, (str, bytes, bytearray)):
        return "given as secret="
    if os.environ.get("MLCACHE_SECRET"):
        return "from $MLCACHE_SECRET"
    return f"from the per-user key file {default_key_file()}"


def resolve_signer(secret: Any, location: str | None) -> Signer | None:
    """The :class:`Signer` for a ``Memory(secret=...)`` whose cache is at
    ``location`` (a local folder, or ``None`` when it has none), or ``None`` when
    signing is off.

    A per-user key file that cannot be created (a read-only home) leaves
    signing off with a :class:`~mlcache.CacheWarning`; a key file others can
    read, or one inside the cache folder, is a :class:`~mlcache.ConfigError`.
    """
    if secret is False:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if isinstance(secret, (bytes, bytearray)):
        if not secret:
            raise ConfigError("secret must not be empty (pass secret=False to turn signing off)")
        return _signer_for(bytes(secret))
    if secret is not None and secret is not True:
        raise TypeError(f"secret must be None, False, a str or bytes, got {type(secret).__name__}")
    env = os.environ.get("MLCACHE_SECRET")
    if env:
        return _signer_for(env.encode())
    path = default_key_file()
    if location is not None and _inside(path, location):
        raise ConfigError(
            f"the mlcache key file {path} is inside the cache folder {location}: anyone "
            "who can write entries there could read it; set MLCACHE_KEY_FILE elsewhere"
        )
    try:
        return _signer_for(_key_from_file(path))
    except ConfigError:
        raise
    except OSError as exc:
        warn(
            f"mlcache: cache entries are not signed: cannot create the key file {path} "
            f"({exc}); set MLCACHE_SECRET or MLCACHE_KEY_FILE, or pass secret=",
            stacklevel=4,
        )
        return None
