"""One way to print a table: rich when it is installed and the text goes to the
terminal's stdout, aligned plain columns otherwise (a pipe, a file, a caller's
own output function, or no rich), which never wrap nor cut a cell. Used by the
``mlcache`` command and the demo."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence

__all__ = ["print_table"]


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
