"""mlcache.torch.collate / as_tensor: a warning-free, copy-free way from samples to
tensors, where ``torch.as_tensor`` (and ``default_collate``, which calls it) warn
"not writable" over a pack's read-only views (``writable=False``)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mlcache.data import PackedDataset, pack  # noqa: E402
from mlcache.torch import as_tensor, collate  # noqa: E402


def _samples(n=12):
    for i in range(n):
        yield {
            "x": np.full((2, 3), i, dtype=np.float32),
            "r": np.arange(i % 4),  # ragged
            "y": i,
            "name": f"s{i}",
            "m": None if i % 3 else np.int16(i),
        }


@pytest.fixture
def packed(tmp_path):
    return pack(_samples(), tmp_path / "d.pack", progress=False).path


def test_collate_stacks_fields_from_read_only_views_without_a_warning(packed):
    ds = PackedDataset(packed, writable=False)
    assert not ds[0]["x"].flags.writeable
    loader = torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=collate)
    batches = list(loader)  # warnings are errors here: "not writable" would fail
    first = batches[0]
    assert first["x"].shape == (5, 2, 3) and first["x"].dtype == torch.float32
    assert first["x"][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert first["y"].tolist() == [0, 1, 2, 3, 4]
    assert first["name"] == ["s0", "s1", "s2", "s3", "s4"]
    assert [t.tolist() for t in first["r"]] == [[], [0], [0, 1], [0, 1, 2], []]
    assert first["m"][0] == 0 and first["m"][1] is None
    assert [len(b["y"]) for b in batches] == [5, 5, 2]
    first["x"] += 1  # the batch is its own memory: the pack is untouched
    assert float(ds[1]["x"][0, 0]) == 1.0
    assert collate([]) == {}
    with pytest.raises(TypeError, match="dicts of fields"):
        collate([1, 2])


def test_as_tensor_shares_a_writable_array_and_copies_a_read_only_one(packed):
    writable = PackedDataset(packed)[3]["x"]
    t = as_tensor(writable)
    assert np.shares_memory(t.numpy(), writable)
    read_only = PackedDataset(packed, writable=False)[3]["x"]
    u = as_tensor(read_only)  # no warning (warnings are errors here)
    u += 1
    assert not np.shares_memory(u.numpy(), read_only) and float(read_only[0, 0]) == 3.0


LOADER = """
import sys
import torch
import mlcache.torch
from mlcache.data import PackedDataset

ds = PackedDataset(sys.argv[1], writable=False)
fn = mlcache.torch.collate if sys.argv[2] == "mlcache" else None
loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=fn)
ys = sorted(int(y) for batch in loader for y in batch["y"])
print("ys", ys)
"""


@pytest.mark.slow
def test_in_dataloader_workers_collate_is_warning_free_where_as_tensor_warns(packed):
    """The workers run with warnings as errors: PyTorch's default collate fails
    on its "not writable" warning (the trap), mlcache.torch.collate does not."""

    def run(which):
        return subprocess.run(
            [sys.executable, "-W", "error", "-c", LOADER, packed, which],
            capture_output=True,
            text=True,
            timeout=120,
        )

    ours = run("mlcache")
    assert ours.returncode == 0, ours.stderr
    assert f"ys {list(range(12))}" in ours.stdout
    assert "not writable" not in ours.stderr
    theirs = run("default")
    assert theirs.returncode != 0 and "not writable" in theirs.stderr
