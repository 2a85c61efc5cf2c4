"""The `mlcache` command behaves like the tools users know (pip cache, git, docker
system df): each test runs the command itself, as a script (no terminal, nothing on
stdin, CI=true) or on a terminal (a pty)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from mlcache import Memory, admin
from mlcache.data import CachedDataset, pack
from mlcache.memo.layout import is_entry


def env() -> dict[str, str]:
    """Now: the session's key file is set once the tests run."""
    return {**os.environ, "CI": "true"}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The command run from ``cwd`` (a user in their project folder), as a script."""
    return subprocess.run(
        [sys.executable, "-m", "mlcache", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env(),
        cwd=cwd,
    )


def on_terminal(*args: str, answer: bytes = b"") -> tuple[int, str]:
    """Run the command with stdin, stdout and stderr on a pty; type ``answer``."""
    master, slave = pty.openpty()
    # a terminal of 30 x 120 (a new pty is 0 x 0, where a progress bar has no room)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlcache", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env(), "COLUMNS": "120"},
    )
    os.close(slave)
    if answer:
        os.write(master, answer)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode(errors="replace")


class Patients(CachedDataset):
    def __init__(self, n: int, **kw):
        self.n = n
        super().__init__(**kw)

    def load_source(self):
        for i in range(self.n):
            yield {"x": np.arange(i + 1.0), "age": i}


def work(x, scale=2.0):
    return np.asarray(x) * scale


def populated(loc: Path) -> Memory:
    """Two functions (one with 1 hit and 1 miss), a pack made by pack(), and two
    packs a CachedDataset built."""
    mem = Memory(loc, verbose=0)
    f = mem.cache(work)
    f(np.arange(10.0))
    f(np.arange(10.0))
    mem.cache(np.cumsum)(np.arange(5))
    mem.stats()  # writes this process's counts
    pack(({"v": np.arange(i + 1.0)} for i in range(20)), loc / "mine" / "d.pack", progress=False)
    Patients(5, cache_dir=loc / "datasets", progress=False)
    Patients(7, cache_dir=loc / "datasets", progress=False)
    return mem


def listing(loc: Path) -> dict:
    res = run("--location", str(loc), "ls", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def state(loc: Path) -> tuple[int, list[str]]:
    """What the cache holds, looked at in this process: results, pack names."""
    results = sum(st.entries for st in admin.functions(Memory(loc, verbose=0)))
    return results, [p.name for p in admin.packs(str(loc), detail=False)]


def _assert_empty(res: subprocess.CompletedProcess[str], loc: Path, said: str) -> None:
    assert res.returncode == 0, res.stderr
    if res.stdout.startswith("{"):
        out = json.loads(res.stdout)
        assert out["location"] == str(loc)
        lists = [v for v in out.values() if isinstance(v, list)]
        assert lists and all(v == [] for v in lists)
    else:
        assert said in res.stdout and str(loc) in res.stdout


def test_a_missing_cache_is_an_empty_result_and_is_not_created(tmp_path):
    loc = tmp_path / "nope"
    for args in (["ls"], ["clear"], ["info", "work", "--json"]):
        _assert_empty(run("--location", str(loc), *args), loc, "no cache at")
    assert not loc.exists()  # a look creates nothing


def test_an_empty_cache_is_an_empty_result(tmp_path):
    loc = tmp_path / "empty"
    loc.mkdir()
    res = run("--location", str(loc), "ls", "--json")
    _assert_empty(res, loc, "")
    assert json.loads(res.stdout) == {"location": str(loc), "functions": [], "datasets": []}
    for args in (["info", "work"], ["clear", "--json"]):
        _assert_empty(run("--location", str(loc), *args), loc, "is empty")


@pytest.mark.slow
def test_every_command_on_a_missing_or_an_empty_cache(tmp_path):
    missing, empty = tmp_path / "nope", tmp_path / "empty"
    empty.mkdir()
    for loc, said in ((missing, "no cache at"), (empty, "is empty")):
        for args in (["ls"], ["info", "work"], ["clear"], ["clear", "work"]):
            for json_flag in ([], ["--json"]):
                _assert_empty(run("--location", str(loc), *args, *json_flag), loc, said)
        for args in (["verify", "--json"], ["prune", "--max-size", "0", "--json"]):
            _assert_empty(run("--location", str(loc), *args), loc, said)
    assert not missing.exists()


AGES = re.compile(r"\d+ (s|min|h|d) ago|\"last_used\": [\d.]+")


def _same(before: list[str], after: list[str]) -> None:
    one, two = run(*before), run(*after)
    assert one.returncode == two.returncode == 0, (before, one.stderr, two.stderr)
    assert one.stdout and AGES.sub("", one.stdout) == AGES.sub("", two.stdout)  # times move on


def test_global_options_before_or_after_the_command(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    _same(["--json", "--location", loc, "ls"], ["ls", "--json", "--location", loc])
    _same(
        ["--json", "info", "work", "--location", loc], ["--location", loc, "info", "work", "--json"]
    )


@pytest.mark.slow
def test_global_options_anywhere_for_every_command(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    _same(["--location", loc, "--json", "ls"], ["ls", "--location", loc, "--json"])
    _same(["--location", loc, "ls"], ["ls", "--location", loc])
    _same(["--json", "--location", loc, "verify"], ["verify", "--location", loc, "--json"])
    _same(
        ["--json", "--location", loc, "clear", "--dry-run"],
        ["clear", "--dry-run", "--json", "--location", loc],
    )
    _same(
        ["--json", "--location", loc, "prune", "--max-size", "0", "--dry-run"],
        ["prune", "--max-size", "0", "--dry-run", "--json", "--location", loc],
    )


def test_piped_into_head_ends_quietly(tmp_path):
    populated(tmp_path)
    src = tmp_path / "mine" / "d.pack"
    many = tmp_path / "many"
    many.mkdir()
    for i in range(1000):  # a listing (~170 KB) far beyond a pipe's buffer (64 KiB)
        shutil.copyfile(src, many / f"{i:05d}-{'a-pack-with-a-rather-long-name' * 3}.pack")
    script = f'"{sys.executable}" -m mlcache --location "{tmp_path}" ls | head -1; '
    script += 'echo "exit=${PIPESTATUS[0]}"'
    res = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env(), timeout=120
    )
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Functions in") and lines[-1] == "exit=0"
    assert res.stderr == ""  # no "[Errno 32] Broken pipe", no traceback


def test_clear_everything_refuses_without_a_terminal_and_dry_run_lists(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    before = state(tmp_path)
    res = run("--location", loc, "clear")
    assert res.returncode == 2 and "no terminal" in res.stderr
    where = f"mlcache --location {loc}"
    assert f"{where} clear --yes" in res.stderr and f"{where} clear --dry-run" in res.stderr
    assert state(tmp_path) == before
    res = run("--location", loc, "clear", "--dry-run")
    assert res.returncode == 0 and "would remove" in res.stdout and "mine/d.pack" in res.stdout
    assert "would remove 2 results of 2 functions and 3 dataset packs" in res.stdout
    assert state(tmp_path) == before


def test_clear_everything_asks_on_a_terminal(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    before = state(tmp_path)
    code, out = on_terminal("--location", loc, "clear", answer=b"n\n")
    assert code == 0 and "[y/N]" in out and "nothing removed" in out
    assert "1 pack made by pack() cannot be rebuilt" in out
    assert state(tmp_path) == before
    code, out = on_terminal("--location", loc, "clear", answer=b"y\n")
    assert code == 0 and "removed 2 results of 2 functions and 3 dataset packs" in out, out
    assert state(tmp_path) == (0, [])


def test_ctrl_c_at_the_question_removes_nothing_and_shows_no_traceback(tmp_path):
    populated(tmp_path)
    before = state(tmp_path)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlcache", "--location", str(tmp_path), "clear"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env(),
    )
    os.close(slave)
    out = b""
    while b"[y/N]" not in out:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, out
        out += os.read(master, 65536)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    with contextlib.suppress(OSError):  # EIO once the child is gone
        while chunk := os.read(master, 65536):
            out += chunk
    os.close(master)
    assert b"interrupted" in out and b"Traceback" not in out
    assert state(tmp_path) == before


def test_prune_dry_run_and_max_size_0_say_what_goes_and_keep_packs_made_by_pack(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    before = state(tmp_path)
    res = run("--location", loc, "prune", "--max-size", "0", "--dry-run")
    assert res.returncode == 0 and "would remove 4 items" in res.stdout
    assert "kept mine/d.pack" in res.stdout and "--all-packs" in res.stdout
    assert state(tmp_path) == before
    res = run("--location", loc, "prune", "--max-size", "0")
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("removing 4 items") and loc in first  # said before it goes
    assert "kept mine/d.pack" in res.stdout
    assert state(tmp_path) == (0, ["mine/d.pack"])
    res = run("--location", loc, "prune", "--max-size", "0", "--all-packs", "--json")
    assert [r["name"] for r in json.loads(res.stdout)["removed"]] == ["mine/d.pack"]
    assert state(tmp_path) == (0, [])


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def damaged(loc: Path) -> tuple[Path, Path, Path]:
    """A populated cache with one damaged entry, one damaged pack made by pack(),
    one damaged pack a dataset built: their paths."""
    mem = populated(loc)
    entry = Path(mem.store.local_path(next(e for e in mem.store.list() if is_entry(e.name)).name))
    ours = loc / "mine" / "d.pack"
    theirs = Path(next(p.path for p in admin.packs(str(loc), detail=False) if p.dataset))
    for path, at in ((entry, -1), (ours, 100), (theirs, 100)):
        _flip(path, at)
    return entry, ours, theirs


def test_verify_says_why_in_plain_words_and_suggests_fix(tmp_path):
    entry, _, _ = damaged(tmp_path)
    res = run("--location", str(tmp_path), "verify")
    assert res.returncode == 1
    text = res.stdout
    assert f"damaged entry {entry.parent.parent.name}/" in text
    assert "its data changed after it was written" in text
    assert "damaged dataset pack mine/d.pack:" in text
    assert f"run `mlcache --location {tmp_path} verify --fix`" in text and "--all-packs" in text
    for jargon in ("block", "region", "checksum mismatch", "Traceback"):
        assert jargon not in text
    out = json.loads(run("--location", str(tmp_path), "verify", "--json").stdout)
    assert len(out["damaged"]) == 1 and "checksum" in out["damaged_entries"][0]["detail"]
    assert {p["rebuildable"] for p in out["damaged_packs"]} == {True, False}


def test_verify_fix_keeps_packs_made_by_pack_unless_asked(tmp_path):
    entry, ours, theirs = damaged(tmp_path)
    res = run("--location", str(tmp_path), "verify", "--fix")
    assert res.returncode == 1 and "made by mlcache.data.pack()" in res.stdout
    assert ours.exists() and not theirs.exists() and not entry.exists()
    res = run("--location", str(tmp_path), "verify", "--fix", "--all-packs")
    assert res.returncode == 0 and "0 damaged entries, 1 damaged pack" in res.stdout
    assert not ours.exists()


def test_a_dataset_by_its_class_name(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    res = run("--location", loc, "info", "Patients", "--json")
    assert sorted(d["samples"] for d in json.loads(res.stdout)["datasets"]) == [5, 7]
    res = run("--location", loc, "clear", "Patients")
    assert res.returncode == 0 and "2 dataset packs" in res.stdout
    assert state(tmp_path)[1] == ["mine/d.pack"]


def _ls_names(loc: Path) -> list[str]:
    out = listing(loc)
    names = [f[k] for f in out["functions"] for k in ("func", "folder")]
    names += [d[k] for d in out["datasets"] for k in ("name", "path")]
    names += [d["dataset"] for d in out["datasets"] if d["dataset"]]
    assert any(n.endswith("Patients") for n in names)
    return names


def test_the_names_ls_prints_are_accepted_by_info_and_clear(tmp_path):
    populated(tmp_path)
    out = listing(tmp_path)
    work = next(f for f in out["functions"] if f["func"].endswith(".work"))
    dataset = next(d for d in out["datasets"] if d["dataset"])
    for name, cmd in ((work["folder"], "info"), (dataset["dataset"], "clear")):
        res = run("--location", str(tmp_path), cmd, name, "--json")
        assert res.returncode == 0, res.stderr
    assert state(tmp_path)[1] == ["mine/d.pack"]


@pytest.mark.slow
def test_every_name_ls_prints_is_accepted_by_info_and_clear(tmp_path):
    populated(tmp_path)
    loc = str(tmp_path)
    for name in _ls_names(tmp_path):
        res = run("--location", loc, "info", name, "--json")
        assert res.returncode == 0, (name, res.stderr)
        got = json.loads(res.stdout)
        assert got["function"] or got["datasets"]
        res = run("--location", loc, "clear", name, "--dry-run", "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["cleared"], name
    text = run("--location", loc, "info", "Patients").stdout
    assert text.count("built by the dataset") == 2 and "age" in text


def test_one_hit_and_times_from_the_entries_metadata(tmp_path):
    mem = populated(tmp_path)
    [entry] = [e for e in mem.store.list() if is_entry(e.name) and "work" in e.name]
    old = time.time() - 5 * 86400
    os.utime(mem.store.local_path(entry.name), (old, old))
    text = run("--location", str(tmp_path), "info", "work").stdout
    assert "1 entry, " in text and "1 hit, 1 miss," in text
    assert "1 hits" not in text and "1 entries" not in text
    # created: the entry's own metadata, not the file's time (which is its last use)
    key = entry.name.rpartition("/")[2]
    [row] = [line for line in text.splitlines() if line.startswith(key)]
    created, last_use = re.findall(r"(\d+ (?:s|min|h|d) ago)", row)
    assert created.endswith(" s ago") and last_use == "5 d ago"


def test_help_says_what_the_commands_do(tmp_path):
    text = run("--help").stdout
    assert "--location and --json may go before or after the command" in text
    text = run("clear", "--help").stdout
    assert "--yes" in text and "--dry-run" in text and "dataset class" in text
    text = run("prune", "--help").stdout
    assert "--all-packs" in text and "cannot rebuild" in text


def test_tables_without_a_terminal_neither_wrap_nor_cut_names(tmp_path):
    populated(tmp_path)
    long = tmp_path / ("x" * 150 + ".pack")
    shutil.copyfile(tmp_path / "mine" / "d.pack", long)
    lines = run("--location", str(tmp_path), "ls").stdout.splitlines()
    [row] = [line for line in lines if long.name in line]
    assert row.split()[:4] == [long.name, "pack()", "current", "20"]
    assert all(
        line.split()[0].endswith(".pack") for line in lines[lines.index(row) - 2 : lines.index(row)]
    )


def test_progress_on_a_terminal_for_verify_and_prune_over_many_entries(tmp_path):
    populated(tmp_path)
    many = tmp_path / "many"
    many.mkdir()
    for i in range(120):
        shutil.copyfile(tmp_path / "mine" / "d.pack", many / f"p{i:03d}.pack")
    loc = str(tmp_path)
    code, out = on_terminal("--location", loc, "verify")
    assert code == 0 and re.search(r"verify: +100%", out), out
    code, out = on_terminal("--location", loc, "prune", "--max-size", "0", "--all-packs")
    assert code == 0 and re.search(r"prune: +100%", out), out
    assert state(tmp_path) == (0, [])


def test_no_progress_bar_without_a_terminal(tmp_path):
    populated(tmp_path)
    for i in range(120):
        shutil.copyfile(tmp_path / "mine" / "d.pack", tmp_path / "mine" / f"p{i:03d}.pack")
    res = run("--location", str(tmp_path), "verify")
    assert res.returncode == 0 and res.stderr == "" and "%" not in res.stdout
    assert "0 damaged entries, 0 damaged packs" in res.stdout


@pytest.mark.slow  # ~7 s: each command reaches the S3 server
def test_a_shared_cache_by_its_url(s3_bucket, monkeypatch):
    url, options = s3_bucket
    monkeypatch.setenv("MLCACHE_SECRET", "the team's secret")  # a shared cache's setup
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])  # how the command reaches S3
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["client_kwargs"]["endpoint_url"])
    cache = f"{url}/cache"
    Memory(cache, backend_options=options, verbose=0).cache(work)(np.arange(3.0))
    out = json.loads(run("--location", cache, "ls", "--json").stdout)
    assert [f["entries"] for f in out["functions"]] == [1] and out["datasets"] == []
    res = run("clear", cache)  # a script: the shared cache is not emptied unasked
    assert res.returncode == 2 and "--yes" in res.stderr
    res = run("clear", cache, "--yes")
    assert res.returncode == 0 and "removed test_cli_conventions.work (1 result)" in res.stdout
    left = json.loads(run("--location", cache, "ls", "--json").stdout)["functions"]
    assert sum(f["entries"] for f in left) == 0


class Notes(CachedDataset):
    """One sample a line of a text file: editing the file makes a new version."""

    def __init__(self, path: Path, **kw):
        self.source_paths = [str(path)]
        super().__init__(**kw)

    def load_source(self):
        for line in Path(self.source_paths[0]).read_text().splitlines():
            yield {"line": line}


def test_ls_marks_the_current_pack_and_the_one_it_replaced(tmp_path):
    """A rebuild (the source edited) while this process still reads the old pack:
    both are listed, the old one as replaced by the new one (it goes once no
    process reads it)."""
    src, loc = tmp_path / "notes.txt", tmp_path / "c"
    src.write_text("a\nb\n")
    old = Notes(src, cache_dir=loc, progress=False)
    assert old[1]["line"] == "b"  # held open by this process
    time.sleep(0.01)
    src.write_text("a\nb\nc\n")
    new = Notes(src, cache_dir=loc, progress=False)
    assert len(new) == 3 and os.path.exists(old.pack_path)
    packs = {p["path"]: p for p in listing(loc)["datasets"]}
    assert packs[old.pack_path]["replaced_by"] == new.pack_path
    assert packs[new.pack_path]["replaced_by"] is None
    text = run("--location", str(loc), "ls").stdout
    lines = {line.split()[0]: line for line in text.splitlines() if ".pack" in line}
    assert [("replaced" in line, "current" in line) for line in lines.values()].count(
        (True, False)
    ) == 1
    info = run("--location", str(loc), "info", "Notes").stdout
    assert f"replaced by {os.path.basename(new.pack_path)}" in info


def test_a_scripts_function_is_named_by_its_name_alone(tmp_path):
    """The README's example: a function defined in a script (``__main__``, whose
    identity ends in ``@<the script's path>``) is found by ``preprocess``."""
    script = tmp_path / "f.py"
    script.write_text(
        "import sys\nfrom mlcache import Memory\n"
        "mem = Memory(sys.argv[1], verbose=0)\n"
        "@mem.cache\ndef preprocess(x):\n    return x * 2\n"
        "preprocess(3)\n"
    )
    loc = tmp_path / "cache"
    subprocess.run([sys.executable, str(script), str(loc)], check=True, timeout=120, env=env())
    for name in ("preprocess", "f.preprocess", "__main__.f.preprocess"):
        res = run("--location", str(loc), "info", name, "--json")
        assert res.returncode == 0, (name, res.stdout, res.stderr)
        assert json.loads(res.stdout)["function"]["func"].startswith("__main__.f.preprocess@")
    res = run("--location", str(loc), "clear", "preprocess")
    assert res.returncode == 0, res.stderr
    assert state(loc)[0] == 0  # its one result is gone


