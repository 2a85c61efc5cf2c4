"""The item table's keys and default fingerprints (:mod:`mlcache.data.items`),
taken in one pass over the items at an open (issue 26): each is the one
:func:`~mlcache.data.items.key_bytes` and :func:`~mlcache.data.items.default_fingerprint`
give an item alone, which the check as read compares at a reopen (a mismatch
would load every sample again)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlcache.data.items import (
    default_fingerprint,
    default_fingerprints,
    item_keys,
    item_table,
    key_bytes,
)


@dataclass
class Pair:
    image: str
    label: int


def _items(tmp_path: Path) -> tuple[list[object], tuple[str, ...]]:
    """Items of every kind: files, a folder, a missing path, a name relative to a
    base, a ``Path``, a tuple, a dataclass, a row number, a name with a NUL."""
    (tmp_path / "a.csv").write_text("a")
    (tmp_path / "b.csv").write_text("bb")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "c.csv").write_text("c")
    a, b = str(tmp_path / "a.csv"), str(tmp_path / "b.csv")
    items: list[object] = [
        a,
        b,
        str(tmp_path / "folder"),
        str(tmp_path / "gone.csv"),
        "a.csv",
        Path(b),
        (a, 1),
        Pair(b, 0),
        7,
        "bad\0name",
    ]
    return items, (str(tmp_path),)


@pytest.mark.parametrize("local", [True, False])
def test_the_fingerprints_of_the_items_are_each_items_own(tmp_path, local):
    items, bases = _items(tmp_path)
    expected = b"".join(default_fingerprint(item, bases, local) for item in items)
    assert default_fingerprints(items, bases, local) == expected
    table = item_table(items, bases=bases, local=local)
    assert table[:, 2:].tobytes() == expected


def test_a_plain_file_is_stated_once(tmp_path, monkeypatch):
    """One ``stat`` a listed file, as ``default_fingerprint`` takes (the same
    fields, the same digest), without its call per item."""
    paths = [str(tmp_path / f"p{i}.csv") for i in range(20)]
    for p in paths:
        Path(p).write_text(p)
    expected = b"".join(default_fingerprint(p) for p in paths)
    stated: list[str] = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: stated.append(p) or real(p, *a, **k))
    assert default_fingerprints(paths) == expected
    assert stated == paths


def test_the_keys_of_the_items_are_each_items_own(tmp_path):
    items, _ = _items(tmp_path)
    assert item_keys(items) == b"".join(key_bytes(item) for item in items)
