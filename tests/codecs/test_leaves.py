"""codecs/leaves: typed values inside the npy tree, found by their exact type's name."""

from __future__ import annotations

import fractions
import json
from pathlib import Path
from typing import Any

import pytest

from mlcache import InvalidRegistration, UnknownFormat
from mlcache.codecs import codecs, leaves, register_leaf
from mlcache.codecs.leaves import leaf_for
from mlcache.entry import EntryReader, decode
from mlcache.testing.codecs import MemorySegments, read, write


class Ratio(fractions.Fraction):
    """A type of this test's own (a leaf for a real type would leak into other tests)."""


class FractionLeaf:
    """A test leaf: a Ratio as two decimal strings, the denominator a segment."""

    name = "test.Ratio"
    types: tuple[str, ...] = (f"{Ratio.__module__}.{Ratio.__qualname__}",)

    def can_encode(self, value: Any) -> bool:
        return value.denominator != 7  # a value it "cannot represent", for the tests

    def encode(self, value: Any, add: Any) -> dict[str, Any]:
        # keys that the tree itself uses ("f", "d", "a") must not confuse it
        return {"f": str(value.numerator), "d": add(str(value.denominator).encode())}

    def decode(self, node: dict[str, Any], segments: Any) -> Any:
        return Ratio(int(node["f"]), int(bytes(segments.buffer(node["d"]))))


register_leaf(FractionLeaf(), replace=True)
npy = codecs["npy"]


def test_a_tree_of_leaves_round_trips(tmp_path: Path) -> None:
    value = {"a": [Ratio(1, 3), (Ratio(-5, 2), 1.5)], "b": None}
    assert npy.can_encode(value)
    encoded = npy.encode(value)
    assert json.loads(json.dumps(encoded.layout)) == encoded.layout
    assert encoded.layout["tree"]["d"][0][1][0] == {"x": "test.Ratio", "f": "1", "d": 0}
    for got in (
        npy.decode(encoded.layout, MemorySegments(encoded)),
        (write(npy, value, tmp_path / "e"), read(npy, tmp_path / "e", "r"))[1],
    ):
        assert got == value and type(got["a"][0]) is Ratio


def test_the_leaf_decides_and_a_refused_part_refuses_the_tree() -> None:
    assert not npy.can_encode([1, Ratio(1, 7)])
    assert not npy.can_encode(decimal_like())  # no leaf for the type


def decimal_like() -> Any:
    import decimal

    return decimal.Decimal("1.5")


def test_subclasses_are_other_types() -> None:
    class MyRatio(Ratio):
        pass

    assert leaf_for(Ratio) is leaves["test.Ratio"]
    assert leaf_for(MyRatio) is None and leaf_for(fractions.Fraction) is None
    assert not npy.can_encode(MyRatio(1, 2))
    assert not npy.can_encode(fractions.Fraction(1, 2))


def test_an_unregistered_leaf_is_an_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "e"
    write(npy, [Ratio(1, 3)], path)
    reader = _reader_with_layout(path, {"tree": [{"x": "test.Missing", "f": "1", "d": 0}]})
    with pytest.raises(UnknownFormat, match="test.Missing"):
        decode(reader, allow_pickle=False)  # type: ignore[arg-type]


def _reader_with_layout(path: Path, layout: dict[str, Any]) -> Any:
    reader = EntryReader(str(path))

    class Forged:
        codec = reader.codec
        codec_layout = layout
        path = reader.path

        def __len__(self) -> int:
            return len(reader)

        def buffer(self, index: int) -> memoryview:
            return reader.buffer(index)

        def array(self, *args: Any) -> Any:
            return reader.array(*args)

    return Forged()


SCRIPT = """
import fractions, os, warnings
import mlcache
from mlcache.codecs import register_leaf

class FractionLeaf:
    name = "script.Fraction"
    types: tuple[str, ...] = ("fractions.Fraction",)
    def can_encode(self, value):
        return True
    def encode(self, value, add):
        return {"n": str(value.numerator), "d": str(value.denominator)}
    def decode(self, node, segments):
        return fractions.Fraction(int(node["n"]), int(node["d"]))

if os.environ.get("REGISTER"):
    register_leaf(FractionLeaf())
mem = mlcache.Memory(os.environ["CACHE"], verbose=0, allow_pickle=False)

@mem.cache
def f(x):
    with open(os.environ["LOG"], "a") as log:
        log.write("computed\\n")
    return {"third": fractions.Fraction(x, 3)}

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(int(os.environ.get("CALLS", "1"))):
        assert f(1) == {"third": fractions.Fraction(1, 3)}
for w in caught:
    print("WARNING", w.message)
"""


