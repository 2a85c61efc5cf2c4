"""The pack writer and SQL sources on what users really feed them (issue 13).

Each case is what a user's code hands ``pack()`` / ``from_sql()``: numpy string
values, numbers of mixed types, CSV cells read by pandas, SQL ``NUMERIC``
columns, joins with repeated column names, large packs on a small disk. Builds
through ``CachedDataset`` run in fresh processes, as a user's script does.
"""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlcache import UnsupportedValue
from mlcache.data import PackedDataset, from_sql, pack
from mlcache.data import writer as writer_module


def _files(folder: Path) -> list[str]:
    """Every file and folder left under ``folder`` (relative names)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _drawn(samples, seen: list[int]):
    """``samples`` one by one, recording each index handed out in ``seen``."""
    for i, sample in enumerate(samples):
        seen.append(i)
        yield sample


# -- 1. numpy string values ------------------------------------------------------------
def test_numpy_string_scalars_are_stored_as_str_and_bytes(tmp_path):
    samples = [
        {"s": np.str_("ab"), "b": np.bytes_(b"xy")},
        {"s": np.str_("abcd"), "b": np.bytes_(b"")},
        {"s": "plain", "b": b"raw"},
    ]
    ds = pack(samples, tmp_path / "s.pack", progress=False)
    for i, want in enumerate(samples):
        got = ds[i]
        assert got["s"] == want["s"] and type(got["s"]) is str
        assert got["b"] == want["b"] and type(got["b"]) is bytes
    ds.verify()


@pytest.mark.parametrize(
    "value", [np.array(["ab", "c", "def"]), np.array([b"ab", b"c"]), np.array("abc")]
)
def test_fixed_width_string_arrays_are_refused_before_the_rest_is_loaded(tmp_path, value):
    seen: list[int] = []
    samples = [{"x": np.zeros(2), "t": None}, {"x": np.ones(2), "t": value}]
    samples += [{"x": np.ones(2), "t": None}] * 5
    with pytest.raises(UnsupportedValue, match=r"sample 1, field 't': .*array of [<|][US]"):
        pack(_drawn(samples, seen), tmp_path / "u.pack", progress=False)
    assert seen == [0, 1]  # refused at once: nothing after it was loaded
    assert _files(tmp_path) == []  # no pack, no spill files


def test_fixed_width_string_arrays_round_trip_with_allow_pickle(tmp_path):
    values = [np.array(["ab", "c", "def"]), np.array(["x"]), np.array([b"ab", b"c"])]
    ds = pack(({"t": v} for v in values), tmp_path / "p.pack", progress=False, allow_pickle=True)
    for i, want in enumerate(values):
        np.testing.assert_array_equal(ds[i]["t"], want)
        assert ds[i]["t"].dtype == want.dtype


NUMPY_STRINGS_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from mlcache.data import CachedDataset

    class Labels(CachedDataset):
        def __init__(self, kind, **kw):
            self.kind = kind
            super().__init__(**kw)

        def load_source(self):
            print("building", flush=True)
            for i in range(50):
                if self.kind == "scalars":
                    yield {"name": np.str_("n%d" % i), "code": np.bytes_(b"c" * (i % 4))}
                else:
                    yield {"name": np.array(["n%d" % i, "x"])}

    try:
        ds = Labels(sys.argv[1], cache_dir=sys.argv[2], progress=False)
    except Exception as exc:
        print("error", type(exc).__name__, exc)
    else:
        print("ok", len(ds), ds[7]["name"], type(ds[7]["name"]).__name__)
    """
)


def _run(script: str, *args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_cached_dataset_of_numpy_strings_builds_once(tmp_path):
    cache = tmp_path / "cache"
    first = _run(NUMPY_STRINGS_SCRIPT, "scalars", str(cache))
    assert first.splitlines() == ["building", "ok 50 n7 str"]
    second = _run(NUMPY_STRINGS_SCRIPT, "scalars", str(cache))
    assert second.splitlines() == ["ok 50 n7 str"]  # opened, not rebuilt


def test_cached_dataset_of_string_arrays_fails_clearly_and_leaves_no_pack(tmp_path):
    cache = tmp_path / "cache"
    for _ in range(2):
        out = _run(NUMPY_STRINGS_SCRIPT, "arrays", str(cache)).splitlines()
        assert out[0] == "building"
        assert out[1].startswith("error UnsupportedValue sample 0, field 'name'")
        assert "PackCorrupted" not in out[1]
    assert not [p for p in _files(cache) if p.endswith(".pack") or ".tmp-" in p]


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "SPILL_CHUNK", 1 << 16, raising=False)

    def source():
        for i in range(400):
            yield {"x": np.full(1000, i, dtype=np.float64), "s": "s" * (i % 7)}
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        pack(source(), tmp_path / "f.pack", progress=False)
    assert _files(tmp_path) == []


