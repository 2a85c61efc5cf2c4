"""The field kinds a JSON or SQL source gives, packed without pickle (issue 18):
lists of numbers (arrays), lists of str (kind ``strs``) and nested dicts (kind
``dict``), their rules, and what a reader does with a forged or newer index."""

from __future__ import annotations

import json
import string
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlcache import UnsupportedValue
from mlcache.data import PackCorrupted, PackedDataset, open_pack, pack
from mlcache.data import format as fmt


def _pack(samples: Any, path: Path, **kw: Any) -> PackedDataset:
    return pack(samples, path, progress=False, **kw)


def _kinds(ds: PackedDataset) -> dict[str, str]:
    return {f["name"]: f["kind"] for f in ds.pack_index["fields"]}


# -- lists of numbers: arrays ------------------------------------------------------------
def test_lists_of_numbers_are_arrays_ragged_when_lengths_vary(tmp_path):
    ds = _pack(
        [{"tokens": [1, 2, 3], "xy": [0.5, 1.5]}, {"tokens": [4], "xy": [2, 3]}],
        tmp_path / "l.pack",
    )
    assert _kinds(ds) == {"tokens": "ragged", "xy": "column"}
    assert ds[0]["tokens"].tolist() == [1, 2, 3] and ds[0]["tokens"].dtype == np.int64
    assert ds[1]["tokens"].tolist() == [4]
    # an int list after a float one: promoted as numbers are (float64), exactly
    assert ds[1]["xy"].dtype == np.float64 and ds[1]["xy"].tolist() == [2.0, 3.0]
    batch = ds.get_batch([0, 1])
    assert batch["xy"].shape == (2, 2)  # one length in every sample: a column
    assert [t.tolist() for t in batch["tokens"]] == [[1, 2, 3], [4]]


def test_list_promotion_follows_the_number_rules(tmp_path):
    ds = _pack(
        [{"a": [True, False], "b": [1, 2.5], "c": [True, 2]}, {"a": [True], "b": [3], "c": [1]}],
        tmp_path / "p.pack",
    )
    assert ds[0]["a"].dtype == np.bool_ and ds[0]["a"].tolist() == [True, False]
    assert ds[0]["b"].dtype == np.float64 and ds[1]["b"].tolist() == [3.0]
    assert ds[0]["c"].dtype == np.int64 and ds[0]["c"].tolist() == [1, 2]


def test_lists_never_round_or_overflow(tmp_path):
    with pytest.raises(ValueError, match=r"sample 1, field 'x': the integer 9007199254740993"):
        _pack([{"x": [1]}, {"x": [2**53 + 1, 0.5]}], tmp_path / "r.pack")
    with pytest.raises(ValueError, match=r"sample 0, field 'x': 9223372036854775808 does not fit"):
        _pack([{"x": [2**63]}], tmp_path / "r.pack")
    # the field's own rule: an exact int list that would be rounded by a float field
    with pytest.raises(ValueError, match="sample 1, field 'x'.*exactly"):
        _pack([{"x": [0.5]}, {"x": [2**60]}], tmp_path / "r.pack")
    assert not (tmp_path / "r.pack").exists()


def test_empty_lists_take_the_dtype_of_the_fields_other_values(tmp_path):
    ds = _pack(
        [{"t": [], "s": []}, {"t": [1, 2], "s": ["a"]}, {"t": [], "s": []}, {"t": None, "s": None}],
        tmp_path / "e.pack",
    )
    assert _kinds(ds) == {"t": "ragged", "s": "strs"}
    assert ds[0]["t"].dtype == np.int64 and ds[0]["t"].shape == (0,)
    assert ds[2]["t"].dtype == np.int64 and ds[2]["t"].shape == (0,)
    assert ds[0]["s"] == [] and ds[2]["s"] == [] and ds[1]["s"] == ["a"]
    assert ds[3] == {"t": None, "s": None}
    only = _pack([{"t": []}, {"t": None}], tmp_path / "o.pack")
    assert only[0]["t"].shape == (0,) and only[0]["t"].dtype == np.float64
    assert only[1]["t"] is None


