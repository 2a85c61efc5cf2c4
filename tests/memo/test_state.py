"""What a computed call changes is state only when it is bookkeeping (issue 23):
an int calls raise, a container calls grow while what it held stays. Anything
else a call changes (an object, a value it sets, a float, a flag) stays input,
what was learned belongs to one function and code version, and what a
container held before cached calls stays in the key. The cases a user meets
across runs run in fresh interpreters; each failed before these rules held."""

from __future__ import annotations

import collections
import functools
import logging
import random
import threading

import numpy as np
import pytest

from mlcache import CacheWarning, Memory
from mlcache.memo.versions import FunctionCode
from scripts import ScriptFolder

HEADER = """
import os, sys
from mlcache import Memory
mem = Memory(os.environ["CACHE"], verbose=0)

def _log(name):
    with open(os.environ["LOG"], "a") as f:
        f.write(name + "\\n")
"""


class Runner(ScriptFolder):
    def run(self, rel: str, *args: str) -> tuple[list[str], str]:
        """(what computed, stdout) of one run of the script ``rel``."""
        res = self.execute(rel, *args)
        return self.logged(), res.stdout.strip()


@pytest.fixture
def runner(tmp_path):
    return Runner(tmp_path)


@pytest.fixture
def mem(tmp_path):
    return Memory(tmp_path / "cache", verbose=0)


# -- case 1: an object a call changes inside is never state --------------------------------
def test_a_model_a_method_puts_in_eval_mode_stays_in_the_key(mem):
    import torch

    class Predictor:
        def __init__(self, model):
            self.model = model

        def predict(self, x):
            self.model.eval()  # flips flags inside the module: not bookkeeping
            with torch.no_grad():
                return float(self.model(x).sum())

    x = torch.ones(1, 3)
    torch.manual_seed(0)
    model_c = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Dropout(0.5))
    torch.manual_seed(1)
    model_d = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Dropout(0.5))
    with torch.no_grad():
        expected = [float(m.eval()(x).sum()) for m in (model_c, model_d)]
    model_c.train(), model_d.train()
    got_c = mem.cache(Predictor(model_c).predict)(x)
    got_d = mem.cache(Predictor(model_d).predict)(x)
    assert [got_c, got_d] == expected and got_c != got_d


HOLDER = (
    HEADER
    + """
class Net:
    def __init__(self, w):
        self.w = w
        self.training = True

    def eval(self):
        self.training = False  # a flag: never bookkeeping

class Ctx:
    model = None

ctx = Ctx()
ctx.model = Net(float(sys.argv[1]))  # another checkpoint in another run

@mem.cache
def predict(x):
    _log("predict")
    ctx.model.eval()
    return x * ctx.model.w

print(predict(2), predict(2))
"""
)


def test_a_module_level_holder_of_a_model_stays_in_the_key_in_a_later_run(runner):
    runner.write("holder.py", HOLDER)
    assert runner.run("holder.py", "3")[1] == "6.0 6.0"
    assert runner.run("holder.py", "5")[1] == "10.0 10.0"
    assert runner.run("holder.py", "3") == ([], "6.0 6.0")


# -- case 2: a value a call writes once and then reads -------------------------------------
def test_a_lazily_fitted_attribute_stays_in_the_key(mem):
    import numpy as np

    class Scaler:
        def __init__(self, mean=None):
            self.mean_ = mean

        def transform(self, X):
            X = np.asarray(X, dtype=float)
            if self.mean_ is None:
                self.mean_ = X.mean()  # a value set to something computed
            return X - self.mean_

    first = mem.cache(Scaler().transform)([0, 1, 2, 3])
    second = mem.cache(Scaler(mean=100).transform)([0, 1, 2, 3])
    assert first.tolist() == [-1.5, -0.5, 0.5, 1.5]
    assert second.tolist() == [-100, -99, -98, -97]


REGISTRY = (
    HEADER
    + """
class Model:
    def __init__(self, w):
        self.w = w
        self.calls = 0

    def predict(self, x):
        self.calls += 1  # a counter: bookkeeping
        return x * self.w

REG = {"clf": Model(2)}

@mem.cache
def predict(x):
    _log("predict")
    return REG["clf"].predict(x)

print(predict(3.0), predict(3.0))
"""
)


