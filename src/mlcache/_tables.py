"""One way to print a table: rich when it is installed and the text goes to the
terminal's stdout, aligned plain columns otherwise (a pipe, a file, a caller's
own output function, or no rich), which never wrap nor cut a cell. Used by the
``mlcache`` command and the demo; and the words of its cells (sizes, ages,
spans of time, counts)."""

from __future__ import annotations

import datetime as _dt
import shutil
import sys
import time
from collections.abc import Callable, Sequence

__all__ = [
    "age_text",
    "count_text",
    "duration_text",
    "print_table",
    "seconds_text",
    "size_text",
]


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    out: Callable[[str], None] = print,
) -> None:
    """First column left-aligned and never cut (names are typed back in), the
    others right-aligned."""
    if not rows:
        out(f"{title}: none")
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = Table = None  # type: ignore[assignment,misc]
    if Table is None or out is not print or not sys.stdout.isatty():
        # plain columns, as wide as their cells: a pipe or a file gets whole lines
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        out(title)
        out("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
        for r in rows:
            out("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return
    table = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        table.add_row(*r)
    Console(width=max(100, shutil.get_terminal_size().columns)).print(table)


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def age_text(t: float | None) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= span:
            return f"{s / span:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def seconds_text(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.3f} s" if s < 60 else str(_dt.timedelta(seconds=round(s)))


def duration_text(s: float) -> str:
    """A span of time as people say it: ``0.42 s``, ``12 s``, ``3 min 5 s``,
    ``3 h 12 min``, ``2 d 5 h`` (its two largest units)."""
    if s < 10:
        return f"{s:.2g} s" if s < 1 else f"{s:.1f} s"
    if s < 59.5:
        return f"{s:.0f} s"
    whole, parts = round(s), []
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if whole >= span:
            parts.append(f"{whole // span} {unit}")
            whole %= span
        elif parts:
            parts.append("")  # a unit skipped still counts as one of the two
    return " ".join(p for p in parts[:2] if p)


def count_text(count: int, what: str, plural: str | None = None) -> str:
    """``1 hit``, ``2 hits``, ``1 entry``, ``0 entries``."""
    if count == 1:
        return f"1 {what}"
    return f"{count:,} {plural or what + 's'}"