def test_nested_rectangular_lists_are_arrays_of_more_dimensions(tmp_path):
    ds = _pack([{"m": [[1, 2], [3, 4]]}, {"m": [[5, 6]]}, {"m": []}], tmp_path / "n.pack")
    assert ds[0]["m"].shape == (2, 2) and ds[0]["m"].tolist() == [[1, 2], [3, 4]]
    assert ds[1]["m"].shape == (1, 2)
    assert ds[2]["m"].shape == (0, 2) and ds[2]["m"].dtype == np.int64


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ([1, None], "a list of NoneType, int"),
        ([[1, 2], [3]], "a list of list"),
        ([1, "a"], "a list of int, str"),
        ([{"a": 1}], "a list of dict"),
        ([b"x"], "a list of bytes"),
    ],
)
def test_other_lists_need_pickle_and_say_so(tmp_path, value, what):
    with pytest.raises(UnsupportedValue, match=rf"sample 1, field 'x': {what}.*allow_pickle"):
        _pack([{"x": [0]}, {"x": value}], tmp_path / "u.pack")


def test_a_list_where_the_field_holds_something_else_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"sample 1, field 'x': an empty list where sample 0"):
        _pack([{"x": 1}, {"x": []}], tmp_path / "k.pack")
    with pytest.raises(TypeError, match=r"sample 1, field 'x': int where sample 0 has an empty"):
        _pack([{"x": []}, {"x": 1}], tmp_path / "k.pack")
    with pytest.raises(TypeError, match=r"sample 1, field 'x': a list of str where sample 0"):
        _pack([{"x": [1]}, {"x": ["a"]}], tmp_path / "k.pack")


# -- lists of str ------------------------------------------------------------------------
def test_lists_of_str_round_trip(tmp_path):
    values = [["a", "", "bé"], [], ["\ud800 lone", "x" * 10_000], None, ["only ascii"]]
    ds = _pack(({"s": v, "i": i} for i, v in enumerate(values)), tmp_path / "s.pack")
    assert _kinds(ds)["s"] == "strs"
    assert [ds[i]["s"] for i in range(len(values))] == values
    assert ds.get_batch([4, 0, 3])["s"] == [values[4], values[0], None]
    ds.verify()


def test_lists_of_str_are_checked_block_by_block(tmp_path):
    """A damaged block of a strs field is never returned: its read raises."""
    ds = _pack(({"s": [f"w{i}"] * 50} for i in range(200)), tmp_path / "b.pack", block_size=64)
    data = bytearray(Path(ds.path).read_bytes())
    region = ds.pack_index["fields"][0]["data"]
    data[region["off"] + 700] ^= 0x01
    damaged = tmp_path / "d.pack"
    damaged.write_bytes(bytes(data))
    bad = PackedDataset(damaged)
    assert bad[0]["s"] == ["w0"] * 50  # its blocks are intact
    with pytest.raises(PackCorrupted, match="checksum"):
        [bad[i] for i in range(200)]


# -- dicts -------------------------------------------------------------------------------
def test_nested_dicts_are_sub_fields_rebuilt_on_read(tmp_path):
    samples = [
        {"meta": {"age": 3, "tags": ["a"], "deep": {"w": [1.0, 2.0]}}, "meta.age": "flat"},
        {"meta": {"age": 4, "tags": [], "deep": {"w": [3.0]}}, "meta.age": "also flat"},
        {"meta": None, "meta.age": "x"},
    ]
    ds = _pack(samples, tmp_path / "d.pack")
    # a dict is one field; a real field named "meta.age" is another, without a clash
    assert ds.field_names == ["meta", "meta.age"]
    assert _kinds(ds) == {"meta": "dict", "meta.age": "str"}
    got = ds[0]
    assert got["meta.age"] == "flat" and got["meta"]["age"] == 3
    assert got["meta"]["tags"] == ["a"] and got["meta"]["deep"]["w"].tolist() == [1.0, 2.0]
    assert ds[1]["meta"]["tags"] == [] and ds[1]["meta"]["deep"]["w"].tolist() == [3.0]
    assert ds[2] == {"meta": None, "meta.age": "x"}
    assert ds.get_batch([1, 2])["meta"][0]["age"] == 4
    ds.verify()
    entry = ds.pack_index["fields"][0]
    assert [f["name"] for f in entry["fields"]] == ["age", "tags", "deep"]


