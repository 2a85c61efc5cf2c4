"""Leaves for pandas: ``DataFrame``, ``Series`` and ``Index`` (``MultiIndex``,
``RangeIndex`` and the others), stored column by column without pickle.

The nodes (labels, columns by kind, indexes) are :mod:`mlcache.codecs.pandas_nodes`'s;
their layout is in ``docs/format.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import Segments
from .pandas_nodes import (
    column_kind,
    decode_column,
    decode_index,
    encode_column,
    encode_index,
    index_ok,
    label,
    label_ok,
    later_layout,
    pandas_module,
    unlabel,
    values_of,
)

__all__ = ["NA_LAYOUT", "DataFrameLeaf", "IndexLeaf", "SeriesLeaf"]

Add = Callable[[Any], int]


# -- the leaves ------------------------------------------------------------------------
def _plain_frame(df: Any) -> bool:
    return not df.attrs and df.flags.allows_duplicate_labels


#: the second name of each leaf: nodes holding NaN or NA among object strings
#: (readers before them do not know it: a miss that keeps the entry)
NA_LAYOUT = ".na"


def _named(name: str, node: dict[str, Any]) -> dict[str, Any]:
    return {"x": name + NA_LAYOUT, **node} if later_layout(node) else node


class IndexLeaf:
    """Any pandas index of storable values: names, dtype, ``freq`` and levels kept."""

    name = "pandas.Index"
    # pandas 3 names its public classes "pandas.X"; pandas 2 by their modules
    types: tuple[str, ...] = (
        "pandas.Index",
        "pandas.RangeIndex",
        "pandas.MultiIndex",
        "pandas.DatetimeIndex",
        "pandas.TimedeltaIndex",
        "pandas.PeriodIndex",
        "pandas.CategoricalIndex",
        "pandas.IntervalIndex",
        "pandas.core.indexes.base.Index",
        "pandas.core.indexes.range.RangeIndex",
        "pandas.core.indexes.multi.MultiIndex",
        "pandas.core.indexes.datetimes.DatetimeIndex",
        "pandas.core.indexes.timedeltas.TimedeltaIndex",
        "pandas.core.indexes.period.PeriodIndex",
        "pandas.core.indexes.category.CategoricalIndex",
        "pandas.core.indexes.interval.IntervalIndex",
    )

    def can_encode(self, value: Any) -> bool:
        return index_ok(pandas_module(), value)

    def encode(self, value: Any, add: Add) -> dict[str, Any]:
        return _named(self.name, {"i": encode_index(pandas_module(), value, add)})

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        return decode_index(pandas_module(), node["i"], segments)


class SeriesLeaf:
    """A pandas Series: its values, index and name."""

    name = "pandas.Series"
    types: tuple[str, ...] = ("pandas.Series", "pandas.core.series.Series")

    def can_encode(self, value: Any) -> bool:
        pd = pandas_module()
        return (
            _plain_frame(value)
            and label_ok(value.name)
            and column_kind(pd, values_of(value)) is not None
            and index_ok(pd, value.index)
        )

    def encode(self, value: Any, add: Add) -> dict[str, Any]:
        pd = pandas_module()
        node = {
            "v": encode_column(pd, values_of(value), add),
            "index": encode_index(pd, value.index, add),
            "name": label(value.name),
        }
        return _named(self.name, node)

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        pd = pandas_module()
        values = decode_column(pd, node["v"], segments)
        index = decode_index(pd, node["index"], segments)
        name = unlabel(node["name"])
        return pd.Series(values, index=index, dtype=values.dtype, name=name, copy=False)


class DataFrameLeaf:
    """A pandas DataFrame: its columns (by position: duplicate names kept), index
    and columns index."""

    name = "pandas.DataFrame"
    types: tuple[str, ...] = ("pandas.DataFrame", "pandas.core.frame.DataFrame")

    def can_encode(self, value: Any) -> bool:
        pd = pandas_module()
        if not (_plain_frame(value) and index_ok(pd, value.index)):
            return False
        if not index_ok(pd, value.columns):
            return False
        return all(
            column_kind(pd, values_of(value.iloc[:, i])) is not None for i in range(value.shape[1])
        )

    def encode(self, value: Any, add: Add) -> dict[str, Any]:
        pd = pandas_module()
        node = {
            "cols": encode_index(pd, value.columns, add),
            "index": encode_index(pd, value.index, add),
            "data": [
                encode_column(pd, values_of(value.iloc[:, i]), add) for i in range(value.shape[1])
            ],
        }
        return _named(self.name, node)

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        pd = pandas_module()
        index = decode_index(pd, node["index"], segments)
        columns = decode_index(pd, node["cols"], segments)
        data = [decode_column(pd, c, segments) for c in node["data"]]
        if len(data) != len(columns) or any(len(c) != len(index) for c in data):
            raise ValueError("bad DataFrame shape")
        series = {
            i: pd.Series(c, index=index, dtype=c.dtype, copy=False) for i, c in enumerate(data)
        }
        df = pd.DataFrame(series, index=index, copy=False)
        df.columns = columns
        return df