def test_a_counter_inside_a_registered_model_leaves_its_weights_in_the_key(runner):
    runner.write("reg.py", REGISTRY)
    assert runner.run("reg.py") == (["predict"], "6.0 6.0")
    assert runner.run("reg.py") == ([], "6.0 6.0")
    runner.edit("reg.py", "Model(2)", "Model(5)")
    assert runner.run("reg.py") == (["predict"], "15.0 15.0")
    runner.edit("reg.py", "Model(5)", "Model(7)")
    assert runner.run("reg.py") == (["predict"], "21.0 21.0")


# -- case 3: one function's write never changes another's key ------------------------------
FIT = (
    HEADER
    + """
CFG = {"scale": 4.0}

@mem.cache
def fit_scale(data):
    _log("fit")
    CFG["scale"] = sum(data) / len(data)  # a fitted value: input, not bookkeeping
    return CFG["scale"]

@mem.cache
def transform(x, override=None):
    _log("transform")
    if override is not None:
        CFG["scale"] = override
    return x * CFG["scale"]

for call in sys.argv[1:]:
    if call == "fit":
        print(fit_scale([1.0, 5.0]))
    elif call == "over":
        print(transform(2, override=0.5))
    else:
        print(transform(2))
"""
)


def test_a_value_one_function_writes_stays_in_the_key_of_the_one_that_reads_it(runner):
    runner.write("fit.py", FIT)
    assert runner.run("fit.py", "fit", "t")[1].split() == ["3.0", "6.0"]
    runner.edit("fit.py", '{"scale": 4.0}', '{"scale": 10.0}')
    assert runner.run("fit.py", "t")[1] == "20.0"
    assert runner.run("fit.py", "fit", "t")[1].split() == ["3.0", "6.0"]


def test_a_function_that_sometimes_writes_what_it_reads_does_not_depend_on_call_order(runner):
    runner.write("fit.py", FIT)
    assert runner.run("fit.py", "over", "t")[1].split() == ["1.0", "1.0"]
    # the other order, in another run: the plain call reads the source's value
    assert runner.run("fit.py", "t", "over")[1].split() == ["8.0", "1.0"]
    runner.edit("fit.py", '{"scale": 4.0}', '{"scale": 10.0}')
    assert runner.run("fit.py", "t")[1] == "20.0"


# -- case 4: what a container held before cached calls stays in the key --------------------
LABELS = (
    HEADER
    + """
LABELS = ["cat", "dog"]

@mem.cache
def encode(label):
    _log("encode-" + label)
    if label not in LABELS:
        LABELS.append(label)  # grows: bookkeeping, but only what calls added
    return LABELS.index(label)

print(encode("bird"), encode("dog"), encode("fish"))
"""
)


def test_a_list_calls_append_to_keeps_what_it_held_in_the_key(runner):
    runner.write("labels.py", LABELS)
    assert runner.run("labels.py") == (["encode-bird", "encode-dog", "encode-fish"], "2 1 3")
    assert runner.run("labels.py") == ([], "2 1 3")  # the appends are bookkeeping
    runner.edit("labels.py", '["cat", "dog"]', '["dog", "cat"]')
    assert runner.run("labels.py")[1] == "2 0 3"


# -- case 5: a big table is keyed by value ---------------------------------------------------
def test_a_module_level_table_over_max_items_is_keyed_by_value(runner):
    runner.write(
        "weights.py",
        HEADER
        + """
WEIGHTS = [1.0] * 150_000
WEIGHTS[7] = 20.0

@mem.cache
def weight(i):
    _log("weight")
    return WEIGHTS[i]

print(weight(7), weight(7))
""",
    )
    assert runner.run("weights.py") == (["weight"], "20.0 20.0")
    assert runner.run("weights.py") == ([], "20.0 20.0")
    runner.edit("weights.py", "WEIGHTS[7] = 20.0", "WEIGHTS[7] = 30.0")
    assert runner.run("weights.py") == (["weight"], "30.0 30.0")


def test_a_big_table_is_hashed_once_per_process(monkeypatch):
    from mlcache.keys import state

    hashed = []
    original = state.hash_value
    monkeypatch.setattr(state, "hash_value", lambda obj: hashed.append(1) or original(obj))
    table = list(range(state.MAX_ITEMS + 10))
    assert not state.watchable(table)  # not compared before and after every call
    first = state.value_digest(table)
    assert state.value_digest(table) == first and len(hashed) == 1
    edited = list(table)
    edited[3] = -1
    assert state.value_digest(edited) != first  # by value: one item differs


