"""Issue 12: mlcache writes and removes nothing outside its cache, serves a
read-only cache's hits, and never takes over a user's folder.

Each case runs the workload a user runs, in fresh processes (``sys.executable``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

#: one run of a user's job: cached function calls (one hit, one miss per round,
#: bytes_limit set so the shared size counter exists), statistics flushed, code
#: manifests written with the first result, and a CachedDataset pack built in the
#: default location ($MLCACHE_DIR/datasets)
WORKLOAD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from mlcache import Memory
    from mlcache.data import CachedDataset

    loc, rnd = sys.argv[1], int(sys.argv[2])
    mem = Memory(loc, verbose=0, bytes_limit="50MB")
    if rnd < 0:  # remove all: a new version of ramp looks at its old ones first
        @mem.cache(version="another")
        def ramp(n):
            return n

        assert ramp(3) == 3
        mem.reduce_size(bytes_limit=0)
        mem.clear(warn=False)
        print("OK")
        sys.exit()

    @mem.cache
    def ramp(n):
        return np.arange(n) * 2

    @mem.cache
    def label(n):
        return {"n": n, "name": f"item-{n}"}

    assert ramp(10).tolist() == [2 * i for i in range(10)]
    assert ramp(100 + rnd).tolist() == [2 * i for i in range(100 + rnd)]
    assert label(rnd) == {"n": rnd, "name": f"item-{rnd}"}
    mem.stats()  # flushes the statistics

    class Squares(CachedDataset):
        def __init__(self, n, **kw):
            self.n = n
            super().__init__(**kw)

        def load_source(self):
            for i in range(self.n):
                yield {"x": np.full(3, i), "y": i * i}

    ds = Squares(5, progress=False)
    assert [ds[i]["y"] for i in range(5)] == [0, 1, 4, 9, 16]
    assert ds[3]["x"].tolist() == [3, 3, 3]
    print("OK")
    """
)


def _run(
    script: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _snapshot(path: Path) -> dict[str, tuple[str, int]]:
    """What a sentinel (a file or a whole folder) holds: every name, its bytes'
    digest and its modification time."""
    out: dict[str, tuple[str, int]] = {}
    paths = [path] if path.is_file() else sorted(path.rglob("*"))
    for p in paths:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(path.parent))] = (digest, st.st_mtime_ns)
    return out


def _written(root: Path) -> list[str]:
    """Every name under ``root`` (files and folders, hidden ones included), plus
    the key lock each entry has while it is computed (removed after)."""
    names = set()
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        names.add(str(rel))
        if p.is_file() and len(p.name) == 32 and len(rel.parts) == 3:
            names.add(str(rel.parent / f".{p.name}.lock"))
    return sorted(names)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """The workload script and a cache after its first round (a template)."""
    base = tmp_path_factory.mktemp("workload")
    script = base / "job.py"
    script.write_text(WORKLOAD)
    template = base / "cache"
    for rnd in ("0", "1"):  # round 1's names too: its miss, its key lock
        done = _run(script, str(template), rnd, env={"MLCACHE_DIR": str(template)})
        assert done.returncode == 0, done.stderr
    names = _written(template)
    shutil.rmtree(template)
    done = _run(script, str(template), "0", env={"MLCACHE_DIR": str(template)})
    assert done.returncode == 0, done.stderr
    return script, template, names


def test_the_workload_writes_the_names_planted_below(workload):
    _, _, names = workload
    found = set(names)
    for expected in (".size.counter", ".gitignore"):
        assert expected in found
    assert any(n.endswith("/code") for n in names)  # a code manifest
    assert any("/stats/" in n for n in names)  # statistics
    assert any(n.endswith(".pack") for n in names)
    assert any(n.endswith(".pack.lock") for n in names)
    assert any(n.endswith(".lock") and not n.endswith(".pack.lock") for n in names)


