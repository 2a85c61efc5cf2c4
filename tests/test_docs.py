"""Every example in README.md and the guide (docs/**/*.md) runs, as a reader would run it.

Each page's ``python`` blocks run in order in one fresh interpreter (``-W error``),
in a temporary folder, each block in a namespace of its own: a block runs as
written, with its own imports and names, and may use the files an earlier block
of its page wrote. A block after an ``<!-- docs-test: s3 -->`` comment needs a
shared cache: the page then runs with a real S3 server (SeaweedFS on 127.0.0.1,
as in tests/store/test_fsspec.py) reached through the standard ``AWS_*``
variables, the bucket ``team-bucket`` made and a team secret in
``MLCACHE_SECRET``. ``<!-- docs-test: skip -->`` leaves a block out. Every block
names its language: ``bash`` for commands, ``text`` for output and drawings,
which are not run. The ``mlcache`` commands shown in ``bash`` blocks must exist,
with the options shown. The guide's pages are all in mkdocs.yml's nav, and the
home page's quick start is the README's, word for word.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [ROOT / "README.md", *GUIDE]
#: the languages a block may name; only python is run
LANGUAGES = {"python", "bash", "text", "json"}

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*([\w-]+)\s*-->\s*$")


def blocks(path: Path) -> list[tuple[str, int, str, str | None]]:
    """(language, first line, code, marker) of each fenced block of ``path``
    (language ``""`` for a fence that names none)."""
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
        elif fence:
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


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# what the fresh interpreter runs: each block in a namespace of its own, in order
_RUN = """
import json, sys, traceback
for where, code in json.load(sys.stdin):
    try:
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(where + " fails (the traceback is above)")
"""


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


@pytest.mark.parametrize("page", [p for p in PAGES if _python(p)], ids=_name)
def test_the_examples_run(page, tmp_path, monkeypatch, request):
    examples = [
        (f"{_name(page)}, the block at line {n}", code)
        for n, code, m in _python(page)
        if m != "skip"
    ]
    assert examples
    if any(m == "s3" for _, _, m in _python(page)):
        request.getfixturevalue("team_bucket")  # sets the AWS_* variables the blocks read
    env = {
        **os.environ,
        "MLCACHE_DIR": str(tmp_path / "default-cache"),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    env.pop("PYTHONWARNINGS", None)
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", _RUN],
        input=json.dumps(examples),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n{run.stdout[-2000:]}"


def test_every_block_names_its_language():
    """A command or an output fenced without a language would look like code to
    run; a block fenced as py or pycon would escape the examples test."""
    odd = [
        f"{_name(page)}:{line} ```{lang}"
        for page in PAGES
        for lang, line, _, _ in blocks(page)
        if lang not in LANGUAGES
    ]
    assert not odd, f"name the block's language ({sorted(LANGUAGES)}): {odd}"


def test_the_home_page_quick_start_is_the_readme_s():
    """The site's quick start is the README's two 30-second examples, word for
    word (text and code), so that the two never drift."""

    def section(path: Path, title: str) -> str:
        text = path.read_text(encoding="utf-8")
        found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        assert found, f"{path.name} has no section '## {title}'"
        # the README links into docs/, the guide's pages link to each other
        return re.sub(r"\]\(docs/", "](", found.group(1)).strip()

    for title in ("30 seconds: functions", "30 seconds: a dataset over your own files"):
        assert section(ROOT / "docs" / "index.md", title) == section(ROOT / "README.md", title)


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


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [str(p.relative_to(ROOT / "docs")) for p in GUIDE]
    listed = set(re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)\s*$", nav, re.M))
    assert pages and not [p for p in pages if p not in listed]


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
