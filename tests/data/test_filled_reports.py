"""What a new user reads about a dataset filled item by item (issue 24): ``mlcache
ls`` gives its building time (the loads that filled it, not 0 s), and a sample
whose fields differ from the first's says which fields it lacks and which it adds.

Each run is a fresh interpreter, as a user's script and ``mlcache ls`` are.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scripts import ScriptFolder

DSMOD = """
import os, time
from mlcache.data import CachedDataset


class Slow(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(**kw)

    def source_items(self):
        return range(self.n)

    def item_fingerprint(self, i):
        return i

    def load_item(self, i):
        time.sleep(0.02)  # a load of at least 20 ms: the pack costs >= n * 20 ms
        return {"a": i}


class Odd(Slow):
    def load_item(self, i):
        if i == int(os.environ["ODD"]):
            return {"a": i, "b": 1, "extra": 2}
        return {"a": i, "b": 1} if os.environ.get("LACKS") != str(i) else {"a": i}
"""


@pytest.fixture
def scripts(tmp_path):
    folder = ScriptFolder(tmp_path)
    folder.write("dsmod.py", DSMOD)
    return folder


def test_a_pack_filled_as_read_shows_the_time_its_loads_took_in_ls(scripts):
    scripts.write(
        "fill.py",
        """
        import os
        from dsmod import Slow
        ds = Slow(10, cache_dir=os.environ["CACHE"], progress=False)
        assert [ds[i]["a"] for i in range(len(ds))] == list(range(10))  # epoch 1 seals
        """,
    )
    scripts.execute("fill.py")
    res = subprocess.run(
        [sys.executable, "-m", "mlcache", "--location", str(scripts.cache), "ls"],
        capture_output=True,
        text=True,
        check=True,
    )
    row = next(line for line in res.stdout.splitlines() if "Slow" in line and ".pack" in line)
    header = next(line for line in res.stdout.splitlines() if "building" in line)
    building = row[header.index("building") :].split()[:2]
    # ten sleeps of 20 ms: at least 0.2 s (before: 0 s, the seal's time not counted)
    assert building[1] == "s" and float(building[0]) >= 0.2, row


def test_a_sample_with_other_fields_says_which_it_lacks_and_which_it_adds(scripts):
    scripts.write(
        "read.py",
        """
        import os
        from dsmod import Odd
        ds = Odd(int(os.environ["N"]), cache_dir=os.environ["CACHE"], progress=False)
        for i in range(len(ds)):
            try:
                ds[i]
            except ValueError as exc:
                print(exc)
        """,
    )
    extra = scripts.execute("read.py", env={"ODD": "2", "N": "6"}).stdout
    assert "sample 2 (item 2): fields differ from sample 0 (item 0): it has the field " in extra
    assert "'extra', which sample 0 has not;" in extra
    lacks = scripts.execute("read.py", env={"ODD": "-1", "LACKS": "3", "N": "7"}).stdout
    differ = r"sample 3 \(item 3\): fields differ from sample 0 \(item 0\): it lacks the field 'b';"
    assert re.search(differ, lacks), lacks
    assert "[]" not in extra + lacks  # before: "missing [], extra ['extra']"