# -- case 7: state in a helper's closure is bookkeeping under the same rules -----------------
def _calls_of(f, *calls):
    for args in calls:
        f(*args)


def test_a_nested_helper_appending_to_its_closure_computes_once(mem):
    def make():
        seen = []

        def helper(x):
            seen.append(x)
            return x

        def f(x):
            return helper(x) * 2

        return f, seen

    f, seen = make()
    cached = mem.cache(f)
    _calls_of(cached, *[(3,)] * 50)
    assert len(seen) == 1


def test_a_lambda_over_a_helper_with_an_accumulator(mem):
    accumulator = []

    def helper(x):
        accumulator.append(1)
        return x

    f = mem.cache(lambda x: helper(x))
    for i in range(3):
        for _ in range(2):
            assert f(i) == i and len(accumulator) == i + 1
    # what the helper's closure only reads stays in the key
    assert [mem.cache(_scaled(2))(3), mem.cache(_scaled(2))(3)] == [6, 6]
    assert mem.cache(_scaled(5))(3) == 15


def test_a_counter_object_reached_through_a_helper(mem):
    class Stats:
        def __init__(self):
            self.n = 0

    stats = Stats()

    def count(x):
        stats.n += 1
        return x

    f = mem.cache(lambda x: count(x) + 1)
    _calls_of(f, *[(1,)] * 10)
    assert stats.n == 1


def test_a_wraps_decorator_with_ignore(mem):
    accumulator = []

    def decorate(f):
        @functools.wraps(f)
        def wrapped(*args, **kwargs):
            return f(*args, **kwargs)

        return wrapped

    @mem.cache(ignore=["y"])
    @decorate
    def z(x, y=1):
        accumulator.append(1)

    z(0, y=1), z(0, y=1), z(0, y=2)
    assert len(accumulator) == 1


def _scaled(scale):
    seen = []

    def helper(x):
        seen.append(x)
        return x * scale  # read: input

    return lambda x: helper(x)


# -- per function, per code version ----------------------------------------------------------
def test_what_one_function_learned_never_leaves_another_functions_key(runner):
    runner.write(
        "two.py",
        HEADER
        + """
TABLE = {"scale": 2}

@mem.cache
def bump(x):
    TABLE["scale"] += 1  # a counter for bump: never for the function that reads it
    return x

@mem.cache
def scaled(x):
    _log("scaled")
    return x * TABLE["scale"]

if sys.argv[1:] == ["both"]:
    bump(1)
print(scaled(3))
""",
    )
    assert runner.run("two.py", "both") == (["scaled"], "9")
    runner.edit("two.py", '{"scale": 2}', '{"scale": 5}')
    assert runner.run("two.py") == (["scaled"], "15")


# -- case 11: learning does not cost every miss ----------------------------------------------
def _count(monkeypatch, name):
    calls = [0]
    original = getattr(FunctionCode, name)

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FunctionCode, name, counted)
    return calls


STATS = {"calls": 0}
COMPUTED: list[int] = []


def counted(x):
    STATS["calls"] += 1  # a module-level counter
    COMPUTED.append(x)
    return x * 2


def test_a_counter_writes_the_state_record_once_not_at_every_miss(mem, monkeypatch):
    saves = _count(monkeypatch, "_save_state")
    COMPUTED.clear()
    cached = mem.cache(counted)
    _calls_of(cached, *[(i,) for i in range(30)])
    assert len(COMPUTED) == 30 and saves[0] == 1
    _calls_of(cached, *[(i,) for i in range(30)])
    assert len(COMPUTED) == 30


def test_a_memo_dict_helper_is_walked_once_not_at_every_miss(mem, monkeypatch):
    walks = _count(monkeypatch, "prepare")
    memo = {}

    def vocab(word):
        if word not in memo:
            memo[word] = len(memo)
        return memo[word]

    cached = mem.cache(lambda w: vocab(w) * 10)
    _calls_of(cached, *[(f"w{i}",) for i in range(30)])
    assert len(memo) == 30 and walks[0] <= 2  # the first call, and once learned


LABELS_SEEN: list[str] = []  # no other test's function reads it


def add_label(label):
    LABELS_SEEN.append(label)  # add_label's bookkeeping: it only grows the list
    return len(LABELS_SEEN)


def label_index(label):
    return LABELS_SEEN.index(label) if label in LABELS_SEEN else -1  # input here


