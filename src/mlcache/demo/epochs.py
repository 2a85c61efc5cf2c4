"""The demo's first-epoch story: the time of each of the first epochs of one
training run, reading the files, with the hand-written pickled list, and with
``mlcache.data.CachedDataset``.

One run of ``epochs`` (3) epochs per approach over the demo's patient files,
each epoch ``ds[i]`` of every sample once in a shuffled order (the same orders
for every approach), the pass itself trivial:

- **reading the files**: every epoch parses every file again;
- **pickled list**: epoch 1 parses every file, dumps the list into one file with
  ``pickle`` (the cache a later run loads) and makes the pass; later epochs pass
  over the list in memory;
- **mlcache**: epoch 1 constructs the dataset on an empty cache (the README's
  dataset, with ``load_item``: the open lists the files, the epoch loads each
  as it reads it and fills the pack) and makes the pass; later epochs read the
  pack. The time to the first sample and
  the number of ``load_item`` calls of each epoch (counted in a file, so a load in
  any process counts) are printed beside it, and a few samples are compared with
  a fresh parse of their files after the last epoch.

Prints one line per epoch, writes a chart of per-epoch time (``chart``) and a
section of the Markdown report (:meth:`Epochs.markdown`).
"""

from __future__ import annotations

import os
import pickle
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .report import BASELINE, COLORS, seconds

__all__ = [
    "APPROACHES",
    "FILES",
    "MLCACHE",
    "PICKLED",
    "Epochs",
    "chart",
    "count",
    "counted",
    "measure",
]

FILES = "reading the files"
PICKLED = "pickled list"
MLCACHE = "mlcache"
APPROACHES = (FILES, PICKLED, MLCACHE)


def count(counter: str | None) -> None:
    """Append one byte to the file ``counter`` (a ``load_item`` call, in whichever
    process made it); nothing when ``counter`` is None."""
    if counter is None:
        return
    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)


def counted(counter: str) -> int:
    """How many calls :func:`count` recorded in ``counter``."""
    try:
        return os.path.getsize(counter)
    except FileNotFoundError:
        return 0


@dataclass
class Epochs:
    """The seconds of each epoch per approach, mlcache's time to its first sample,
    its ``load_item`` calls per epoch and the indices of any wrong sample found."""

    samples: int
    times: dict[str, list[float]] = field(default_factory=dict)
    first_sample: float = 0.0
    loads: list[int] = field(default_factory=list)
    wrong: list[int] = field(default_factory=list)
    chart: str | None = None

    @property
    def title(self) -> str:
        return (
            f"the first {len(self.loads)} epochs of one training run, {self.samples:,} patient "
            "files (every sample once an epoch, shuffled; one run, each epoch timed once)"
        )

    def lines(self) -> list[str]:
        """One line per epoch, then what they say."""
        out = []
        for e in range(len(self.loads)):
            files, listed, ours = (self.times[a][e] for a in APPROACHES)
            what = "read + dump + pass" if e == 0 else "in memory"
            first = f"first sample after {seconds(self.first_sample)}; " if e == 0 else ""
            out.append(
                f"epoch {e + 1}: {FILES} {seconds(files)}, {PICKLED} {seconds(listed)} "
                f"({what}), {MLCACHE} {seconds(ours)} ({first}{self.loads[e]:,} files "
                f"parsed): {_versus(files, ours)} than the files"
            )
        if self.wrong:
            out.append(f"WRONG SAMPLES from mlcache at indices {self.wrong}")
        else:
            out.append("the samples checked after the last epoch equal a new parse of their files")
        return out

    def show(self, out: Callable[[str], None]) -> None:
        out("")
        out(f"## {self.title}")
        for line in self.lines():
            out(f"  {line}")

    def markdown(self) -> list[str]:
        """The section of the Markdown report: a table, the lines, the chart."""
        lines = [f"## {self.title}", "", "| epoch | " + " | ".join(APPROACHES) + " |"]
        lines.append("|---" + "|---:" * len(APPROACHES) + "|")
        for e in range(len(self.loads)):
            cells = [seconds(self.times[a][e]) for a in APPROACHES]
            lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
        lines += [""] + [f"- {line}" for line in self.lines()] + [""]
        if self.chart:
            lines += [f"![per-epoch time]({os.path.basename(self.chart)})", ""]
        return lines


def _versus(base: float, s: float) -> str:
    up = base / s if s > 0 else float("inf")
    return f"{up:,.1f}x faster" if up >= 1 else f"{1 / up:,.1f}x slower"


