"""The names a dataset's items give (:mod:`mlcache.data.names`), as the walk of a
folder attribute needs them (issue 26: the first open of a folder of listed
files): a listed absolute path names itself, made without a ``candidates()`` call
and a ``normpath`` per item, and always what those two would make of it."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

import mlcache.data.names as names
from mlcache.data.names import names_of
from mlcache.data.sources import candidates, path_parts


def _reference(items: list[Any], bases: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each part's candidates made absolute and normal the long way (what the
    walk's names were before issue 26)."""
    chains = []
    for item in items:
        for part in path_parts(item):
            chain = tuple(os.path.normpath(os.path.abspath(c)) for c in candidates(part, bases))
            if chain:
                chains.append(chain)
    return chains


def _counted(monkeypatch: Any) -> list[Any]:
    """The parts ``candidates()`` is asked about from now on."""
    asked: list[Any] = []
    real = names.candidates
    monkeypatch.setattr(
        names, "candidates", lambda part, bases: asked.append(part) or real(part, bases)
    )
    return asked


def test_a_listed_absolute_path_names_itself_without_candidates(monkeypatch, tmp_path):
    """20,000 listed files cost ~45 ms of names through ``candidates()`` and
    ``normpath`` at the first open; a plain absolute path is its own name."""
    listed = [str(tmp_path / f"p{i:05d}.csv") for i in range(50)]
    asked = _counted(monkeypatch)
    chains = names_of([], listed, (str(tmp_path),)).chains
    assert chains == [(p,) for p in listed]
    assert asked == []  # before: each of the 50 paths


# paths normpath changes (or that name nothing), beside plain ones
@example(["/data/a/../b.csv", "/data//b.csv", "/data/./b.csv", "/data/b/", "/", "//x"])
@example(["/data/.hidden", "/data/..", "/data/.", "rel/b.csv", "./b.csv", "", "/a\0b", "..."])
@given(st.lists(st.text(alphabet="/.ab\0", max_size=12), max_size=6))
@settings(max_examples=200, deadline=None)
def test_the_names_are_what_candidates_and_normpath_make(parts):
    """Whatever the items, their names are the reference's; a plain absolute path
    among them is never asked of ``candidates()``."""
    plain = "/data/p00001.csv"
    items = [plain, *parts, (plain, 1), {"image": "b.csv"}]
    bases = ("/data", "/data/sub")
    asked: list[Any] = []
    real = names.candidates
    names.candidates = lambda part, b: asked.append(part) or real(part, b)  # type: ignore[assignment]
    try:
        chains = names_of([], items, bases).chains
    finally:
        names.candidates = real
    assert chains == _reference(items, bases)
    assert asked.count(plain) == 1  # the one inside a tuple; before: 2
