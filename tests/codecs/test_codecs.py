"""codecs/: our codecs pass the shipped conformance suite
(:class:`mlcache.testing.codecs.CodecTests`), plus each codec's specifics."""

from __future__ import annotations

import collections
import enum
import fractions
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlcache import RegistryError, UnsupportedValue, register_codec
from mlcache.codecs import Encoded, codecs, select_codec
from mlcache.codecs.npy import NumpyCodec
from mlcache.codecs.pickle import PickleCodec
from mlcache.keys.hashing import hash_value
from mlcache.testing.codecs import CodecTests, read, write


# -- npy ----------------------------------------------------------------------------
class Thing:
    def __init__(self, x: Any) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return type(other) is Thing and hash_value(self.x) == hash_value(other.x)

    __hash__ = None  # type: ignore[assignment]


class Color(enum.IntEnum):
    RED = 1


class TestNpyCodec(CodecTests):
    codec = NumpyCodec()

    @staticmethod
    def samples() -> dict[str, Any]:
        grid = np.arange(24, dtype=np.float64).reshape(4, 6)
        return {
            "none": None,
            "bools": [True, False],
            "small-ints": [0, 1, -1, 2**53 - 1, -(2**53) + 1],
            "big-ints": [2**53, -(2**53), 2**63, -(2**64) - 7, 10**100],
            "floats": [0.0, -0.0, 1.5, 1e-310, float("inf"), float("-inf"), float("nan"), 0.1],
            "complex": [1 + 2j, complex(float("nan"), -0.0), complex(float("inf"), 1e-300)],
            "str": ["", "plain", "ünïcødé ✓", "\x00\n\t", "\ud800"],
            "bytes": [b"", b"\x00\xff" * 100, bytes(range(256))],
            "tuple-list": (1, [2, (3, [4, ()])], [], ((),)),
            "dict-nonstr-keys": {
                1: "int",
                2.5: "float",
                (1, "a"): "tuple",
                None: "none",
                b"k": "bytes",
                "s": {"nested": {-1: [None]}},
                False: "bool",
                np.int64(7): "np int",
            },
            "dict-order": {"z": 1, "a": 2, "m": 3},
            "np-scalars": [
                np.float32(1.5),
                np.float64(-0.0),
                np.int8(-3),
                np.uint64(2**64 - 1),
                np.bool_(True),
                np.complex64(1 - 1j),
                np.float16(0.5),
                np.datetime64("2020-01-02T03:04"),
                np.timedelta64(5, "ms"),
                np.str_("np string"),
                np.bytes_(b"np bytes"),
            ],
            "array-c": grid,
            "array-f": np.asfortranarray(grid),
            "array-f-3d": np.asfortranarray(np.arange(60, dtype=np.int16).reshape(3, 4, 5)),
            "array-non-contiguous": grid[::2, 1::2],
            "array-reversed": np.arange(10)[::-1],
            "array-0d": np.array(3.25),
            "array-empty": np.empty((0, 3), dtype=np.int32),
            "array-empty-f": np.empty((3, 0), order="F"),
            "array-nan": np.array([np.nan, -np.inf, -0.0, 1.0]),
            "array-kinds": [
                np.array([True, False]),
                np.arange(5, dtype=">i4"),
                np.array(["ab", "cde"]),
                np.array([b"ab", b"c"]),
                np.arange(3).astype("datetime64[D]"),
                np.arange(4, dtype=np.complex128),
                np.arange(4, dtype=np.float16),
                np.zeros(3, dtype="V4"),
            ],
            "mixed": {"x": np.arange(3), "meta": (3, "x", None), "ys": [np.ones((2, 2))]},
            "shared-array": [grid, grid],
            "deep": [[[[[[[[[[1]]]]]]]]]],
        }

    @staticmethod
    def array_sample() -> Any:
        return {"a": np.arange(100.0), "b": [np.ones((3, 4), dtype=np.int32), np.array(7)]}

    def test_is_safe(self):
        assert self.codec.safe is True and self.codec.name == "npy"

    @staticmethod
    def refused() -> dict[str, Any]:
        values = [
            np.array([1, "a"], dtype=object),
            [1, np.array([None], dtype=object)],
            np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
            np.ma.array([1, 2], mask=[0, 1]),
            collections.Counter(a=1),  # (OrderedDict is a leaf: codecs/ordered.py)
            collections.defaultdict(int),
            {1, 2},
            frozenset({1}),
            {"a": {1, 2}},
            Thing(1),
            Color.RED,
            fractions.Fraction(1, 3),
            type("MyStr", (str,), {})("x"),
            type("MyList", (list,), {})([1]),
            np.float64,
            range(3),
            bytearray(b"x"),
            memoryview(b"x"),
            np.zeros(1, dtype=[("a", "u1")])[0],
        ]
        return {f"{i}-{type(v).__name__}": v for i, v in enumerate(values)}

    def test_refuses_self_reference_and_too_deep_nesting_without_crashing(self):
        loop: list[Any] = [1]
        loop.append(loop)
        assert self.codec.can_encode(loop) is False
        deep: list[Any] = []
        for _ in range(500):
            deep = [deep]
        assert self.codec.can_encode(deep) is False

    def test_mapped_arrays_are_memmaps_with_their_order(self, tmp_path):
        path = tmp_path / "entry"
        f = np.asfortranarray(np.arange(12.0).reshape(3, 4))
        write(self.codec, {"f": f, "c": np.ascontiguousarray(f)}, path)
        out = read(self.codec, path, "r")
        assert isinstance(out["f"], np.memmap) and isinstance(out["c"], np.memmap)
        assert out["f"].flags.f_contiguous and not out["f"].flags.c_contiguous
        assert out["c"].flags.c_contiguous
        assert out["f"].mode == "r" and Path(out["f"].filename) == path.resolve()

    def test_not_mapped_arrays_are_plain_ndarrays(self, tmp_path):
        path = tmp_path / "entry"
        write(self.codec, np.arange(5), path)
        assert type(read(self.codec, path, None)) is np.ndarray