def test_dicts_before_the_first_and_none_inside(tmp_path):
    ds = _pack(
        [{"m": None}, {"m": {"a": None, "b": "x"}}, {"m": {"a": 1, "b": None}}], tmp_path / "n.pack"
    )
    assert [ds[i]["m"] for i in range(3)] == [None, {"a": None, "b": "x"}, {"a": 1, "b": None}]
    assert _pack([{"m": {}}, {"m": {}}], tmp_path / "e.pack")[1] == {"m": {}}


def test_dict_rules_name_the_sample_and_the_sub_field(tmp_path):
    with pytest.raises(
        ValueError, match=r"sample 1, field 'm': keys differ from sample 0: it lacks the key 'b'$"
    ):
        _pack([{"m": {"a": 1, "b": 2}}, {"m": {"a": 1}}], tmp_path / "k.pack")
    with pytest.raises(TypeError, match=r"sample 0, field 'm': the keys of a dict must be str"):
        _pack([{"m": {1: 2}}], tmp_path / "k.pack")
    with pytest.raises(TypeError, match=r"sample 1, field 'm.a.b': str where sample 0 has int"):
        _pack([{"m": {"a": {"b": 1}}}, {"m": {"a": {"b": "x"}}}], tmp_path / "k.pack")
    with pytest.raises(TypeError, match=r"sample 1, field 'm': a dict where sample 0 has int"):
        _pack([{"m": 1}, {"m": {"a": 1}}], tmp_path / "k.pack")
    with pytest.raises(UnsupportedValue, match=r"sample 0, field 'm.when'.*allow_pickle"):
        _pack([{"m": {"when": object()}}], tmp_path / "k.pack")
    assert list(tmp_path.iterdir()) == []  # no pack, no spill file


def test_allow_pickle_keeps_pickling_lists_and_dicts_exactly(tmp_path):
    """With allow_pickle=True nothing changes: such values are pickled as before and
    read back as they were given (a list, not an array)."""
    samples = [{"t": [1, 2], "m": {"a": [1, None]}}, {"t": [1, "a"], "m": {"b": 2}}]
    ds = _pack(samples, tmp_path / "p.pack", allow_pickle=True)
    assert _kinds(ds) == {"t": "pickle", "m": "pickle"}
    assert [ds[0], ds[1]] == samples


# -- torch tensors -----------------------------------------------------------------------
def test_tensors_round_trip_as_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    samples = [
        {
            "x": torch.arange(i + 1, dtype=torch.int64),  # lengths vary: ragged
            "img": base.T * i,  # not contiguous
            "b": (torch.ones(2, 3) * i).to(torch.bfloat16),  # no numpy dtype: bits
            "f8": torch.full((2,), float(i)).to(torch.float8_e4m3fn),
            "z": (torch.ones(2, dtype=torch.complex64) * 1j).conj(),  # a lazy conj
            "g": torch.ones(2, requires_grad=True) * i,
            "s": torch.tensor(i),  # 0-d
            "m": torch.ones(2, dtype=torch.bool) if i % 2 else None,
        }
        for i in range(4)
    ]
    ds = _pack(samples, tmp_path / "t.pack")
    assert set(_kinds(ds).values()) == {"tensor"}
    for i, want in enumerate(samples):
        got = ds[i]
        for name, value in want.items():
            if value is None:
                assert got[name] is None
                continue
            out = got[name]
            assert type(out) is torch.Tensor and out.dtype == value.dtype, name
            assert out.shape == value.shape and not out.requires_grad
            assert torch.equal(out, value.detach().resolve_conj()), name
    read = ds[3]["img"]
    read += 1  # private to the read
    assert torch.equal(ds[3]["img"], base.T * 3)
    frozen = PackedDataset(ds.path, writable=False)[3]["img"]
    frozen += 1  # a copy of the read-only view: the map is never written
    assert torch.equal(PackedDataset(ds.path, writable=False)[3]["img"], base.T * 3)
    assert [t.tolist() for t in ds.get_batch([0, 1])["x"]] == [[0], [0, 1]]
    ds.verify()


