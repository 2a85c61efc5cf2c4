"""Forged lengths, offsets, shapes and counts inside files whose checksums are right.

The other fuzz tests (``entry/test_entry.py``, ``data/test_pack.py``) feed random or
damaged bytes, which the checksums mostly stop at the door. Here every checksum
is recomputed after the forgery (as docs/format.md defines them), so a forged
number reaches the parser and the decoder. Each example starts from a valid
entry (npy codec, pickle codec, zlib-compressed npy) or a valid pack (a ragged
array field, a fixed-shape array column, a str, an int and an optional float
field) and forges the header integers, any number of the entry's layout or the
pack's index (huge, negative, off by one, wrapping modulo 2**64, non-integral,
infinite or NaN: Python's json reads them all) and the pack's offsets and shapes
tables, then opens and reads everything and checks that

* only the documented exception escapes: ``EntryCorrupted`` for entries (and
  ``UnsupportedValue`` from ``decode`` of a pickle entry with pickle disabled),
  ``PackCorrupted`` for packs;
* no header, index or payload checksum refused the file (the forgery did reach
  the parser);
* the peak of traced allocations (numpy's included) stays below 64 MiB plus ten
  times the file size, whatever the forged numbers claim.

Single forgeries that each need a check of their own (segment references, shapes
and numbers of the npy codec's tree; a pack's sample count, column shapes, text
that is not UTF-8, ragged shapes wrapping around 2**64, Infinity and NaN in the
index) are regression tests of their own, with the same checks.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import re
import struct
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from mlcache.codecs import codecs
from mlcache.codecs.compression import Compression
from mlcache.data import PackCorrupted, PackedDataset, pack
from mlcache.entry import EntryReader, decode, read_info, verify_file, write_entry
from mlcache.errors import EntryCorrupted, UnsupportedValue

ENTRY_MAGIC = b"\x93MLCACHE"
PACK_MAGIC = b"\x93MLCPACK"
U32, U64 = 2**32, 2**64
ALLOWANCE = 64 << 20
_names = itertools.count()

# -- forging one number ------------------------------------------------------------
SPECIAL = (
    *(0, 1, 2, -1, -2, 63, 64, 65),
    *(2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**53 + 1),
    *(2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1),
    *(-(2**31), -(2**40), -(2**63), -(2**63) - 1),
)
Op = tuple[str, Any]
#: integer forgeries: special values, shifts (small ones too), scalings (x * (2**63 - 1) twice is x
#: modulo 2**64, x * -1 twice keeps a product), anything
int_ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(SPECIAL)),
    st.tuples(st.just("add"), st.sampled_from((1, -1, 8, -8, 64, -64, 2**32, 2**62, 2**63, U64))),
    st.tuples(st.just("mul"), st.sampled_from((-1, 0, 2, 3, 2**32, 2**62 + 1, 2**63 - 1))),
    st.tuples(st.just("add"), st.integers(-130, 130)),  # near: may still pass the checks
    st.tuples(st.just("set"), st.integers(-(2**64), 2**65)),
)
FINITE = (0.0, -0.0, 0.5, 1.0, 64.0, 2.0**63, 1e300)
NONFINITE = (math.inf, -math.inf, math.nan)  # Python's json reads Infinity and NaN
#: JSON numbers that are not integers
float_ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FINITE + NONFINITE)),
    st.tuples(st.just("float"), st.none()),
)
json_ops = int_ops | float_ops


def forge(op: Op, x: Any) -> Any:
    kind, k = op
    if kind == "set":
        return k
    if kind == "float":
        return float(x)
    if kind == "add":
        return x + k
    return x * k


def edits(ops: st.SearchStrategy[Op], max_size: int = 4) -> st.SearchStrategy:
    """Which numbers to forge (an index, taken modulo their count) and how."""
    return st.lists(st.tuples(st.integers(0, 10**6), ops), max_size=max_size)


def int_slots(obj: Any, skip: tuple[str, ...] = (), path: tuple[Any, ...] = ()) -> list[tuple]:
    """The paths of every JSON integer in ``obj`` (not bools), except under keys ``skip``."""
    if type(obj) is int:
        return [path]
    if type(obj) is list:
        return [p for i, x in enumerate(obj) for p in int_slots(x, skip, (*path, i))]
    if type(obj) is dict:
        return [p for k, x in obj.items() if k not in skip for p in int_slots(x, skip, (*path, k))]
    return []


def get_at(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def set_at(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    get_at(obj, path[:-1])[path[-1]] = value


def apply_json_edits(doc: Any, todo: list[tuple[int, Op]], skip=()) -> Any:
    """A copy of ``doc`` with the numbers ``todo`` forged."""
    doc = json.loads(json.dumps(doc))
    slots = int_slots(doc, skip)
    for i, op in todo:
        path = slots[i % len(slots)]
        set_at(doc, path, forge(op, get_at(doc, path)))
    return doc


# -- running a reader: only the allowed exceptions, bounded memory ------------------
def bounded(run: Callable[[], None], size: int) -> None:
    """Run ``run``, and check the peak of traced allocations against the file size."""
    tracemalloc.start()
    try:
        run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOWANCE + 10 * size, f"peak allocation {peak} bytes for a {size}-byte file"


def touch(value: Any) -> None:
    """Look at every byte of a decoded value (a bad map or view would fault here)."""
    if isinstance(value, np.ndarray):
        value.tobytes()
    elif isinstance(value, dict):
        for k, v in value.items():
            touch(k)
            touch(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            touch(v)


def note(what: str) -> None:
    """Count ``what`` for ``--hypothesis-show-statistics`` (a no-op outside hypothesis)."""
    try:
        event(re.sub(r"\d+", "#", what)[:48])
    except InvalidArgument:
        pass


def refused(exc: Exception) -> None:
    """A documented refusal: it must come from the parser, not from a checksum (they
    were all recomputed; only a region moved onto the header or the index, whose
    bytes change when the file is rebuilt, may fail its block checksums)."""
    message = str(exc)
    assert "header checksum mismatch" not in message, message
    assert "index checksum mismatch" not in message, message
    assert "payload checksum mismatch" not in message, message
    note("refused: " + message.split(": ", 1)[-1])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("forged")


def fresh(folder: Path, data: bytes) -> Path:
    """A new file for each example: a map of the previous one may still be alive."""
    path = folder / f"f{next(_names)}"
    path.write_bytes(data)
    return path


# == entries ===========================================================================
def npy_value() -> dict[str, Any]:
    return {
        "x": np.arange(6, dtype=np.float64).reshape(2, 3),
        "f": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
        "e": np.zeros((0, 5), dtype=np.uint8),
        "b": b"some bytes",
        "s": np.float32(1.5),
        "t": (1, "two", None, -5, 2**60),
    }


def pickle_value() -> dict[str, Any]:
    return {"x": np.arange(10, dtype=np.int64), "y": np.ones((3, 2)), "z": {1, 2, 3}}


ENTRY_KINDS = {
    "npy": ("npy", npy_value, None),
    "pickle": ("pickle", pickle_value, None),
    "npy-zlib": ("npy", npy_value, Compression("zlib", 1)),
}
_ENTRIES: dict[str, tuple[bytes, dict[str, Any], bytes, bytes]] = {}


def base_entry(kind: str) -> tuple[bytes, dict[str, Any], bytes, bytes]:
    """(file, layout, info, payload) of a valid entry written by write_entry."""
    if kind not in _ENTRIES:
        codec, value, compression = ENTRY_KINDS[kind]
        buf = io.BytesIO()
        write_entry(buf, codec, codecs[codec].encode(value()), {"func": "f"}, compression)
        data = buf.getvalue()
        _m, _v, _f, lay_n, info_n, _s, p_off, p_len = struct.unpack_from("<8sHHIIIQQ", data)
        layout = json.loads(data[64 : 64 + lay_n])
        info = data[64 + lay_n : 64 + lay_n + info_n]
        _ENTRIES[kind] = (data, layout, info, data[p_off : p_off + p_len])
    return _ENTRIES[kind]


#: header integers: position among (L, I, segment count, P, N), and modulus
ENTRY_FIELDS = {"L": (0, U32), "I": (1, U32), "nseg": (2, U32), "P": (3, U64), "N": (4, U64)}


def build_entry(
    layout: Any, info: bytes, payload: bytes, head_edits: list[tuple[str, Op]]
) -> bytes:
    """An entry around ``layout`` and ``payload`` with the header integers forged by
    ``head_edits``, and both checksums computed (per docs/format.md) over the byte
    ranges the forged header names."""
    lay = json.dumps(layout, separators=(",", ":")).encode()
    meta_end = 64 + len(lay) + len(info)
    p_off = meta_end + (-meta_end % 64)
    data = bytes(64) + lay + info + bytes(p_off - meta_end) + payload
    head = [len(lay), len(info), len(layout["seg"]), p_off, len(payload)]
    for name, op in head_edits:
        i, modulus = ENTRY_FIELDS[name]
        head[i] = forge(op, head[i]) % modulus
    lay_n, info_n, nseg, p_off, p_len = head
    psum = xxhash.xxh3_64_intdigest(data[p_off : p_off + p_len])
    fixed = struct.pack("<8sHHIIIQQQ", ENTRY_MAGIC, 1, 0, lay_n, info_n, nseg, p_off, p_len, psum)
    seed = xxhash.xxh3_64_intdigest(fixed)
    hsum = xxhash.xxh3_64_intdigest(data[64 : 64 + lay_n + info_n], seed=seed)
    return fixed + struct.pack("<QQ", hsum, 0) + data[64:]


def read_entry_everything(path: Path, pickled: bool) -> None:
    """Everything a caller does with an entry; only EntryCorrupted may escape (and
    UnsupportedValue from decoding a pickle entry with pickle disabled)."""
    for mode in (None, "r"):
        try:
            reader = EntryReader(str(path), mode)
            assert isinstance(reader.info, dict)
            for i in range(len(reader)):
                reader.buffer(i)
            try:
                value = decode(reader, allow_pickle=False)
            except UnsupportedValue:
                assert pickled
            else:
                touch(value)
                note("decoded")
        except EntryCorrupted as exc:
            refused(exc)
    for call in (read_info, verify_file):
        try:
            call(str(path))
        except EntryCorrupted as exc:
            refused(exc)


def check_entry(folder: Path, data: bytes, kind: str) -> None:
    path = fresh(folder, data)
    try:
        bounded(lambda: read_entry_everything(path, kind == "pickle"), len(data))
    finally:
        path.unlink()


entry_kinds = st.sampled_from(sorted(ENTRY_KINDS))
entry_head_edits = st.lists(st.tuples(st.sampled_from(sorted(ENTRY_FIELDS)), int_ops), max_size=3)


@pytest.mark.parametrize("kind", sorted(ENTRY_KINDS))
def test_unforged_entries_are_rebuilt_byte_for_byte(kind):
    data, layout, info, payload = base_entry(kind)
    assert build_entry(layout, info, payload, []) == data


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=entry_kinds, lay_edits=edits(json_ops), head_edits=entry_head_edits)
@example(kind="npy", lay_edits=[], head_edits=[("N", ("add", U64 - 64)), ("P", ("add", 64))])
@example(kind="npy", lay_edits=[], head_edits=[("L", ("add", 1)), ("I", ("add", -1))])
@example(kind="npy", lay_edits=[], head_edits=[("P", ("set", 2**63)), ("N", ("set", 2**63))])
@example(kind="npy", lay_edits=[(0, ("set", 7))], head_edits=[])  # "a" of the first array
@example(kind="npy", lay_edits=[(13, ("add", 64))], head_edits=[])  # onto the next segment
@example(kind="pickle", lay_edits=[(4, ("set", 2**40))], head_edits=[])  # a segment length
@example(kind="pickle", lay_edits=[(0, ("set", 2**63))], head_edits=[])  # out-of-band count
@example(kind="npy-zlib", lay_edits=[(24, ("set", 2**40))], head_edits=[])  # a raw length
@example(kind="npy-zlib", lay_edits=[(23, ("set", 10))], head_edits=[])  # compression level
def test_entry_with_forged_numbers_only_raises_entry_corrupted(
    scratch, kind, lay_edits, head_edits
):
    """Header integers (lengths, segment count, payload offset and length) and the
    layout's numbers (segment table, raw lengths, compression level, pickle's
    out-of-band count, the npy tree's segment references, shapes and plain numbers)
    forged, checksums right."""
    _data, layout, info, payload = base_entry(kind)
    data = build_entry(apply_json_edits(layout, lay_edits), info, payload, head_edits)
    check_entry(scratch, data, kind)


ARRAY = ("c", "tree", "d", 0, 1)  # the float64 array [2, 3] of npy_value()
BYTES = ("c", "tree", "d", 3, 1)  # its bytes
TUPLE = ("c", "tree", "d", 5, 1, "t")  # its tuple of plain values
#: single forgeries of the npy codec's tree: [(path in the layout, value)]
NPY_TREE_FORGERIES = {
    # the segment reference of an array or bytes: past the segment table, not an int
    "array-ref-past-table": [((*ARRAY, "a"), 7)],
    "array-ref-2**64": [((*ARRAY, "a"), 2**64)],
    "array-ref-float": [((*ARRAY, "a"), 0.0)],
    "bytes-ref-past-table": [((*BYTES, "b"), 5)],
    # shapes whose int64 product still equals the 6 elements stored
    "shape-negative": [((*ARRAY, "shape", 0), -2), ((*ARRAY, "shape", 1), -3)],
    "shape-wraps-2**64": [((*ARRAY, "shape", 0), 2**61 + 1), ((*ARRAY, "shape", 1), 2**62 + 6)],
    # shapes that are not ints, or outside int64
    "shape-float": [((*ARRAY, "shape", 0), 2.0)],
    "shape-2**64": [((*ARRAY, "shape", 0), 2**64)],
    "shape-2**64-1": [((*ARRAY, "shape", 0), 2**64 - 1)],
    # a plain number of the tree made non-integral
    "tree-number-infinity": [((*TUPLE, 0), math.inf)],
}


@pytest.mark.parametrize("case", sorted(NPY_TREE_FORGERIES))
def test_npy_tree_forgeries_only_raise_entry_corrupted(scratch, case):
    _data, layout, info, payload = base_entry("npy")
    layout = json.loads(json.dumps(layout))
    for path, value in NPY_TREE_FORGERIES[case]:
        set_at(layout, path, value)
    check_entry(scratch, build_entry(layout, info, payload, []), "npy")


# == packs =============================================================================
def samples() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [
        {
            "x": rng.random((i + 1, 3), dtype=np.float32),  # ragged
            "img": np.full((2, 2), i, dtype=np.uint8),  # column of shape [2, 2]
            "s": f"s{i}" * i,  # str
            "y": 7 * i - 3,  # column of Python ints
            "opt": None if i % 2 else 0.5 * i,  # column with a validity table
        }
        for i in range(5)
    ]


N_SAMPLES = len(samples())
_PACK: dict[str, bytes] = {}


@pytest.fixture(scope="module")
def base_pack(scratch) -> None:
    """Write the valid pack the pack tests forge (into ``_PACK``: hypothesis would
    print a fixture's value with every failing example)."""
    if "base" not in _PACK:
        ds = pack(samples(), scratch / "base.pack", progress=False, block_size=64)
        ds.verify()
        _PACK["base"] = Path(ds.path).read_bytes()


REGIONS = ("data", "offsets", "shapes", "valid")
MAX_SUMS = 1 << 14


def region_sums(data: bytes, spec: Any, block: Any) -> None:
    """Recompute a region's block checksums after its numbers were forged, where the
    forged numbers still describe bytes of the file; else give its checksum table
    the length they imply (when small), so that the forgery reaches the bounds checks."""
    if type(spec) is not dict or type(block) is not int or block <= 0 or block & (block - 1):
        return
    off, n = spec.get("off"), spec.get("len")
    if type(off) is not int or type(n) is not int or n < 0 or -(-n // block) > MAX_SUMS:
        return
    if off >= 0 and off + n <= len(data):
        sums = [data[off + i : off + min(i + block, n)] for i in range(0, n, block)]
        spec["sums"] = [xxhash.xxh3_64_intdigest(piece) for piece in sums]
    else:
        spec["sums"] = [0] * -(-n // block)


def table_slots(index: dict[str, Any]) -> list[int]:
    """The absolute offset of every int64 of the offsets and shapes tables."""
    slots = []
    for field in index["fields"]:
        for key in ("offsets", "shapes"):
            if key in field:
                r = field[key]
                slots += [r["off"] + 8 * i for i in range(r["len"] // 8)]
    return slots


def split_base() -> tuple[int, int, dict[str, Any], bytearray]:
    """(sample count, index offset, index, the bytes before the index) of the base pack."""
    base = _PACK["base"]
    n, i_off, i_len = struct.unpack_from("<QQQ", base, 16)
    return n, i_off, json.loads(base[i_off : i_off + i_len]), bytearray(base[:i_off])


def seal_pack(body: bytes, index: Any, n: int, i_off: int, len_ops: Sequence[Op] = ()) -> bytes:
    """``body`` followed by ``index``, with every region's block checksums recomputed
    (``region_sums``), under a header that claims ``n`` samples and an index at
    ``i_off`` whose length is forged by ``len_ops``, with the checksums of the bytes
    they name."""
    for field in index["fields"]:
        for key in REGIONS:
            if key in field:
                region_sums(body, field[key], index["block"])
    index_b = json.dumps(index, separators=(",", ":")).encode()
    data = body + index_b
    i_len = len(index_b)
    for op in len_ops:
        i_len = forge(op, i_len) % U64
    i_sum = xxhash.xxh3_64_intdigest(data[i_off : i_off + i_len])
    first = struct.pack("<8sHHIQQQQ", PACK_MAGIC, 1, 0, 0, n, i_off, i_len, i_sum)
    return first + struct.pack("<QQ", xxhash.xxh3_64_intdigest(first), 0) + data[64:]


def build_pack(
    index_edits: list[tuple[int, Op]],
    table_edits: list[tuple[int, Op]],
    head_edits: list[tuple[str, Op]],
    tie_n: bool,
) -> bytes:
    """The base pack with forged offsets/shapes table entries, index numbers and
    header integers (``tie_n``: the index's sample count follows the header's), and
    every checksum (blocks, index, header) recomputed."""
    n, i_off, index, body = split_base()
    slots = table_slots(index)
    for i, op in table_edits:
        pos = slots[i % len(slots)]
        value = forge(op, struct.unpack_from("<q", body, pos)[0])
        struct.pack_into("<q", body, pos, (value + 2**63) % U64 - 2**63)
    index = apply_json_edits(index, index_edits, skip=("sums",))
    head = {"n": n, "i_off": i_off}
    for name, op in head_edits:
        if name in head:
            head[name] = forge(op, head[name]) % U64
    if tie_n:
        index["n"] = head["n"]
    len_ops = [op for name, op in head_edits if name == "i_len"]
    return seal_pack(bytes(body), index, head["n"], head["i_off"], len_ops)


def read_pack_everything(path: Path) -> None:
    """Everything a caller does with a pack; only PackCorrupted may escape."""
    try:
        ds = PackedDataset(path)
    except PackCorrupted as exc:
        refused(exc)
        return
    note("opened")
    n = len(ds)
    repr(ds)
    # every sample, but not 2**62 of them when the count is forged
    indices = sorted({*range(min(n, N_SAMPLES + 3)), *([n - 1, -1, -n] if n else [])})
    for i in indices:
        try:
            touch(ds[i])
            note("read a sample")
        except PackCorrupted as exc:
            refused(exc)
    for batch in (indices, indices[::-1]):
        try:
            touch(ds.get_batch(batch))
        except PackCorrupted as exc:
            refused(exc)
    try:
        ds.verify()
    except PackCorrupted as exc:
        refused(exc)


def check_pack(folder: Path, data: bytes) -> None:
    path = fresh(folder, data)
    try:
        bounded(lambda: read_pack_everything(path), len(data))
    finally:
        path.unlink()


pack_head_edits = st.lists(st.tuples(st.sampled_from(("i_len", "i_off", "n")), int_ops), max_size=2)


def test_an_unforged_pack_is_rebuilt_byte_for_byte(base_pack):
    for tie_n in (False, True):
        assert build_pack([], [], [], tie_n) == _PACK["base"]


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index_edits=edits(json_ops),
    table_edits=edits(int_ops, 3),
    head_edits=pack_head_edits,
    tie_n=st.booleans(),
)
@example(index_edits=[], table_edits=[], head_edits=[("n", ("set", 2**40))], tie_n=True)
@example(index_edits=[], table_edits=[], head_edits=[("n", ("set", 2**63))], tie_n=True)
@example(index_edits=[], table_edits=[(0, ("set", -1))], head_edits=[], tie_n=False)
@example(index_edits=[], table_edits=[], head_edits=[("i_off", ("add", -64))], tie_n=False)
@example(index_edits=[(2, ("set", 1))], table_edits=[], head_edits=[], tie_n=False)  # block
@example(index_edits=[], table_edits=[(17, ("add", 1))], head_edits=[], tie_n=False)  # str offset
@example(index_edits=[], table_edits=[(6, ("set", 2**30 - 1))], head_edits=[], tie_n=False)
@example(
    index_edits=[(12, ("mul", -1)), (13, ("mul", -1))], table_edits=[], head_edits=[], tie_n=False
)  # a column's shape [-2, -2]: the same row size
def test_pack_with_forged_numbers_only_raises_pack_corrupted(
    scratch, base_pack, index_edits, table_edits, head_edits, tie_n
):
    """Header integers (sample count, index offset and length), the index's numbers
    (count, block size, ndim, shapes, every region's offset and length) and the
    offsets and shapes tables forged, every checksum right."""
    check_pack(scratch, build_pack(index_edits, table_edits, head_edits, tie_n))


def pack_index_path(index: dict[str, Any], name: str, *keys: Any) -> tuple[Any, ...]:
    k = next(i for i, f in enumerate(index["fields"]) if f["name"] == name)
    return ("fields", k, *keys)


def forge_pack(
    index_values: dict[tuple[Any, ...], Any], table: list[tuple[str, int, int]]
) -> bytes:
    """The base pack with index numbers set ({(field, key...) or (key,): value}) and
    table entries set ([(field, row-major position in its shapes table, value)]),
    every checksum recomputed; the header's sample count follows the index's."""
    n, i_off, index, body = split_base()
    for name, i, value in table:
        region = get_at(index, pack_index_path(index, name, "shapes"))
        struct.pack_into("<q", body, region["off"] + 8 * i, value)
    for where, value in index_values.items():
        set_at(index, where if len(where) == 1 else pack_index_path(index, *where), value)
    return seal_pack(bytes(body), index, index["n"] if type(index["n"]) is int else n, i_off)


PACK_FORGERIES = {
    # a sample count of 2**63 or more, header and index agreeing
    "count-2**63": ({("n",): 2**63}, []),
    "count-2**64-1": ({("n",): 2**64 - 1}, []),
    # a column's shape outside int64
    "column-shape-2**64": ({("img", "shape", 0): 2**64}, []),
    "column-shape-2**63": ({("img", "shape", 0): 2**63}, []),
    # a str field's data moved onto bytes that are not UTF-8
    "str-data-off-64": ({("s", "data", "off"): 64}, []),
    # a ragged shapes row whose int64 product wraps around 2**64 to the right byte count
    "ragged-shape-wraps": ({}, [("x", 1, 3 + 2**62)]),
    # Infinity and NaN: a region's offset and length, an ndim, the block size
    "region-off-infinity": ({("opt", "valid", "off"): math.inf}, []),
    "region-len-infinity": ({("s", "offsets", "len"): -math.inf}, []),
    "ndim-infinity": ({("x", "ndim"): math.inf}, []),
    "block-nan": ({("block",): math.nan}, []),
}


@pytest.mark.parametrize("case", sorted(PACK_FORGERIES))
def test_pack_forgeries_only_raise_pack_corrupted(scratch, base_pack, case):
    check_pack(scratch, forge_pack(*PACK_FORGERIES[case]))


def test_an_empty_batch_of_a_valid_pack(scratch, base_pack):
    batch = PackedDataset(fresh(scratch, _PACK["base"])).get_batch([])
    assert batch.keys() == samples()[0].keys()
    assert all(len(values) == 0 for values in batch.values())
    assert batch["img"].shape == (0, 2, 2)
    assert batch["y"].shape == (0,)
