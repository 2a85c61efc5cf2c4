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
them to rebuild. Columns become fields; NULLs must be the same in every row of
a column (use ``COALESCE`` for columns that are sometimes NULL).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..hashing import hash_value

__all__ = ["SqlSource", "from_sql"]


class SqlSource:
    """Rows of a query as sample dicts (column name -> value), and a fingerprint."""

    def __init__(
        self,
        query: str,
        connection: Any,
        params: Sequence[Any] | dict[str, Any] = (),
        *,
        data_version: str | None = None,
        arraysize: int = 1000,
    ) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty SQL string")
        if not hasattr(connection, "cursor"):
            raise TypeError(f"connection must be a DB-API connection, got {connection!r}")
        self.query = query
        self.connection = connection
        self.params = params
        self.data_version = data_version
        self.arraysize = arraysize

    def fingerprint(self) -> str:
        """Changes with the query text, its parameters and ``data_version``."""
        params = dict(self.params) if isinstance(self.params, dict) else list(self.params)
        return hash_value((" ".join(self.query.split()), params, self.data_version))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        cursor = self.connection.cursor()
        try:
            cursor.execute(self.query, self.params)
            names = [d[0] for d in cursor.description or ()]
            while True:
                rows = cursor.fetchmany(self.arraysize)  # streams: bounded memory
                if not rows:
                    return
                for row in rows:
                    yield dict(zip(names, row))
        finally:
            cursor.close()


def from_sql(
    query: str,
    connection: Any,
    params: Sequence[Any] | dict[str, Any] = (),
    *,
    data_version: str | None = None,
) -> SqlSource:
    """The rows of ``query`` on ``connection`` as a dataset source. See :class:`SqlSource`."""
    return SqlSource(query, connection, params, data_version=data_version)