def _in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, cwd=folder)


def _hint(text: str, verb: str) -> list[str]:
    """The command a message suggests (between backticks), as words."""
    found = re.findall(r"`(mlcache [^`]*)`", text)
    return shlex.split(next(c for c in found if f" {verb} " in c + " "))


def test_hints_repeat_the_options_that_chose_the_cache(tmp_path):
    (tmp_path / "cache").mkdir()
    mem = Memory(tmp_path / "cache", verbose=0)
    mem.cache(np.add)(1, 2)
    res = _in(tmp_path, "--location", "cache", "clear")
    assert res.returncode == 2
    hint = _hint(res.stderr, "clear")
    assert hint == ["mlcache", "--location", "cache", "clear", "--yes"], res.stderr
    # the suggestion, run as given, empties that cache (and not the default one)
    assert _in(tmp_path, *hint[1:]).returncode == 0
    assert not [e for e in mem.store.list() if is_entry(e.name)]
    # verify's hint too
    mem.cache(np.add)(1, 2)
    [entry] = [e for e in mem.store.list() if is_entry(e.name)]
    path = Path(mem.store.local_path(entry.name))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    res = _in(tmp_path, "verify", "--location", "cache")
    assert res.returncode == 1
    hint = _hint(res.stdout, "verify")
    assert hint == ["mlcache", "--location", "cache", "verify", "--fix"], res.stdout
    assert _in(tmp_path, *hint[1:]).returncode == 0 and not path.exists()


