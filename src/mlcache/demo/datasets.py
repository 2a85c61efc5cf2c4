"""The demo's datasets over its patient files: the README's (``load_item``: the
pack fills as an epoch reads it) and its alternative (``load_source()``: the
whole pack built at the open).

Both live here, not in the demo's package, so the fresh processes of the demo
(:mod:`mlcache.demo.children`) open the very class the demo built: the same
module, the same code, the same pack.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ..data import CachedDataset
from .epochs import count
from .synthetic import read_patient

__all__ = ["Patients", "PatientsByItem"]


class PatientsByItem(CachedDataset):
    """The README's dataset: the declared source (``*.csv`` of ``root``) and
    ``load_item`` one file. The open lists the files; epoch 1 loads each file as
    it reads it and stores it in the pack; an edited file is loaded again at the
    next open, alone. Each load is counted in the file ``counter`` (any process's)."""

    source_glob = "*.csv"
    cache_ignore = ("counter",)

    def __init__(self, root: str, counter: str | None = None, **kw: Any) -> None:
        self.source_dir, self.counter = root, counter
        super().__init__(**kw)

    def load_item(self, item: str) -> dict[str, Any]:
        count(self.counter)
        return read_patient(item)


class Patients(CachedDataset):
    """The alternative: ``load_source()`` yields every sample, so the whole pack is
    built at the first open (and again after any edit of a file)."""

    def __init__(self, root: str, **kw: Any) -> None:
        self.root = root
        super().__init__(**kw)

    def source_files(self) -> list[str]:
        names = sorted(n for n in os.listdir(self.root) if n.endswith(".csv"))
        return [os.path.join(self.root, n) for n in names]

    #: source files parsed by builds in this process (the demo counts its rebuilds)
    parsed = 0

    def load_source(self) -> Iterator[dict[str, Any]]:
        for path in self.source_files():
            Patients.parsed += 1
            yield read_patient(path)
