"""The ``pickle`` codec: the last resort for values no safe codec represents.

Pickle protocol 5 with out-of-band buffers: numpy arrays inside any object (an
sklearn estimator, a DataFrame) are stored as raw aligned segments, so they too
come back memory-mapped and are not copied through the pickle stream.
Unpickling runs code: this codec is refused when ``allow_pickle=False``.
"""

from __future__ import annotations

import pickle
from typing import Any

from . import Encoded, Segments


class PickleCodec:
    """Any picklable value; arrays inside it are stored out of band."""

    name = "pickle"
    safe = False

    def can_encode(self, value: Any) -> bool:
        return True

    def encode(self, value: Any) -> Encoded:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        raws: list[Any] = [data]
        for b in buffers:
            try:
                raws.append(b.raw())
            except BufferError:  # non-contiguous: fall back to a copy
                raws.append(memoryview(b).tobytes())
        return Encoded({"oob": len(buffers)}, raws)

    def decode(self, layout: dict[str, Any], segments: Segments) -> Any:
        n = int(layout["oob"])
        return pickle.loads(segments.buffer(0), buffers=[segments.buffer(i + 1) for i in range(n)])
