"""Datasets that fill themselves, as ML engineers write them (issue 24, cases 5-10):
random augmentation frozen in ``load_item`` is said, epoch 1 serves empty lists as
the sealed pack does, warnings point at the user's line, a full disk costs no
descriptor and no pile of files, a seal that cannot fit is not tried, and two
scripts sharing a class name and a ``cache_dir`` keep each other's pack.

Each run is a fresh interpreter (what a user runs), over the dataset module
``dsmod.py``; its ``load_item`` calls append the item to ``LOG``.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from mlcache.data.frozen import MAX_PROBES, PROBE_EVERY
from scripts import ScriptFolder

DSMOD = """
import os, time
import numpy as np
from mlcache.data import CachedDataset


def logged(item):
    with open(os.environ["LOG"], "a") as f:
        f.write(f"{item}\\n")


class Base(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(cache_dir=os.environ.get("DATA_CACHE", os.environ["CACHE"]),
                         progress=False, **kw)

    def source_items(self):
        return list(range(self.n))


class Cropped(Base):
    \"\"\"A random crop and jitter moved from __getitem__ into load_item (a crop
    alone, of 8 places, came out the same at all three probes 1 run in 512).\"\"\"

    def load_item(self, i):
        logged(i)
        start = np.random.randint(0, 8)
        return {"x": np.arange(16.0)[start:start + 8] * (i + 1) + np.random.random(),
                "label": i}


class Fixed(Base):
    def load_item(self, i):
        logged(i)
        return {"x": np.arange(8.0) * i, "label": i}


class Slow(Fixed):
    def load_item(self, i):
        time.sleep(0.02)  # workers would pay
        return super().load_item(i)


class Lists(Base):
    def load_item(self, i):
        logged(i)
        return {"ids": list(range((i + 1) % 3)), "scores": [0.5] * (i % 2),
                "tags": ["t"] * ((i + 1) % 2), "none": [],
                "meta": {"boxes": [[1.0, 2.0]] * ((i + 1) % 2)}}


class Big(Base):
    \"\"\"8 kB samples.\"\"\"

    def load_item(self, i):
        logged(i)
        return {"x": np.full(1024, i, dtype=np.float64)}
"""


def _folder(tmp_path: Path) -> ScriptFolder:
    folder = ScriptFolder(tmp_path)
    folder.write("dsmod.py", DSMOD)
    return folder


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CacheWarning" in line]


# -- 5: random augmentation inside load_item ------------------------------------------------
AUGMENT = """
import os, sys
import numpy as np
import dsmod

ds = getattr(dsmod, sys.argv[1])(int(sys.argv[2]))
first = [ds[i]["x"] for i in range(len(ds))]
print("sealed", os.path.exists(ds.pack_path))
print("same", all(np.array_equal(a, ds[i]["x"]) for i, a in enumerate(first)))
"""


def test_random_augmentation_in_load_item_is_said_once_and_the_pack_still_served(tmp_path):
    folder = _folder(tmp_path)
    folder.write("augment.py", AUGMENT)
    n = PROBE_EVERY * MAX_PROBES  # three items loaded again at the seal, each different
    run = folder.execute("augment.py", "Cropped", str(n))
    assert "sealed True" in run.stdout and "same True" in run.stdout  # served, as filled
    said = _warnings(run.stderr)
    assert len(said) == 1, run.stderr
    assert re.search(r"augment\.py:\d+: CacheWarning", said[0]), said  # the user's line
    assert "Cropped.load_item gave two different samples" in run.stderr
    assert "transform=" in run.stderr
    assert len(folder.logged()) == n + MAX_PROBES  # the probe: a few loads, no more
    again = folder.execute("augment.py", "Cropped", str(n))  # the sealed pack: no probe
    assert folder.logged() == [] and _warnings(again.stderr) == []


def test_a_deterministic_load_item_is_not_warned_about(tmp_path):
    folder = _folder(tmp_path)
    folder.write("augment.py", AUGMENT)
    run = folder.execute("augment.py", "Fixed", str(PROBE_EVERY))
    assert "sealed True" in run.stdout and _warnings(run.stderr) == [], run.stderr
    assert len(folder.logged()) == PROBE_EVERY + 1


# -- 6: empty lists ----------------------------------------------------------------------
FORMS = """
import json, os, sys
import numpy as np
from dsmod import Lists


