"""codecs/tensors: torch tensors as leaves of the npy tree, every dtype, never pickled."""

from __future__ import annotations

import collections
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from mlcache import Memory  # noqa: E402
from mlcache.codecs import codecs, leaves  # noqa: E402
from mlcache.codecs.tensors import TensorLeaf  # noqa: E402
from mlcache.entry import EntryReader  # noqa: E402
from mlcache.testing.codecs import MemorySegments, read, write  # noqa: E402

npy = codecs["npy"]
leaf = leaves["torch.Tensor"]

#: every dtype the leaf stores (torch 2.13): the numpy ones and the others
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def bits(t: Any) -> bytes:
    """The tensor's elements as bytes (equal bits: NaN payloads, -0.0)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def assert_same_tensor(got: Any, want: Any) -> None:
    """Equal means equal: type, dtype, shape, device, requires_grad, bits."""
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.requires_grad == want.requires_grad
    assert got.device == want.device
    if want.device.type != "meta":
        assert bits(got) == bits(want)


def random_tensor(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> Any:
    """Random bits of ``dtype`` (NaNs and infinities included for floats)."""
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dtype == torch.bool:
        raw = raw & 1
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ComplexHalf support is experimental")
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


def through_leaf(value: Any) -> tuple[Any, dict[str, Any], list[Any]]:
    """``value`` encoded by the leaf and decoded from in-memory segments."""
    segments: list[Any] = []

    def add(segment: Any) -> int:
        segments.append(segment)
        return len(segments) - 1

    assert leaf.can_encode(value) is True
    node = json.loads(json.dumps(leaf.encode(value, add)))
    from mlcache.codecs import Encoded

    return leaf.decode(node, MemorySegments(Encoded({}, segments))), node, segments


def test_is_registered_and_does_not_import_torch_until_needed() -> None:
    assert isinstance(leaf, TensorLeaf)
    code = "import sys, mlcache; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (2, 3, 5)], ids=str)
def test_every_dtype_round_trips_bit_for_bit(dtype: Any, shape: tuple[int, ...]) -> None:
    t = random_tensor(dtype, shape)
    got, node, segments = through_leaf(t)
    assert_same_tensor(got, t)
    assert node["dtype"] == str(dtype).removeprefix("torch.")
    assert "device" not in node and "grad" not in node
    assert sum(memoryview(s).nbytes for s in segments) == t.numel() * dtype.itemsize


@pytest.mark.parametrize("mmap_mode", [None, "r", "c", "r+"])
def test_a_dict_of_tensors_round_trips_through_an_entry(
    mmap_mode: str | None, tmp_path: Path
) -> None:
    value = {f"{d}": random_tensor(d, (4, 3), seed=i) for i, d in enumerate(DTYPES)}
    value["nested"] = [(random_tensor(torch.float32, (2,)), np.arange(3)), "text"]
    write(npy, value, tmp_path / "e")
    got = read(npy, tmp_path / "e", mmap_mode)
    assert list(got) == list(value)
    for k in DTYPES:
        assert_same_tensor(got[str(k)], value[str(k)])
    assert_same_tensor(got["nested"][0][0], value["nested"][0][0])
    assert np.array_equal(got["nested"][0][1], np.arange(3)) and got["nested"][1] == "text"


def test_views_and_non_contiguous_tensors_store_only_their_elements() -> None:
    big = torch.arange(10_000, dtype=torch.float64)
    for t in (big[100:110], big.reshape(100, 100)[:, 3], big.reshape(100, 100).t()[:5, :7]):
        got, _, segments = through_leaf(t)
        assert torch.equal(got, t) and got.is_contiguous()
        assert sum(memoryview(s).nbytes for s in segments) == t.numel() * 8
    conj = torch.tensor([1 + 2j, 3 - 4j]).conj()  # a conjugate view: its values are stored
    got, _, _ = through_leaf(conj)
    assert torch.equal(got, conj) and not got.is_conj()
    neg = torch.tensor([1 + 2j]).conj().imag  # a negative-bit view
    got, _, _ = through_leaf(neg)
    assert torch.equal(got, neg) and not got.is_neg()


def test_requires_grad_and_parameters_are_kept() -> None:
    w = torch.randn(3, 2, requires_grad=True)
    y = w * 2  # has a grad_fn: comes back as a leaf tensor that requires grad
    for t in (w, y):
        got, node, _ = through_leaf(t)
        assert node["grad"] is True and got.requires_grad and got.grad_fn is None
        assert torch.equal(got.detach(), t.detach())
    for p in (torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(2), False)):
        got, _, _ = through_leaf(p)
        assert_same_tensor(got, p)


def test_meta_tensors_keep_their_device_and_have_no_data() -> None:
    t = torch.empty(5, 6, dtype=torch.bfloat16, device="meta")
    got, node, segments = through_leaf(t)
    assert node["device"] == "meta" and "seg" not in node and segments == []
    assert_same_tensor(got, t)


def test_a_tensor_from_a_device_this_process_lacks_comes_back_on_the_cpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # what a CUDA tensor's node holds (the data copied to the CPU, the device noted);
    # no GPU here, so the node is made from a CPU tensor's with the device added
    t = random_tensor(torch.float32, (3, 3))
    segments: list[Any] = []
    node = leaf.encode(t, lambda s: segments.append(s) or len(segments) - 1)
    node["device"] = "cuda:7"
    from mlcache.codecs import Encoded

    with caplog.at_level(logging.INFO, logger="mlcache"):
        got = [leaf.decode(node, MemorySegments(Encoded({}, segments))) for _ in range(3)]
    for g in got:
        assert g.device.type == "cpu" and bits(g) == bits(t)
    said = [r for r in caplog.records if "cuda:7" in r.getMessage()]
    assert len(said) <= 1  # once per process and device (maybe already said)


def test_mapped_tensors_are_views_of_the_file_except_read_only(tmp_path: Path) -> None:
    t = random_tensor(torch.float32, (256, 64))
    b = random_tensor(torch.bfloat16, (1000,))
    path = tmp_path / "e"
    write(npy, {"w": t, "b": b}, path)
    before = path.read_bytes()
    for mode in ("c", "r+"):
        reader = EntryReader(str(path), mode)
        got = npy.decode(reader.codec_layout, reader)
        for key, seg in (("w", 0), ("b", 1)):
            size = got[key].numel() * got[key].element_size()
            mapped = reader.array(seg, np.dtype(np.uint8), (size,), "C")
            assert got[key].data_ptr() == mapped.ctypes.data, f"{mode}: {key} is a copy"
        if mode == "c":
            got["w"][0, 0] = 123.0  # private: the file is not changed
            assert path.read_bytes() == before
    # read-only map: torch has no read-only tensors, so a copy (writable, no warning)
    reader = EntryReader(str(path), "r")
    got = npy.decode(reader.codec_layout, reader)
    mapped = reader.array(0, np.dtype(np.float32), tuple(t.shape), "C")
    assert got["w"].data_ptr() != mapped.ctypes.data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got["w"].add_(1)
    assert bits(read(npy, path, None)["w"]) == bits(t)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor([1.0, 2.0]).to_sparse(),  # sparse layout
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),  # nested
        lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8),  # quantized
    ],
    ids=["sparse", "nested", "quantized"],
)
def test_refuses_what_it_cannot_fully_represent(make: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested/quantized are "prototype"/deprecated
        t = make()
    assert leaf.can_encode(t) is False
    assert npy.can_encode({"t": t}) is False


def test_refuses_subclasses_and_tensors_with_attributes() -> None:
    class Mine(torch.Tensor):
        pass

    assert not npy.can_encode(torch.ones(2).as_subclass(Mine))
    t = torch.ones(2)
    t.note = "mine"  # would be lost
    assert not npy.can_encode(t)


class Forged:
    """An entry reader whose layout was replaced (a damaged entry whose checksums
    were forged to match)."""

    def __init__(self, reader: EntryReader, layout: dict[str, Any]) -> None:
        self.codec, self.codec_layout, self.path = reader.codec, layout, reader.path
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def buffer(self, index: int) -> memoryview:
        return self.reader.buffer(index)

    def array(self, index: int, dtype: np.dtype, shape: tuple[int, ...], order: str) -> Any:
        return self.reader.array(index, dtype, shape, order)


def test_a_damaged_node_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    from mlcache.entry import decode
    from mlcache.errors import EntryCorrupted

    path = tmp_path / "e"
    write(npy, [random_tensor(torch.bfloat16, (4, 4))], path)
    reader = EntryReader(str(path))
    good = reader.codec_layout
    for key, bad in [
        ("dtype", "object"),
        ("dtype", 3),
        ("dtype", "qint8"),
        ("shape", [4, -4]),
        ("shape", [5, 5]),
        ("shape", "x"),
        ("seg", 9),
        ("device", 1),
        ("grad", "yes"),
    ]:
        node = dict(good["tree"][0], **{key: bad})
        forged = Forged(reader, {"tree": [node]})
        with pytest.raises(EntryCorrupted):
            decode(forged, allow_pickle=False)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), max_size=4).map(tuple),
    seed=st.integers(0, 2**32 - 1),
    transpose=st.booleans(),
)
def test_any_tensor_round_trips(
    dtype: Any, shape: tuple[int, ...], seed: int, transpose: bool
) -> None:
    t = random_tensor(dtype, shape, seed)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, -1)
    got, _, _ = through_leaf(t)
    assert_same_tensor(got, t)


def test_a_state_dict_through_memory_without_pickle(tmp_path: Path) -> None:
    mem = Memory(tmp_path, verbose=0, allow_pickle=False)
    runs = []

    @mem.cache
    def train(width: int) -> dict[str, Any]:
        runs.append(width)
        torch.manual_seed(width)
        model = torch.nn.Sequential(torch.nn.Linear(width, 4), torch.nn.BatchNorm1d(4))
        model.to(torch.bfloat16)
        return dict(model.state_dict())

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: no "not stored" warning
        first = train(8)
        again = train(8)
    assert runs == [8]  # the hit did not run the body
    assert list(again) == list(first)
    for k in first:
        assert_same_tensor(again[k], first[k])
    entries = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and len(p.name) == 32 and all(c in "0123456789abcdef" for c in p.name)
    ]
    assert len(entries) == 1
    assert EntryReader(str(entries[0])).codec == "npy"  # no pickle in the entry


# -- storages: tied tensors, views, memory formats ------------------------------------------
class Tied(torch.nn.Module):
    """A language-model head tied to its embedding (one Parameter, two names)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