def test_a_bare_command_prints_the_help():
    res = run()
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: mlcache") and "verify" in res.stdout


def test_ls_has_a_totals_line_and_thousands_separators(tmp_path):
    mem = Memory(tmp_path, verbose=0)
    square = mem.cache(np.square)
    for i in range(1_001):
        square(i)
    square(3)
    out = run("--location", str(tmp_path), "ls").stdout
    row = next(line for line in out.splitlines() if "square" in line)
    assert re.search(r"\b1,001\b", row), out
    total = out.strip().splitlines()[-1]
    assert total.startswith("total: 1,001 results of 1 function, "), total
    assert "0 dataset packs" in total


def test_a_scripts_function_is_shown_under_the_current_folder_and_taken_back(tmp_path):
    (tmp_path / "train.py").write_text(
        "from mlcache import Memory\n"
        "mem = Memory('cache', verbose=0)\n"
        "@mem.cache\n"
        "def fit(x):\n"
        "    return x + 1\n"
        "fit(1)\n"
    )
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, env=env())
    out = _in(tmp_path, "--location", "cache", "ls").stdout
    [name] = re.findall(r"^(\S*fit@\S+)", out, re.MULTILINE)
    assert name == "__main__.train.fit@train.py", out
    # elsewhere, the absolute path; from the folder, the short name is accepted back
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert f"@{tmp_path}/train.py" in _in(other, "--location", "../cache", "ls").stdout
    res = _in(tmp_path, "--location", "cache", "info", name)
    assert res.returncode == 0 and "1 entry" in res.stdout, res.stderr
    res = _in(tmp_path, "--location", "cache", "clear", name)
    assert res.returncode == 0 and "removed" in res.stdout, res.stderr


def test_local_copies_of_remote_packs_go_as_results_do(tmp_path):
    # a remote pack's copy on this machine (remote-packs/) is fetched again at its next
    # open: prune and clear may remove it as they remove what a dataset rebuilds, while
    # a pack written by pack() elsewhere in the folder is kept
    Memory(tmp_path, verbose=0)  # the folder is a cache
    (tmp_path / "remote-packs" / "s3_bucket").mkdir(parents=True)
    (tmp_path / "mine").mkdir()
    samples = [{"x": np.arange(100) + i} for i in range(20)]
    pack(samples, tmp_path / "remote-packs" / "s3_bucket" / "copy.pack")
    pack(samples, tmp_path / "mine" / "own.pack")
    res = run("--location", str(tmp_path), "prune", "--max-size", "0", "--dry-run", "--json")
    out = json.loads(res.stdout)
    copy = os.path.join("remote-packs", "s3_bucket", "copy.pack")
    assert [e["name"] for e in out["removed"]] == [copy], res.stdout
    assert [e["name"] for e in out["kept"]] == [os.path.join("mine", "own.pack")]
