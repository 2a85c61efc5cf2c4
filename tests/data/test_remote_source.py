"""A dataset whose packs live in a remote ``cache_dir`` (S3, here a real
SeaweedFS server) counts its source files by size and modification time only
(issue 24, case 3's remote side): an edited file is still noticed, and a second
machine, which holds its own copy of the files (new inodes and change times) and
its own download folder, reuses the pack another machine built.

Each run is a fresh interpreter; a "machine" is a download folder of its own
(``MLCACHE_DIR``), the bucket shared.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from scripts import ScriptFolder

READ = """
import json, os, sys
from mlcache.data import CachedDataset


class Notes(CachedDataset):
    source_glob = "*.txt"

    def __init__(self, root, **kw):
        self.source_dir = root
        super().__init__(**kw)

    def load_item(self, path):
        with open(os.environ["LOG"], "a") as f:
            f.write(os.path.basename(path) + "\\n")
        with open(path) as f:
            return {"text": f.read()}


class Rows(CachedDataset):
    \"\"\"Rows of files under a folder attribute, which no item names.\"\"\"

    def __init__(self, root, **kw):
        self.root = root
        super().__init__(**kw)

    def source_items(self):
        return range(4)

    def load_item(self, i):
        with open(os.environ["LOG"], "a") as f:
            f.write(f"row{i}\\n")
        with open(os.path.join(self.root, f"{i:02d}.txt")) as f:
            return {"text": f.read()}


kind, root = sys.argv[1:]
options = json.loads(os.environ["S3_OPTIONS"])
ds = globals()[kind](root, cache_dir=os.environ["S3_URL"], storage_options=options,
                     progress=False)
print(json.dumps([ds[i]["text"] for i in range(len(ds))]))
"""


def _scripts(tmp_path: Path, s3_bucket) -> tuple[ScriptFolder, dict[str, str]]:
    url, options = s3_bucket
    scripts = ScriptFolder(tmp_path)
    scripts.write("read.py", READ)
    env = {"S3_URL": f"{url}/datasets", "S3_OPTIONS": json.dumps(options)}
    return scripts, env


def _texts(root: Path, n: int) -> None:
    root.mkdir(exist_ok=True)
    for i in range(n):
        (root / f"{i:02d}.txt").write_text(f"text {i}")


def _on(scripts: ScriptFolder, env: dict[str, str], machine: str, *args: str) -> list[str]:
    run = scripts.execute("read.py", *args, env={**env, "MLCACHE_DIR": machine})
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_an_edited_source_file_is_noticed_when_the_pack_is_remote(tmp_path, s3_bucket):
    scripts, env = _scripts(tmp_path, s3_bucket)
    root, machine = tmp_path / "notes", str(tmp_path / "machine-a")
    _texts(root, 6)
    for kind in ("Notes", "Rows"):
        assert _on(scripts, env, machine, kind, str(root))[:4] == [f"text {i}" for i in range(4)]
        assert len(scripts.logged()) == (6 if kind == "Notes" else 4)
    (root / "02.txt").write_text("edited")  # another size, another mtime
    assert _on(scripts, env, machine, "Notes", str(root))[2] == "edited"
    assert scripts.logged() == ["02.txt"]  # that file only: the rest from the pack
    assert _on(scripts, env, machine, "Rows", str(root))[2] == "edited"  # before: "text 2"
    assert "row2" in scripts.logged()


def test_a_second_machine_reuses_the_remote_pack_and_its_refill(tmp_path, s3_bucket):
    scripts, env = _scripts(tmp_path, s3_bucket)
    root = tmp_path / "notes"
    _texts(root, 6)
    a, b = str(tmp_path / "machine-a"), str(tmp_path / "machine-b")
    built = {kind: _on(scripts, env, a, kind, str(root)) for kind in ("Notes", "Rows")}
    # the second machine's own copy of the files, at the same place: the same
    # bytes, sizes and modification times (rsync -t), new inodes and change times
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    shutil.rmtree(root)
    os.rename(copy, root)
    for kind in ("Notes", "Rows"):
        assert _on(scripts, env, b, kind, str(root)) == built[kind]
        assert scripts.logged() == []  # fetched, not loaded
    assert any(Path(b).rglob("*.pack"))  # into its own download folder
    (root / "04.txt").write_text("edited on b")
    assert _on(scripts, env, b, "Notes", str(root))[4] == "edited on b"
    assert scripts.logged() == ["04.txt"]
    assert _on(scripts, env, a, "Notes", str(root))[4] == "edited on b"
    assert scripts.logged() == []  # b's refilled pack, fetched