# -- 2. numbers of mixed types, None and NaN ----------------------------------------------
@pytest.mark.parametrize(
    ("values", "dtype", "kind"),
    [
        ([1, 2.5, 3], np.float64, float),
        ([np.int64(1), 2, np.int64(3)], np.int64, np.int64),
        ([True, 2, False], np.int64, int),
        ([np.float32(1.5), np.float64(2.25)], np.float64, np.float64),
        ([np.int8(3), np.int16(-300), np.uint8(200)], np.int16, np.int16),
        ([2.5, True], np.float64, float),
        ([np.int32(7), np.float32(0.5)], np.float64, np.float64),
    ],
)
def test_numbers_promote_as_numpy_does(tmp_path, values, dtype, kind):
    seen: list[int] = []
    ds = pack(_drawn(({"v": v} for v in values), seen), tmp_path / "n.pack", progress=False)
    assert ds.pack_index["fields"][0]["dtype"] == np.dtype(dtype).str
    for i, want in enumerate(values):
        got = ds[i]["v"]
        assert got == want and type(got) is kind, (i, got, want)
    ds.verify()


def test_arrays_of_mixed_dtypes_promote(tmp_path):
    values = [np.arange(3, dtype=np.float32), np.linspace(0, 1, 3), np.arange(4, dtype=np.int32)]
    ds = pack(({"a": v} for v in values), tmp_path / "a.pack", progress=False, block_size=64)
    for i, want in enumerate(values):
        np.testing.assert_array_equal(ds[i]["a"], want)
        assert ds[i]["a"].dtype == np.float64
    ds.verify()
    same_shape = [np.arange(6, dtype=np.int16).reshape(2, 3), np.ones((2, 3), np.int64)]
    ds = pack(({"a": v} for v in same_shape), tmp_path / "b.pack", progress=False)
    assert ds.pack_index["fields"][0]["kind"] == "column"
    assert ds.get_batch([0, 1])["a"].dtype == np.int64
    np.testing.assert_array_equal(ds[0]["a"], same_shape[0])


def test_nan_is_a_float_value_and_none_is_missing(tmp_path):
    nan = float("nan")
    samples = [
        {"f": nan, "i": 1, "s": nan, "late": None, "only": nan},
        {"f": 1.5, "i": nan, "s": "text", "late": nan, "only": None},
        {"f": None, "i": None, "s": None, "late": "x", "only": nan},
        {"f": np.float32("nan"), "i": 3, "s": np.float64("nan"), "late": nan, "only": nan},
    ]
    ds = pack(samples, tmp_path / "m.pack", progress=False)
    got = [ds[i] for i in range(4)]
    assert math.isnan(got[0]["f"]) and got[1]["f"] == 1.5 and got[2]["f"] is None
    assert math.isnan(got[3]["f"])
    assert got[0]["i"] == 1 and math.isnan(got[1]["i"]) and got[2]["i"] is None
    assert [g["s"] for g in got] == [None, "text", None, None]  # NaN in text: missing
    assert [g["late"] for g in got] == [None, None, "x", None]
    assert math.isnan(got[0]["only"]) and got[1]["only"] is None and math.isnan(got[2]["only"])
    ds.verify()


_NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(width=64),
    *(hnp.from_dtype(np.dtype(d)) for d in ("int8", "int16", "int32", "uint8", "float32", "?")),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_NUMBERS, min_size=1, max_size=10))
def test_mixed_numbers_read_back_as_numpy_promotes_them(tmp_path, values):
    present = [v for v in values if v is not None]
    ds = pack(({"v": v} for v in values), tmp_path / "h.pack", progress=False, block_size=64)
    if not present:
        assert ds.pack_index["fields"][0]["kind"] == "none"
        return
    dtype = np.result_type(*(np.asarray(v).dtype for v in present))
    assert ds.pack_index["fields"][0]["dtype"] == dtype.str
    python = all(type(v) in (bool, int, float) for v in present)
    for i, want in enumerate(values):
        got = ds[i]["v"]
        if want is None:
            assert got is None
            continue
        expected = np.asarray(want).astype(dtype)
        assert type(got) is (type(expected.item()) if python else dtype.type), (got, want)
        assert np.array_equal(np.asarray(got), expected, equal_nan=dtype.kind == "f")
    ds.verify()


