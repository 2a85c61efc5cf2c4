"""The seal of a pack filled as read (issue 26): records whose fields have one kind
and dtype in every sample are copied into the pack byte for byte, not decoded and
written again; the pack is the one the decoding seal writes, byte for byte, and
anything the copy cannot take (None, promotion, lists of str, dicts, another field
order, a NaN first) is sealed by decoding, as before."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from mlcache.data import CachedDataset
from mlcache.data import filling as filling_module
from mlcache.data.sealing import SealSource

N = 12


def _copied(i: int) -> dict[str, Any]:
    """Every kind the copy takes, with values that vary in size and shape."""
    return {
        "i": -(2**62) + i if i % 2 else i * 1000,
        "f": float("nan") if i == 5 else i / 3,
        "b": i % 3 == 0,
        "s": "é日本"[: i % 4] + "x" * i,
        "y": bytes(range(i)),
        "f32": np.float32(i) / 7,
        "when": np.datetime64("2024-01-01") + np.timedelta64(i, "D"),
        "fixed": np.arange(6, dtype=np.int16).reshape(2, 3) * i,
        "ragged": np.full((i % 4, 3), i, np.float32),
        "cube": np.arange(i * 4, dtype=np.uint8).reshape(i, 2, 2),
        "big": np.arange(i, dtype=">i4"),
        "days": np.arange(i % 3).astype("M8[s]"),
        "none0": np.zeros((0, 2)),
    }


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "copied": _copied,
    # what the copy cannot take: the decoding seal writes these
    "none": lambda i: {"x": None if i == 4 else np.arange(i), "y": i},
    "promoted": lambda i: {
        "x": 1.5 if i == 7 else i,
        "y": np.arange(i, dtype=np.int32 if i else np.int64),
    },
    "strs": lambda i: {"x": ["a"] * i, "y": i},
    "dict": lambda i: {"x": {"a": i, "b": np.arange(i)}, "y": i},
    "order": lambda i: {"x": i, "y": str(i)} if i != 3 else {"y": str(i), "x": i},
    "nan first": lambda i: {"x": float("nan") if i == 0 else float(i)},
    "empty list": lambda i: {"x": np.arange(i) if i else []},
}


class Samples(CachedDataset):
    """``CASES[case](i)`` for the items ``0 .. N-1``."""

    cache_ignore: ClassVar[tuple[str, ...]] = ()

    def __init__(self, case: str, **kw: Any) -> None:
        self.case = case
        super().__init__(progress=False, **kw)

    def source_items(self) -> list[int]:
        return list(range(N))

    def load_item(self, item: int) -> dict[str, Any]:
        return CASES[self.case](item)


def _epoch(case: str, cache: Path) -> tuple[list[Any], bytes]:
    """Epoch 1 on an empty cache (it seals the pack); the samples it served, the
    pack's bytes."""
    ds = Samples(case, cache_dir=cache)
    served = [ds[i] for i in range(N)]
    (pack,) = cache.rglob("*.pack")
    assert not list(cache.rglob("*.pack.fill")), "the seal removes the records"
    return served, pack.read_bytes()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (np.ndarray, np.generic)):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and np.shape(a) == np.shape(b)
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("case", list(CASES))
def test_the_seal_writes_the_pack_the_decoding_seal_writes(case, tmp_path, monkeypatch):
    decoded = []
    real = filling_module.decode_sample

    def counting(payload: bytes, allow_pickle: bool) -> dict[str, Any]:
        decoded.append(1)
        return real(payload, allow_pickle)

    monkeypatch.setattr(filling_module, "decode_sample", counting)
    served, copied = _epoch(case, tmp_path / "copied")
    if case == "copied":
        assert not decoded, "every record copied, none decoded (the probes load none of 12)"
    with monkeypatch.context() as m:
        m.setattr(SealSource, "copied_fields", lambda self: None)
        served_decoded, written = _epoch(case, tmp_path / "decoded")
    assert copied == written
    again = Samples(case, cache_dir=tmp_path / "copied")
    for i in range(N):
        assert _same(served[i], served_decoded[i]), (i, served[i], served_decoded[i])
        if case == "copied":  # epoch 1 served what the pack serves (types and values);
            # a promotion by a later sample is the documented exception (values.read_back)
            assert _same(served[i], again[i]), (i, served[i], again[i])


def test_a_damaged_record_is_found_at_the_seal_and_loaded_again(tmp_path):
    class Counted(Samples):
        loads: ClassVar[list[int]] = []

        def load_item(self, item: int) -> dict[str, Any]:
            Counted.loads.append(item)
            return super().load_item(item)

    ds = Counted("copied", cache_dir=tmp_path)
    for i in range(N - 1):
        ds[i]
    (segment,) = tmp_path.rglob("*.seg")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a value's byte, in a record of the middle
    segment.write_bytes(bytes(data))
    Counted.loads.clear()
    last = ds[N - 1]  # its load seals the pack: the damaged record is loaded again
    assert len(Counted.loads) == 2
    assert not list(tmp_path.rglob("*.pack.fill"))
    fresh = Counted("copied", cache_dir=tmp_path)
    for i in range(N):
        assert _same(fresh[i], _copied_read_back(i)), i
    assert _same(last, fresh[N - 1])


def _copied_read_back(i: int) -> dict[str, Any]:
    from mlcache.data.values import read_back

    return read_back(_copied(i), False, i)


def test_records_of_other_processes_are_copied_too(tmp_path, monkeypatch):
    """A segment per process: the seal copies from each (a DataLoader's workers),
    the items of the two segments interleaved, none decoded."""
    ds = Samples("copied", cache_dir=tmp_path)
    pid = os.fork()
    if pid == 0:  # a worker: records every other item, in its own segment
        try:
            for i in range(0, N, 2):
                ds[i]
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    decoded = []
    real = filling_module.decode_sample
    monkeypatch.setattr(filling_module, "decode_sample", lambda *a: decoded.append(1) or real(*a))
    served = [ds[i] for i in range(1, N, 2)]  # the other half, then the seal
    assert len(list(tmp_path.rglob("*.pack"))) == 1 and len(list(tmp_path.rglob("*.seg"))) == 0
    assert not decoded, "every record copied, none decoded"
    monkeypatch.undo()
    served = [ds[i] for i in range(N)]
    again = Samples("copied", cache_dir=tmp_path)
    for i in range(N):
        assert _same(served[i], again[i])
        assert _same(again[i], _copied_read_back(i))
