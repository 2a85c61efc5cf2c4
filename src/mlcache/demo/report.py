"""The demo's output: a table on the terminal, a bar chart, a Markdown report.

Every step is timed a few times (:class:`Row`: its times, min and median) and
says what its time measures: in this process or in a fresh one, to which
sample, with the source checked or not; so two figures that measure different
things never read as one contradicting the other. The table uses rich when it
is installed and plain text otherwise; the chart needs matplotlib (the ``cli``
extra) and is skipped, with a message, without it. The same formatted cells go
to the terminal and to the report, so what a user reads in one is what they find
in the other. Each contender has one colour in every chart of the demo
(:data:`COLORS`).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._tables import print_table

__all__ = [
    "BASELINE",
    "COLORS",
    "HEADERS",
    "JOBLIB",
    "MLCACHE",
    "PICKLED",
    "Row",
    "cells",
    "chart",
    "headers",
    "markdown",
    "seconds",
    "show",
]

#: the contenders, each with one colour in every chart of the demo
BASELINE, PICKLED, MLCACHE, JOBLIB = "no cache", "pickled list", "mlcache", "joblib"
COLORS = {BASELINE: "#868e96", PICKLED: "#e8590c", MLCACHE: "#2b8a3e", JOBLIB: "#1971c2"}
_LEGEND = {BASELINE: "no cache (the baseline)", JOBLIB: "joblib.Memory"}

HEADERS = ["step", "what is timed", "min", "median", "vs the baseline (min)"]

#: what the tables' words mean, said above them on the terminal and in the report
READING = (
    "Each step is timed {n} times: min (the least disturbed by other work on the machine) "
    "and median; the speed-ups compare the mins. 'this process': timed where the demo runs, "
    "its imports and the files' pages already there; 'a fresh process': a new run of a "
    "training script, a process started for each trial and timed after its imports, up to "
    "its first sample."
)


def seconds(s: float) -> str:
    """A duration as the demo prints it: ``1.23 s``, ``4.5 ms``, ``67 µs``."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


@dataclass
class Row:
    """One timed step: its ``group`` (a table, a panel of the chart), ``name``,
    ``what`` its time measures, ``who`` (one of :data:`COLORS`), its ``times``
    (seconds, one a repeat) and the baseline (seconds) its speed-up is measured
    against (its own min when it is the baseline)."""

    group: str
    name: str
    what: str
    who: str
    times: list[float] = field(default_factory=list)
    baseline: float | None = None

    @property
    def seconds(self) -> float:
        """The fastest repeat: the least disturbed by a busy machine."""
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def speedup(self) -> float | None:
        return None if self.baseline is None or self.seconds <= 0 else self.baseline / self.seconds


def cells(row: Row) -> list[str]:
    """The formatted cells of one row: name, what, min, median, speed-up."""
    up = row.speedup
    if up is None:
        ratio = ""
    elif row.seconds == row.baseline:
        ratio = "baseline"
    elif up >= 1:
        ratio = f"{up:,.1f}x faster"
    else:
        ratio = f"{1 / up:,.1f}x slower"
    return [row.name, row.what, seconds(row.seconds), seconds(row.median), ratio]


def headers(members: Sequence[Row]) -> list[str]:
    """The table's headers: how many times its steps were timed, in the min and
    median columns."""
    counts = sorted({len(m.times) for m in members})
    n = "/".join(map(str, counts))
    return [HEADERS[0], HEADERS[1], f"min of {n}", f"median of {n}", HEADERS[4]]


def _reading(rows: Sequence[Row]) -> str:
    return READING.format(n="/".join(map(str, sorted({len(r.times) for r in rows}))))


def _groups(rows: Sequence[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return groups


def show(rows: Sequence[Row], changes: Sequence[str], out: Callable[[str], None]) -> None:
    """Print what the tables' words mean, one table per group, then the changes."""
    out("")
    out(_reading(rows))
    for group, members in _groups(rows).items():
        out("")
        print_table(group, headers(members), [cells(m) for m in members], out)
    out("")
    out("## what a change does")
    for line in changes:
        out(f"  {line}")


def chart(rows: Sequence[Row], path: str, out: Callable[[str], None]) -> str | None:
    """Horizontal bars of the fastest repeat, one panel per group, each on its own
    linear axis (seconds or milliseconds, fitted to its longest bar), a label
    with the value on each bar, one colour per contender and a legend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        out("matplotlib is not installed (pip install 'mlcache[cli]'): no chart")
        return None
    groups = _groups(rows)
    heights = [len(m) for m in groups.values()]
    fig, axes = plt.subplots(
        len(groups),
        1,
        figsize=(10, 1.4 + 0.42 * sum(heights) + 0.75 * len(groups)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, (group, members) in zip(axes[:, 0], groups.items()):
        longest = max(m.seconds for m in members)
        scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")
        names = [m.name for m in members][::-1]
        values = [m.seconds * scale for m in members][::-1]
        colors = [COLORS[m.who] for m in members][::-1]
        bars = ax.barh(names, values, color=colors)
        for bar, m in zip(bars, members[::-1]):
            ax.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                f" {seconds(m.seconds)}",
                va="center",
                fontsize=8,
            )
        ax.set_xlim(0, longest * scale * 1.15)  # room for the last label, no more
        ax.set_title(group, loc="left", fontsize=9)
        ax.set_xlabel(unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    present = [who for who in COLORS if any(r.who == who for r in rows)]
    fig.legend(
        handles=[Patch(color=COLORS[w], label=_LEGEND.get(w, w)) for w in present],
        loc="upper right",
        ncol=len(present),
        fontsize=8,
        frameon=False,
    )
    repeats = sorted({len(r.times) for r in rows})
    runs = "/".join(map(str, repeats))
    fig.suptitle(
        f"mlcache demo: the fastest of {runs} runs of each step "
        f"({os.cpu_count()} CPUs, Python {platform.python_version()})",
        fontsize=10,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(
    rows: Sequence[Row],
    changes: Sequence[str],
    chart_path: str | None,
    path: str,
    sections: Sequence[str] = (),
    conditions: str = "",
) -> str:
    """Write the report: the conditions, the tables, the changes, the chart, then
    ``sections`` (Markdown lines of further parts, as they come)."""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# mlcache demo",
        "",
        f"{when}; {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}.{' ' + conditions if conditions else ''}",
        "",
        _reading(rows),
        "",
    ]
    for group, members in _groups(rows).items():
        lines += [f"## {group}", "", "| " + " | ".join(headers(members)) + " |"]
        lines.append("|---|---|---:|---:|---:|")
        lines += ["| " + " | ".join(cells(m)) + " |" for m in members]
        lines.append("")
    lines += ["## What a change does", ""] + [f"- {c}" for c in changes] + [""]
    if chart_path:
        lines += [f"![timings]({os.path.basename(chart_path)})", ""]
    lines += list(sections)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path