# -- pickle -------------------------------------------------------------------------
def fitted_estimator():
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    x = rng.random((50, 4))
    return LinearRegression().fit(x, x @ [1.0, 2.0, 3.0, 4.0] + 0.5)


class TestPickleCodec(CodecTests):
    codec = PickleCodec()

    @staticmethod
    def samples() -> dict[str, Any]:
        return {
            "plain": {"a": [1, 2.5, None], "b": (b"x", "y")},
            "ordered-dict": collections.OrderedDict([("b", 1), ("a", np.arange(3))]),
            "sets": [{1, 2}, frozenset({"a"})],
            "user-object": Thing([np.arange(4), {"k": (1, 2)}]),
            "enum": Color.RED,
            "fraction": fractions.Fraction(2, 3),
            "object-array": [np.array([1, "a", None], dtype=object)],
            "structured-array": [np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])],
            "f-array": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
            "non-contiguous-array": np.arange(20)[::3],
            "floats": [float("nan"), -0.0, float("inf")],
            "big": np.arange(200_000, dtype=np.int64),
        }

    @staticmethod
    def array_sample() -> Any:
        return fitted_estimator()

    @staticmethod
    def arrays_of(value: Any) -> list[np.ndarray]:
        return [value.coef_]

    def test_is_not_safe(self):
        assert self.codec.safe is False and self.codec.name == "pickle"

    def test_claims_anything(self):
        assert self.codec.can_encode(object()) is True

    def test_arrays_are_stored_out_of_band(self):
        big = np.arange(100_000, dtype=np.float64)
        encoded = self.codec.encode({"big": big})
        assert encoded.layout == {"oob": 1}
        assert len(encoded.segments[0]) < 1000  # the pickle stream holds no array data
        assert memoryview(encoded.segments[1]).nbytes == big.nbytes

    def test_sklearn_estimator_round_trip(self, tmp_path):
        est = fitted_estimator()
        path = tmp_path / "entry"
        write(self.codec, est, path)
        for mode in (None, "r"):
            out = read(self.codec, path, mode)
            assert type(out) is type(est)
            assert out.get_params() == est.get_params()
            np.testing.assert_array_equal(out.coef_, est.coef_)
            x = np.ones((2, 4))
            np.testing.assert_array_equal(out.predict(x), est.predict(x))


# -- selection and registration -------------------------------------------------------
@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(codecs, "_entries", dict(codecs._entries))