def test_memory_keeps_an_entry_whose_leaf_this_process_lacks(tmp_path: Path) -> None:
    from tests.scripts import ScriptFolder

    folder = ScriptFolder(tmp_path)
    folder.write("run.py", SCRIPT)
    first = folder.execute("run.py", env={"REGISTER": "1"})
    assert folder.log.read_text() == "computed\n" and "WARNING" not in first.stdout
    # another process without the leaf: computed again (and not stored: the value
    # needs pickle there), with one warning saying which leaf it lacks
    second = folder.execute("run.py")
    assert folder.log.read_text() == "computed\n"
    warned = [line for line in second.stdout.splitlines() if "not registered" in line]
    assert warned and "'script.Fraction'" in warned[0], second.stdout


def test_the_memory_tier_keeps_an_entry_whose_leaf_this_process_lacks(tmp_path: Path) -> None:
    """Read again and again without the leaf (the in-process tier keeps an entry at
    its second read): each read is a miss, and the entry stays for the processes
    that have the leaf."""
    from tests.scripts import ScriptFolder

    folder = ScriptFolder(tmp_path)
    folder.write("run.py", SCRIPT)
    folder.execute("run.py", env={"REGISTER": "1"})
    entries = sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file())
    folder.execute("run.py", env={"CALLS": "4"})
    assert sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file()) >= entries
    folder.execute("run.py", env={"REGISTER": "1", "CALLS": "2"})
    assert not folder.log.exists()  # a hit: the entry was kept


def test_registration_is_checked() -> None:
    with pytest.raises(InvalidRegistration):
        register_leaf(FractionLeaf)  # type: ignore[arg-type]  # a class, not an instance
    with pytest.raises(InvalidRegistration):
        register_leaf(object())  # type: ignore[arg-type]

    class Clash(FractionLeaf):
        name = "test.Other"

    with pytest.raises(InvalidRegistration, match="handled by the leaf 'test.Ratio'"):
        register_leaf(Clash())
    with pytest.raises(InvalidRegistration, match="invalid leaf name"):

        class Bad(FractionLeaf):
            name = "no spaces allowed"

        register_leaf(Bad())


class Ratio2(fractions.Fraction):
    """Another type of this test's own, for a leaf with a second layout."""


class TwoLayouts:
    """Stores a Ratio2 with denominator 1 in the first layout, others under its other
    name (a later layout that older readers must not read)."""

    name = "test.Ratio2"
    types: tuple[str, ...] = (f"{Ratio2.__module__}.{Ratio2.__qualname__}",)

    def can_encode(self, value: Any) -> bool:
        return True

    def encode(self, value: Any, add: Any) -> dict[str, Any]:
        if value.denominator == 1:
            return {"n": str(value.numerator)}
        return {"x": "test.Ratio2.v2", "n": str(value.numerator), "d": str(value.denominator)}

    def decode(self, node: dict[str, Any], segments: Any) -> Any:
        d = int(node["d"]) if node["x"] == "test.Ratio2.v2" else 1
        return Ratio2(int(node["n"]), d)


def test_a_leaf_stores_a_later_layout_under_another_name(tmp_path: Path) -> None:
    """Readers that know only the first name miss (UnknownFormat, the entry kept)
    on the later layout and still read the first."""
    leaf = TwoLayouts()
    register_leaf(leaf, replace=True, also=("test.Ratio2.v2",))
    value = [Ratio2(3), Ratio2(1, 3)]
    tree = npy.encode(value).layout["tree"]
    assert [n["x"] for n in tree] == ["test.Ratio2", "test.Ratio2.v2"]
    write(npy, value, tmp_path / "e")
    assert read(npy, tmp_path / "e", None) == value
    register_leaf(leaf, replace=True)  # a reader before the second layout
    with pytest.raises(UnknownFormat, match="test.Ratio2.v2"):
        read(npy, tmp_path / "e", None)
    with pytest.raises(ValueError, match="the key 'x'"):  # a name it did not register
        npy.encode(value)
    write(npy, [Ratio2(5)], tmp_path / "first")
    assert read(npy, tmp_path / "first", None) == [Ratio2(5)]
    with pytest.raises(InvalidRegistration, match="is taken"):
        register_leaf(leaf, replace=True, also=("test.Ratio",))  # another leaf's name
    register_leaf(leaf, replace=True, also=("test.Ratio2.v2",))
    with pytest.raises(InvalidRegistration, match="is taken"):

        class Other(FractionLeaf):
            name = "test.Other2"
            types = ("test.NoSuchType",)

        register_leaf(Other(), also=("test.Ratio2.v2",))  # another leaf's other name