def shares(a: Any, b: Any) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_tied_state_dict_through_memory_loads_a_tied_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored here, read in a fresh process (a user's next run): the model loaded
    from it is tied, as with torch.save or joblib."""
    from tests.scripts import ScriptFolder

    folder = ScriptFolder(tmp_path)
    folder.write(
        "tiedmodel.py",
        """
        import os, torch
        from mlcache import Memory

        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 4)
                self.head = torch.nn.Linear(4, 10, bias=False)
                self.head.weight = self.emb.weight

        mem = Memory(os.environ["CACHE"], verbose=0, allow_pickle=False)

        @mem.cache
        def train(seed):
            with open(os.environ["LOG"], "a") as f:
                f.write("computed\\n")
            torch.manual_seed(seed)
            return Tied().state_dict()
        """,
    )
    folder.write(
        "load.py",
        """
        import torch
        from tiedmodel import Tied, train

        model = Tied()
        model.load_state_dict(train(0), assign=True)
        with torch.no_grad():
            model.emb.weight[0, 0] = 123.0  # a tied model: the head sees it
            print(float(model.head.weight[0, 0]))
        """,
    )
    monkeypatch.setenv("CACHE", str(folder.cache))
    monkeypatch.setenv("LOG", str(folder.log))
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiedmodel  # type: ignore[import-not-found]

    sys.modules.pop("tiedmodel")  # (another test's folder would be another module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored: no "not stored" warning
        want = tiedmodel.train(0)
    assert shares(want["emb.weight"], want["head.weight"])
    assert folder.log.read_text() == "computed\n"
    out = folder.execute("load.py")
    assert not folder.log.exists()  # a hit, stored without pickle
    assert out.stdout.split() == ["123.0"]


@pytest.mark.parametrize("mmap_mode", [None, "r", "c", "r+"])
def test_views_of_one_storage_keep_sharing_it(mmap_mode: str | None, tmp_path: Path) -> None:
    base = random_tensor(torch.float32, (6, 5))
    sd = Tied().state_dict()
    value = {
        "sd": sd,
        "base": base,
        "row": base[2],  # offset 10
        "t": base.t(),  # strides (1, 5)
        "cols": base[1:, ::2],  # gaps: offset 5, strides (5, 2)
        "bytes": base.view(torch.uint8)[3:],  # another dtype over the same bytes
        "same": [base, base],
    }
    encoded = npy.encode(value)
    stored = sum(memoryview(s).nbytes for s in encoded.segments)
    assert stored == base.nbytes + sd["emb.weight"].nbytes  # each storage once
    write(npy, value, tmp_path / "e")
    got = read(npy, tmp_path / "e", mmap_mode)
    assert shares(got["sd"]["emb.weight"], got["sd"]["head.weight"])
    for name in ("base", "row", "t", "cols", "bytes"):
        want = value[name]
        assert_same_tensor(got[name], want)
        assert shares(got[name], got["base"]), name
        assert got[name].stride() == want.stride(), name
        assert got[name].storage_offset() == want.storage_offset(), name
    assert shares(got["same"][0], got["same"][1]) and shares(got["same"][0], got["base"])
    got["base"][2, 0] = -1.0  # one storage: every view sees the write
    assert got["row"][0] == -1.0 and got["t"][0, 2] == -1.0 and got["same"][1][2, 0] == -1.0


@pytest.mark.parametrize("mmap_mode", [None, "r", "c"])
def test_a_channels_last_tensor_keeps_its_memory_format(
    mmap_mode: str | None, tmp_path: Path
) -> None:
    x = random_tensor(torch.bfloat16, (2, 3, 4, 5)).to(memory_format=torch.channels_last)
    w = torch.nn.Parameter(random_tensor(torch.float32, (2, 3, 1, 1, 2)))
    w.data = w.data.to(memory_format=torch.channels_last_3d)
    value = {"x": x, "w": w, "t": random_tensor(torch.int16, (3, 4)).t()}
    encoded = npy.encode(value)
    assert sum(memoryview(s).nbytes for s in encoded.segments) == sum(
        t.nbytes for t in value.values()
    )  # its own elements only, as before
    write(npy, value, tmp_path / "e")
    got = read(npy, tmp_path / "e", mmap_mode)
    for name, want in value.items():
        assert_same_tensor(got[name], want)
        assert got[name].stride() == want.stride(), name
    assert got["x"].is_contiguous(memory_format=torch.channels_last)
    assert got["w"].is_contiguous(memory_format=torch.channels_last_3d)
    assert type(got["w"]) is torch.nn.Parameter and got["w"].requires_grad


def test_a_lone_contiguous_tensor_keeps_the_first_layout() -> None:
    """Readers before storages read these entries as they always did."""
    value = {"a": torch.arange(4.0), "slice": torch.arange(10.0)[2:5], "sd": Tied().state_dict()}
    tree = npy.encode(value).layout["tree"]["d"]
    assert [n["x"] for _, n in tree[:2]] == ["torch.Tensor", "torch.Tensor"]
    assert "seg" in tree[0][1] and "stride" not in tree[0][1]
    items = tree[2][1]["items"]["t"][0]
    assert [n["t"][1]["x"] for n in items] == ["torch.Tensor.strided"] * 2  # tied


def test_readers_without_storages_miss_and_keep_such_entries(tmp_path: Path) -> None:
    """A process that knows only the first layout (no 'torch.Tensor.strided') finds
    an unknown leaf: UnknownFormat, a miss that keeps the entry, never the bytes of a
    storage read as one tensor's elements."""
    from mlcache.codecs import register_leaf
    from mlcache.codecs.tensors import STRIDED
    from mlcache.entry import decode
    from mlcache.errors import UnknownFormat

    x = torch.arange(24.0).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    write(npy, {"x": x}, tmp_path / "e")
    register_leaf(TensorLeaf(), replace=True)  # as before: no other name
    try:
        with pytest.raises(UnknownFormat, match="torch.Tensor.strided"):
            decode(EntryReader(str(tmp_path / "e")), allow_pickle=False)
    finally:
        register_leaf(leaf, replace=True, also=(STRIDED,))
    assert torch.equal(read(npy, tmp_path / "e", None)["x"], x)


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_entries_of_the_first_tensor_layout_still_read(mmap_mode: str | None) -> None:
    """The committed fixture written by mlcache 0.3.0: each tensor its own elements."""
    path = Path(__file__).parents[1] / "entry" / "fixtures" / "entry_v1_tensors.mlc"
    got = read(npy, path, mmap_mode)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 3, generator=g)
    assert list(got) == ["f32", "bf16", "param", "channels_last", "transposed", "tied"]
    assert_same_tensor(got["f32"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert_same_tensor(got["bf16"], torch.linspace(-2, 2, 5).to(torch.bfloat16))
    assert_same_tensor(got["param"], torch.nn.Parameter(torch.ones(2, dtype=torch.float64)))
    assert_same_tensor(got["channels_last"], torch.arange(24.0).reshape(1, 2, 3, 4))
    assert got["channels_last"].is_contiguous()  # what that layout kept
    assert_same_tensor(got["transposed"], torch.arange(6).reshape(2, 3).t())
    assert type(got["tied"]) is collections.OrderedDict
    for name in ("emb.weight", "head.weight"):
        assert_same_tensor(got["tied"][name], weight)


# -- OrderedDict (a state_dict) -----------------------------------------------------
def test_a_state_dict_stays_an_ordered_dict_with_its_metadata(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    sd = model.state_dict()
    assert type(sd) is collections.OrderedDict and "_metadata" in vars(sd)
    value = {"head": np.arange(4), "sd": sd, "after": [random_tensor(torch.int8, (3,))]}
    assert npy.can_encode(value)
    write(npy, value, tmp_path / "e")
    for mode in (None, "r", "c"):
        got = read(npy, tmp_path / "e", mode)
        assert type(got["sd"]) is collections.OrderedDict
        assert list(got["sd"]) == list(sd)  # in order
        for k in sd:
            assert_same_tensor(got["sd"][k], sd[k])
        assert vars(got["sd"]) == vars(sd)  # _metadata: the modules' versions
        # segments after the ordered dict's are still found
        assert np.array_equal(got["head"], np.arange(4))
        assert_same_tensor(got["after"][0], value["after"][0])
    model.load_state_dict(read(npy, tmp_path / "e", None)["sd"])


def test_ordered_dicts_of_plain_values_nest_and_keep_their_order() -> None:
    inner = collections.OrderedDict([("z", b"bytes"), ((1, "k"), [1.5, None])])
    value = collections.OrderedDict([("b", inner), ("a", np.ones(2)), (3, "three")])
    value.move_to_end("b")
    encoded = npy.encode(value)
    got = npy.decode(json.loads(json.dumps(encoded.layout)), MemorySegments(encoded))
    assert type(got) is collections.OrderedDict and list(got) == ["a", 3, "b"]
    assert type(got["b"]) is collections.OrderedDict and list(got["b"]) == ["z", (1, "k")]
    assert got["b"] == inner and np.array_equal(got["a"], np.ones(2))


def test_ordered_dicts_it_cannot_fully_represent_are_refused() -> None:
    loop: collections.OrderedDict[str, Any] = collections.OrderedDict()
    loop["me"] = loop
    assert npy.can_encode(loop) is False
    odd = collections.OrderedDict(a=1)
    odd.note = object()  # an attribute pickle alone would store
    assert npy.can_encode(odd) is False

    class Mine(collections.OrderedDict):  # type: ignore[type-arg]
        pass

    assert npy.can_encode(Mine(a=1)) is False
    assert npy.can_encode(collections.OrderedDict(a=object())) is False


def test_an_ordered_state_dict_through_memory_without_pickle(tmp_path: Path) -> None:
    mem = Memory(tmp_path, verbose=0, allow_pickle=False)
    runs = []

    @mem.cache
    def fit(seed: int) -> Any:
        runs.append(seed)
        torch.manual_seed(seed)
        return torch.nn.Linear(4, 3).state_dict()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first, again = fit(1), fit(1)
    assert runs == [1] and type(again) is collections.OrderedDict
    assert list(again) == list(first) and vars(again) == vars(first)
    for k in first:
        assert_same_tensor(again[k], first[k])


def test_a_damaged_ordered_dict_node_is_a_miss(tmp_path: Path) -> None:
    from mlcache.entry import decode
    from mlcache.errors import EntryCorrupted

    path = tmp_path / "e"
    write(npy, [np.arange(2), collections.OrderedDict(a=np.ones(3), b=2)], path)
    reader = EntryReader(str(path))
    good = reader.codec_layout["tree"][1]
    assert good["base"] == 1
    for bad in (
        dict(good, base=-1),
        dict(good, base=5),
        dict(good, base="1"),
        dict(good, items=[1, 2]),
        dict(good, items={"t": [[{"t": [1]}], {"d": []}]}),  # a pair of one
        dict(good, items={"t": [[], {"d": [[1, 2]]}]}),  # an attribute named 1
    ):
        forged = Forged(reader, {"tree": [reader.codec_layout["tree"][0], bad]})
        with pytest.raises(EntryCorrupted):
            decode(forged, allow_pickle=False)  # type: ignore[arg-type]


@pytest.mark.slow  # a fresh interpreter importing torch: 3-5 s here
def test_a_process_that_has_not_imported_torch_reads_tensors(tmp_path: Path) -> None:
    path = tmp_path / "e"
    sd = torch.nn.Linear(3, 2).to(torch.bfloat16).state_dict()
    write(npy, {"sd": sd}, path)
    code = (
        "import sys; from mlcache.codecs import codecs; from mlcache.testing.codecs import read\n"
        "assert 'torch' not in sys.modules\n"
        f"v = read(codecs['npy'], __import__('pathlib').Path({str(path)!r}), 'c')\n"
        "print(type(v['sd']).__name__, list(v['sd']), v['sd']['weight'].dtype)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["OrderedDict", "['weight',", "'bias']", "torch.bfloat16"]


@pytest.mark.parametrize(
    "value",
    [
        random_tensor(torch.bfloat16, (3, 4)),
        torch.nn.Parameter(torch.ones(2)),
        collections.OrderedDict(w=random_tensor(torch.complex64, (2,))),
        torch.empty(2, 2, device="meta"),
        [torch.ones(3, 2).t(), torch.ones(3, 2).t()[1]][1:],  # a view alone
        (lambda b: [b[1:], b[::2]])(random_tensor(torch.float16, (6,))),  # one storage
    ],
    ids=["bfloat16", "parameter", "ordered-dict", "meta", "strided", "shared"],
)
def test_every_damaged_layout_is_a_corrupted_entry(value: Any, tmp_path: Path) -> None:
    """Each place of the layout replaced by values of other types and ranges (the
    conformance kit's sweep): only EntryCorrupted comes out (or UnknownFormat for a
    leaf name replaced by another: both are misses), or a value."""
    from mlcache.entry import decode
    from mlcache.errors import EntryCorrupted, UnknownFormat
    from mlcache.testing.codecs import _garbled

    path = tmp_path / "e"
    write(npy, value, path)
    reader = EntryReader(str(path))
    tried = 0
    for layout in _garbled(reader.codec_layout):
        tried += 1
        try:
            decode(Forged(reader, layout), allow_pickle=False)  # type: ignore[arg-type]
        except (EntryCorrupted, UnknownFormat):
            pass
    assert 20 <= tried < 200  # every place of the layout was damaged


def test_mutating_a_returned_tensor_never_changes_the_next_hit(tmp_path: Path) -> None:
    import time

    mem = Memory(tmp_path, verbose=0, allow_pickle=False)

    @mem.cache
    def small(k: int) -> Any:  # small: later hits come from the in-process tier
        torch.manual_seed(k)
        return {"sd": torch.nn.Linear(3, 2).state_dict(), "t": torch.arange(4.0)}

    want = small(1)
    time.sleep(0.1)  # settled: the tier may keep the entry (not asserted)
    for _ in range(4):
        got = small(1)
        assert torch.equal(got["t"], want["t"])
        assert torch.equal(got["sd"]["weight"], want["sd"]["weight"])
        got["t"].zero_()
        got["sd"]["weight"].add_(1)
