"""A Griffe extension for the API reference: mlcache's docstrings are numpydoc with
Sphinx's reST habits, which Markdown would print literally or misread.

- ``:func:`pack```, ``:class:`~mlcache.data.PackedDataset``` and the other roles
  become code that links to the object where the reference documents it (an
  *optional* cross-reference: a private helper stays plain code, never a broken
  link that fails the strict build);
- a doctest (``>>>`` lines and their output) becomes a ``pycon`` code block, where
  Markdown would read each ``>`` as a quote;
- a paragraph ending in ``::`` (reST's literal block) ends in ``:``, its indented
  block being a Markdown code block already.

mkdocs.yml loads it (``extensions:`` of the python handler); nothing in the
package imports it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|exc|data|obj|const):`(~?)([^`<]+?)`")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _target(obj: griffe.Object, name: str) -> str | None:
    """The full path ``name`` means where ``obj`` is written, if Griffe knows it."""
    name = name.strip("~").rstrip("()")
    scope: Any = obj
    while scope is not None:
        try:
            return scope.resolve(name.split(".", 1)[0]) + (
                "." + name.split(".", 1)[1] if "." in name else ""
            )
        except (griffe.NameResolutionError, KeyError, AttributeError):
            scope = scope.parent
    return name if name.startswith("mlcache.") else None


def _roles(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        short, name = match.group(1), match.group(2).strip()
        shown = name.rsplit(".", 1)[-1] if short else name
        shown = shown.replace("<", "&lt;")
        target = _target(obj, name)
        if target is None:
            return f"<code>{shown}</code>"
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(link, text)


def _doctests(text: str) -> str:
    """Wrap each run of ``>>>`` lines (with their output) in a pycon fence."""
    out: list[str] = []
    lines = text.split("\n")
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    return re.sub(r"(\S)::\n\n", r"\1:\n\n", re.sub(r"^::\n\n", "", text, flags=re.M))


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded (names then resolve)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()

        def walk(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                text = _literal_blocks(_doctests(obj.docstring.value))
                obj.docstring.value = _roles(obj, text)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)  # type: ignore[arg-type]

        walk(pkg)
