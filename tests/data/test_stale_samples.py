"""Never a stale sample, whatever the items are (issue 24, cases 1-4): items that
are dicts (a MONAI datalist), nested tuples or dataclasses; rows of one data file
named by an attribute; a file replaced by one of equal size and modification
time; a sqlite database read by ``from_sql`` without a ``data_version``.

Each case runs fresh interpreters over a dataset module written to a temporary
folder (``staleds.py``); ``load_item`` (or ``load_source``) appends what it
loads to the log, so the loads of each run are counted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from mlcache.data import from_sql
from mlcache.errors import CacheWarning
from scripts import ScriptFolder

STALEDS = """
import dataclasses, os, sqlite3
import numpy as np
from mlcache.data import CachedDataset, from_sql


def logged(what):
    with open(os.environ["LOG"], "a") as f:
        f.write(f"{what}\\n")


def read(path):
    with open(path) as f:
        return f.read()


@dataclasses.dataclass(frozen=True)
class Scan:
    path: str
    label: int


class Listed(CachedDataset):
    \"\"\"Items of several shapes, each naming one file of root.\"\"\"

    def __init__(self, root, shape):
        self.root, self.shape = root, shape
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def source_items(self):
        paths = sorted(os.path.join(self.root, n) for n in os.listdir(self.root))
        if self.shape == "dict":  # MONAI's datalist
            return [{"path": p, "label": i} for i, p in enumerate(paths)]
        if self.shape == "nested":
            return [((p, "x"), i) for i, p in enumerate(paths)]
        return [Scan(p, i) for i, p in enumerate(paths)]

    def load_item(self, item):
        path = item["path"] if self.shape == "dict" else (
            item[0][0] if self.shape == "nested" else item.path)
        logged(os.path.basename(path))
        return {"text": read(path)}


class Rows(CachedDataset):
    \"\"\"Rows of one .npy file, opened lazily by each load (the memmap pattern).\"\"\"

    # folders each run writes into (outputs, the log): a folder attribute counts by
    # its files, so these are left out of the key, as its warning says
    cache_ignore = ("out_dir", "root")

    def __init__(self, path, out_dir, root):
        self.path, self.out_dir, self.root = path, out_dir, root
        self.cache = os.environ["CACHE"]  # the cache folder itself, as an attribute
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def source_items(self):
        return range(3)

    def load_item(self, i):
        logged(f"row{i}")
        return {"x": np.array(np.load(self.path, mmap_mode="r")[i])}


class WholeRows(CachedDataset):
    \"\"\"The same file read whole by load_source().\"\"\"

    def __init__(self, path):
        self.path = path
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def load_source(self):
        logged("whole")
        for row in np.load(self.path):
            yield {"x": row}


class Numbers(CachedDataset):
    \"\"\"Items that name no file, and no attribute that does either.\"\"\"

    def __init__(self, n):
        self.n = n
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def source_items(self):
        return range(int(self.n))

    def load_item(self, i):
        return {"x": i}


class Declared(CachedDataset):
    source_glob = "*.txt"

    def __init__(self, root):
        self.source_dir = root
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def load_item(self, path):
        logged("declared:" + os.path.basename(path))
        return {"text": read(path)}


class Paths(CachedDataset):
    def __init__(self, root):
        self.root = root
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def source_items(self):
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root))

    def load_item(self, path):
        logged("paths:" + os.path.basename(path))
        return {"text": read(path)}


class Whole(CachedDataset):
    source_glob = "*.txt"

    def __init__(self, root):
        self.source_dir = root
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def load_source(self):
        logged("whole")
        for path in self.source_files():
            yield {"text": read(path)}


class Admissions(CachedDataset):
    def __init__(self, db, how):
        self.db, self.how = db, how
        super().__init__(cache_dir=os.environ["CACHE"], progress=False)

    def query(self):
        con = self.db if self.how == "path" else sqlite3.connect(self.db)
        return from_sql("SELECT id, age FROM adm ORDER BY id", con)

    def load_source(self):
        logged("sql")
        return self.query()

    def source_fingerprint(self):
        return self.query().fingerprint()
"""

SERVE = """
import json, sys
import staleds

kind, *args = sys.argv[1:]
opened = [getattr(staleds, kind)(*args) for _ in range(2)][-1]  # a second open: said once
rows = [opened[i] for i in range(len(opened))]
print(json.dumps([{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()}
                  for r in rows]))