def form(v):
    if isinstance(v, dict):
        return {k: form(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return ["array", v.dtype.str, list(v.shape)]
    return [type(v).__name__, len(v) if isinstance(v, list) else None]


ds = Lists(12)
sealed = os.path.exists(ds.pack_path)  # at the open: epoch 1 fills it, or it is read
print(json.dumps({"sealed": sealed, "forms": [form(ds[i]) for i in range(12)]}))
"""


def test_epoch_one_serves_empty_lists_as_the_sealed_pack_does(tmp_path):
    folder = _folder(tmp_path)
    folder.write("forms.py", FORMS)
    first = json.loads(folder.execute("forms.py").stdout)
    assert not first["sealed"] and len(folder.logged()) == 12  # epoch 1, as filled
    sealed = json.loads(folder.execute("forms.py").stdout)
    assert sealed["sealed"] and folder.logged() == []
    assert first["forms"] == sealed["forms"]
    assert sealed["forms"][2]["ids"] == ["array", "<i8", [0]]
    assert sealed["forms"][1]["tags"] == ["list", 0]
    assert sealed["forms"][1]["meta"]["boxes"] == ["array", "<f8", [0, 2]]


# -- 7: where a warning points -------------------------------------------------------------
IN_THIS_PROCESS = """
import threading
from dsmod import Slow

threading.Thread(target=threading.Event().wait, name="busy", daemon=True).start()
ds = Slow(20, num_workers=2)  # the user's line
print(len(ds))
"""


def test_the_building_in_this_process_warning_points_at_the_users_line(tmp_path):
    """At the first frame outside mlcache: the dataset's ``super().__init__`` (it
    pointed into mlcache/data/filling.py)."""
    folder = _folder(tmp_path)
    folder.write("busy.py", IN_THIS_PROCESS)
    run = folder.execute("busy.py")
    (said,) = _warnings(run.stderr)
    assert "building Slow in this process" in said
    lines = (tmp_path / "dsmod.py").read_text().splitlines()
    line = next(k for k, text in enumerate(lines, 1) if "super().__init__(cache_dir" in text)
    assert said.startswith(f"{tmp_path / 'dsmod.py'}:{line}: CacheWarning"), said


# -- 8: a full disk while filling -----------------------------------------------------------
FULL = """
import os, resource, sys
import numpy as np
from dsmod import Big

resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
fds = len(os.listdir("/proc/self/fd"))
ds = Big(1000)
wrong = sum(int(ds[i]["x"][0]) != i for i in range(int(sys.argv[1])))
print(wrong, len(os.listdir("/proc/self/fd")) - fds)
"""


def _fill_up(disk: Path) -> None:
    """Fill ``disk`` to the last byte."""
    with open(disk / "ballast", "wb") as f, pytest.raises(OSError, match="No space left"):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def test_a_full_disk_while_filling_serves_every_sample_without_leaking(tmp_path, mount_tmpfs):
    """A run records 10 samples of 8 kB; the disk fills up; the next run reads all
    1,000 (on main: a new empty segment file and a leaked descriptor each, until
    'Too many open files')."""
    disk = mount_tmpfs("2m")
    folder = _folder(tmp_path)
    folder.write("full.py", FULL)
    env = {"DATA_CACHE": str(disk)}
    assert folder.execute("full.py", "10", env=env).stdout.split()[0] == "0"
    (before,) = list(disk.rglob("*.seg"))
    _fill_up(disk)
    run = folder.execute("full.py", "1000", env=env)
    wrong, more_fds = map(int, run.stdout.split())
    assert wrong == 0 and more_fds <= 2, run.stdout
    assert len(folder.logged()) == 990  # each served, loaded once
    said = _warnings(run.stderr)
    assert len(said) == 1 and "No space left on device" in run.stderr, run.stderr
    assert list(disk.rglob("*.seg")) == [before] and before.stat().st_size > 80_000


# -- 9: a seal that cannot fit -------------------------------------------------------------
SEAL = """
import os, sys
import mlcache.data.building as building
from dsmod import Big

writes = []
real = building.write_pack
building.write_pack = lambda *a, **kw: writes.append(1) or real(*a, **kw)
ds = Big(150)
wrong = sum(int(ds[i]["x"][0]) != i for i in range(len(ds)))
print(wrong, len(writes), os.path.exists(ds.pack_path))
"""


def test_a_seal_that_cannot_fit_is_not_tried_and_the_records_serve(tmp_path, mount_tmpfs):
    """150 samples of 8 kB: 1.2 MB of records, and as much again for the pack,
    on a 4 MB disk 2 MB of which another file holds."""
    disk = mount_tmpfs("4m")
    ballast = disk / "ballast"
    ballast.write_bytes(b"\0" * (2 << 20))
    folder = _folder(tmp_path)
    folder.write("seal.py", SEAL)
    env = {"DATA_CACHE": str(disk / "c")}
    first = folder.execute("seal.py", env=env)
    assert first.stdout.split() == ["0", "0", "False"], first.stdout + first.stderr
    assert len(folder.logged()) == 150
    for run in (first, folder.execute("seal.py", env=env)):
        said = _warnings(run.stderr)
        assert len(said) == 1 and "not sealing" in run.stderr and "MiB free" in run.stderr
    assert folder.logged() == []  # the second run read the records
    ballast.unlink()
    sealed = folder.execute("seal.py", env=env)
    assert sealed.stdout.split() == ["0", "1", "True"] and _warnings(sealed.stderr) == []
    assert folder.logged() == [] and not list(disk.rglob("*.pack.fill"))


# -- 10: two scripts, one class name, one cache_dir ---------------------------------------------
SCRIPT = """
import os, sys
import numpy as np
from mlcache.data import CachedDataset


class Tiles(CachedDataset):
    def source_items(self):
        return list(range(30))

    def load_item(self, i):
        with open(os.environ["LOG"], "a") as f:
            f.write(f"{i}\\n")
        return {"x": np.full(4, i * SCALE)}


ds = Tiles(cache_dir=os.environ["CACHE"], progress=False)
print(sum(int(ds[i]["x"][0]) for i in range(len(ds))))
"""


def test_two_scripts_with_one_class_name_keep_each_others_pack(tmp_path):
    """train.py and eval.py (their code differs) share a cache_dir: alternate runs,
    with every pack last used 20 days ago, load nothing again."""
    folder = _folder(tmp_path)
    folder.write("train.py", "SCALE = 1\n" + SCRIPT)
    folder.write("eval.py", "SCALE = 2\n" + SCRIPT)
    for script in ("train.py", "eval.py"):
        folder.execute(script)
        assert len(folder.logged()) == 30
    for _ in range(2):
        for script, total in (("train.py", 435), ("eval.py", 870)):
            days_ago = time.time() - 20 * 86400
            for pack in folder.cache.rglob("*.pack"):
                os.utime(pack, (days_ago, days_ago))
            run = folder.execute(script)
            assert int(run.stdout) == total and folder.logged() == [], script
    assert len(list(folder.cache.rglob("*.pack"))) == 2
