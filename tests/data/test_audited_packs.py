"""The dataset cache checks itself (mlcache.data.audit): from a process's second
pass over a sealed pack on, a few samples read are loaded again with ``load_item``
and compared, within a share of the load time the pack saved. Every run is a
fresh process (the passes and the budget are per process)."""

from __future__ import annotations

import json
import pickle

import pytest

from mlcache.data import CachedDataset
from scripts import ScriptFolder

#: a dataset of N items whose load_item takes 2 ms and logs each load; KIND says
#: what it returns. Runs EPOCHS passes in a shuffled order; prints one JSON line:
#: per epoch, the samples served wrong and the loads, and the warnings said.
#: STOP=1 ends the run at the read that warned (the pack's refill left half done).
RUN = """
import json, os, random, sys, time, warnings
import numpy as np
from mlcache import CacheWarning
from mlcache.data import CachedDataset

LOADS = []


class Items(CachedDataset):
    def __init__(self, n, **kw):
        self.n = n
        super().__init__(cache_dir=os.environ["CACHE"], progress=False, **kw)

    def source_items(self):
        return range(self.n)

    def load_item(self, i):
        LOADS.append(i)
        time.sleep(0.002)
        return KIND


def right(i, sample):
    return int(sample["x"][0]) == (i + 1) * int(os.environ.get("FACTOR", "1"))


n, epochs = int(sys.argv[1]), int(sys.argv[2])
ds = Items(n, **({"audit": json.loads(os.environ["AUDIT"])} if "AUDIT" in os.environ else {}))
report, stop = [], False
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for _ in range(epochs):
        before, wrong = len(LOADS), 0
        for i in np.random.permutation(n).tolist():
            warned = len(said)
            wrong += not right(i, ds[i])
            if os.environ.get("STOP") and len(said) > warned:
                stop = True
                break
        report.append({"wrong": wrong, "loads": len(LOADS) - before})
        if stop:
            break
print(json.dumps({
    "epochs": report,
    "warnings": [str(w.message) for w in said if issubclass(w.category, CacheWarning)],
}))
"""

KINDS = {
    # an input the items' fingerprints cannot see
    "env": "{'x': np.array([(i + 1) * int(os.environ['FACTOR'])]), 'meta': {'id': i}, 'none': []}",
    # random augmentation frozen in the pack
    "random": "{'x': np.array([i + 1]), 'noise': np.random.rand(3)}",
    # deterministic, with what a byte comparison would get wrong: NaN, -0.0, dicts
    "pure": (
        "{'x': np.array([i + 1]), 'f': np.array([np.nan, -0.0, i / 3]), 'meta': {'a': i, "
        "'t': str(i)}, 'none': [], 'nan': float('nan')}"
    ),
}

#: the audit's first waits for this many seconds of loads saved (the default, 1 s,
#: would take 10 passes of 50 items of 2 ms; the test of the default budget does)
QUICK = json.dumps({"after": 0.15})


@pytest.fixture
def run(tmp_path):
    folder = ScriptFolder(tmp_path)

    def go(kind: str, n: int, epochs: int, **env: str) -> dict:
        folder.write(f"run_{kind}.py", RUN.replace("KIND", KINDS[kind]))
        res = folder.execute(f"run_{kind}.py", str(n), str(epochs), env=env)
        return json.loads(res.stdout.strip().splitlines()[-1])

    return go


def test_a_source_changed_unseen_is_caught_and_the_pack_filled_again(run):
    first = run("env", 50, 1, FACTOR="1", AUDIT=QUICK)
    assert first["epochs"] == [{"wrong": 0, "loads": 50}] and first["warnings"] == []
    # FACTOR changes: no fingerprint sees it; the first passes serve the stale pack
    second = run("env", 50, 6, FACTOR="2", AUDIT=QUICK)
    said = second["warnings"]
    assert len(said) == 1, said  # once
    assert "stale sample in the pack of Items.load_item" in said[0]
    assert "an environment variable" in said[0] and "item_fingerprint" in said[0]
    epochs = second["epochs"]
    caught = next(k for k, e in enumerate(epochs) if e["wrong"] < 50)
    assert caught <= 3, epochs  # within a few epochs (the budget: 2% once 0.15 s saved)
    assert epochs[caught]["loads"] > 2  # the rest of that epoch is loaded again
    assert all(e["wrong"] == 0 for e in epochs[caught + 1 :]), epochs  # right after
    # filled again: sealed during the next epoch, whose loads fill what the
    # epoch of the warning had not; then no load at all
    assert sum(e["loads"] for e in epochs[caught:]) >= 50
    assert epochs[-1]["loads"] == 0, epochs
    third = run("env", 50, 1, FACTOR="2", AUDIT=QUICK)
    assert third["epochs"] == [{"wrong": 0, "loads": 0}], third  # the refilled pack


