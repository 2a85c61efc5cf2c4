"""CachedDataset with a declared source (``source_dir`` + ``source_glob``, or
``source_paths``) and ``check_source=`` "open", "background" and "never"."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlcache import CacheWarning
from mlcache.data import CachedDataset
from mlcache.data.sources import DeclaredSource, files_digest

BUILDS: list[int] = []


class Notes(CachedDataset):
    """The declared source as class attribute and attribute set in ``__init__``."""

    source_glob = "*.txt"

    def __init__(self, root, **kw):
        self.source_dir = str(root)
        super().__init__(**kw)

    def load_source(self):
        BUILDS.append(1)
        for path in self.source_files():
            yield {"name": os.path.basename(path), "text": Path(path).read_text()}


class Listed(CachedDataset):
    """The declared source as a constructor argument: a list of paths."""

    def load_source(self):
        BUILDS.append(1)
        for path in self.source_files():
            yield {"text": Path(path).read_text()}


@pytest.fixture
def root(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_text(f"note {i}")
    (src / "skip.csv").write_text("not a note")
    (src / "folder.txt").mkdir()  # a folder is not a file of the source
    BUILDS.clear()
    return src


def _open(root, tmp_path, **kw):
    return Notes(root, cache_dir=tmp_path / "cache", progress=False, **kw)


def _texts(ds):
    return [ds[i]["text"] for i in range(len(ds))]


def _edit(path: Path, text: str) -> None:
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse clock too


def _checked(ds) -> None:
    """Wait for the background checks of this process."""
    for t in threading.enumerate():
        if t.name == "mlcache-source-check":
            t.join(30)


def test_a_declared_source_lists_its_files(root, tmp_path):
    ds = _open(root, tmp_path)
    assert [ds[i]["name"] for i in range(len(ds))] == [f"{i}.txt" for i in range(5)]
    assert ds.source_files() == [str(root / f"{i}.txt") for i in range(5)]
    assert len(BUILDS) == 1
    _open(root, tmp_path)
    assert len(BUILDS) == 1  # opened


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_a_declared_source_notices_a_change(root, tmp_path, change):
    _open(root, tmp_path)
    if change == "edit":
        _edit(root / "3.txt", "note 3, edited")
    elif change == "add":
        (root / "5.txt").write_text("note 5")
    else:
        (root / "0.txt").unlink()
    (root / "other.csv").write_text("not a note: changes nothing")
    ds = _open(root, tmp_path)
    assert len(BUILDS) == 2
    expected = [p.read_text() for p in sorted(root.glob("*.txt")) if p.is_file()]
    assert _texts(ds) == expected


def test_a_change_outside_the_pattern_changes_nothing(root, tmp_path):
    _open(root, tmp_path)
    _edit(root / "skip.csv", "edited")
    (root / "new.csv").write_text("new")
    _open(root, tmp_path)
    assert len(BUILDS) == 1


def test_source_paths_notice_an_edit(root, tmp_path):
    paths = [root / "4.txt", root / "1.txt"]

    def opened():
        return Listed(source_paths=paths, cache_dir=tmp_path / "cache", progress=False)

    assert _texts(opened()) == ["note 4", "note 1"]  # in their order
    opened()
    assert len(BUILDS) == 1
    _edit(root / "1.txt", "note 1, edited")
    assert _texts(opened()) == ["note 4", "note 1, edited"]
    assert len(BUILDS) == 2


def test_the_fingerprint_is_the_files_digest_in_every_run(root, tmp_path):
    """The declared fingerprint is what source_files() = sorted(glob) made (so
    declaring a source changes no key), and the same in another process."""
    expected = files_digest([p for p in sorted(Path(root).glob("*.txt")) if p.is_file()])
    ds = _open(root, tmp_path)
    assert ds.source_fingerprint() == expected
    assert DeclaredSource(str(root), "*.txt", None).digest() == expected
    code = (
        "import sys; from mlcache.data.sources import DeclaredSource; "
        "print(DeclaredSource(sys.argv[1], '*.txt', None).digest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected
    paths = [root / "2.txt", root / "0.txt"]
    assert DeclaredSource(None, None, paths).digest() == files_digest(paths)


def test_background_serves_the_old_pack_then_says_it_is_stale(root, tmp_path, caplog):
    """The stale pack is said by a CacheWarning, which a user sees without
    configuring logging (before: a log record only, which mlcache's NullHandler
    kept silent, while the docs promised a warning)."""
    _open(root, tmp_path, check_source="background")  # first open: checked at open
    assert len(BUILDS) == 1
    same = _open(root, tmp_path, check_source="background")
    _checked(same)
    assert not same.is_stale and len(BUILDS) == 1
    _edit(root / "2.txt", "note 2, edited")
    with (
        caplog.at_level(logging.WARNING, logger="mlcache"),
        pytest.warns(CacheWarning, match="source of Notes .* changed since its pack was built"),
    ):
        old = _open(root, tmp_path, check_source="background")
        assert len(BUILDS) == 1  # opened at once, the old pack
        assert old[2]["text"] == "note 2"
        _checked(old)
    assert old.is_stale
    assert any("source of Notes" in r.getMessage() for r in caplog.records)
    assert pickle.loads(pickle.dumps(old)).is_stale  # a worker gets it, not the thread
    new = _open(root, tmp_path, check_source="background")
    assert len(BUILDS) == 2 and new[2]["text"] == "note 2, edited"
    _checked(new)
    assert not new.is_stale


def test_never_trusts_the_pack_until_force_recache(root, tmp_path):
    _open(root, tmp_path, check_source="never")
    _edit(root / "0.txt", "note 0, edited")
    (root / "9.txt").write_text("note 9")
    for _ in range(2):
        ds = _open(root, tmp_path, check_source="never")
        assert len(BUILDS) == 1 and len(ds) == 5 and ds[0]["text"] == "note 0"
        assert not ds.is_stale
    ds = _open(root, tmp_path, check_source="never", force_recache=True)
    assert len(BUILDS) == 2 and len(ds) == 6 and ds[0]["text"] == "note 0, edited"
    # "open" sees the source as it is: the rebuilt pack
    assert _open(root, tmp_path)[5]["text"] == "note 9" and len(BUILDS) == 2


def test_never_without_its_pack_checks_at_open(root, tmp_path):
    _open(root, tmp_path, check_source="never")
    _edit(root / "0.txt", "note 0, edited")
    for pack in (tmp_path / "cache").rglob("*.pack"):
        pack.unlink()  # `mlcache clear`
    ds = _open(root, tmp_path, check_source="never")
    assert len(BUILDS) == 2 and ds[0]["text"] == "note 0, edited"


def test_user_source_files_still_work_with_background(tmp_path, root):
    class Mine(CachedDataset):
        def __init__(self, root, **kw):
            self.root = str(root)
            super().__init__(**kw)

        def source_files(self):
            return sorted(Path(self.root).glob("*.txt"))

        def load_source(self):
            BUILDS.append(1)
            for p in self.source_files():
                if p.is_file():
                    yield {"text": p.read_text()}

    def opened():
        return Mine(root, cache_dir=tmp_path / "c", progress=False, check_source="background")

    opened()
    _edit(root / "1.txt", "edited")
    with pytest.warns(CacheWarning, match="changed since its pack was built"):
        stale = opened()
        _checked(stale)
    assert stale.is_stale and len(BUILDS) == 1
    assert opened()[1]["text"] == "edited" and len(BUILDS) == 2


def test_bad_declarations_say_what_is_wrong(root, tmp_path):
    kw = {"cache_dir": tmp_path / "cache", "progress": False}
    with pytest.raises(ValueError, match="check_source must be one of"):
        _open(root, tmp_path, check_source="sometimes")
    with pytest.raises(ValueError, match="check_source must be one of"):
        _open(root, tmp_path, check_source=True)
    with pytest.raises(ValueError, match="source_glob"):
        Listed(source_dir=root, source_glob="*/x.txt", **kw)
    with pytest.raises(TypeError, match="one of the two"):
        Listed(source_dir=root, source_paths=[root / "1.txt"], **kw)
    with pytest.raises(TypeError, match="one of the two.*before calling super"):
        Listed(source_glob="*.txt", **kw)  # as when source_dir is set after super().__init__()
    with pytest.raises(TypeError, match="list of paths"):
        Listed(source_paths=str(root / "1.txt"), **kw)

    class Both(Notes):
        def source_files(self):
            return []

    with pytest.raises(TypeError, match="not both"):
        Both(root, source_dir=root, **kw)
    assert BUILDS == []


def test_a_class_with_its_own_source_files_keeps_its_attributes(root, tmp_path):
    """Attributes named source_dir or source_glob of a class that defines
    source_files() (written before declared sources) are its own, not a declaration."""

    class Older(CachedDataset):
        source_glob = "*.csv"

        def __init__(self, root, **kw):
            self.source_dir = str(root)
            super().__init__(**kw)

        def source_files(self):
            return [root / "1.txt"]

        def load_source(self):
            for p in self.source_files():
                yield {"text": p.read_text()}

    ds = Older(root, cache_dir=tmp_path / "cache", progress=False)
    assert _texts(ds) == ["note 1"]
    assert ds._declared is None  # its own attribute: no declaration of every *.csv
    # a folder attribute, so the folder's other files count with source_files()
    fingerprint = ds.source_fingerprint()
    assert fingerprint != files_digest([root / "1.txt"])
    (root / "3.txt").write_text("edited note")
    assert ds.source_fingerprint() != fingerprint


@pytest.mark.parametrize("pattern", ["*", "*.txt", "[13].txt", "?.txt", "*.t?t"])
def test_the_pattern_matches_as_pathlib_glob(root, pattern):
    (root / "2.TXT").write_text("another case")
    (root / ".hidden.txt").write_text("hidden")
    expected = [str(p) for p in sorted(root.glob(pattern)) if p.is_file()]
    assert DeclaredSource(root, pattern, None).files() == expected


def test_two_declared_folders_are_two_datasets(root, tmp_path):
    """The declaration is in the key: a build of one folder's dataset does not take
    the other's pack for an older version of itself."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("a")

    def opened(folder, **kw):
        cache = tmp_path / "cache"
        return Listed(source_dir=folder, source_glob="*.txt", cache_dir=cache, progress=False, **kw)

    first = opened(root)
    assert len(opened(other)) == 1
    long_ago = time.time() - 3600
    os.utime(first.pack_path, (long_ago, long_ago))
    opened(other, force_recache=True)  # a build removes the older versions of its key
    assert os.path.exists(first.pack_path)
    assert len(opened(root)) == 5 and len(BUILDS) == 3


def test_an_undeclared_dataset_is_keyed_by_its_attributes_only(root, tmp_path):
    class Plain(CachedDataset):
        def __init__(self, root, **kw):
            self.root = str(root)
            super().__init__(**kw)

        def source_files(self):
            return sorted(p for p in Path(self.root).glob("*.txt") if p.is_file())

        def load_source(self):
            for p in self.source_files():
                yield {"text": p.read_text()}

    Plain(root, cache_dir=tmp_path / "cache", progress=False)
    (args,) = (tmp_path / "cache").rglob(".*.args")
    assert set(json.loads(args.read_text())["attrs"]) == {"root"}
