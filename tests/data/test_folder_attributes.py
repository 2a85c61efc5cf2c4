"""A dataset's folder attributes count as its source (issue 24, case 2's folder
part): the shards under ``self.root`` that ``load_item(i)`` opens by row number
(no item names them) are fingerprinted by the same ``stat`` as any source file,
the files the items do name count item by item, the cache is never walked, an
output folder rewritten at every run is named in one warning, and a huge folder
too.

Each run is a fresh interpreter (what a user runs), over ``dsmod.py``; its
``load_item`` calls append the item to ``LOG``.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlcache.data import CachedDataset
from mlcache.data.checking import trusted_after
from scripts import ScriptFolder

DSMOD = """
import os
import numpy as np
from mlcache.data import CachedDataset


def logged(item):
    with open(os.environ["LOG"], "a") as f:
        f.write(f"{item}\\n")


class Shards(CachedDataset):
    \"\"\"Rows of .npy shards, 10 a shard: the h5py / np.memmap pattern.\"\"\"

    def __init__(self, root, n, **kw):
        self.root, self.n = root, n
        super().__init__(cache_dir=os.environ["CACHE"], progress=False, **kw)

    def source_items(self):
        return range(self.n)

    def load_item(self, i):
        logged(i)
        rows = np.load(os.path.join(self.root, f"part-{i // 10}.npy"), mmap_mode="r")
        return {"x": np.array(rows[i % 10])}


class Labelled(CachedDataset):
    \"\"\"Items name files in root; load_item also reads root/labels.txt, which no
    item names.\"\"\"

    def __init__(self, root, **kw):
        self.root = root
        super().__init__(cache_dir=os.environ["CACHE"], progress=False, **kw)

    def source_items(self):
        return sorted(n for n in os.listdir(self.root) if n.endswith(".txt") and n != "labels.txt")

    def load_item(self, name):
        logged(name)
        with open(os.path.join(self.root, "labels.txt")) as f:
            labels = f.read().split()
        with open(os.path.join(self.root, name)) as f:
            return {"text": f.read(), "label": labels[int(name[:-4])]}


class Trained(Shards):
    \"\"\"A training script that writes into an output folder, an attribute.\"\"\"

    def __init__(self, root, n, out_dir, **kw):
        self.out_dir = out_dir
        super().__init__(root, n, **kw)
"""

RUN = """
import os, sys
import dsmod

ds = dsmod.Shards(sys.argv[1], int(sys.argv[2]))
print(" ".join(str(int(ds[i]["x"][0])) for i in range(len(ds))))
"""


def _folder(tmp_path: Path) -> ScriptFolder:
    folder = ScriptFolder(tmp_path)
    folder.write("dsmod.py", DSMOD)
    folder.write("run.py", RUN)
    return folder


def _shard(root: Path, k: int, base: int) -> None:
    root.mkdir(exist_ok=True)
    np.save(root / f"part-{k}.npy", np.arange(10, dtype=np.int64)[:, None] + base)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CacheWarning" in line]


def test_a_regenerated_shard_under_a_folder_attribute_serves_its_new_rows(tmp_path):
    scripts = _folder(tmp_path)
    shards = tmp_path / "shards"
    for k in range(3):
        _shard(shards, k, 100 * k)
    first = scripts.execute("run.py", str(shards), "30")
    assert first.stdout.split() == [str(100 * (i // 10) + i % 10) for i in range(30)]
    assert len(scripts.logged()) == 30 and not _warnings(first.stderr)
    again = scripts.execute("run.py", str(shards), "30")
    assert again.stdout == first.stdout and scripts.logged() == []  # reused, nothing loaded
    _shard(shards, 1, 500)  # regenerated in place: same name, size and folder
    after = scripts.execute("run.py", str(shards), "30")
    rows = after.stdout.split()
    assert rows[10:20] == [str(500 + i) for i in range(10)]  # before: 100..109, stale
    assert rows[:10] == first.stdout.split()[:10] and len(scripts.logged()) == 30
    assert scripts.execute("run.py", str(shards), "30").stdout == after.stdout
    assert scripts.logged() == []  # unchanged since: reused, no item loaded again


def test_the_cache_inside_a_folder_attribute_is_never_walked(tmp_path):
    scripts = _folder(tmp_path)
    shards = tmp_path / "shards"
    for k in range(2):
        _shard(shards, k, 100 * k)
    env = {"CACHE": str(shards / "cache")}  # each run writes there: walked, every run a miss
    scripts.execute("run.py", str(shards), "20", env=env)
    assert len(scripts.logged()) == 20
    scripts.execute("run.py", str(shards), "20", env=env)
    assert scripts.logged() == []
    _shard(shards, 0, 700)
    assert scripts.execute("run.py", str(shards), "20", env=env).stdout.split()[0] == "700"


LABELLED = """
import sys
import dsmod