def _same(a: Any, b: Any) -> bool:
    """Equal samples: the same fields, arrays equal in dtype, shape and values."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping) or set(a) != set(b):
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _pass(dataset: Any, order: Sequence[int]) -> tuple[float, int]:
    """Read ``dataset[i]`` in ``order``: seconds to the first sample, and the
    trivial work's result (a count of fields)."""
    t0 = time.perf_counter()
    touched = len(dataset[order[0]])
    first = time.perf_counter() - t0
    for i in order[1:]:
        touched += len(dataset[i])
    return first, touched


class _Files:
    """The files as a dataset: parse the file at each read."""

    def __init__(self, paths: Sequence[str], load: Callable[[str], Any]) -> None:
        self.paths, self.load = paths, load

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        return self.load(self.paths[i])


def measure(
    paths: Sequence[str],
    load: Callable[[str], Mapping[str, Any]],
    open_dataset: Callable[[str], Sequence[Any]],
    folder: str,
    *,
    epochs: int = 3,
    out: Callable[[str], None] = print,
) -> Epochs:
    """Time ``epochs`` epochs of each approach over ``paths``.

    ``load`` parses one file; ``open_dataset(counter)`` constructs the mlcache
    dataset over the same files on an empty cache, its ``load_item`` calling
    :func:`count` ``(counter)``; ``folder`` holds the pickle and the counter
    (removed at the end).
    """
    if epochs < 1 or not paths:
        raise ValueError(f"need at least 1 epoch and 1 path, got {epochs}, {len(paths)}")
    os.makedirs(folder, exist_ok=True)
    result = Epochs(len(paths), {a: [] for a in APPROACHES})
    rng = np.random.default_rng(0)
    orders = [rng.permutation(len(paths)).tolist() for _ in range(epochs)]
    out(f"first epochs: {epochs} epochs of each approach over {len(paths):,} files")
    files = _Files(paths, load)
    for order in orders:
        t0 = time.perf_counter()
        _pass(files, order)
        result.times[FILES].append(time.perf_counter() - t0)
    pkl, counter = os.path.join(folder, "epochs.pkl"), os.path.join(folder, "loads")
    try:
        for e, order in enumerate(orders):
            t0 = time.perf_counter()
            if e == 0:
                listed = [load(p) for p in paths]
                with open(pkl, "wb") as f:
                    pickle.dump(listed, f, protocol=pickle.HIGHEST_PROTOCOL)
            _pass(listed, order)
            result.times[PICKLED].append(time.perf_counter() - t0)
        del listed
        done = 0
        for e, order in enumerate(orders):
            t0 = time.perf_counter()
            if e == 0:
                ds = open_dataset(counter)
                opened = time.perf_counter() - t0
            first, _ = _pass(ds, order)
            result.times[MLCACHE].append(time.perf_counter() - t0)
            if e == 0:  # construction included: what a training loop waits for
                result.first_sample = opened + first
            now = counted(counter)
            result.loads.append(now - done)
            done = now
        checked = sorted({0, len(paths) // 2, len(paths) - 1})
        result.wrong = [k for k in checked if not _same(ds[k], load(paths[k]))]
    finally:
        for path in (pkl, counter):
            if os.path.exists(path):
                os.unlink(path)
    return result


def chart(result: Epochs, path: str, out: Callable[[str], None]) -> str | None:
    """Grouped bars, one group an epoch, one bar an approach (a linear axis, a
    label with the value on each bar, the demo's colours)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        out("matplotlib is not installed (pip install 'mlcache[cli]'): no chart of the epochs")
        return None
    colors = {FILES: COLORS[BASELINE], PICKLED: COLORS[PICKLED], MLCACHE: COLORS[MLCACHE]}
    n = len(result.loads)
    fig, ax = plt.subplots(figsize=(9, 4.6))
    width = 0.8 / len(APPROACHES)
    x = np.arange(n)
    longest = max(max(t) for t in result.times.values())
    scale, unit = (1.0, "seconds") if longest >= 1 else (1e3, "ms")
    for k, approach in enumerate(APPROACHES):
        secs = result.times[approach]
        heights = [s * scale for s in secs]
        bars = ax.bar(x + (k - 1) * width, heights, width, color=colors[approach], label=approach)
        for bar, s in zip(bars, secs):
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height(),
                seconds(s),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_ylim(0, longest * scale * 1.12)  # room for the labels, no more
    ax.set_xticks(x, [f"epoch {e + 1}" for e in range(n)])
    ax.set_ylabel(unit, fontsize=8)
    ax.set_title(
        "epoch 1 builds each cache (pickled list: read + dump; mlcache: an empty cache); "
        f"mlcache's first sample after {seconds(result.first_sample)}",
        loc="left",
        fontsize=9,
    )
    ax.tick_params(labelsize=8)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=8)
    # wrapped: the title says what was timed, and a cut title says less
    fig.suptitle("\n".join(textwrap.wrap(f"per-epoch time: {result.title}", 105)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