def test_select_codec_prefers_the_safe_codec():
    assert select_codec(np.arange(3), allow_pickle=True).name == "npy"
    assert select_codec({"a": [1, (2, None)]}, allow_pickle=False).name == "npy"
    assert select_codec(collections.Counter(), allow_pickle=True).name == "pickle"
    assert select_codec(Thing(1), allow_pickle=True).name == "pickle"


def test_a_step_returning_part_of_a_mapped_input_is_stored_without_pickle(tmp_path):
    """A memoized step of a mapped pipeline that returns arrays of its input (each
    a numpy.memmap) is stored as arrays: before, only pickle could store it, so
    with allow_pickle=False it was never stored and warned of a dict at every
    call."""
    from mlcache import Memory

    calls = []

    def load(n):
        return {"X": np.arange(n, dtype=np.float64), "y": np.ones(n)}

    def select(d):
        calls.append(1)
        return {"X": d["X"], "y": d["y"][:5]}

    mem = Memory(tmp_path, verbose=0, mmap_mode="r", allow_pickle=False)
    data = mem.cache(load)(100)
    assert type(data["X"]) is np.memmap
    assert select_codec(select(data), allow_pickle=False).name == "npy"
    step = mem.cache(select)
    step(data)
    hit = step(data)
    assert len(calls) == 2  # one computation, one hit
    np.testing.assert_array_equal(hit["X"], np.arange(100.0))
    np.testing.assert_array_equal(hit["y"], np.ones(5))
    assert (
        select_codec(
            np.memmap(tmp_path / "m", np.float32, "w+", shape=(3,)), allow_pickle=False
        ).name
        == "npy"
    )


def test_a_result_refused_pickle_is_named_by_the_part_that_needs_it(tmp_path):
    """With allow_pickle=False, the warning of an unstored result names the part
    that needs pickle, by its place, not only the container around it (before:
    "a value of type builtins.dict needs pickle")."""
    from mlcache import CacheWarning, Memory

    def fit(n):
        return {"weights": np.ones(n), "extra": [1, {"vocab": collections.Counter(a=n)}]}

    f = Memory(tmp_path, verbose=0, allow_pickle=False).cache(fit)
    with pytest.warns(CacheWarning, match=r"\['extra'\]\[1\]\['vocab'\]: collections\.Counter"):
        assert f(2)["extra"][1]["vocab"] == collections.Counter(a=2)
    with pytest.raises(UnsupportedValue, match=r"\(\[1\]: a list held twice\)"):
        shared: list[Any] = [1]
        select_codec(([shared], shared), allow_pickle=False)


def test_a_result_holding_one_list_or_dict_twice_keeps_the_sharing(tmp_path):
    """A cached result that holds one list or dict in two places comes back holding
    one object there, as the function returned it (and as joblib's pickle keeps
    it): an edit of one shows in the other (before: two copies, [1] for [1, 2])."""
    from mlcache import Memory

    def shared(n):
        log, cfg = [n], {"lr": 0.1}
        return {"train": (log, cfg), "all": [log, {"cfg": cfg}]}

    mem = Memory(tmp_path, verbose=0)
    f = mem.cache(shared)
    f(1)
    hit = f(1)
    assert f.check_call_in_cache(1)
    hit["train"][0].append(2)
    hit["train"][1]["lr"] = 0.5
    assert hit["all"][0] == [1, 2] and hit["all"][1]["cfg"] == {"lr": 0.5}
    assert select_codec(shared(1), allow_pickle=True).name == "pickle"
    looped: list[Any] = [1]
    looped.append(looped)
    assert select_codec(looped, allow_pickle=True).name == "pickle"
    assert select_codec({"a": [1], "b": [1]}, allow_pickle=False).name == "npy"  # equal, not one
    assert select_codec((np.zeros(2),) * 2, allow_pickle=False).name == "npy"


@pytest.mark.parametrize(
    ("value", "typename"),
    [
        (collections.Counter(a=1), "collections.Counter"),
        (Thing(1), "Thing"),
        (np.array([None], dtype=object), "numpy.ndarray"),
    ],
)
def test_select_codec_without_pickle_names_the_type(value, typename):
    with pytest.raises(UnsupportedValue, match=typename) as info:
        select_codec(value, allow_pickle=False)
    assert isinstance(info.value, TypeError)
    assert "allow_pickle" in str(info.value)


