"""A database query as a dataset source (any DB-API 2 connection: sqlite3, psycopg...).

Example, with the standard library's sqlite3::

    import sqlite3
    from mlcache.data import CachedDataset, from_sql

    class Admissions(CachedDataset):
        def __init__(self, db, **kw):
            self.db = db
            super().__init__(**kw)

        def query(self):
            return from_sql(
                "SELECT id, age, label FROM admissions WHERE age >= ?",
                sqlite3.connect(self.db),
                params=(18,),
                data_version="2024-06",   # bump when the table's rows change
            )

        def load_source(self):
            return self.query()

        def source_fingerprint(self):
            return self.query().fingerprint()

The fingerprint is the query text, its parameters and the ``data_version`` you
give: change any of them to rebuild. Without a ``data_version``, a sqlite
database (a path, a ``sqlite3`` connection, a SQLAlchemy engine or connection on
sqlite) counts by its files' own ``stat`` (the database and its ``-wal``, and
any attached one), which costs nothing and changes with every committed write;
any other database cannot tell cheaply whether its rows changed, and a warning
says once that their changes will not be seen.

``connection`` is a DB-API 2 connection (anything with ``cursor()``), the path of
a sqlite file, or a SQLAlchemy ``Engine`` or ``Connection`` (the query then runs
on its DB-API connection, in the driver's own parameter style: ``?`` for
sqlite, ``%s`` for psycopg); SQLAlchemy itself is never imported.

Columns become fields, named as the query names them. A name that repeats (a
join's ``SELECT t.id, u.id``) is kept under a new name, as ``pandas.read_csv``
names repeated headers: the second ``id`` becomes ``id.1``, the third ``id.2``;
a name the query gives itself is never taken (``id``, ``id``, ``id.1`` give
``id``, ``id.2``, ``id.1``). A NULL is a missing value (``None``); a column of numbers of
several types (a ``NUMERIC`` column holding 1.5 and 2) is promoted as numpy
does (here float64); see :mod:`mlcache.data.writer` for the rules.

``pack()`` reads the rows ``arraysize`` at a time (``cursor.fetchmany``) and
stores them a column at a time (:meth:`SqlSource.column_batches`), never a
dict per row; iterating the source yields one dict per row.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import warn
from ..keys.hashing import hash_value
from .sources import stat_fields

#: said once a process: a query whose row changes no fingerprint can see
_SAID_UNVERSIONED: set[str] = set()

__all__ = ["SqlSource", "from_sql", "unique_names"]


def unique_names(names: Sequence[str]) -> list[str]:
    """``names`` with each repeat renamed ``<name>.<k>`` (``k`` counts the repeats
    of that name), as ``pandas.read_csv`` names repeated headers, except that a
    name the query gives itself is never taken by a renamed repeat: the repeat
    gets the next free suffix instead (``SELECT t.id, u.id, t.id AS "id.1"``
    keeps ``id.1`` for the column so named).

    >>> unique_names(["id", "id", "label", "id"])
    ['id', 'id.1', 'label', 'id.2']
    >>> unique_names(["id", "id", "id.1", "id"])
    ['id', 'id.2', 'id.1', 'id.3']
    """
    given = set(names)
    taken: set[str] = set()
    counts: dict[str, int] = {}
    out = []
    for name in names:
        if name not in taken:
            out.append(name)
            taken.add(name)
            continue
        k = counts.get(name, 0)
        candidate = name
        while candidate in taken or candidate in given:
            k += 1
            candidate = f"{name}.{k}"
        counts[name] = k
        out.append(candidate)
        taken.add(candidate)
    return out


class SqlSource:
    """Rows of a query as sample dicts (column name -> value), and a fingerprint.

    A :class:`~mlcache.data.writer.ColumnSource`: ``pack()`` takes its rows a
    column at a time (:meth:`column_batches`).
    """

    def __init__(
        self,
        query: str,
        connection: Any,
        params: Sequence[Any] | dict[str, Any] = (),
        *,
        data_version: str | None = None,
        arraysize: int = 10_000,
    ) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty SQL string")
        if isinstance(connection, (str, os.PathLike)):
            if not os.path.isfile(connection):
                raise FileNotFoundError(f"no sqlite database at {os.fspath(connection)!r}")
            connection = os.path.abspath(connection)
        elif not (hasattr(connection, "cursor") or _alchemy(connection)):
            raise TypeError(
                "connection must be a DB-API connection, the path of a sqlite file or a "
                f"SQLAlchemy Engine or Connection, got {connection!r}"
            )
        self.query = query
        self.connection = connection
        self.params = params
        self.data_version = data_version
        if not isinstance(arraysize, int) or arraysize < 1:
            raise ValueError(f"arraysize must be a positive int, got {arraysize!r}")
        self.arraysize = arraysize

    def fingerprint(self) -> str:
        """Changes with the query text, its parameters and ``data_version``; without
        a ``data_version``, with a sqlite database's files (see the module docstring)."""
        params = dict(self.params) if isinstance(self.params, dict) else list(self.params)
        given = (" ".join(self.query.split()), params, self.data_version)
        if self.data_version is not None:
            return hash_value(given)
        files = self._sqlite_files()
        if files is not None:
            return hash_value((*given, files))
        if not _SAID_UNVERSIONED:
            _SAID_UNVERSIONED.add("said")
            kind = type(self.connection).__qualname__
            warn(
                f"mlcache: from_sql on a {kind} connection without data_version: a change "
                "of its rows is not seen (only a sqlite file tells it for free), so the "
                "pack keeps serving the rows of its build; pass data_version= and change "
                "it when the rows change",
                stacklevel=2,
            )
        return hash_value(given)

    def _sqlite_files(self) -> list[tuple[str, tuple[int, ...]]] | None:
        """The files of a sqlite database (each attached one, and its ``-wal``
        when it holds any frame) with their stat; None when the database is not
        a sqlite file (another database, ``:memory:``) or cannot be asked."""
        try:
            with self._dbapi() as con:
                raw = _driver_connection(con)
                if not isinstance(raw, sqlite3.Connection):
                    return None
                names = [row[2] for row in raw.execute("PRAGMA database_list")]
            found: list[tuple[str, tuple[int, ...]]] = []
            for name in names:
                if not name:  # an in-memory or temporary database: no file tells
                    return None
                found.append((name, stat_fields(os.stat(name))))
                with contextlib.suppress(FileNotFoundError):
                    wal = os.stat(name + "-wal")
                    if wal.st_size:  # an empty -wal is none: made by a mere open
                        # not its ctime: sqlite run as root chowns the -wal at each
                        # open, reads too; a write moves its mtime all the same
                        found.append((name + "-wal", stat_fields(wal)[:3]))
            return found or None
        except Exception:  # a connection of another thread, a closed one: unknown
            return None

    @contextlib.contextmanager
    def _dbapi(self) -> Iterator[Any]:
        """The DB-API connection to run on: the one given; one opened on the sqlite
        file (closed after); a SQLAlchemy engine's (back to its pool after) or
        connection's."""
        given = self.connection
        if isinstance(given, str):
            con = sqlite3.connect(given)
            try:
                yield con
            finally:
                con.close()
        elif hasattr(given, "cursor"):
            yield given
        elif callable(getattr(given, "raw_connection", None)):  # a SQLAlchemy Engine
            con = given.raw_connection()
            try:
                yield con
            finally:
                con.close()
        else:  # a SQLAlchemy Connection: its pooled DB-API connection
            yield given.connection

    def _batches(self) -> Iterator[tuple[list[str], list[Any]]]:
        """The column names (made unique) and the rows, ``arraysize`` at a time."""
        with self._dbapi() as con:
            cursor = con.cursor()
            try:
                cursor.execute(self.query, self.params)
                names = unique_names([str(d[0]) for d in cursor.description or ()])
                while True:
                    rows = cursor.fetchmany(self.arraysize)  # streams: bounded memory
                    if not rows:
                        return
                    yield names, rows
            finally:
                cursor.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for names, rows in self._batches():
            for row in rows:
                yield dict(zip(names, row))

    def column_batches(self) -> Iterator[dict[str, Sequence[Any]]]:
        """The rows as columns: ``{name: values}`` for each ``arraysize`` rows."""
        for names, rows in self._batches():
            yield dict(zip(names, zip(*rows)))


def _alchemy(connection: Any) -> bool:
    """Whether ``connection`` is a SQLAlchemy ``Engine`` or ``Connection`` (by its
    module, so that SQLAlchemy need not be installed, nor imported, to check)."""
    module = type(connection).__module__ or ""
    return module.split(".")[0] == "sqlalchemy" and (
        callable(getattr(connection, "raw_connection", None))
        or hasattr(getattr(connection, "connection", None), "cursor")
    )


def _driver_connection(con: Any) -> Any:
    """The driver's own connection under a SQLAlchemy pool's proxy (or ``con``)."""
    for name in ("driver_connection", "dbapi_connection"):  # SQLAlchemy 2.0, 1.4
        inner = getattr(con, name, None)
        if inner is not None:
            return inner
    return con


def from_sql(
    query: str,
    connection: Any,
    params: Sequence[Any] | dict[str, Any] = (),
    *,
    data_version: str | None = None,
) -> SqlSource:
    """The rows of ``query`` on ``connection`` as a dataset source. See :class:`SqlSource`."""
    return SqlSource(query, connection, params, data_version=data_version)
