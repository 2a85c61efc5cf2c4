"""Leaves for polars: ``DataFrame`` and ``Series``, as one polars IPC file each.

The node is ``{"s": segment, "kind": "frame" | "series"}``; the segment is the
frame written by polars' own Arrow IPC writer (uncompressed), which keeps every
polars dtype (``Categorical``, ``Enum``, ``Decimal``, ``Array``, ``Struct``,
time zones); a Series is stored as its one-column frame, its name kept.
``Object`` columns (arbitrary Python objects) are refused. polars is imported
only once a value of it is met.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from . import Segments

__all__ = ["PolarsLeaf"]


def _dtype_ok(pl: Any, dtype: Any, depth: int = 0) -> bool:
    if depth > 64 or isinstance(dtype, pl.Object) or dtype == pl.Object:
        return False
    inner = getattr(dtype, "inner", None)
    if inner is not None and not _dtype_ok(pl, inner, depth + 1):
        return False
    fields = getattr(dtype, "fields", None)
    if isinstance(fields, list):
        return all(_dtype_ok(pl, f.dtype, depth + 1) for f in fields)
    return True


class PolarsLeaf:
    """A polars DataFrame or Series, dtypes and names kept."""

    name = "polars.DataFrame"
    types: tuple[str, ...] = ("polars.dataframe.frame.DataFrame", "polars.series.series.Series")

    def can_encode(self, value: Any) -> bool:
        import polars as pl

        return all(_dtype_ok(pl, dtype) for dtype in _frame(pl, value).schema.values())

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        import polars as pl

        buf = io.BytesIO()
        _frame(pl, value).write_ipc(buf, compression="uncompressed")
        kind = "series" if isinstance(value, pl.Series) else "frame"
        return {"s": add(buf.getbuffer()), "kind": kind}

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        import polars as pl

        kind = node["kind"]
        if kind not in ("frame", "series"):
            raise ValueError(f"bad polars node kind {kind!r}")
        frame = pl.read_ipc(io.BytesIO(segments.buffer(node["s"])))
        if kind == "frame":
            return frame
        if frame.width != 1:
            raise ValueError("a stored polars Series is not one column")
        return frame.to_series(0)


def _frame(pl: Any, value: Any) -> Any:
    return value.to_frame() if isinstance(value, pl.Series) else value
