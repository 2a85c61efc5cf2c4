"""Every example in README.md and docs/*.md runs, as a reader would run it.

Each file's ``python`` blocks run in order in one namespace, in a temporary
folder (a reader pastes them one after the other). A block after an
``<!-- docs-test: s3 -->`` comment needs a shared cache: the file then runs with a
real S3 server (SeaweedFS on 127.0.0.1, as in tests/store/test_fsspec.py) reached
through the standard ``AWS_*`` variables, the bucket ``team-bucket`` made and a
team secret in ``MLCACHE_SECRET``. ``<!-- docs-test: skip -->`` leaves a block
out. The ``mlcache`` commands shown in ``bash`` blocks must exist, with the
options shown. The guide's pages are all in mkdocs.yml's nav.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*([\w-]+)\s*-->\s*$")


def blocks(path: Path) -> list[tuple[str, int, str, str | None]]:
    """(language, first line, code, marker) of each fenced block of ``path``."""
    out: list[tuple[str, int, str, str | None]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARK.match(line)
        fence = _FENCE.match(line)
        if found:
            marker = found.group(1)
        elif fence and fence.group(1):
            lang, start, body = fence.group(1), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise AssertionError(f"{path.name}:{start}: a code block is never closed")
            out.append((lang, start + 1, "\n".join(body) + "\n", marker))
            marker = None
        elif line.strip():
            marker = None
        i += 1
    return out


def _python(path: Path) -> list[tuple[int, str, str | None]]:
    return [(n, code, m) for lang, n, code, m in blocks(path) if lang == "python"]


@pytest.fixture
def team_bucket(request, monkeypatch):
    """The S3 environment a reader of the sharing page has: AWS_* variables, a
    bucket, a team secret."""
    import s3fs

    url = request.getfixturevalue("s3_endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "mlcache")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "mlcache")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("MLCACHE_SECRET", "the team's secret, for the docs test")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if fs.exists("team-bucket"):
        fs.rm("team-bucket", recursive=True)
    fs.mkdir("team-bucket")
    s3fs.S3FileSystem.clear_instance_cache()
    return url


@pytest.mark.parametrize("page", [p for p in PAGES if _python(p)], ids=lambda p: p.name)
def test_the_examples_run(page, tmp_path, monkeypatch, request):
    examples = [(n, code) for n, code, m in _python(page) if m != "skip"]
    assert examples
    if any(m == "s3" for _, _, m in _python(page)):
        request.getfixturevalue("team_bucket")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLCACHE_DIR", str(tmp_path / "default-cache"))
    namespace: dict[str, object] = {"__name__": "__main__"}
    for line, code in examples:
        where = f"{page.relative_to(ROOT)}, the block at line {line}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{where} fails: {exc!r}") from exc


def _commands() -> dict[str, set[str]]:
    """The ``mlcache`` commands shown in bash blocks, with the options shown."""
    shown: dict[str, set[str]] = {}
    for page in PAGES:
        for lang, _, code, _ in blocks(page):
            if lang != "bash":
                continue
            for line in code.splitlines():
                words = line.split("#")[0].split()
                while len(words) >= 3 and words[1] in ("--location", "--json"):
                    del words[1 : 3 if words[1] == "--location" else 2]  # global options
                if len(words) >= 2 and words[0] == "mlcache":
                    opts = {w.strip("[]").split("=")[0] for w in words[2:]}
                    shown.setdefault(words[1], set()).update(o for o in opts if o[:2] == "--")
    return shown


@pytest.mark.parametrize("command", sorted(_commands()))
def test_the_commands_shown_exist(command):
    run = subprocess.run(
        [sys.executable, "-m", "mlcache", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, f"mlcache {command}: {run.stderr}"
    missing = {o for o in _commands()[command] if o not in run.stdout}
    assert not missing, f"mlcache {command} has no {sorted(missing)}"


def test_the_make_targets_shown_exist():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    shown = {
        line.split()[1]
        for page in PAGES
        for lang, _, code, _ in blocks(page)
        if lang == "bash"
        for line in code.splitlines()
        if line.startswith("make ") and len(line.split()) > 1
    }
    assert shown and not shown - targets, f"no such make target: {sorted(shown - targets)}"


def test_only_python_blocks_hold_python():
    """A block fenced as py or pycon would escape the examples test."""
    odd = [
        f"{page.name}:{line}"
        for page in PAGES
        for lang, line, _, _ in blocks(page)
        if lang in {"py", "pycon", "python3", "ipython"}
    ]
    assert not odd


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.name for p in PAGES[1:]]
    assert pages and not [p for p in pages if f": {p}" not in nav]


def test_the_readme_is_short_and_links_to_pages_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(((?:docs/|benchmarks/|CHANGELOG)[^)#]*)", text)
    assert links and not [link for link in links if not (ROOT / link).exists()]


def test_the_changelog_names_the_version():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)  # type: ignore[union-attr]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"^## \[([^\]]+)\]", changelog, re.M)
    assert first and first.group(1) == version
    import mlcache  # what `mlcache --version` prints is the package's version too

    assert mlcache.__version__ == version