"""


class Stale(ScriptFolder):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.write("staleds.py", STALEDS)
        self.write("serve.py", SERVE)
        self.err = ""

    def serve(self, kind: str, *args: str, cache: Path | None = None) -> list[dict]:
        env = {"CACHE": str(cache)} if cache is not None else None
        done = self.execute("serve.py", kind, *args, env=env)
        self.err = done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])


def _files(folder: Path, texts: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)


@pytest.mark.parametrize("shape", ["dict", "nested", "dataclass"])
def test_an_edited_file_named_inside_an_item_of_any_shape_is_loaded_again(tmp_path, shape):
    """Case 1: ``{"path": p, "label": y}``, ``((p, "x"), y)``, a dataclass."""
    run = Stale(tmp_path)
    src = tmp_path / "src"
    _files(src, {"a.txt": "a1", "b.txt": "b1", "c.txt": "c1"})
    assert [r["text"] for r in run.serve("Listed", str(src), shape)] == ["a1", "b1", "c1"]
    assert sorted(run.logged()) == ["a.txt", "b.txt", "c.txt"]
    assert [r["text"] for r in run.serve("Listed", str(src), shape)] == ["a1", "b1", "c1"]
    assert run.logged() == []  # nothing changed: the pack
    (src / "b.txt").write_text("b2 edited")
    assert [r["text"] for r in run.serve("Listed", str(src), shape)] == ["a1", "b2 edited", "c1"]
    assert run.logged() == ["b.txt"]  # the edit costs its own load only


def test_regenerating_the_data_file_an_attribute_names_is_seen(tmp_path):
    """Case 2: rows of ``self.path``; an output folder and the run's folder left out
    of the key and the cache folder held as attributes, all changing at every run,
    leave the pack alone."""
    import numpy as np

    run = Stale(tmp_path)
    table, out = tmp_path / "table.npy", tmp_path / "out"
    out.mkdir()
    np.save(table, np.arange(6).reshape(3, 2))
    args = ("Rows", str(table), str(out), str(tmp_path))
    assert [r["x"] for r in run.serve(*args)] == [[0, 1], [2, 3], [4, 5]]
    assert sorted(run.logged()) == ["row0", "row1", "row2"]
    for k in range(2):  # a run writing its outputs: no reload
        (out / f"checkpoint{k}.txt").write_text("weights")
        assert [r["x"] for r in run.serve(*args)] == [[0, 1], [2, 3], [4, 5]]
        assert run.logged() == []
    np.save(table, np.arange(6).reshape(3, 2) * 10)  # regenerated: same shape, same size
    assert [r["x"] for r in run.serve(*args)] == [[0, 10], [20, 30], [40, 50]]
    assert sorted(run.logged()) == ["row0", "row1", "row2"]
    assert "item_fingerprint" not in run.err  # the file says what the rows hold

    assert [r["x"] for r in run.serve("WholeRows", str(table))] == [[0, 10], [20, 30], [40, 50]]
    np.save(table, np.arange(6).reshape(3, 2) + 1)
    assert [r["x"] for r in run.serve("WholeRows", str(table))] == [[1, 2], [3, 4], [5, 6]]
    assert run.logged() == ["whole"]


def test_items_that_name_no_file_say_once_how_to_fingerprint_them(tmp_path):
    run = Stale(tmp_path)
    assert [r["x"] for r in run.serve("Numbers", "3")] == [0, 1, 2]
    assert run.err.count("none of its 3 items names a file") == 1, run.err
    assert "item_fingerprint(item)" in run.err and "source_fingerprint()" in run.err


def _replace_keeping_size_and_mtime(path: Path, text: str, in_place: bool) -> None:
    """What ``cp -p`` (in place) and ``rsync -t``/``tar x`` (a new file renamed
    over the old one) leave: other bytes, the same size and modification time."""
    before = path.stat()
    assert len(text) == before.st_size
    if in_place:
        path.write_text(text)
        target = path
    else:
        target = path.with_name(path.name + ".tmp")
        target.write_text(text)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    if not in_place:
        os.replace(target, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_file_replaced_by_one_of_equal_size_and_mtime_is_loaded_again(tmp_path):
    """Case 3, for a declared source, items that are paths, and a pack built whole;
    a reopen with nothing changed stays a hit, in another process, and so does a
    copy of the whole cache folder; a copy of the data (new inodes) is loaded
    again, never served stale."""
    run = Stale(tmp_path)
    src = tmp_path / "src"
    _files(src, {"a.txt": "a1", "b.txt": "b1"})
    kinds = ("Declared", "Paths", "Whole")
    for kind in kinds:
        assert [r["text"] for r in run.serve(kind, str(src))] == ["a1", "b1"]
        assert run.serve(kind, str(src)) and run.logged() == []  # a reopen: the pack
    _replace_keeping_size_and_mtime(src / "a.txt", "a2", in_place=False)
    _replace_keeping_size_and_mtime(src / "b.txt", "b2", in_place=True)
    loads = {"Declared": ["declared:a.txt", "declared:b.txt"], "Whole": ["whole"]}
    loads["Paths"] = ["paths:a.txt", "paths:b.txt"]
    for kind in kinds:
        assert [r["text"] for r in run.serve(kind, str(src))] == ["a2", "b2"]
        assert sorted(run.logged()) == loads[kind]
    copied = tmp_path / "cache-copy"
    shutil.copytree(run.cache, copied)  # the cache moved to another disk, or restored
    for kind in kinds:
        assert [r["text"] for r in run.serve(kind, str(src), cache=copied)] == ["a2", "b2"]
        assert run.logged() == []
    # the data restored from a copy (cp -a: same bytes, sizes and times, new
    # inodes): nothing proves the files are the ones packed, so they are loaded
    shutil.copytree(src, tmp_path / "src-copy")
    shutil.rmtree(src)
    os.rename(tmp_path / "src-copy", src)
    for kind in kinds:
        assert [r["text"] for r in run.serve(kind, str(src))] == ["a2", "b2"]
        assert sorted(run.logged()) == loads[kind]


def _admissions(db: Path, ages: list[int]) -> None:
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE adm (id INTEGER, age INTEGER)")
        con.executemany("INSERT INTO adm VALUES (?, ?)", list(enumerate(ages)))
    con.close()


@pytest.mark.parametrize("how", ["path", "connection"])
def test_from_sql_without_a_data_version_sees_changed_rows_of_a_sqlite_file(tmp_path, how):
    """Case 4: a committed UPDATE, in the database file, then one still in its
    -wal (a writer holds the database open in WAL mode: no checkpoint yet)."""
    run = Stale(tmp_path)
    db = tmp_path / "h.db"
    _admissions(db, [30, 40])
    assert run.serve("Admissions", str(db), how) == [{"id": 0, "age": 30}, {"id": 1, "age": 40}]
    assert run.serve("Admissions", str(db), how) and run.logged() == []  # a reopen: the pack
    with sqlite3.connect(db) as con:
        con.execute("UPDATE adm SET age = 31 WHERE id = 0")
    con.close()
    assert run.serve("Admissions", str(db), how)[0] == {"id": 0, "age": 31}
    assert run.logged() == ["sql"]
    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        run.serve("Admissions", str(db), how)  # the same rows, now from a WAL database
        with writer:
            writer.execute("UPDATE adm SET age = 41 WHERE id = 1")
        assert os.path.getsize(str(db) + "-wal") > 0  # the change is in the -wal only
        assert run.serve("Admissions", str(db), how)[1] == {"id": 1, "age": 41}
        assert run.logged() == ["sql"]
        assert "CacheWarning" not in run.err
    finally:
        writer.close()


class _Proxy:
    """A DB-API connection that is not sqlite's own (as psycopg's would be)."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def cursor(self) -> sqlite3.Cursor:
        return self.con.cursor()


