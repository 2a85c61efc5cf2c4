"""The demo's output: a table on the terminal, a bar chart, a Markdown report.

The table uses rich when it is installed and plain text otherwise; the chart
needs matplotlib (the ``cli`` extra) and is skipped, with a message, without
it. The same formatted cells go to the terminal and to the report, so what a
user reads in one is what they find in the other.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from .._tables import print_table

__all__ = ["cells", "chart", "markdown", "seconds", "show"]

HEADERS = ["step", "time", "vs the first row"]


def seconds(s: float) -> str:
    """A duration as the demo prints it: ``1.23 s``, ``4.5 ms``, ``67 µs``."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def cells(row: Any) -> list[str]:
    """The formatted cells of one row: name, time, speed-up."""
    up = row.speedup
    if up is None:
        ratio = ""
    elif row.seconds == row.baseline:
        ratio = "baseline"
    elif up >= 1:
        ratio = f"{up:,.1f}x faster"
    else:
        ratio = f"{1 / up:,.1f}x slower"
    return [row.name, seconds(row.seconds), ratio]


def _groups(rows: Sequence[Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return groups


def show(rows: Sequence[Any], changes: Sequence[str], out: Callable[[str], None]) -> None:
    """Print one table per group, then the changes."""
    for group, members in _groups(rows).items():
        out("")
        print_table(group, HEADERS, [cells(m) for m in members], out)
    out("")
    out("## what a change does")
    for line in changes:
        out(f"  {line}")


def chart(rows: Sequence[Any], path: str, out: Callable[[str], None]) -> str | None:
    """A horizontal bar chart of the times, one panel per group (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        out("matplotlib is not installed (pip install 'mlcache[cli]'): no chart")
        return None
    groups = _groups(rows)
    heights = [len(m) for m in groups.values()]
    fig, axes = plt.subplots(
        len(groups),
        1,
        figsize=(10, 1.2 + 0.45 * sum(heights) + 0.6 * len(groups)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, (group, members) in zip(axes[:, 0], groups.items()):
        names = [m.name for m in members][::-1]
        secs = [m.seconds for m in members][::-1]
        colors = [
            "#2b8a3e" if n.startswith("mlcache") else "#868e96" if "joblib" in n else "#c92a2a"
            for n in names
        ]
        bars = ax.barh(names, secs, color=colors)
        ax.set_xscale("log")
        ax.set_title(group, loc="left", fontsize=10)
        ax.set_xlabel("seconds (log scale)", fontsize=8)
        ax.tick_params(labelsize=8)
        for bar, s in zip(bars, secs):
            ax.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                " " + seconds(s),
                va="center",
                fontsize=7,
            )
        ax.set_xlim(min(secs) / 3, max(secs) * 8)
    fig.suptitle(
        f"mlcache demo: {os.cpu_count()} CPUs, Python {platform.python_version()}", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(
    rows: Sequence[Any],
    changes: Sequence[str],
    chart_path: str | None,
    path: str,
    sections: Sequence[str] = (),
) -> str:
    """Write the report: the tables, the changes, the chart, then ``sections``
    (Markdown lines of further parts, as they come)."""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# mlcache demo",
        "",
        f"{when}; {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}.",
        "",
    ]
    for group, members in _groups(rows).items():
        lines += [f"## {group}", "", "| " + " | ".join(HEADERS) + " |", "|---|---:|---:|"]
        lines += ["| " + " | ".join(cells(m)) + " |" for m in members]
        lines.append("")
    lines += ["## What a change does", ""] + [f"- {c}" for c in changes] + [""]
    if chart_path:
        lines += [f"![timings]({os.path.basename(chart_path)})", ""]
    lines += list(sections)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path