def test_a_csv_text_column_with_an_empty_cell(tmp_path):
    pd = pytest.importorskip("pandas")
    csv = tmp_path / "t.csv"
    csv.write_text("id,name,score\n1,,0.5\n2,bob,\n3,eve,2\n")
    frame = pd.read_csv(csv)
    ds = pack(frame.to_dict("records"), tmp_path / "c.pack", progress=False)
    assert [ds[i]["name"] for i in range(3)] == [None, "bob", "eve"]
    assert ds[0]["score"] == 0.5 and math.isnan(ds[1]["score"]) and ds[2]["score"] == 2.0
    assert [ds[i]["id"] for i in range(3)] == [1, 2, 3]


def test_a_sql_numeric_column_of_ints_and_floats(tmp_path):
    db = sqlite3.connect(tmp_path / "n.db")
    db.execute("CREATE TABLE t (id INTEGER, amount NUMERIC, note TEXT)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(1, 1.5, "a"), (2, 2, None), (3, "7", "c")])
    db.commit()
    ds = pack(from_sql("SELECT * FROM t ORDER BY id", db), tmp_path / "q.pack", progress=False)
    assert [ds[i]["amount"] for i in range(3)] == [1.5, 2.0, 7.0]
    assert all(type(ds[i]["amount"]) is float for i in range(3))
    assert [ds[i]["note"] for i in range(3)] == ["a", None, "c"]


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        ("text", np.zeros(3), ("str", "array of float64")),
        (np.zeros(3), "text", ("array of float64", "str")),
        (1, "text", ("int", "str")),
        (b"raw", 2.5, ("bytes", "float")),
        (np.zeros(2), 3, ("array of float64", "int")),
    ],
)
def test_a_sample_that_does_not_fit_fails_at_once(tmp_path, first, second, words):
    seen: list[int] = []
    samples = [{"k": 0, "v": first}, {"k": 1, "v": None}, {"k": 2, "v": second}]
    samples += [{"k": 3, "v": first}] * 10
    with pytest.raises(TypeError) as caught:
        pack(_drawn(samples, seen), tmp_path / "x.pack", progress=False)
    message = str(caught.value)
    assert message.startswith("sample 2, field 'v': ")
    assert words[1] in message and words[0] in message and "sample 0" in message
    assert seen == [0, 1, 2]
    assert _files(tmp_path) == []


@pytest.mark.parametrize(
    "values",
    [
        [2**53 + 1, 0.5],
        [0.5, 2**53 + 1],
        [np.array([1, 2**60]), np.array([0.5])],
        [np.array([0.5]), np.array([1, -(2**60)])],
        [np.uint64(2**63), np.int64(1)],
    ],
)
def test_ints_that_float64_would_round_are_refused(tmp_path, values):
    with pytest.raises(ValueError, match=r"sample 1, field 'v': .*2\*\*53"):
        pack(({"v": v} for v in values), tmp_path / "r.pack", progress=False)
    assert _files(tmp_path) == []


def test_ints_that_float64_holds_exactly_promote(tmp_path):
    values = [2**53, -(2**53), 0.25]
    ds = pack(({"v": v} for v in values), tmp_path / "e.pack", progress=False)
    assert [ds[i]["v"] for i in range(3)] == [float(2**53), -float(2**53), 0.25]


# -- 3. disk: the pack plus a bounded spill ----------------------------------------------
def _folder_size(folder: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def test_peak_disk_use_is_the_pack_plus_a_bounded_spill(tmp_path, monkeypatch):
    chunk = 1 << 20
    monkeypatch.setattr(writer_module, "SPILL_CHUNK", chunk, raising=False)
    out = tmp_path / "out"
    out.mkdir()
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _folder_size(out))

    rows = 160  # 160 samples x 2 fields x 128 KiB: 40 MiB of data
    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        ds = pack(
            (
                {"a": np.full(1 << 14, i, dtype=np.float64), "b": np.full(1 << 15, i, np.int32)}
                for i in range(rows)
            ),
            out / "big.pack",
            progress=False,
        )
    finally:
        done.set()
        watcher.join()
    size = os.path.getsize(ds.path)
    assert size > 40 << 20
    # the pack, one chunk per field still open, one chunk being copied
    assert peak[0] <= size + 4 * chunk, (peak[0], size)
    assert ds[100]["b"][0] == 100 and ds[159]["a"][-1] == 159.0
    ds.verify()