def test_a_symlink_planted_at_any_name_is_never_written_through(workload, tmp_path):
    """For each name the workload writes (files and folders): move what is there
    outside the cache, put a symlink to it in its place, run the next round in a
    fresh process. What the link points to is unchanged, and the results are right."""
    script, template, names = workload
    failures = []
    for i, name in enumerate(names):
        cache = tmp_path / f"c{i}" / "cache"
        shutil.copytree(template, cache, symlinks=True)
        planted = cache / name
        sentinel = tmp_path / f"c{i}" / "outside" / Path(name).name
        sentinel.parent.mkdir()
        if planted.exists():
            shutil.move(str(planted), str(sentinel))
        else:  # a name the next round writes (its key lock)
            planted.parent.mkdir(parents=True, exist_ok=True)
            sentinel.write_bytes(b"a user's file\n")
        before = _snapshot(sentinel)
        planted.symlink_to(sentinel, target_is_directory=sentinel.is_dir())
        done = _run(script, str(cache), "1", env={"MLCACHE_DIR": str(cache)})
        if done.returncode != 0 or "OK" not in done.stdout:
            failures.append(f"{name}: the run failed: {done.stderr[-800:]}")
        elif (after := _snapshot(sentinel)) != before:
            changed = sorted(k for k in before | after if before.get(k) != after.get(k))
            failures.append(f"{name}: written through the link ({', '.join(changed[:5])})")
        elif name == ".size.counter" and f"{name} is a symbolic link" not in done.stderr:
            failures.append(f"{name}: replaced without a warning naming it")
    assert not failures, "\n".join(failures)