ds = dsmod.Labelled(sys.argv[1])
print(" ".join(f"{ds[i]['text']}:{ds[i]['label']}" for i in range(len(ds))))
"""


def test_a_file_no_item_names_counts_and_the_named_ones_count_by_item(tmp_path):
    scripts = _folder(tmp_path)
    scripts.write("labelled.py", LABELLED)
    root = tmp_path / "data"
    root.mkdir()
    for i in range(12):
        (root / f"{i:02d}.txt").write_text(f"t{i}")
    (root / "labels.txt").write_text(" ".join("a" * 12))
    scripts.execute("labelled.py", str(root))
    assert len(scripts.logged()) == 12
    (root / "03.txt").write_text("edited")  # an item's own file: its own load
    out = scripts.execute("labelled.py", str(root)).stdout.split()
    assert out[3] == "edited:a" and scripts.logged() == ["03.txt"]
    (root / "labels.txt").write_text(" ".join("b" * 12))  # read by every load_item
    out = scripts.execute("labelled.py", str(root)).stdout.split()
    assert out == [f"{'edited' if i == 3 else f't{i}'}:b" for i in range(12)]  # before: :a
    assert len(scripts.logged()) == 12


TRAIN = """
import os, sys, time
import dsmod

ds = dsmod.Trained(sys.argv[1], 10, sys.argv[2])
for i in range(len(ds)):
    ds[i]
with open(os.path.join(sys.argv[2], "checkpoint.txt"), "w") as f:  # each run's output
    f.write(str(time.time_ns()))
"""


def test_an_output_folder_written_at_every_run_is_named_in_one_warning(tmp_path):
    scripts = _folder(tmp_path)
    scripts.write("train.py", TRAIN)
    shards, out = tmp_path / "shards", tmp_path / "runs"
    _shard(shards, 0, 0)
    out.mkdir()
    said = []
    for _ in range(3):
        run = scripts.execute("train.py", str(shards), str(out))
        assert len(scripts.logged()) == 10  # a new pack each run: a miss, never stale
        said += [w for w in _warnings(run.stderr) if "'out_dir'" in w]
    assert len(said) == 1, said  # the third run: once
    assert "'out_dir' held other files at each of the last 3 runs" in said[0]
    assert "cache_ignore = ('out_dir',)" in said[0]


HUGE = """
import os, sys
import dsmod


class Home(dsmod.Shards):
    def __init__(self, root, n, **kw):
        self.home = os.path.expanduser("~")
        super().__init__(root, n, **kw)


ds = Home(sys.argv[1], 10)
ds[0]
"""


def test_a_home_folder_attribute_is_not_walked_and_said_once(tmp_path):
    scripts = _folder(tmp_path)
    scripts.write("huge.py", HUGE)
    shards = tmp_path / "shards"
    _shard(shards, 0, 0)
    run = scripts.execute("huge.py", str(shards), env={"HOME": str(tmp_path)})
    said = _warnings(run.stderr)
    assert len(said) == 1 and "Home.home is the folder" in said[0], run.stderr
    assert "cache_ignore = ('home',)" in said[0] and "source_fingerprint()" in said[0]


def test_a_folder_attribute_inside_the_declared_folder_counts(tmp_path):
    """The declaration names the *.txt files of images/; a folder attribute below it
    (images/meta/, read by every load) is no part of the declaration: it counts."""

    class Captioned(CachedDataset):
        source_glob = "*.txt"

        def __init__(self, root, **kw):
            self.source_dir = os.path.join(root, "images")
            self.meta = os.path.join(root, "images", "meta")
            super().__init__(cache_dir=tmp_path / "cache", progress=False, **kw)

        def load_item(self, path):
            with open(os.path.join(self.meta, "caption.txt")) as f:
                caption = f.read()
            with open(path) as f:
                return {"text": f.read(), "caption": caption}

    meta = tmp_path / "data" / "images" / "meta"
    meta.mkdir(parents=True)
    for i in range(3):
        (meta.parent / f"{i}.txt").write_text(f"image {i}")
    (meta / "caption.txt").write_text("old")
    ds = Captioned(tmp_path / "data")
    assert [ds[i]["caption"] for i in range(len(ds))] == ["old"] * 3
    (meta / "caption.txt").write_text("new")
    ds = Captioned(tmp_path / "data")
    assert [ds[i]["caption"] for i in range(len(ds))] == ["new"] * 3  # before: "old"
    assert [ds[i]["text"] for i in range(len(ds))] == [f"image {i}" for i in range(3)]


class Paired(CachedDataset):
    """Items are names found in both ``images/`` and ``masks/`` (folder attributes);
    ``names`` (a file outside them) lists the items."""

    def __init__(self, root: Path, cache: Path, **kw: Any) -> None:
        self.images, self.masks = str(root / "images"), str(root / "masks")
        self.names = str(root / "names.txt")
        super().__init__(cache_dir=cache, progress=False, **kw)

    def source_items(self) -> list[str]:
        with open(self.names) as f:
            return f.read().split()

    def load_item(self, name: str) -> dict[str, Any]:
        with open(os.path.join(self.images, name)) as f, open(os.path.join(self.masks, name)) as g:
            return {"image": f.read(), "mask": g.read()}


def _paired(tmp_path: Path, names: str) -> Path:
    root = tmp_path / "data"
    for part in ("images", "masks"):
        (root / part).mkdir(parents=True)
        for i in range(3):
            (root / part / f"p{i}.txt").write_text(f"{part} {i}")
    (root / "names.txt").write_text(names)
    return root


def test_a_file_an_item_may_name_but_its_check_does_not_stat_counts_in_its_folder(tmp_path):
    """``p1.txt`` is checked as ``images/p1.txt`` (the first base holding it); the
    ``masks/p1.txt`` beside it is no item's file: it counts in ``masks``."""
    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    ds = Paired(root, tmp_path / "cache")
    assert [ds[i]["mask"] for i in range(3)] == [f"masks {i}" for i in range(3)]
    (root / "masks" / "p1.txt").write_text("masks 1, edited")
    ds = Paired(root, tmp_path / "cache")
    assert ds[1]["mask"] == "masks 1, edited"  # before: "masks 1", for good
    assert ds[1]["image"] == "images 1"