def test_tensor_rules(tmp_path):
    torch = pytest.importorskip("torch")
    ds = _pack(
        [{"t": torch.ones(2, dtype=torch.float16)}, {"t": torch.ones(2)}], tmp_path / "p.pack"
    )
    assert ds[0]["t"].dtype == torch.float32  # promoted as arrays are
    with pytest.raises(TypeError, match=r"sample 1, field 't': a tensor of float32 where"):
        _pack([{"t": torch.ones(2, dtype=torch.bfloat16)}, {"t": torch.ones(2)}], tmp_path / "k")
    with pytest.raises(TypeError, match=r"sample 1, field 't': a tensor of int64 where sample 0"):
        _pack([{"t": 1}, {"t": torch.ones(2, dtype=torch.int64)}], tmp_path / "k")
    with pytest.raises(TypeError, match=r"sample 1, field 't': int where sample 0 has a tensor"):
        _pack([{"t": torch.ones(2)}, {"t": 1}], tmp_path / "k")
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(UnsupportedValue, match=r"sample 0, field 't': a tensor of float32.*"):
        _pack([{"t": sparse}], tmp_path / "k")
    pickled = _pack([{"t": sparse}], tmp_path / "q.pack", allow_pickle=True)
    assert _kinds(pickled) == {"t": "pickle"}
    assert torch.equal(pickled[0]["t"].to_dense(), torch.eye(3))


def test_a_dataloader_batches_dict_and_tensor_fields(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from mlcache.torch import TorchDataset, collate

    samples = [
        {"t": torch.full((2,), float(i)), "m": {"a": i, "w": [i, i + 1], "s": ["x"] * i}}
        for i in range(4)
    ]
    ds = _pack(samples, tmp_path / "l.pack")
    assert isinstance(TorchDataset(ds)[1]["m"]["w"], torch.Tensor)  # arrays in a dict too
    batch = next(iter(DataLoader(TorchDataset(ds), batch_size=3, collate_fn=collate)))
    assert torch.equal(batch["t"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    assert batch["m"]["a"].tolist() == [0, 1, 2]
    assert batch["m"]["w"].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert batch["m"]["s"] == [[], ["x"], ["x", "x"]]


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("holds tensors of float9", lambda f: f.update(view="float9")),
        ("holds tensors of bfloat16", lambda f: f.update(view="bfloat16")),  # 4-byte values
        ("bad index", lambda f: f["fields"].append(f["fields"][0])),
        ("holds tensors of", lambda f: f["fields"][0].update(py="float")),
        ("unknown kind", lambda f: f["fields"][0].update(kind="tensor2")),
    ],
)
def test_a_forged_tensor_field_only_raises_pack_corrupted(tmp_path, where, change):
    torch = pytest.importorskip("torch")
    ds = _pack([{"t": torch.ones(2)}, {"t": torch.zeros(2)}], tmp_path / "t.pack")
    p = _forged(ds, tmp_path, lambda ix: change(ix["fields"][0]))
    with pytest.raises(PackCorrupted, match=where):
        PackedDataset(p)[0]


# -- sources -----------------------------------------------------------------------------
def test_a_json_lines_source_packs_without_pickle(tmp_path):
    lines = [
        {"id": i, "tokens": list(range(i % 4)), "labels": ["pos"] * (i % 2), "meta": {"n": i}}
        for i in range(50)
    ]
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))

    def records():
        with open(src) as f:
            for line in f:
                yield json.loads(line)

    ds = _pack(records(), tmp_path / "j.pack")
    again = open_pack(tmp_path / "j.pack")
    for i in (0, 3, 49):
        assert again[i]["tokens"].tolist() == lines[i]["tokens"]
        assert again[i]["labels"] == lines[i]["labels"]
        assert again[i]["meta"] == lines[i]["meta"]
    assert len(ds) == 50


def test_a_column_source_gives_lists_and_dicts(tmp_path):
    class Columns:
        def column_batches(self):
            yield {"t": [[1], [2, 3]], "m": [{"a": "x"}, {"a": "y"}]}
            yield {"t": [[], None], "m": [None, {"a": "z"}]}

    ds = _pack(Columns(), tmp_path / "c.pack")
    assert [ds[i]["t"] is None or ds[i]["t"].tolist() for i in range(4)] == [
        [1],
        [2, 3],
        [],
        True,
    ]
    assert [ds[i]["m"] for i in range(4)] == [{"a": "x"}, {"a": "y"}, None, {"a": "z"}]


