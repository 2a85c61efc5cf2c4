"""The demo's fourth part: where each approach wins, at every size.

Generated samples (``{"x": float32[64], "y": int, "id": str}``, in memory, no
source files) are written once at each size to the two caches a training
script can keep: one pickle file of the whole list (the hand-written cache)
and one pack (:func:`mlcache.data.pack`). Then, for each:

* **Reopen**: a fresh process opens the cache file and reads one sample (the
  pickle: ``pickle.load`` of the list; the pack: ``PackedDataset(path)[0]``, the
  file alone: no source files to check, unlike the dataset's reopen of part 1),
  timed in that process after its imports, the files in the page cache (warm). Each
  trial is a new process, so nothing the parent or an earlier trial loaded is
  reused; the two contenders alternate, trial by trial. Min and median.
* **Per-worker memory**: ``workers`` processes at once, as DataLoader workers,
  each opening the cache and reading every sample once. Each reports how much
  its memory grew, from ``/proc/self/smaps_rollup`` (Linux), in two parts:
  **private**, the growth of ``Anonymous`` (heap: what the worker built for
  itself, a copy no other process can use: the whole unpickled list) and
  **shared**, the resident pages of its mappings of the cache file (from
  ``/proc/self/smaps``: the pack's pages of the page cache, one copy in RAM for
  every worker and for the next run; none for the pickle, which is read, not
  mapped). Both are read while every worker still holds its data. Code pages
  of libraries a worker touches for the first time count in neither. Without
  ``smaps_rollup`` the memory is not measured.

The processes are forked from one server process (:mod:`mlcache.demo.children`)
started for the section, numpy and mlcache imported, its objects frozen out of
the garbage collector: a child starts in milliseconds, holds nothing of the
demo's process, and the caller's ``__main__`` never runs again (as it would
under ``spawn`` or ``forkserver``). Needs ``os.fork`` (Linux, macOS; the demo
skips the section elsewhere, saying so).

Each worker here loads the pickle itself, as a dataset that loads in its
worker does, or any worker under ``spawn``. Workers forked from a parent that
holds the list (not measured here) start by sharing its pages and copy each
page whose objects' reference counts they touch.

A pack's open costs milliseconds at any size (its header, its index, at the
first read the check of its per-sample tables, 8 bytes a sample), so at a few
thousand samples the pickled list may load faster: the notes say so when it does.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._tables import print_table
from ..data import pack
from .children import PACK, PICKLE, Server
from .report import COLORS, MLCACHE, PICKLED, seconds

__all__ = ["MAX_SAMPLES", "Measure", "Scaling", "chart", "measure", "sizes_for"]

#: the largest size :func:`sizes_for` gives (a pickle of about 150 MB, a copy per worker)
MAX_SAMPLES = 500_000
_MB = 1e6


def sizes_for(patients: int) -> tuple[int, ...]:
    """The section's sizes for a demo of ``patients`` patient files: as many
    samples, 10x and 100x as many, at most :data:`MAX_SAMPLES` (5,000 patients:
    5k, 50k, 500k; ``--quick``'s 300: 300, 3k, 30k).

    >>> sizes_for(5000)
    (5000, 50000, 500000)
    """
    if patients < 1:
        raise ValueError(f"patients must be at least 1, got {patients}")
    return tuple(sorted({min(patients * 10**k, MAX_SAMPLES) for k in range(3)}))


def samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` generated samples ``{"x": float32[64], "y": int, "id": str}``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 64), dtype=np.float32)
    y = rng.integers(0, 10, n).tolist()
    return [{"x": x[i], "y": y[i], "id": f"s{i:07d}"} for i in range(n)]


class _Columns:
    """The samples handed to :func:`mlcache.data.pack` a column at a time (a
    :class:`~mlcache.data.writer.ColumnSource`): the same pack, written in half
    the time of one dict at a time, which keeps the demo short."""

    def __init__(self, data: list[dict[str, Any]], batch: int = 8192) -> None:
        self.data, self.batch = data, batch

    def __iter__(self) -> Iterator[dict[str, Any]]:  # what any other reader sees
        return iter(self.data)

    def column_batches(self) -> Iterator[dict[str, list[Any]]]:
        names = list(self.data[0])
        for start in range(0, len(self.data), self.batch):
            chunk = self.data[start : start + self.batch]
            yield {name: [s[name] for s in chunk] for name in names}


# -- the measures -------------------------------------------------------------------------
@dataclass
class Measure:
    """One cache at one size: its file, its reopen times (one a trial), and per
    worker the seconds of its pass and its memory growth (bytes, None when not
    measured): ``private`` (anonymous) and ``shared`` (file pages)."""

    approach: str
    samples: int
    file_bytes: int
    write_seconds: float
    reopen: list[float] = field(default_factory=list)
    passes: list[float] = field(default_factory=list)
    private: list[int] | None = None
    shared: list[int] | None = None

    @property
    def best(self) -> float:
        return min(self.reopen)

    @property
    def median(self) -> float:
        return statistics.median(self.reopen)


@dataclass
class Scaling:
    """Every measure of the section, the sizes in order, with its settings."""

    sizes: list[int]
    workers: int
    trials: int
    measures: list[Measure] = field(default_factory=list)
    chart: str | None = None

    def at(self, approach: str, n: int) -> Measure:
        return next(m for m in self.measures if m.approach == approach and m.samples == n)

    @property
    def title(self) -> str:
        return (
            "reopen and per-worker memory at every size (reopen: a fresh process opens the "
            f"file alone, no source to check, and reads sample 0, min / median of {self.trials};"
            f" memory: {self.workers} workers reading every sample)"
        )

    HEADERS = (
        "samples",
        "pickled list: load, [0] (min / median)",
        "mlcache: open the pack, [0] (min / median)",
        "mlcache vs the list (min)",
        "private per worker: list",
        "private per worker: mlcache",
        "shared pages: mlcache",
    )

    def cells(self) -> list[list[str]]:
        """The formatted table, one row a size: the terminal's and the report's."""
        rows = []
        for n in self.sizes:
            p, m = self.at(PICKLE, n), self.at(PACK, n)
            up = p.best / m.best
            ratio = f"{up:,.1f}x faster" if up >= 1 else f"{1 / up:,.1f}x slower"
            rows.append(
                [
                    f"{n:,}",
                    f"{seconds(p.best)} / {seconds(p.median)}",
                    f"{seconds(m.best)} / {seconds(m.median)}",
                    ratio,
                    _megabytes(p.private),
                    _megabytes(m.private),
                    _megabytes(m.shared),
                ]
            )
        return rows

    def notes(self) -> list[str]:
        """What the table says, in words: who wins where, how each grows."""
        lines = []
        small, large = self.sizes[0], self.sizes[-1]
        for n in self.sizes:
            p, m = self.at(PICKLE, n), self.at(PACK, n)
            lines.append(
                f"{n:,} samples: a pickle of {p.file_bytes / _MB:,.1f} MB (dumped in "
                f"{seconds(p.write_seconds)}), a pack of {m.file_bytes / _MB:,.1f} MB (packed in "
                f"{seconds(m.write_seconds)})"
            )
        slower = [n for n in self.sizes if self.at(PICKLE, n).best < self.at(PACK, n).best]
        for n in slower:
            p, m = self.at(PICKLE, n), self.at(PACK, n)
            lines.append(
                f"at {n:,} samples the pickled list reopens faster: {seconds(p.best)} against "
                f"mlcache's {seconds(m.best)} (a pack's open costs milliseconds at any size: "
                "its header, its index, the check of its per-sample tables)"
            )
        if not slower:
            lines.append(
                f"the pack opened faster than the list loaded at every size here, {small:,} "
                "samples included (the file alone; part 1's reopen of a dataset also checks "
                "its source files)"
            )
        if len(self.sizes) > 1:
            p0, p1 = self.at(PICKLE, small), self.at(PICKLE, large)
            m0, m1 = self.at(PACK, small), self.at(PACK, large)
            lines.append(
                f"from {small:,} to {large:,} samples ({large / small:,.0f}x as many): the "
                f"pickled list's load took {p1.best / p0.best:,.1f}x as long, mlcache's open "
                f"{m1.best / m0.best:,.1f}x"
            )
        p, m = self.at(PICKLE, large), self.at(PACK, large)
        if p.private is not None and m.private is not None and m.shared is not None:
            lines.append(
                f"at {large:,} samples each of {self.workers} workers holds its own copy of "
                f"the pickled list ({_megabytes(p.private)}, {sum(p.private) / _MB:,.1f} MB in "
                f"all); mlcache's workers hold {_megabytes(m.private)} of their own and map "
                f"{_megabytes(m.shared)} of the pack's pages, one copy in the page cache for "
                "all of them"
            )
        else:
            lines.append("per-worker memory not measured: no /proc/self/smaps_rollup here")
        lines.append(
            "private = the growth of a worker's anonymous memory (smaps_rollup Anonymous: its "
            "own heap); shared = the resident pages of its mappings of the pack (smaps: the "
            "page cache's pages, one copy for every worker)"
        )
        return lines

    def show(self, out: Callable[[str], None]) -> None:
        out("")
        print_table(self.title, list(self.HEADERS), self.cells(), out)
        for line in self.notes():
            out(f"  {line}")

    def markdown(self) -> list[str]:
        """The section of the Markdown report: the table, the notes, the chart."""
        lines = [f"## {self.title}", "", "| " + " | ".join(self.HEADERS) + " |"]
        lines.append("|---" + "|---:" * (len(self.HEADERS) - 1) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.cells()]
        lines += [""] + [f"- {line}" for line in self.notes()] + [""]
        if self.chart:
            lines += [f"![reopen and memory at every size]({os.path.basename(self.chart)})", ""]
        return lines


def _megabytes(values: Sequence[int] | None) -> str:
    if values is None:
        return "n/a"
    return ", ".join(f"{v / _MB:,.1f}" for v in values) + " MB"


def _warm(path: str) -> None:
    """Read the file once, so every trial finds it in the page cache."""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def _growth(pairs: list[tuple[Any, Any]]) -> tuple[list[int], list[int]] | None:
    """Each worker's private growth (anonymous memory) and the pages of the cache
    file it maps, from its ``(before, after)`` :func:`resident` pairs."""
    if any(before is None or after is None for before, after in pairs):
        return None
    private = [max(0, a["Anonymous"] - b["Anonymous"]) for b, a in pairs]
    return private, [a["Mapped"] for _, a in pairs]


def _workers(server: Server, m: Measure, path: str, workers: int) -> None:
    m.passes, memory = server.ask("workers", m.approach, path, workers)
    growth = _growth(memory)
    if growth is not None:
        m.private, m.shared = growth


def measure(
    folder: str,
    sizes: Sequence[int],
    *,
    trials: int = 3,
    workers: int = 2,
    out: Callable[[str], None] = print,
) -> Scaling:
    """Write, reopen and read the two caches at each size in ``folder`` (files
    removed as each size is done); return the measures.

    Raises ``RuntimeError`` when a child process fails.
    """
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive sample counts, got {list(sizes)}")
    if trials < 1 or workers < 1:
        raise ValueError(f"trials and workers must be at least 1, got {trials}, {workers}")
    os.makedirs(folder, exist_ok=True)
    result = Scaling(sorted(set(sizes)), workers, trials)
    server = Server()
    try:
        for n in result.sizes:
            result.measures += _one_size(server, folder, n, trials, workers, out)
    finally:
        server.close()
    return result


def _one_size(
    server: Server, folder: str, n: int, trials: int, workers: int, out: Callable[[str], None]
) -> list[Measure]:
    """Write both caches of ``n`` samples, reopen each ``trials`` times, run the
    workers on each; the two files are removed at the end."""
    out(f"at every size: {n:,} samples (write once, reopen {trials}x, {workers} workers)")
    data = samples(n)
    pkl, pck = os.path.join(folder, f"{n}.pkl"), os.path.join(folder, f"{n}.pack")
    t0 = time.perf_counter()
    with open(pkl, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    took = time.perf_counter() - t0
    p = Measure(PICKLE, n, os.path.getsize(pkl), took)
    t0 = time.perf_counter()
    pack(_Columns(data), pck, progress=True)
    m = Measure(PACK, n, os.path.getsize(pck), time.perf_counter() - t0)
    del data
    gc.collect()
    try:
        for path in (pkl, pck):
            _warm(path)
        for _ in range(trials):  # side by side, trial by trial
            p.reopen.append(server.ask("reopen", PICKLE, pkl))
            m.reopen.append(server.ask("reopen", PACK, pck))
        _workers(server, p, pkl, workers)
        _workers(server, m, pck, workers)
    finally:
        for path in (pkl, pck):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return [p, m]


def chart(result: Scaling, path: str, out: Callable[[str], None]) -> str | None:
    """Two panels, log axes: reopen time against size, per-worker memory against
    size, for the pickled list and for mlcache (median as the line, min to max
    as the band)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        out("matplotlib is not installed (pip install 'mlcache[cli]'): no scaling chart")
        return None
    colors = {PICKLE: COLORS[PICKLED], PACK: COLORS[MLCACHE]}  # as in every chart of the demo
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    n = result.sizes
    for approach in (PICKLE, PACK):
        ms = [result.at(approach, k) for k in n]
        label = "pickled list: pickle.load" if approach == PICKLE else "mlcache: open a pack"
        left.plot(n, [m.median for m in ms], "o-", color=colors[approach], label=label)
        left.fill_between(
            n, [m.best for m in ms], [max(m.reopen) for m in ms], color=colors[approach], alpha=0.2
        )
        if all(m.private is not None for m in ms):
            # at least 10 kB: a log axis has no place for a worker that grew by nothing
            private = [max(10_000, *(m.private or [0])) / _MB for m in ms]
            right.plot(n, private, "o-", color=colors[approach], label=f"{approach}: private")
    if all(result.at(PACK, k).shared is not None for k in n):
        shared = [max(10_000, *(result.at(PACK, k).shared or [0])) / _MB for k in n]
        label = "mlcache: pack pages mapped (shared: one copy for all)"
        right.plot(n, shared, "s--", color=colors[PACK], label=label)
    left.set_title("reopen in a fresh process: the file alone, one sample", loc="left", fontsize=10)
    left.set_ylabel("seconds (log scale)", fontsize=8)
    right.set_title(
        f"memory growth per worker ({result.workers} workers, every sample read)",
        loc="left",
        fontsize=10,
    )
    right.set_ylabel("MB (log scale)", fontsize=8)
    if not right.lines:
        right.text(0.5, 0.5, "not measured here (no /proc/self/smaps_rollup)", ha="center")
    for ax in (left, right):
        ax.set_xscale("log")
        if ax.lines:
            ax.set_yscale("log")
            ax.legend(fontsize=8)
        ax.set_xlabel("samples (log scale)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle("where each approach wins, at every size", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