def test_a_list_one_function_grows_stays_input_of_the_one_that_reads_it(mem):
    """What one function's calls grow as bookkeeping is read again by the versions
    of the others that count it by value (label_index served -1 for "b" after
    add_label("b"): keyed by the list as it was when it was first walked)."""
    add, index = mem.cache(add_label), mem.cache(label_index)
    assert index("b") == -1
    assert add("a") == 1 and add("b") == 2  # learned at the first: then its baseline
    assert index("b") == 1
    assert add("c") == 3 and index("c") == 2 and index("b") == 1


class Batches:
    def __init__(self, data):
        self.data, self.pos, self.epoch, self.calls = data, 0, 0, 0

    def next(self, n):
        self.calls += 1  # a counter nothing reads: bookkeeping
        batch = self.data[self.pos : self.pos + n]  # a cursor the call reads: input
        self.pos += n
        return batch

    def noisy(self, x):
        self.epoch += 1  # a seed: input
        return x + self._draw()

    def _draw(self):
        return random.Random(self.epoch).randrange(1000)  # read in another method


def test_a_counter_the_code_reads_otherwise_is_input(mem):
    """An int a call raises and also reads (a cursor, a seed read by another
    method) may change the next result: it stays in the key, as joblib keys the
    object (the first batch and the first draw were served again). A counter
    nothing reads stays bookkeeping."""
    loader = Batches(list(range(6)))
    batches = mem.cache(loader.next)
    assert [batches(2), batches(2), batches(2)] == [[0, 1], [2, 3], [4, 5]]
    draws = [mem.cache(loader.noisy)(0) for _ in range(3)]
    truth = Batches([])
    assert draws == [truth.noisy(0) for _ in range(3)] and len(set(draws)) == 3
    assert "self.calls (counter)" in batches._code.state_names()  # still learned


# -- a counter kept in a dict: a key the code reads is input --------------------------------
SEED = {"epoch": 0}  # no other test's function reads or changes these
CURSOR = {"pos": 0}
FEED = list(range(20))


def seeded_draw(n):
    SEED["epoch"] += 1
    return np.random.default_rng(SEED["epoch"]).integers(0, 1000, n).tolist()


def next_rows(n):
    rows = FEED[CURSOR["pos"] : CURSOR["pos"] + n]  # a cursor: read, then moved
    CURSOR["pos"] += n
    return rows


class Sampler:
    def __init__(self):
        self.state = {"epoch": 0, "calls": 0}

    def draw(self, n):
        self.state["calls"] += 1  # only raised: bookkeeping
        self.state["epoch"] += 1
        return random.Random(self.state["epoch"]).sample(range(1000), n)


SAMPLER = Sampler()


def sampled(n):
    return SAMPLER.draw(n)  # a helper's object holds the dict


def _truth(f, state, calls):
    """What plain calls of ``f`` return from ``state`` as it is (restored after)."""
    saved = {k: dict(v) for k, v in state.items()}
    try:
        return [f(*args) for args in calls]
    finally:
        for k, v in saved.items():
            state[k].clear()
            state[k].update(v)


def test_a_seed_or_cursor_kept_in_a_dict_is_input(mem):
    """A key of a dict a call raises and reads (a seed ``SEED["epoch"] += 1``
    then ``default_rng(SEED["epoch"])``, a cursor ``FEED[CURSOR["pos"]:]``, a
    seed in the dict of an object a helper holds) may change the next result:
    it stays in the key (the first draw was served four times, [[473, 511]] * 4).
    A key the same code only raises stays bookkeeping."""
    cases = [
        (seeded_draw, {"seed": SEED}),
        (next_rows, {"cursor": CURSOR}),
        (sampled, {"sampler": SAMPLER.state}),
    ]
    for f, state in cases:
        truth = _truth(f, state, [(2,)] * 4)
        assert len({repr(t) for t in truth}) == 4
        cached = mem.cache(f)
        assert [cached(2) for _ in range(4)] == truth, f.__name__
    names = cached._code.state_names()  # sampled's: "calls" learned, not "epoch"
    assert len(names) == 1 and names[0].startswith("test_state.SAMPLER.state[")


NOT_SURE = {"whole": 0, "items": 0, "kwargs": 0, "computed": 0}
EPOCH_KEY = "computed"  # a key the code does not spell out


def _seed_of(state, name):
    return state[name]


def _seed_of_kwargs(kwargs=0, **_):
    return kwargs


