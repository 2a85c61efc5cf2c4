"""Leaves for pyarrow: ``Table`` and ``RecordBatch``, as one Arrow IPC stream each.

The node is ``{"s": segment, "kind": "table" | "batch"}``; the segment is the
Arrow IPC stream (schema with its metadata, then the record batches: a table's
chunks are kept). Decoding opens the stream on the segment's buffer, so with
``mmap_mode`` every column buffer is a zero-copy view of the mapped entry.

Extension types other than Arrow's canonical ones (which pyarrow always
knows) are refused: a process without the extension registered would read the
storage type back, not the value stored. pyarrow is imported only once a value
of it is met.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import Segments

__all__ = ["ArrowLeaf", "ipc_segment", "read_ipc"]

#: extension types pyarrow registers itself (canonical Arrow extensions)
_CANONICAL = ("FixedShapeTensorType", "UuidType", "JsonType", "Bool8Type", "OpaqueType")


def _type_ok(pa: Any, t: Any, depth: int = 0) -> bool:
    if isinstance(t, pa.BaseExtensionType):
        canonical = tuple(getattr(pa, n) for n in _CANONICAL if hasattr(pa, n))
        if not isinstance(t, canonical):
            return False
        t = t.storage_type
    if depth > 64:
        return False
    return all(_type_ok(pa, t.field(i).type, depth + 1) for i in range(t.num_fields))


def schema_ok(schema: Any) -> bool:
    """Whether every field of an Arrow ``schema`` reads back as the same type in
    any process (no extension type that needs registering)."""
    import pyarrow as pa

    return all(_type_ok(pa, field.type) for field in schema)


def ipc_segment(value: Any, add: Callable[[Any], int]) -> int:
    """A Table or RecordBatch as one Arrow IPC stream segment; its index."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, value.schema) as writer:
        if isinstance(value, pa.RecordBatch):
            writer.write_batch(value)
        else:
            writer.write_table(value)
    return add(sink.getvalue())


def read_ipc(segments: Segments, index: int) -> Any:
    """The Table in the IPC stream segment ``index``, its buffers views of the
    segment (of the mapped file, when mapped)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(segments.buffer(index))).read_all()


class ArrowLeaf:
    """A pyarrow Table (its chunks kept) or RecordBatch, schema metadata included."""

    name = "pyarrow.Table"
    types: tuple[str, ...] = ("pyarrow.lib.Table", "pyarrow.lib.RecordBatch")

    def can_encode(self, value: Any) -> bool:
        return schema_ok(value.schema)

    def encode(self, value: Any, add: Callable[[Any], int]) -> dict[str, Any]:
        import pyarrow as pa

        kind = "batch" if isinstance(value, pa.RecordBatch) else "table"
        return {"s": ipc_segment(value, add), "kind": kind}

    def decode(self, node: dict[str, Any], segments: Segments) -> Any:
        if node["kind"] == "table":
            return read_ipc(segments, node["s"])
        if node["kind"] != "batch":
            raise ValueError(f"bad pyarrow node kind {node['kind']!r}")
        import pyarrow as pa

        batches = list(pa.ipc.open_stream(pa.py_buffer(segments.buffer(node["s"]))))
        if len(batches) != 1:
            raise ValueError("a stored RecordBatch is not one batch")
        return batches[0]