def test_removing_never_follows_a_link_out_of_the_cache(workload, tmp_path):
    """clear, reduce_size, ``mlcache prune`` and ``mlcache clear`` (and a new code
    version looking at the old ones) remove links, never what they point to:
    function folders, version folders, entries and packs planted as links to
    copies of themselves outside the cache are all still there afterwards."""
    script, template, _ = workload
    cache = tmp_path / "cache"
    shutil.copytree(template, cache, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    ramp = next(p for p in cache.iterdir() if ".job.ramp" in p.name)
    label = next(p for p in cache.iterdir() if ".job.label" in p.name)
    planted = [ramp]  # a whole function folder: the one whose new version runs
    planted += sorted(label.iterdir())  # a code version's folder, the statistics'
    planted += sorted(cache.glob("datasets/*/*.pack"))  # a pack
    for i, p in enumerate(planted):
        target = outside / f"{i}-{p.name}"
        shutil.copytree(p, target) if p.is_dir() else shutil.copy2(p, target)
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        p.symlink_to(target, target_is_directory=target.is_dir())
    before = _snapshot(outside)
    done = _run(script, str(cache), "-1")
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr
    for command in (["prune", "--max-size", "0", "--all-packs"], ["clear", "--yes"]):
        cli = subprocess.run(
            [sys.executable, "-m", "mlcache", "--location", str(cache), *command],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
    assert _snapshot(outside) == before


def test_a_fifo_or_folder_planted_at_a_counter_is_replaced_not_opened(tmp_path):
    """Not only links: a fifo where the size counter belongs would hang a writer
    opening it, a folder would fail it. Each is one warning and is replaced."""
    from mlcache import CacheWarning
    from mlcache.store.local import LocalStore

    store = LocalStore(tmp_path / "cache")
    counter = tmp_path / "cache" / ".size.counter"
    for plant in (lambda: os.mkfifo(counter), counter.mkdir):
        plant()
        warned = pytest.warns(CacheWarning, match="not a regular file")
        with warned, store.shared_counter("size", timeout=5) as shared:
            assert shared is not None
            shared.value = 7
        assert counter.is_file() and counter.stat().st_size == 16
        counter.unlink()


# -- a read-only cache serves its hits ------------------------------------------------
READ_ONLY_JOB = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    from mlcache import CacheWarning, Memory
    from mlcache.data import CachedDataset

    loc, calls = sys.argv[1], sys.argv[2]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mem = Memory(loc, verbose=0, bytes_limit="20MB")

        @mem.cache
        def ramp(n):
            with open(calls, "a") as f:
                f.write(f"{n}\\n")
            return np.arange(n)

        results = [ramp(n).tolist() == list(range(n)) for n in (5, 6, 7, 7, 8)]
        shelved = ramp.call_and_shelve(9).get().tolist() == list(range(9))
        mem.stats()

        class Squares(CachedDataset):
            def load_source(self):
                for i in range(4):
                    yield {"y": i * i}

        ds = Squares(cache_dir=loc + "/datasets", progress=False)
        packed = [ds[i]["y"] for i in range(4)] == [0, 1, 4, 9]
    found = [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]
    print(json.dumps({"ok": all(results) and shelved and packed, "warnings": found}))
    """
)


def test_a_cache_on_a_read_only_mount_serves_its_hits(tmpfs, tmp_path):
    """A team's cache, filled then mounted read-only: a fresh process reads the hits
    (never computes them), computes the misses and returns them, with one warning
    that nothing is stored; nothing it tries to write (locks, size counter,
    statistics, last-use times) fails a call. A dataset pack there is read too."""
    import json

    script = tmp_path / "job.py"
    script.write_text(READ_ONLY_JOB)
    cache = tmpfs / "cache"
    calls = tmp_path / "calls.txt"
    done = _run(script, str(cache), str(calls))
    assert done.returncode == 0, done.stderr
    fill = json.loads(done.stdout)
    assert fill["ok"] and fill["warnings"] == []
    # 5, 6, 7, 8 and 9 are cached now; the read-only run misses 10 instead of 9
    READ = READ_ONLY_JOB.replace(
        "call_and_shelve(9).get().tolist() == list(range(9))",
        "call_and_shelve(10).get().tolist() == list(range(10))",
    )
    script.write_text(READ)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    calls.write_text("")
    done = _run(script, str(cache), str(calls))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"], done.stderr
    assert calls.read_text().split() == ["10"]  # every other call was a hit
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "read-only" in out["warnings"][0]
    assert "Traceback" not in done.stderr


RO_CLEAR_JOB = textwrap.dedent(
    """
    import sys, warnings
    from mlcache import Memory

    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as seen:
        mem = Memory(sys.argv[1], verbose=0)  # a folder: filled before, or never made
        double = mem.cache(lambda x: 2 * x)
        assert double(4) == 8 and double(4) == 8
        mem.clear()
        double.clear()
    print(len(seen), "|".join(str(w.message) for w in seen))
    """
)


def test_clearing_a_read_only_cache_or_one_never_made_there_never_fails(tmpfs, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(RO_CLEAR_JOB)
    filled = _run(script, str(tmpfs / "cache"))
    assert filled.returncode == 0, filled.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    for where in (tmpfs / "cache", tmpfs / "never-made"):
        done = _run(script, str(where))
        assert done.returncode == 0, done.stderr
        assert "read-only" in done.stdout and "Traceback" not in done.stderr
    assert (tmpfs / "cache").exists() and not (tmpfs / "never-made").exists()


@pytest.mark.parametrize("name", ["CACHEDIR.TAG", ".gitignore", ".size.counter"])
def test_a_link_planted_at_a_top_level_name_does_not_move_the_cache(tmp_path, name):
    """One link where mlcache keeps a file of its own is repaired in place: the
    folder stays the cache (its entries still hit), it is not taken for a user's."""
    from mlcache import Memory

    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.write_text("a file of the user's\n")
    calls = []

    def double(x):
        calls.append(x)
        return 2 * x

    assert Memory(cache, verbose=0, bytes_limit="1M").cache(double)(3) == 6
    (cache / name).unlink(missing_ok=True)
    (cache / name).symlink_to(outside)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the link is reported; what matters is below
        mem = Memory(cache, verbose=0, bytes_limit="1M")
        assert mem.store.location == str(cache)
        assert mem.cache(double)(3) == 6
        assert mem.cache(double)(4) == 8
    assert calls == [3, 4]
    assert outside.read_text() == "a file of the user's\n"


# -- a location never takes over a user's folder ---------------------------------------
USER_JOB = textwrap.dedent(
    """
    import json, os, sys
    from mlcache import Memory
    from mlcache.data import CachedDataset

    loc, calls, action = sys.argv[1], sys.argv[2], sys.argv[3]
    mem = Memory(loc, verbose=0)

    @mem.cache
    def double(x):
        with open(calls, "a") as f:
            f.write(f"{x}\\n")
        return 2 * x

    class Rows(CachedDataset):
        def load_source(self):
            for i in range(3):
                yield {"y": i}

    if action == "clear":
        mem.clear(warn=False)
    else:
        assert double(21) == 42
        ds = Rows(cache_dir=loc, progress=False)
        assert ds[2]["y"] == 2
    print(json.dumps({"location": mem.location, "store": mem.store.location,
                      "pack": ds.pack_path if action != "clear" else None}))
    """
)


def _user_folder(path: Path) -> dict[str, bytes]:
    """A repository root: a project's files, its .git folder, and a folder whose
    names look like a cache's (``clear`` must not take it for one)."""
    files = {
        "README.md": b"# my project\n",
        "train.py": b"print('training')\n",
        ".git/HEAD": b"ref: refs/heads/main\n",
        "runs-0123abcd/0123456789abcdef/0123456789abcdef0123456789abcdef": b"my run\n",
    }
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return files


def _run_in(cwd: Path, script: Path, *args: str) -> dict:
    import json

    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_empty_location_is_refused():
    from mlcache import Memory

    with pytest.raises(ValueError, match="empty"):
        Memory("")


@pytest.mark.parametrize("spelling", [".", "ABS"])
def test_a_folder_of_user_files_keeps_the_cache_in_a_subfolder(tmp_path, spelling):
    """Memory(".") in a repository root: no .gitignore there (git still sees every
    file of the project), the entries and the dataset pack go to ./mlcache (with
    its own .gitignore), every run chooses the same folder (the second run hits),
    ``location`` is what was given (as joblib's), and ``clear`` leaves every file
    of the user's in place, even one that looks like a cache entry."""
    repo = tmp_path / "repo"
    repo.mkdir()
    files = _user_folder(repo)
    script, calls = tmp_path / "job.py", tmp_path / "calls.txt"
    script.write_text(USER_JOB)
    loc = "." if spelling == "." else str(repo)
    first = _run_in(repo, script, loc, str(calls), "run")
    second = _run_in(repo, script, loc, str(calls), "run")
    assert calls.read_text().split() == ["21"]  # computed once: the same folder both times
    assert first["location"] == loc
    assert first["store"] == second["store"] == str(repo / "mlcache")
    assert first["pack"].startswith(str(repo / "mlcache") + os.sep)
    assert not (repo / ".gitignore").exists()
    assert (repo / "mlcache" / ".gitignore").read_text().splitlines()[-1] == "*"
    _run_in(repo, script, loc, str(calls), "clear")
    for name, data in files.items():
        assert (repo / name).read_bytes() == data, name
    assert sorted(p.name for p in repo.iterdir()) == sorted(
        [".git", "README.md", "mlcache", "runs-0123abcd", "train.py"]
    )


def test_a_new_or_empty_folder_is_the_cache_itself(tmp_path):
    """A folder that does not exist yet, or is empty, becomes the cache (entries
    directly in it, marked as mlcache's); it stays so on the next runs, even once
    it holds entries and packs."""
    script, calls = tmp_path / "job.py", tmp_path / "calls.txt"
    script.write_text(USER_JOB)
    (tmp_path / "empty").mkdir()
    for name in ("new", "empty"):
        loc = tmp_path / name
        for _ in range(2):
            out = _run_in(tmp_path, script, str(loc), str(calls), "run")
            assert out["store"] == str(loc)
        assert (loc / ".gitignore").exists()
        assert not (loc / "mlcache").exists()
    assert calls.read_text().split() == ["21", "21"]  # once per cache


def test_a_marker_another_process_writes_while_one_looks_keeps_one_cache(tmp_path, monkeypatch):
    """Eight processes opening one new location at once: one marks it between
    another's look for the marker and its listing. The second must still take the
    folder for the cache (the marker is ours), not move to ``<location>/mlcache``:
    else two caches, and a new call computed twice (a CI failure once)."""
    from mlcache.store import local
    from mlcache.store.local import cache_folder, mark_cache_folder

    loc = tmp_path / "c"
    first = local._has_marker

    def marked_meanwhile(root):
        monkeypatch.setattr(local, "_has_marker", first)
        mark_cache_folder(str(loc))  # the other process, just after this one looked
        return False

    monkeypatch.setattr(local, "_has_marker", marked_meanwhile)
    assert cache_folder(loc) == str(loc)
    assert sorted(os.listdir(loc)) == [".gitignore", "CACHEDIR.TAG"]


def test_a_cache_made_before_the_marker_is_still_used_in_place(tmp_path):
    """A cache folder an older mlcache made (function folders, packs, its own
    .gitignore, no marker) is recognised as a cache: its results are hits."""
    script, calls = tmp_path / "job.py", tmp_path / "calls.txt"
    script.write_text(USER_JOB)
    loc = tmp_path / "cache"
    _run_in(tmp_path, script, str(loc), str(calls), "run")
    for p in loc.iterdir():  # what only a newer mlcache writes
        if p.is_file() and p.name != ".gitignore" and not p.name.startswith("."):
            p.unlink()
    out = _run_in(tmp_path, script, str(loc), str(calls), "run")
    assert out["store"] == str(loc)
    assert calls.read_text().split() == ["21"]