class AlsoReads(Paired):
    """Reads ``images/p2.txt`` with every item, whether an item names it or not."""

    def load_item(self, name: str) -> dict[str, Any]:
        with open(os.path.join(self.images, "p2.txt")) as f:
            return {**super().load_item(name), "extra": f.read()}


def test_a_file_no_longer_named_by_an_item_counts_in_its_folder_again(tmp_path):
    """The walk of ``images/`` left out ``p2.txt`` (an item named it); the items
    change (a file outside the folder lists them), the folder does not: the
    recorded walk no longer holds, ``p2.txt`` counts in the folder again."""
    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    images = root / "images"
    # the recorded walk is trusted only once well after the folder's last change
    time.sleep(trusted_after(os.stat(images).st_ctime_ns) / 1e9 + 0.05)
    ds = AlsoReads(root, tmp_path / "cache")
    assert [ds[i]["image"] for i in range(3)] == [f"images {i}" for i in range(3)]
    (root / "names.txt").write_text("p0.txt p1.txt")
    ds = AlsoReads(root, tmp_path / "cache")
    assert [ds[i]["extra"] for i in range(2)] == ["images 2"] * 2
    (images / "p2.txt").write_text("images 2, edited")  # the folder itself is unchanged
    ds = AlsoReads(root, tmp_path / "cache")
    assert [ds[i]["extra"] for i in range(2)] == ["images 2, edited"] * 2  # before: stale


class Linked(CachedDataset):
    """Rows of shards in ``root``, each sample with the label in ``root/meta/``: a
    symbolic link to a folder elsewhere."""

    def __init__(self, root: Path, cache: Path, **kw: Any) -> None:
        self.root = str(root)
        super().__init__(cache_dir=cache, progress=False, **kw)

    def source_items(self) -> range:
        return range(3)

    def load_item(self, i: int) -> dict[str, Any]:
        with open(os.path.join(self.root, "meta", "label.txt")) as f:
            return {"i": i, "label": f.read()}


def test_a_linked_folder_in_a_folder_attribute_is_walked_once(tmp_path):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "shard.npy").write_bytes(b"rows")
    (elsewhere / "label.txt").write_text("old")
    (root / "meta").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "back").symlink_to(root, target_is_directory=True)  # a loop
    ds = Linked(root, tmp_path / "cache")
    assert [ds[i]["label"] for i in range(3)] == ["old"] * 3
    (elsewhere / "label.txt").write_text("newer")
    ds = Linked(root, tmp_path / "cache")
    assert [ds[i]["label"] for i in range(3)] == ["newer"] * 3  # before: "old", for good
    assert [ds[i]["i"] for i in range(3)] == [0, 1, 2]


class MasksOnly(Paired):
    """Reads ``masks/<name>`` only; ``images/`` is searched first for the name."""

    def load_item(self, name: str) -> dict[str, Any]:
        with open(os.path.join(self.masks, name)) as f:
            return {"mask": f.read()}