def test_from_sql_without_a_data_version_on_another_database_warns_once(tmp_path, monkeypatch):
    import mlcache.data.sql as sql

    monkeypatch.setattr(sql, "_SAID_UNVERSIONED", set())
    db = tmp_path / "h.db"
    _admissions(db, [30])
    con = sqlite3.connect(db)
    try:
        source = from_sql("SELECT * FROM adm", _Proxy(con))
        with pytest.warns(CacheWarning, match="row changes|rows is not seen.*data_version="):
            first = source.fingerprint()
        assert source.fingerprint() == first  # said once
        assert from_sql("SELECT * FROM adm", _Proxy(con), data_version="v1").fingerprint()
        assert list(from_sql("SELECT * FROM adm", _Proxy(con), data_version="v1")) == [
            {"id": 0, "age": 30}
        ]
        memory = sqlite3.connect(":memory:")  # no file tells its changes either
        monkeypatch.setattr(sql, "_SAID_UNVERSIONED", set())
        with pytest.warns(CacheWarning, match="data_version="):
            from_sql("SELECT 1", memory).fingerprint()
        memory.close()
    finally:
        con.close()
    with pytest.raises(FileNotFoundError):
        from_sql("SELECT 1", tmp_path / "missing.db")


def test_from_sql_takes_a_sqlalchemy_engine_and_connection(tmp_path):
    import sqlalchemy  # in the dev extra

    db = tmp_path / "h.db"
    _admissions(db, [30, 40])
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    query = "SELECT id, age FROM adm WHERE age > ? ORDER BY id"
    before = from_sql(query, engine, (35,)).fingerprint()
    assert list(from_sql(query, engine, (35,))) == [{"id": 1, "age": 40}]
    with engine.connect() as con:
        assert list(from_sql(query, con, (0,))) == [{"id": 0, "age": 30}, {"id": 1, "age": 40}]
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE adm SET age = 50 WHERE id = 1")
    raw.close()
    assert from_sql(query, engine, (35,)).fingerprint() != before
    engine.dispose()


@dataclasses.dataclass
class _Row:
    path: str
    label: int


def test_item_keys_taken_with_one_hasher_are_each_items_own_key():
    """The item table's keys (a row number's is half as dear with one reused
    hasher) are each item's key alone, whatever came before: an object shared
    between items, a cycle, paths, an item that cannot be hashed."""
    from mlcache.data.items import item_keys, key_bytes

    shared = {"a": [1, 2]}
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    items = [0, 1, (shared, shared), shared, cyclic, "a.txt", Path("a.txt"), _Row("p", 1), 2.5]
    assert item_keys(items) == b"".join(key_bytes(i) for i in items)
    assert len({key_bytes(i) for i in items}) == len(items) - 1  # "a.txt" twice: one path
    with pytest.raises(TypeError):
        item_keys([1, lambda: 0, threading.Lock()])
