"""The package's shape, as DESIGN.md draws it, checked on the source.

Imports point down the layers (base -> store -> codecs -> entry -> keys ->
memo, data -> torch, admin, testing -> demo -> cli -> the package's face), no two
modules import each other at import time, no module is over 600 lines, the top
level holds at most 15 modules, and no module reads another class's private
attributes. Each rule reads the code as text (``ast``), so a broken rule fails
here with the file and line to look at.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "mlcache"

#: the layer of each room of the package; an import may only point to a lower or
#: equal layer, and within a layer only inside its own room (memo and data are
#: both the API layer and independent of each other)
LAYERS = {
    "errors": 0,
    "_registry": 0,
    "_atomic": 0,
    "_util": 0,
    "_log": 0,
    "_tables": 0,
    "_audit": 0,
    "store": 1,
    "codecs": 2,
    "entry": 3,
    "keys": 4,
    "memo": 5,
    "data": 5,
    "torch": 6,
    "admin": 6,
    "testing": 6,
    "demo": 7,
    "cli": 8,
    "__init__": 9,
    "__main__": 9,
}
BASE = {name for name, layer in LAYERS.items() if layer == 0}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported mlcache module, line, at import time?) for every import of
    ``module`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            inner = top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:  # a submodule imported by name counts as itself
                    sub = f"{target}.{alias.name}"
                    name = sub if sub in MODULES else target
                    if name in MODULES:
                        found.append((name, child.lineno, inner))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in MODULES:
                        found.append((alias.name, child.lineno, inner))
            visit(child, inner)

    visit(tree, True)
    return found


def test_every_import_points_down_the_layers():
    wrong = []
    for module, path in MODULES.items():
        room = _room(module)
        for target, line, _ in _imports(module, path):
            there = _room(target)
            if there == room or (
                target == "mlcache" and LAYERS[room] >= 7
            ):  # the face uses the API
                continue
            up = LAYERS[there] > LAYERS[room]
            sideways = LAYERS[there] == LAYERS[room] and there not in BASE
            if up or sideways:
                wrong.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for target, _, _ in _imports(module, path):
            # a package importing its own submodules to re-export them is its
            # own registration, not a cycle; nor is a submodule importing them
            # from its package
            if target == module or target.startswith(module + "."):
                continue
            if module.startswith(target + ".") and MODULES[target].name == "__init__.py":
                continue
            graph[module].add(target)
    cycles = []
    state: dict[str, int] = {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                walk(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(MODULES):
        if module not in state:
            walk(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_600_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 600, f"{module} has {lines} lines"


def test_the_top_level_holds_at_most_15_modules():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 15, top
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == {"keys", "codecs", "entry", "store", "memo", "data", "demo", "testing"}


#: private names of other libraries we rely on, each with the reason
FOREIGN_PRIVATES = {
    "_exit",  # os._exit in a forked child
    "_getframe",  # sys._getframe: the caller's frame for identity
    "_current_frames",
    "_parent",  # fsspec's AbstractFileSystem._parent: the parent of a path, no public twin
    "_strip_protocol",  # fsspec's documented classmethod for a URL's path
    # the abstract methods of joblib's StoreBackendBase, which every joblib store
    # backend implements (the adapter drives a user's backend through them)
    "_open_item",
    "_item_exists",
    "_move_item",
}


def _private_names(tree: ast.Module) -> set[str]:
    """Every ``_name`` a class of the module defines: methods, class attributes and
    ``self._name = ...`` assignments."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                for target in getattr(item, "targets", [getattr(item, "target", None)]):
                    if isinstance(target, ast.Name):
                        names.add(target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def test_no_module_reads_another_classs_private_attributes():
    wrong = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        own = _private_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in FOREIGN_PRIVATES:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if attr in own:
                continue
            wrong.append(f"{path.relative_to(SRC)}:{node.lineno} reads .{attr}")
    assert not wrong, "private attributes of other classes read:\n" + "\n".join(wrong)