def passed_whole(x):
    NOT_SURE["whole"] += 1
    return x + _seed_of(NOT_SURE, "whole")  # the dict passed to a helper whole


def by_items(x):
    NOT_SURE["items"] += 1
    return x + sum(v for k, v in NOT_SURE.items() if k == "items")


def by_kwargs(x):
    NOT_SURE["kwargs"] += 1
    return x + _seed_of_kwargs(**NOT_SURE)


def by_computed_key(x):
    NOT_SURE[EPOCH_KEY] += 1
    return x + NOT_SURE[EPOCH_KEY]


def test_a_dict_key_the_code_may_read_is_input(mem):
    """Not sure the code does not read the key a call raises: a dict passed whole
    to a helper, iterated (``.items()``), spread (``**``), or a key held in a
    name: the key stays input, each call computes (a miss is cheap)."""
    for f in (passed_whole, by_items, by_kwargs, by_computed_key):
        truth = _truth(f, {"s": NOT_SURE}, [(0,)] * 3)
        assert len(set(truth)) == 3
        assert [mem.cache(f)(0) for _ in range(3)] == truth, f.__name__


TALLY = {"n": 0, "calls": 0}


def _summary(x):
    shape = {"n": x, "calls": x + 1}  # the same keys, of another dict
    return [shape["n"], shape.get("calls")]


def tallied(x):
    TALLY["n"] += 1
    TALLY["calls"] += 1
    return _summary(x)


def test_a_dict_key_only_raised_stays_bookkeeping(mem):
    """The documented bookkeeping keeps hitting: ``TALLY["n"] += 1`` while other
    code reads the key ``"n"`` of another dict (the reverted rule took any ``"n"``
    for a read: every call missed)."""
    TALLY.update(n=0, calls=0)
    counted = mem.cache(tallied)
    assert [counted(3) for _ in range(3)] == [[3, 4]] * 3
    assert TALLY == {"n": 1, "calls": 1}
    assert len([n for n in counted._code.state_names() if "(counter)" in n]) == 2


ROWS_AT = [0]  # no other test's function reads or changes these
CALLED = [0]


def rows_by_list(n):
    CALLED[0] += 1  # only raised: bookkeeping
    rows = FEED[ROWS_AT[0] : ROWS_AT[0] + n]  # a cursor in a list, read by index
    ROWS_AT[0] += n
    return rows


def _closure_rows():
    pos, calls = 0, 0

    def rows(n):
        nonlocal pos, calls
        calls += 1  # only raised: bookkeeping
        pos += n
        return FEED[pos : pos + n]  # a nonlocal cursor, read

    return rows


def _closure_counted():
    calls = 0

    def double(x):
        nonlocal calls
        calls += 1
        return x * 2

    return double


