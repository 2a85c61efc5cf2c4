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