def test_the_next_open_never_serves_the_stale_pack(run):
    run("env", 50, 1, FACTOR="1", AUDIT=QUICK)
    # stopped at the read that warned: the refill is barely begun
    stopped = run("env", 50, 6, FACTOR="2", AUDIT=QUICK, STOP="1")
    assert len(stopped["warnings"]) == 1 and stopped["epochs"][-1]["wrong"] < 50
    after = run("env", 50, 1, FACTOR="2", AUDIT=QUICK)
    assert after["epochs"][0]["wrong"] == 0, after  # loaded again, not the old pack
    assert after["epochs"][0]["loads"] >= 49


def test_random_augmentation_in_load_item_is_warned_and_the_pack_still_served(run):
    run("random", 50, 1, AUDIT=QUICK)  # filled (50 loads: the seal probes none)
    second = run("random", 50, 5, AUDIT=QUICK)
    said = second["warnings"]
    assert len(said) == 1, said
    assert "Items.load_item gave two different samples" in said[0]
    assert "transform=" in said[0]
    # the pack is still served: no epoch after the warning loads its samples again
    loads = [e["loads"] for e in second["epochs"]]
    assert sum(loads) <= 3, loads  # the audit's loads only (a third to tell)


def test_a_deterministic_load_item_is_audited_within_budget_and_never_reported(run):
    """The default budget: 2% of the loads saved, once they saved 1 s (50 items of
    2 ms: 10 passes over the sealed pack)."""
    n, epochs = 50, 16
    out = run("pure", n, epochs)
    assert out["warnings"] == []
    loads = [e["loads"] for e in out["epochs"]]
    assert loads[0] == n  # the first pass: as without the audit
    assert loads[1] == 0  # the first pass over the sealed pack: no audit either
    audits = sum(loads[1:])
    assert audits >= 1, loads  # at least one audit
    # within the budget: 2% of the 14 passes' loads, and a few over for the timing
    assert audits <= 0.02 * n * (epochs - 2) + 3, loads


@pytest.mark.parametrize("how", ["env", "argument"])
def test_turned_off(run, how):
    """MLCACHE_AUDIT=0 wins over a policy that audits every pass from the third."""
    eager = json.dumps({"after": 0.0, "share": 1.0})
    env = {"MLCACHE_AUDIT": "0", "AUDIT": eager} if how == "env" else {"AUDIT": "false"}
    out = run("pure", 50, 5, **env)
    assert [e["loads"] for e in out["epochs"]] == [50, 0, 0, 0, 0]


class _Rows(CachedDataset):
    def __init__(self, root, **kw):
        super().__init__(cache_dir=root, progress=False, **kw)

    def source_items(self):
        return range(4)

    def load_item(self, i):
        return {"x": i}


def test_a_worker_counts_its_own_reads(tmp_path):
    """A spawned DataLoader worker gets the dataset pickled: it counts from zero
    (its first pass is not audited), with the same policy."""
    ds = _Rows(tmp_path, audit={"share": 0.5})
    for _ in range(3):
        for i in range(len(ds)):
            ds[i]
    assert ds._audit is not None and ds._audit.reads == 12
    worker = pickle.loads(pickle.dumps(ds))
    assert worker._audit.reads == 0 and worker._audit.policy.share == 0.5
    assert [worker[i]["x"] for i in range(4)] == [0, 1, 2, 3]
    assert worker._audit.reads == 4
    assert _Rows(tmp_path, audit=False)._audit is None