def test_from_sql_with_json_columns_packs_without_pickle(tmp_path):
    """sqlite3 gives lists and dicts for a column declared ``json`` once a converter
    is registered (as psycopg does for json and array columns)."""
    import sqlite3

    from mlcache.data import from_sql

    sqlite3.register_converter("json", json.loads)  # process-wide: removed below
    con = sqlite3.connect(tmp_path / "db.sqlite", detect_types=sqlite3.PARSE_DECLTYPES)
    try:
        con.execute("CREATE TABLE notes (id INTEGER, tokens json, meta json)")
        rows = [(i, json.dumps([i] * (i % 3)), json.dumps({"tags": ["a"] * i})) for i in range(5)]
        con.executemany("INSERT INTO notes VALUES (?, ?, ?)", rows)
        con.commit()
        ds = _pack(from_sql("SELECT * FROM notes ORDER BY id", con), tmp_path / "q.pack")
    finally:
        con.close()
        sqlite3.converters.pop("JSON", None)
    assert _kinds(ds) == {"id": "column", "tokens": "ragged", "meta": "dict"}
    assert ds[4]["tokens"].tolist() == [4] and ds[3]["tokens"].size == 0
    assert ds[2]["meta"] == {"tags": ["a", "a"]}


def test_sharded_packs_hold_the_new_kinds(tmp_path):
    samples = [{"t": [i] * (i % 3), "m": {"s": [str(i)]}} for i in range(10)]
    ds = pack(samples, tmp_path / "sh.shards", progress=False, shard_size=3)
    assert ds[7]["t"].tolist() == [7] and ds[7]["m"] == {"s": ["7"]}


def test_a_remote_pack_read_by_ranges_fetches_the_blocks_of_sub_fields(tmp_path):
    """fetch="ranges": a dict's sub-fields are regions like any other, fetched when
    a read first touches them and checked."""
    import fsspec

    rows = [{"m": {"s": [f"w{i}"] * 40, "t": list(range(i, i + 30))}} for i in range(300)]
    built = _pack(rows, tmp_path / "r.pack", block_size=4096)
    fsspec.filesystem("memory").put_file(built.path, "/kinds/r.pack")
    ds = PackedDataset(
        "memory://kinds/r.pack", local_cache_dir=str(tmp_path / "copy"), fetch="ranges"
    )
    assert ds[250]["m"]["s"][0] == "w250" and ds[250]["m"]["t"][0] == 250
    copy = next((tmp_path / "copy").glob("*.sparse"))
    assert copy.stat().st_blocks * 512 < copy.stat().st_size  # not all of it fetched
    assert all(ds[i]["m"]["t"][0] == i and ds[i]["m"]["s"][-1] == f"w{i}" for i in range(300))
    ds.verify()


# -- hypothesis: a round trip of lists and nesting ---------------------------------------
_TEXT = st.text(alphabet=string.printable + "éλ\u4e2d", max_size=8)
_INTS = st.lists(st.integers(-(2**40), 2**40), max_size=6)
_LEAF = st.one_of(
    st.integers(-(2**62), 2**62), _TEXT, _INTS, st.lists(_TEXT, max_size=5), st.none()
)


@st.composite
def _samples(draw: Any) -> list[dict[str, Any]]:
    """Samples of one structure: each field a leaf kind (or a dict of them, nested),
    every sample drawing its own values of that kind (None anywhere)."""

    def shape(depth: int) -> Any:
        if depth < 2 and draw(st.booleans()):
            keys = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
            return {k: shape(depth + 1) for k in keys}
        return draw(st.sampled_from(["int", "text", "ints", "texts"]))

    def value(kind: Any) -> Any:
        if isinstance(kind, dict):
            return None if draw(st.integers(0, 9)) == 0 else {k: value(v) for k, v in kind.items()}
        if draw(st.integers(0, 5)) == 0:
            return None
        strategy = {
            "int": st.integers(-(2**62), 2**62),
            "text": _TEXT,
            "ints": _INTS,
            "texts": st.lists(_TEXT, max_size=5),
        }[kind]
        return draw(strategy)

    fields = draw(st.dictionaries(st.sampled_from(["x", "y", "z.w"]), st.just(0), min_size=1))
    kinds = {name: shape(0) for name in fields}
    n = draw(st.integers(1, 8))
    return [{name: value(kind) for name, kind in kinds.items()} for _ in range(n)]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(samples=_samples())