# -- 4. SQL: repeated column names -----------------------------------------------------------
def _join_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (id INTEGER, x REAL)")
    db.execute("CREATE TABLE u (id INTEGER, t_id INTEGER, label TEXT)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(1, 0.5), (2, 1.5)])
    db.executemany("INSERT INTO u VALUES (?, ?, ?)", [(10, 1, "a"), (20, 2, "b")])
    db.commit()
    return db


def test_a_join_keeps_both_id_columns(tmp_path):
    db = _join_db(tmp_path / "j.db")
    query = "SELECT t.id, u.id, u.label FROM t JOIN u ON u.t_id = t.id ORDER BY t.id"
    rows = list(from_sql(query, db))
    assert rows == [{"id": 1, "id.1": 10, "label": "a"}, {"id": 2, "id.1": 20, "label": "b"}]
    ds = pack(from_sql(query, db), tmp_path / "j.pack", progress=False)
    assert ds.field_names == ["id", "id.1", "label"]
    assert [ds[i] for i in range(2)] == rows


def test_a_name_the_query_gives_is_never_taken_by_a_renamed_repeat(tmp_path):
    db = _join_db(tmp_path / "j.db")
    query = 'SELECT t.id, u.id, t.x AS "id.1", u.id FROM t JOIN u ON u.t_id = t.id ORDER BY t.id'
    ds = pack(from_sql(query, db), tmp_path / "k.pack", progress=False)
    # repeats are <name>.<k> as pandas.read_csv names them, but "id.1" is the
    # query's own name for t.x: the repeats take id.2 and id.3
    assert ds.field_names == ["id", "id.2", "id.1", "id.3"]
    assert ds[0] == {"id": 1, "id.2": 10, "id.1": 0.5, "id.3": 10}


# -- 5. SQL: columns at once -----------------------------------------------------------------
def test_from_sql_packs_columns_without_a_dict_per_row(tmp_path, monkeypatch):
    db = sqlite3.connect(tmp_path / "b.db")
    db.execute("CREATE TABLE t (id INTEGER, v REAL, s TEXT, n NUMERIC, b BLOB)")
    rows = [
        (i, i / 3, f"row {i}" if i % 5 else None, i if i % 2 else i + 0.5, bytes([i % 256]))
        for i in range(5000)
    ]
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    db.commit()
    source = from_sql("SELECT * FROM t ORDER BY id", db)
    source.arraysize = 777  # batches that do not divide the rows

    def no_rows(self):
        raise AssertionError("pack() asked for one dict per row")
        yield

    monkeypatch.setattr(type(source), "__iter__", no_rows)
    ds = pack(source, tmp_path / "b.pack", progress=False, block_size=256)
    assert len(ds) == len(rows)
    for i in (0, 1, 4, 5, 776, 777, 4999):
        want = dict(zip(["id", "v", "s", "n", "b"], rows[i]))
        assert ds[i] == want and type(ds[i]["n"]) is float
    batch = ds.get_batch(np.arange(len(rows)))
    np.testing.assert_array_equal(batch["id"], np.arange(len(rows)))
    ds.verify()
    reopened = PackedDataset(ds.path)
    assert reopened[3] == ds[3]


def test_a_build_sweeps_what_killed_builds_of_other_packs_left(tmp_path):
    """A build killed part way leaves its temporary (and spill folder) under a name
    no later build uses (another version's pack, a shard's random name): the next
    build in the folder removes them, and leaves a live writer's alone."""
    import fcntl
    import time

    dead = tmp_path / ".old-version.pack.tmp-0123456789ab"
    dead.write_bytes(b"\0" * 4096)
    dead_spill = tmp_path / ".shard-3f2a-00006.pack.tmp-spillabcdef"
    dead_spill.mkdir()
    (dead_spill / "field0").write_bytes(b"\0" * 4096)
    live = tmp_path / ".other.pack.tmp-livewriter00"
    live.write_bytes(b"x")
    old = time.time() - 3600
    for p in (dead, dead_spill, live):
        os.utime(p, (old, old))
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # its writer is alive
        pack([{"x": 1}], tmp_path / "new.pack", progress=False)
        assert not dead.exists() and not dead_spill.exists()
        assert live.exists()
