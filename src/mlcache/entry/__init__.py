"""The entry format of the function cache: one self-describing file per cached
call, and the only code that reads or writes its bytes.

- :mod:`~mlcache.entry.format`: the byte table (also in ``docs/format.md``),
  its constants and the parsing of an entry's header;
- :mod:`~mlcache.entry.writer`: :class:`EntryPlan` (an entry laid out, its size
  known before it is written) and :func:`write_entry`;
- :mod:`~mlcache.entry.reader`: :class:`EntryReader` (checksums, signature,
  segments for the codec), :func:`open_entry`, :func:`read_entry_info` and
  :func:`decode` for an entry of a store, :func:`verify_file`;
- :mod:`~mlcache.entry.signing`: the HMAC key and :class:`Signer`.

Examples
--------
>>> import io
>>> from mlcache.codecs import codecs
>>> from mlcache.entry import EntryReader, decode, write_entry
>>> f = io.BytesIO()
>>> npy = codecs["npy"]
>>> write_entry(f, "npy", npy.encode([1, 2.5]), {"func": "f"}) > 0
True
>>> _ = f.seek(0)
>>> decode(EntryReader(f), allow_pickle=False)
[1, 2.5]
"""

from __future__ import annotations

from .format import BLOCK_SUMS, CODE_SIGNED, FORMAT_VERSION, HEADER, MAGIC, SIGNED
from .marks import map_holds
from .reader import (
    REF_ATTR,
    EntryReader,
    decode,
    forget_verified,
    keep_verified,
    local_file,
    open_entry,
    read_entry_info,
    read_info,
    verify_file,
)
from .writer import BLOCK_SIZE, BLOCK_TABLE_MIN, EntryPlan, write_entry

__all__ = [
    "BLOCK_SIZE",
    "BLOCK_SUMS",
    "BLOCK_TABLE_MIN",
    "CODE_SIGNED",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "REF_ATTR",
    "SIGNED",
    "EntryPlan",
    "EntryReader",
    "decode",
    "forget_verified",
    "keep_verified",
    "local_file",
    "map_holds",
    "open_entry",
    "read_entry_info",
    "read_info",
    "verify_file",
    "write_entry",
]