def test_lists_and_nesting_round_trip(tmp_path, samples):
    ds = _pack(samples, tmp_path / "h.pack")
    assert [_plain(ds[i]) for i in range(len(samples))] == samples
    batch = ds.get_batch(list(range(len(samples))))
    for name in samples[0]:
        got = batch[name]
        assert [_plain(v) for v in (got.tolist() if isinstance(got, np.ndarray) else got)] == [
            s[name] for s in samples
        ]


# -- readers: a forged index, an older reader --------------------------------------------
def _forged(ds: PackedDataset, tmp_path: Path, change: Any, table: Any = None) -> Path:
    """The pack with its index edited by ``change(index)`` and, with ``table`` =
    (field, region, position, value), an int64 of that region set: checksums valid."""
    data = bytearray(Path(ds.path).read_bytes())
    n, i_off, _, _ = fmt.read_header(bytes(data[:64]), len(data), "t")
    index = json.loads(bytes(data[i_off:]))
    if table is not None:
        field, key, at, value = table
        region = index["fields"][field][key]
        struct.pack_into("<q", data, region["off"] + 8 * at, value)
        piece = data[region["off"] : region["off"] + region["len"]]
        region["sums"] = fmt.block_sums(piece, index["block"])
    change(index)
    new_index = json.dumps(index).encode()
    p = tmp_path / "forged.pack"
    p.write_bytes(fmt.pack_header(n, i_off, new_index) + bytes(data[64:i_off]) + new_index)
    return p


def _strs_pack(tmp_path: Path) -> PackedDataset:
    samples = [{"s": ["ab", "c"], "m": {"a": 1}}, {"s": ["d"], "m": {"a": 2}}]
    return _pack(samples, tmp_path / "s.pack")


def _same(index: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    ("where", "change", "table"),
    [
        (
            "unknown kind 'future' \\(unsupported",
            lambda ix: ix["fields"][0].update(kind="future"),
            None,
        ),
        ("bad string ends", _same, (0, "ends", 1, 99)),
        ("bad string ends", _same, (0, "ends", 2, 1)),
        ("bad offsets", _same, (0, "offsets", 1, 4)),
        ("table region has the wrong size", _same, (0, "offsets", 2, 2)),
        ("bad index", lambda ix: ix["fields"][1].update(fields="no"), None),
        ("bad index", lambda ix: ix["fields"][1]["fields"][0].update(name=[1]), None),
        ("bad index", lambda ix: ix["fields"][1].pop("fields"), None),
        ("unknown kind 'x'", lambda ix: ix["fields"][1]["fields"][0].update(kind="x"), None),
    ],
)
def test_a_forged_index_of_the_new_kinds_only_raises_pack_corrupted(tmp_path, where, change, table):
    p = _forged(_strs_pack(tmp_path), tmp_path, change, table)
    with pytest.raises(PackCorrupted, match=where):
        ds = PackedDataset(p)
        [ds[i] for i in range(len(ds))]


def test_dicts_nested_too_deep_are_refused(tmp_path):
    def deepen(index: dict[str, Any]) -> None:
        entry = index["fields"][1]
        for _ in range(40):
            entry = {"name": "d", "kind": "dict", "fields": [entry]}
        index["fields"][1] = entry

    with pytest.raises(PackCorrupted, match="bad sub-fields"):
        PackedDataset(_forged(_strs_pack(tmp_path), tmp_path, deepen))


def test_packs_of_the_old_kinds_still_read(tmp_path):
    """Nothing changes for what a pack held before: the same kinds, the same index."""
    samples = [{"x": np.arange(i), "y": i, "s": "t", "b": b"b", "n": None} for i in range(3)]
    ds = _pack(samples, tmp_path / "o.pack")
    assert _kinds(ds) == {"x": "ragged", "y": "column", "s": "str", "b": "bytes", "n": "none"}
    assert all("fields" not in f and "ends" not in f for f in ds.pack_index["fields"])
    assert ds[2]["x"].tolist() == [0, 1] and ds[2]["s"] == "t"
