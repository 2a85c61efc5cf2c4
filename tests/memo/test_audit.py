"""The function cache checks itself (mlcache.memo.audit, mlcache._audit): a sample
of hits, within a budget of the time saved, is computed again and compared; a
wrong cached value is said once and no longer served. Runs of many hits run in
fresh processes (the budget is per process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from mlcache import AuditPolicy, ConfigError, ConfigTypeError, Memory
from mlcache._audit import CLOSE, DIFFERENT, SAME, AuditBudget, audit_policy, compare
from scripts import ScriptFolder

#: a 2 ms function hit 2,000 times over 10 keys; prints one JSON line: what each
#: call returned, the index of the call during which a warning came (None), the
#: warnings, the calls that computed, and the function's statistics
RUN = """
import json, os, random, sys, time, warnings
import numpy as np
from mlcache import CacheWarning, Memory

COMPUTED = []
mem = Memory(os.environ["CACHE"], verbose=0)

@mem.cache
def f(x):
    COMPUTED.append(x)
    time.sleep(0.002)
    KIND
    return value

out, at = [], None
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for i in range(int(sys.argv[1])):
        out.append(f(i % 10))
        if said and at is None:
            at = i
st = f.stats()
print(json.dumps({
    "out": [o if not isinstance(o, dict) else o["x"] for o in out],
    "at": at,
    "warnings": [str(w.message) for w in said if issubclass(w.category, CacheWarning)],
    "computed": len(COMPUTED),
    "stats": st.as_dict(),
}))
"""

KINDS = {
    # an input the key cannot see
    "env": "value = x * int(os.environ['FACTOR'])",
    "random": "value = random.random()",
    # deterministic, with what a byte comparison would get wrong: NaN, -0.0, dicts
    "pure": (
        "value = {'x': x, 'nan': float('nan'), 'zero': -0.0, "
        "'arr': np.array([x, np.nan, -0.0]), 'map': {str(k): k for k in range(x)}}"
    ),
}


@pytest.fixture
def run(tmp_path):
    folder = ScriptFolder(tmp_path)

    def go(kind: str, hits: int = 2000, env: dict[str, str] | None = None) -> dict:
        folder.write(f"run_{kind}.py", RUN.replace("KIND", KINDS[kind]))
        res = folder.execute(f"run_{kind}.py", str(hits), env=env)
        return json.loads(res.stdout.strip().splitlines()[-1])

    go.folder = folder  # type: ignore[attr-defined]
    return go


def test_an_input_the_key_cannot_see_is_caught_said_once_and_no_longer_served(run):
    first = run("env", 10, env={"FACTOR": "2"})
    assert first["out"] == [2 * i for i in range(10)] and first["computed"] == 10
    got = run("env", env={"FACTOR": "3"})
    assert len(got["warnings"]) == 1, got["warnings"]
    said = got["warnings"][0]
    assert "__main__" in said and "env" in said  # the function
    assert "an input its key cannot see" in said and "environment variable" in said
    at = got["at"]
    assert at is not None and at < 2000
    # the audited call returned the fresh value; every call after it a right one
    assert all(v == 3 * (i % 10) for i, v in enumerate(got["out"]) if i >= at)
    assert got["stats"]["mismatches"] == 1 and got["stats"]["audits"] >= 1
    # the entries stored now are served as usual: the next run hits right values
    again = run("env", 200, env={"FACTOR": "3"})
    # every call a hit; what computed is the audit's sampling (more of it on a busy
    # machine, whose slower calls save more time), each one agreeing
    # (the statistics add up over runs: this run's part is the difference)
    now, before = again["stats"], got["stats"]
    assert again["warnings"] == [] and now["misses"] == before["misses"]
    assert again["computed"] == now["audits"] - before["audits"]
    assert now["mismatches"] == before["mismatches"]
    assert again["out"] == [3 * (i % 10) for i in range(200)]


def test_a_random_function_is_reported_as_not_deterministic(run):
    got = run("random")
    assert len(got["warnings"]) == 1, got["warnings"]
    assert "not deterministic" in got["warnings"][0]


def test_a_deterministic_function_hit_2000_times_is_audited_a_little_never_reported(run):
    got = run("pure")
    assert got["warnings"] == []
    st = got["stats"]
    assert st["hits"] == 1990 and st["misses"] == 10 and st["mismatches"] == 0
    assert st["audits"] >= 1
    assert got["computed"] == 10 + st["audits"]
    assert st["audits"] <= 0.05 * 2000  # no more than a few percent computed again
    assert st["audited"] <= 0.03 * st["saved"]  # the budget: 2% of the time saved
    ls = subprocess.run(
        [sys.executable, "-m", "mlcache", "ls", "--json", "--location", str(run.folder.cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    (listed,) = json.loads(ls.stdout)["functions"]
    assert listed["audits"] == st["audits"] and listed["mismatches"] == 0


@pytest.mark.parametrize("how", ["env", "argument"])
def test_audits_can_be_turned_off(run, how):
    folder = run.folder
    script = RUN.replace("KIND", KINDS["random"])
    if how == "argument":
        script = script.replace("@mem.cache", "@mem.cache(audit=False)")
    folder.write("off.py", script)
    env = {"MLCACHE_AUDIT": "0"} if how == "env" else {}
    got = json.loads(folder.execute("off.py", "2000", env=env).stdout.strip().splitlines()[-1])
    assert got["warnings"] == [] and got["computed"] == 10
    assert got["stats"]["audits"] == 0


def test_a_function_hit_a_few_times_is_never_audited(tmp_path):
    calls = []

    def slow(x):
        calls.append(x)
        return x

    f = Memory(tmp_path, verbose=0).cache(slow)
    f(1)
    for _ in range(200):  # a fast function never saves the second audits wait for
        assert f(1) == 1
    assert calls == [1] and f.stats().audits == 0


# -- the budget and the comparison -------------------------------------------------


def test_the_budget_is_a_share_of_the_time_saved_after_a_first_second():
    b = AuditBudget(0.02, after=1.0)
    # a 2 ms function whose hits take 0.1 ms: the first audit near the 530th hit
    due = [i for i in range(2000) if b.hit(0.0019, 0.002) and (b.spend(0.002) or True)]
    assert 500 < due[0] < 560
    assert 30 <= len(due) <= 40 and b.spent <= 0.02 * b.saved
    # a 10-minute fit hit five times: none
    fit = AuditBudget(0.02, after=1.0)
    assert not any(fit.hit(600.0, 600.0) for _ in range(5))
    # a hit that costs more than the computation saves nothing
    assert not AuditBudget(0.02).hit(-1.0, 0.0)


def test_the_compute_time_is_read_from_the_metadata_without_parsing_it_all():
    from mlcache.memo.audit import recorded_duration

    info = {"func": 'm.f"duration":9,', "time": 1.0, "duration": 2.5e-06}
    info["input_args"] = {"duration": "7"}  # a parameter named duration comes later
    assert recorded_duration(json.dumps(info).encode()) == 2.5e-06
    assert recorded_duration(json.dumps(info, separators=(",", ":")).encode()) == 2.5e-06
    assert recorded_duration(b'{"time": 1, "duration": 3}') == 3.0  # another shape: parsed
    assert recorded_duration(b"") == recorded_duration(b"[1]") == 0.0


def test_values_are_compared_not_bytes():
    nan, other_nan = np.array([np.nan]), np.array([np.nan])
    other_nan.view(np.uint64)[0] ^= 1  # another NaN payload
    assert compare(nan, other_nan) == SAME
    assert compare({"a": 1, "b": 2}, {"b": 2, "a": 1}) == SAME
    assert compare(np.array([-0.0]), np.array([0.0])) == SAME
    assert compare([float("nan"), -0.0], (float("nan"), 0.0)) == SAME
    assert compare(np.arange(3), np.arange(3)) == SAME
    assert compare({"a": 1}, {"a": 2}) == DIFFERENT
    assert compare(np.arange(3), np.arange(1, 4)) == DIFFERENT
    assert compare("a", "b") == DIFFERENT


def test_floats_that_differ_in_their_last_bits_are_close_or_equal_within_a_tolerance():
    x = np.random.default_rng(0).random(100)
    y = x.copy()
    y[7] = np.nextafter(y[7], 2.0)
    assert compare(x, y) == CLOSE
    assert compare(x, y, rtol=1e-9) == SAME
    assert compare(0.1 + 0.2, 0.3) == CLOSE
    assert compare(x, x + 1e-3) == DIFFERENT
    assert compare(math.inf, 1.0) == DIFFERENT


def test_the_audit_option():
    assert audit_policy(None) == AuditPolicy() and audit_policy(True) == AuditPolicy()
    assert audit_policy(False) is None and audit_policy(0) is None
    assert audit_policy(0.1) == AuditPolicy(share=0.1)
    assert audit_policy({"rtol": 1e-6}) == AuditPolicy(rtol=1e-6)
    with pytest.raises(ConfigError):
        AuditPolicy(share=2.0)
    with pytest.raises(ConfigTypeError):
        AuditPolicy(rtol="small")  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError):
        audit_policy({"tolerance": 1})
    with pytest.raises(ConfigTypeError):
        audit_policy("often")
    with pytest.raises(TypeError):
        AuditPolicy(0.1)  # type: ignore[misc]  # keyword-only


def test_the_audit_option_is_off_with_mlcache_audit_0(monkeypatch, tmp_path):
    monkeypatch.setenv("MLCACHE_AUDIT", "0")
    assert audit_policy(True) is None and audit_policy(AuditPolicy(share=0.5)) is None
    assert Memory(tmp_path, verbose=0).context.audit is None


def test_a_memory_pickles_with_its_audit_option(tmp_path):
    import pickle

    off = pickle.loads(pickle.dumps(Memory(tmp_path, verbose=0, audit=False)))
    assert off.context.audit is None
    mine = AuditPolicy(rtol=1e-6)
    assert pickle.loads(pickle.dumps(Memory(tmp_path, audit=mine))).context.audit == mine


def test_a_key_another_process_holds_is_not_audited_and_a_due_audit_returns_the_fresh_value(
    tmp_path,
):
    calls = []

    def slow(x):
        calls.append(x)
        time.sleep(0.002)
        return [x]

    mem = Memory(tmp_path, verbose=0, audit=AuditPolicy(share=1.0, after=0.0))
    f = mem.cache(slow)
    f(1)
    name = f._name((1,), {})
    with mem.store.lock(name, 0) as held:  # as another process computing or auditing it
        assert held
        for _ in range(20):
            assert f(1) == [1]
    assert calls == [1] and f.stats().audits == 0
    for _ in range(20):
        assert f(1) == [1]
    assert len(calls) > 1 and f.stats().audits == len(calls) - 1