def test_a_cursor_in_a_list_or_a_closure_is_input(mem):
    """A cursor raised and read by index in a short list (``ROWS_AT[0] += n``
    beside ``FEED[ROWS_AT[0]:]``) or in a closure (``nonlocal pos``) stays in the
    key: the first rows were served again. An int only raised, in a list or a
    closure, stays bookkeeping."""
    ROWS_AT[0] = CALLED[0] = 0
    by_list = mem.cache(rows_by_list)
    assert [by_list(2) for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    plain = _closure_rows()
    truth = [plain(2) for _ in range(3)]
    by_closure = mem.cache(_closure_rows())
    assert [by_closure(2) for _ in range(3)] == truth == [[2, 3], [4, 5], [6, 7]]
    assert CALLED == [3]  # the cursor made each call compute
    f = _closure_counted()
    double = mem.cache(f)
    assert [double(3) for _ in range(3)] == [6, 6, 6]
    assert f.__closure__[0].cell_contents == 1  # computed once


LEVEL = 0  # no other test's function reads or binds it


def raise_level(n):
    global LEVEL
    LEVEL += n
    return FEED[LEVEL : LEVEL + 2]  # a cursor in a global the call binds


def at_level(x):
    return x + LEVEL  # read here, bound by raise_level


def test_a_global_a_call_binds_is_read_again(mem):
    """A global a cached call binds (``global LEVEL; LEVEL += n``) counted by
    value in the code version is read again, by this function and by the others
    that read it: the first rows were served again, and ``at_level`` kept the
    level it first saw."""
    global LEVEL
    LEVEL = 0
    rows, level = mem.cache(raise_level), mem.cache(at_level)
    assert level(0) == 0
    assert [rows(1) for _ in range(3)] == [[1, 2], [2, 3], [3, 4]]
    assert level(0) == 3


class Seeded:
    def __init__(self, **settings):
        self.__dict__.update(settings)  # sets them: not a read
        self.epoch = 0

    def by_vars(self, n):
        self.epoch += 1
        return random.Random(sum(vars(self).values())).sample(range(1000), n)

    def by_dict(self, n):
        self.epoch += 1
        return random.Random(str(self.__dict__)).sample(range(1000), n)


class Named:  # apart: Seeded's vars(self) makes any of its attributes read
    def __init__(self):
        self.epoch = 0

    def by_name(self, n):
        self.epoch += 1
        return random.Random(getattr(self, SEED_FIELD)).sample(range(1000), n)


SEED_FIELD = "epoch"  # an attribute named by a value


class Configured:
    def __init__(self, **settings):
        self.__dict__.update(settings)  # sets them: not a read
        self.calls = 0

    def counted(self, n):
        self.calls += 1  # only raised: bookkeeping
        return [n] * n


SEEDED = Seeded(scale=1)


def test_an_object_whose_attributes_the_code_reads_whole_is_input(mem):
    """A seed raised in place and read through ``vars(self)``, ``self.__dict__`` or
    ``getattr(self, SEED_FIELD)`` (no attribute name to see) is input: the first
    draw was served again.
    ``self.__dict__.update(...)`` sets attributes, and a counter beside it stays
    bookkeeping."""
    for obj, method in (
        (SEEDED, Seeded.by_vars),
        (SEEDED, Seeded.by_dict),
        (Named(), Named.by_name),
    ):
        obj.epoch = 0
        truth = [method(obj, 2) for _ in range(3)]
        obj.epoch = 0
        drawn = mem.cache(getattr(obj, method.__name__))
        assert [drawn(2) for _ in range(3)] == truth and len({str(t) for t in truth}) == 3
    plain = Configured(scale=1)
    counted = mem.cache(plain.counted)
    assert [counted(2) for _ in range(3)] == [[2, 2]] * 3 and plain.calls == 1


WORDS: collections.Counter = collections.Counter()  # no other test's function reads these
TALLIES: collections.Counter = collections.Counter()
UPPERED: list[str] = []


def times_seen(word):
    WORDS[word] += 1
    return WORDS[word]  # what the call raised, read


def uppered(word):
    TALLIES[word] += 1  # only raised: bookkeeping
    UPPERED.append(word)
    return word.upper()


def test_a_counter_dict_whose_counts_the_code_reads_is_input(mem):
    """A dict whose items the code raises in place by a computed key and also
    reads (``WORDS[word] += 1; return WORDS[word]``) is no grown bookkeeping: the
    count a call read was served again ([1, 1, 1, 1] for "abab"). One only raised
    stays bookkeeping: each word computed once."""
    WORDS.clear()
    seen = mem.cache(times_seen)
    assert [seen(w) for w in "abab"] == [1, 1, 2, 2]
    TALLIES.clear()
    UPPERED.clear()
    upper = mem.cache(uppered)
    assert [upper(w) for w in "abab"] == ["A", "B", "A", "B"] and UPPERED == ["a", "b"]


STREAM = (i for i in range(100))  # no other test's function reads it


def from_stream(n):
    return [next(STREAM) for _ in range(n)]


def test_a_generator_the_code_reads_is_never_keyed_by_its_type(mem):
    """A module-level generator cannot be hashed, and a call consuming it is not
    seen changing it: it counted by its type, and the first items were served
    again. The function runs uncached, with one warning naming it."""
    cached = mem.cache(from_stream)
    with pytest.warns(CacheWarning, match="STREAM.*generator") as caught:
        assert [cached(2) for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert len(caught) == 1


DRAWS = (
    HEADER
    + """
import numpy as np
STATE = {"epoch": 0, "calls": 0}

@mem.cache
def draw(n):
    STATE["calls"] += 1
    STATE["epoch"] += 1
    _log("draw")
    return np.random.default_rng(STATE["epoch"]).integers(0, 1000, n).tolist()

out = []
for _ in range(3):  # what a plain call returns from the seed as it is now
    seed = STATE["epoch"] + 1
    out.append(draw(2) == np.random.default_rng(seed).integers(0, 1000, 2).tolist())
print(out, STATE["epoch"])
"""
)


def test_a_seed_in_a_dict_is_input_in_the_next_run_too(runner):
    """Each call returns what a plain call returns from the seed as it is then,
    in the run that learns and in the next (which reads what the first learned:
    its hits are the first run's draws, under their own seeds; a hit raises no
    seed, as joblib's does not)."""
    runner.write("draws.py", DRAWS)
    assert runner.run("draws.py") == (["draw"] * 3, "[True, True, True] 3")
    assert runner.run("draws.py")[1].startswith("[True, True, True]")


ENTERED, RELEASE = threading.Event(), threading.Event()
GATED = {"calls": 0}  # no other test's function changes it


def gated(x):
    GATED["calls"] += 1  # learned when the first call ends
    COMPUTED.append(x)
    ENTERED.set()
    RELEASE.wait(60)
    return x * 2


def test_a_call_waiting_on_a_key_does_not_recompute_when_state_is_first_learned(mem, monkeypatch):
    import time

    from mlcache.memo import locking

    COMPUTED.clear()
    ENTERED.clear(), RELEASE.clear()
    waiting = threading.Event()
    sleep = time.sleep

    def noted(seconds):
        waiting.set()  # the second call waits for the first one's lock
        sleep(seconds)

    monkeypatch.setattr(locking.time, "sleep", noted)
    cached = mem.cache(gated)
    got = []
    first = threading.Thread(target=lambda: got.append(cached(1)))
    first.start()
    assert ENTERED.wait(60)
    second = threading.Thread(target=lambda: got.append(cached(1)))
    second.start()
    assert waiting.wait(60)
    RELEASE.set()
    first.join(), second.join()
    assert got == [2, 2] and COMPUTED == [1]


SHARED = {"calls": 0}


def shared(x):
    SHARED["calls"] += 1  # learned by the first of many threads to finish
    COMPUTED.append(x)
    return x * 2


def test_threads_on_the_same_keys_compute_each_once(mem):
    COMPUTED.clear()
    cached = mem.cache(shared)
    results: list[list[int]] = []

    def worker():
        results.append([cached(i) for i in range(20)])

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(COMPUTED) == list(range(20))
    assert results == [[2 * i for i in range(20)]] * 20


# -- say it -----------------------------------------------------------------------------------
def test_verbose_and_the_miss_explanation_name_what_is_treated_as_state(tmp_path, caplog):
    stats = {"calls": 0}
    history = []

    def f(x):
        stats["calls"] += 1
        history.append(x)
        return x

    cached = Memory(tmp_path, verbose=2).cache(f)
    with caplog.at_level(logging.INFO, logger="mlcache"):
        cached(1)
    said = caplog.text
    assert "treated as state" in said
    assert "stats[" in said and "(counter)" in said and "history (grown)" in said
    assert cached._code.state_names() == sorted(cached._code.state_names())
    assert any(n == "history (grown)" for n in cached._code.state_names())


def test_what_a_function_learned_holds_for_another_wrapper_after_clear(tmp_path):
    # joblib's test_memory_integration: Memory.eval (a new wrapper of the same
    # function) after clear() removed the record of what its calls change
    calls = []

    def f(x):
        calls.append(1)
        return x

    mem = Memory(tmp_path, verbose=0)
    g = mem.cache(f)
    g(1)
    g.clear(warn=False)
    g(1)
    done = len(calls)
    assert mem.eval(f, 1) == 1
    assert len(calls) == done  # a hit: the new wrapper keys calls as g does


BUDGET = [10]
WIDE = [0] * 17  # longer than INT_LIST_MAX: not a short list of counters


def spend(x):
    BUDGET[0] -= 1  # lowered, not raised: not a counter, its value is input
    return x + BUDGET[0]


def tally(x):
    WIDE[0] += 1  # raised, but in a list too long to be taken for counters
    return x + WIDE[0]


def test_a_short_int_list_a_call_lowers_or_a_long_one_stays_in_the_key(mem):
    """Not sure it is bookkeeping, so keyed: a list of ints a call lowers, and one
    longer than INT_LIST_MAX that it raises; each call sees the value it read."""
    BUDGET[0] = 10
    WIDE[0] = 0
    spent = mem.cache(spend)
    assert [spent(1) for _ in range(3)] == [10, 9, 8]
    tallied = mem.cache(tally)
    assert [tallied(1) for _ in range(3)] == [2, 3, 4]