class FractionCodec:
    """A user codec: fractions as two ints, safe."""

    name = "fraction"
    safe = True

    def can_encode(self, value: Any) -> bool:
        return type(value) is fractions.Fraction

    def encode(self, value: Any) -> Encoded:
        return Encoded({"n": str(value.numerator), "d": str(value.denominator)}, [])

    def decode(self, layout: dict[str, Any], segments: Any) -> Any:
        return fractions.Fraction(int(layout["n"]), int(layout["d"]))


def test_a_registered_safe_codec_is_selected_before_pickle(scratch_registry, tmp_path):
    value = fractions.Fraction(22, 7)
    assert select_codec(value, allow_pickle=True).name == "pickle"
    register_codec(FractionCodec())
    codec = select_codec(value, allow_pickle=False)
    assert codec.name == "fraction"
    write(codec, value, tmp_path / "entry")
    assert read(codec, tmp_path / "entry") == value
    assert select_codec(np.arange(3), allow_pickle=True).name == "npy"  # order kept
    with pytest.raises(RegistryError, match="already registered"):
        register_codec(FractionCodec())
    register_codec(FractionCodec(), replace=True)


def test_registration_is_undone_by_the_fixture():
    assert "fraction" not in codecs


# -- the kit, as a codec author uses it ------------------------------------------------
class TestAUserCodecThroughTheKit(CodecTests):
    """A codec written outside mlcache runs the same suite (registered for the test)."""

    codec = FractionCodec()

    @pytest.fixture(autouse=True)
    def registered(self, scratch_registry):
        register_codec(self.codec)

    def samples(self) -> dict[str, Any]:
        return {"third": fractions.Fraction(1, 3), "big": fractions.Fraction(-(10**30), 7)}

    def refused(self) -> dict[str, Any]:
        return {"float": 0.5, "int": 3, "str": "1/3"}


class LossyCodec(FractionCodec):
    """Claims fractions, stores them as floats: what the kit exists to catch."""

    def encode(self, value: Any) -> Encoded:
        return Encoded({"x": float(value)}, [])

    def decode(self, layout: dict[str, Any], segments: Any) -> Any:
        return fractions.Fraction(layout["x"])

    def can_encode(self, value: Any) -> bool:
        return type(value) in (fractions.Fraction, float)


def test_the_kit_fails_a_codec_that_loses_data_or_claims_too_much(tmp_path):
    class Suite(TestAUserCodecThroughTheKit):
        codec = LossyCodec()

    suite, third = Suite(), fractions.Fraction(1, 3)
    with pytest.raises(AssertionError, match="Fraction"):
        suite.test_round_trip(third, None, tmp_path)
    with pytest.raises(AssertionError, match="claims"):
        suite.test_refuses_what_it_cannot_fully_represent()
    suite.test_round_trip(fractions.Fraction(1, 2), None, tmp_path)  # exact in a float


class NoMethods:
    name = "nomethods"
    safe = True


@pytest.mark.parametrize(
    "bad",
    [object(), NoMethods(), FractionCodec, 42, "npy"],
    ids=["object", "no-methods", "a-class-not-an-instance", "int", "str"],
)
def test_register_codec_rejects_non_codecs(bad, scratch_registry):
    with pytest.raises(RegistryError):
        register_codec(bad)


def test_register_codec_rejects_bad_names(scratch_registry):
    for name in ("", "Upper", "has space", "1digit", "a/b"):
        codec = FractionCodec()
        codec.name = name
        with pytest.raises(RegistryError, match="invalid codec name"):
            register_codec(codec)


def test_unknown_codec_name_is_a_registry_error():
    with pytest.raises(RegistryError, match="unknown codec 'nope'.*npy"):
        codecs["nope"]


def test_an_entry_of_a_codec_this_process_lacks_is_unknown_not_corrupted(
    scratch_registry, tmp_path, monkeypatch
):
    from mlcache.entry import EntryReader, decode
    from mlcache.errors import EntryCorrupted, UnknownFormat

    register_codec(FractionCodec())
    path = tmp_path / "entry"
    write(codecs["fraction"], fractions.Fraction(1, 3), path)
    monkeypatch.setattr(
        codecs, "_entries", {k: v for k, v in codecs._entries.items() if k != "fraction"}
    )
    with pytest.raises(UnknownFormat, match="register_codec") as got:
        decode(EntryReader(str(path)), allow_pickle=False)
    assert not isinstance(got.value, EntryCorrupted)  # not damaged: others can read it
