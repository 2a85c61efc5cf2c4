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

A database cannot tell cheaply whether its rows changed, so the fingerprint is
the query text, its parameters and the ``data_version`` you give: change any of
them to rebuild.

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

from collections.abc import Iterator, Sequence
from typing import Any

from ..keys.hashing import hash_value

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
        if not hasattr(connection, "cursor"):
            raise TypeError(f"connection must be a DB-API connection, got {connection!r}")
        self.query = query
        self.connection = connection
        self.params = params
        self.data_version = data_version
        if not isinstance(arraysize, int) or arraysize < 1:
            raise ValueError(f"arraysize must be a positive int, got {arraysize!r}")
        self.arraysize = arraysize

    def fingerprint(self) -> str:
        """Changes with the query text, its parameters and ``data_version``."""
        params = dict(self.params) if isinstance(self.params, dict) else list(self.params)
        return hash_value((" ".join(self.query.split()), params, self.data_version))

    def _batches(self) -> Iterator[tuple[list[str], list[Any]]]:
        """The column names (made unique) and the rows, ``arraysize`` at a time."""
        cursor = self.connection.cursor()
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


def from_sql(
    query: str,
    connection: Any,
    params: Sequence[Any] | dict[str, Any] = (),
    *,
    data_version: str | None = None,
) -> SqlSource:
    """The rows of ``query`` on ``connection`` as a dataset source. See :class:`SqlSource`."""
    return SqlSource(query, connection, params, data_version=data_version)