def test_a_named_file_that_an_earlier_folder_now_shadows_counts_in_its_folder(tmp_path):
    """``p2.txt`` is checked as ``masks/p2.txt`` (``images/`` has none), so the walk
    of ``masks/`` left it out; a ``images/p2.txt`` appears, and the item's check
    stats that one from now on: ``masks/p2.txt`` counts in its folder again."""
    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    (root / "images" / "p2.txt").unlink()
    time.sleep(trusted_after(os.stat(root / "images").st_ctime_ns) / 1e9 + 0.05)
    ds = MasksOnly(root, tmp_path / "cache")
    assert [ds[i]["mask"] for i in range(3)] == [f"masks {i}" for i in range(3)]
    (root / "images" / "p2.txt").write_text("a decoy")  # masks/ itself is unchanged
    assert MasksOnly(root, tmp_path / "cache")[2]["mask"] == "masks 2"
    (root / "masks" / "p2.txt").write_text("masks 2, edited")
    ds = MasksOnly(root, tmp_path / "cache")
    assert ds[2]["mask"] == "masks 2, edited"  # before: "masks 2", for good


def test_a_reopen_whose_items_are_as_recorded_builds_no_names(tmp_path, monkeypatch):
    """The names check of a recorded walk is keyed by the working folder, the folder
    attributes and the items' keys: the same items build no names at a reopen (the
    names of 20,000 items cost ~120 ms); other items build them and are checked."""
    import mlcache.data.names as names

    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    time.sleep(trusted_after(os.stat(root / "images").st_ctime_ns) / 1e9 + 0.05)
    built: list[Any] = []
    real = names.candidates
    monkeypatch.setattr(names, "candidates", lambda *a: built.append(a) or real(*a))
    ds = AlsoReads(root, tmp_path / "cache")
    assert [ds[i]["extra"] for i in range(3)] == ["images 2"] * 3
    AlsoReads(root, tmp_path / "cache")  # the record learns the names' key
    built.clear()
    AlsoReads(root, tmp_path / "cache")
    assert built == []  # before: 3 names built at each reopen
    (root / "names.txt").write_text("p0.txt p1.txt")
    (root / "images" / "p2.txt").write_text("images 2, edited")
    ds = AlsoReads(root, tmp_path / "cache")
    assert built  # other items: their names are built and checked
    assert [ds[i]["extra"] for i in range(2)] == ["images 2, edited"] * 2


def test_the_folder_attributes_are_read_from_a_copy_of_the_attributes(tmp_path):
    """The background check reads the folder attributes while ``ds[i]`` sets others
    (seen under load: "dictionary changed size during iteration", the check
    lost): they are read from a copy."""
    from mlcache.data.attributes import OpenItems

    class Opening(OpenItems):
        pass

    class Growing:  # a path whose reading sets another attribute, as ds[i] would
        def __init__(self, owner: Opening, path: Path) -> None:
            self.owner, self.path = owner, path

        def __fspath__(self) -> str:
            setattr(self.owner, f"_read_{len(vars(self.owner))}", True)
            return str(self.path)

    ds = Opening()
    ds.root = Growing(ds, tmp_path)  # type: ignore[attr-defined]
    ds.other = str(tmp_path)  # type: ignore[attr-defined]
    assert len(ds._folder_attributes()) == 2  # before: RuntimeError


def test_a_dataset_opens_from_a_working_folder_that_was_removed(tmp_path, monkeypatch):
    """A notebook whose folder was removed: the names are made without it (a relative
    name then names nothing, as for the item's check), never an error out of the open."""
    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    assert Paired(root, tmp_path / "cache")[1]["mask"] == "masks 1"
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    ds = Paired(root, tmp_path / "cache")  # before: FileNotFoundError
    assert [ds[i]["mask"] for i in range(3)] == [f"masks {i}" for i in range(3)]
    (root / "masks" / "p1.txt").write_text("masks 1, edited")
    assert Paired(root, tmp_path / "cache")[1]["mask"] == "masks 1, edited"


def test_a_copy_pickled_during_the_open_lists_the_items_as_they_are(tmp_path):
    """The open lists the items once; a copy pickled meanwhile (a spawned worker, a
    deepcopy) does not keep that list: it lists them as they are when it checks."""
    _COPIES.clear()
    root = _paired(tmp_path, "p0.txt p1.txt p2.txt")
    Copied(root, tmp_path / "cache")
    (root / "names.txt").write_text("p0.txt p1.txt")
    assert _COPIES[0]._open_items()[0] == ["p0.txt", "p1.txt"]
    (root / "names.txt").write_text("p0.txt")
    assert _COPIES[0]._open_items()[0] == ["p0.txt"]  # before: kept the list before


_COPIES: list[Any] = []


class Copied(Paired):
    """Pickles itself once while its open lists the items."""

    def source_items(self) -> list[str]:
        if not _COPIES and getattr(self, "_listing_once", False):
            _COPIES.append(pickle.loads(pickle.dumps(self)))
        return super().source_items()
