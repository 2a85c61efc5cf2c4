"""Scripts in a temporary folder, run in fresh interpreters sharing one cache:
how the compatibility cases run what a user runs (two scripts, two runs with an
edit between them, a script without a main guard)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: a run that takes longer than this has hung
TIMEOUT = int(os.environ.get("MLCACHE_TEST_TIMEOUT", "180"))


class ScriptFolder:
    """A folder of scripts; each run gets ``CACHE`` (the shared cache) and ``LOG``
    (a file the scripts append what they computed to) in its environment, and
    the folder on its ``PYTHONPATH`` (before the caller's)."""

    def __init__(self, root: Path, log: str = "computed.log") -> None:
        self.root = root
        self.cache = root / "cache"
        self.log = root / log

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new))

    def execute(
        self, rel: str, *args: str, env: dict[str, str] | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """One run of the script ``rel`` (the log emptied first); a failed run
        raises ``AssertionError`` with its output unless ``ok`` is false."""
        self.log.unlink(missing_ok=True)
        full = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "CACHE": str(self.cache),
            "LOG": str(self.log),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.root), os.environ.get("PYTHONPATH")])
            ),
            **(env or {}),
        }
        full.pop("PYTHONWARNINGS", None)
        res = subprocess.run(
            [sys.executable, str(self.root / rel), *args],
            env=full,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if ok and res.returncode != 0:
            raise AssertionError(f"{rel} failed:\n{res.stdout}\n{res.stderr}")
        return res

    def logged(self) -> list[str]:
        """What the last run appended to the log, a word each."""
        return self.log.read_text().split() if self.log.exists() else []


# -- a package edited between fresh interpreter runs (code versions) ----------

HELPERS = '''
"""Helpers of the pipeline."""
import numpy as np

SCALE = 2


def normalize(x):
    """Divide by ten (docstring v1)."""
    # comment v1
    return x / 10


def scaled(x):
    return x * SCALE


def unrelated(x):
    return x - 1


class Shifter:
    offset = 1

    def apply(self, x):
        return x + self.offset


square = lambda x: x * x  # noqa: E731


def make_adder(k):
    def add(x):
        return x + k

    return add


add_three = make_adder(3)


def is_even(n):
    return n == 0 or is_odd(n - 1)


def is_odd(n):
    return n != 0 and is_even(n - 1)


def mean(x):
    return float(np.mean(x))
'''

PIPELINE = """
import logging
import os

from mlcache import Memory

from tpkg import helpers
from tpkg.helpers import Shifter, add_three, is_even, scaled, square

if os.environ.get("TPKG_VERBOSE"):
    logging.basicConfig(level=logging.INFO, format="%(message)s")
mem = Memory(
    os.environ["TPKG_CACHE"],
    verbose=int(os.environ.get("TPKG_VERBOSE", "0")),
    code=os.environ.get("TPKG_CODE", "transitive"),
)
LOG = os.environ["TPKG_LOG"]


def _log(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")


@mem.cache
def f_normalize(x):
    _log("f_normalize")
    return helpers.normalize(x)


@mem.cache
def f_scaled(x):
    _log("f_scaled")
    return scaled(x)


@mem.cache
def f_shift(x):
    _log("f_shift")
    return Shifter().apply(x)


@mem.cache
def f_square(x):
    _log("f_square")
    return square(x)


@mem.cache
def f_add(x):
    _log("f_add")
    return add_three(x)


@mem.cache
def f_even(n):
    _log("f_even")
    return is_even(n)


@mem.cache
def f_local_import(x):
    from .helpers import normalize as norm

    _log("f_local_import")
    return norm(x) + 1


@mem.cache
def f_mean(x):
    _log("f_mean")
    return helpers.mean(x)


def run_all():
    return [f(4) for f in (f_normalize, f_scaled, f_shift, f_square, f_add, f_even,
                           f_local_import, f_mean)]
"""

ALL = {
    "f_normalize",
    "f_scaled",
    "f_shift",
    "f_square",
    "f_add",
    "f_even",
    "f_local_import",
    "f_mean",
}


class Project:
    """A package ``tpkg`` in a temporary folder, run in fresh interpreters."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root = root
        pkg = root / "tpkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "helpers.py").write_text(HELPERS)
        (pkg / "pipeline.py").write_text(PIPELINE)
        self.log = root / "computed.log"
        self.env = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "TPKG_CACHE": str(root / "cache"),
            "TPKG_LOG": str(self.log),
            **env,
        }

    def edit(self, module: str, old: str, new: str) -> None:
        path = self.root / "tpkg" / f"{module}.py"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new))

    def run(self, **env: str) -> set[str]:
        """Which functions computed in one run of the whole pipeline."""
        self.log.unlink(missing_ok=True)
        code = f"import sys; sys.path.insert(0, {str(self.root)!r}); "
        code += "from tpkg.pipeline import run_all; run_all()"
        res = subprocess.run(
            [sys.executable, "-c", code],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        self.stderr = res.stderr
        return set(self.log.read_text().split()) if self.log.exists() else set()
