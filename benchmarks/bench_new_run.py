"""The hits a user meets first: the next run of a script, in a fresh process.

A small function (two ints in, a small dict out), defined in a module of its own,
has 200 entries in a mlcache cache and in a joblib cache. Each trial starts a
fresh Python process per library that imports it, makes its ``Memory``, and hits
the 200 entries once each (the next run of a script that calls a cached step per
item); the same process then hits them all again (the repeated hit that the
README's headline figure used to be). The child times only the calls: interpreter
start-up and imports are reported apart. Processes of the two libraries alternate.

    python benchmarks/bench_new_run.py [--quick] [--dir PARENT]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from _bench import Result, Target, finish, machine_note, parse_args, report, scratch_dir

WORK = textwrap.dedent(
    """
    def small(a, b):
        return {"sum": a + b, "pair": [a, b], "name": "item%d" % a}
    """
)

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    which, loc, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if which == "mlcache":
        from mlcache import Memory
    else:
        from joblib import Memory
    import work
    mem = Memory(loc, verbose=0)
    f = mem.cache(work.small)
    t1, c1 = time.perf_counter(), time.thread_time()
    first = f(0, 1)
    t2 = time.perf_counter()
    for i in range(1, n):
        f(i, i + 1)
    t3, c3 = time.perf_counter(), time.thread_time()
    for i in range(n):
        f(i, i + 1)
    t4 = time.perf_counter()
    assert first == {"sum": 1, "pair": [0, 1], "name": "item0"}, first
    print(json.dumps({"setup": t1 - t0, "first": t2 - t1, "new": (t3 - t1) / n,
                      "repeated": (t4 - t3) / n, "new_cpu": (c3 - c1) / n}))
    """
)


def child(which: str, loc: str, n: int, scratch: str) -> dict[str, float]:
    # the children run in the scratch folder: a relative PYTHONPATH entry (``src``)
    # would name nothing there, and they would import the installed mlcache
    inherited = [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    res = subprocess.run(
        [sys.executable, "-c", CHILD, which, loc, str(n)],
        capture_output=True,
        text=True,
        cwd=scratch,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([scratch, *inherited])},
        check=False,
    )
    if res.returncode != 0:
        sys.exit(f"the {which} child failed:\n{res.stderr[-3000:]}")
    out: dict[str, float] = json.loads(res.stdout)
    return out


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    n, trials = (50, 2) if args.quick else (200, 9)
    print(f"# bench_new_run\n\n{machine_note()}")
    with scratch_dir(args.dir, "new-run") as scratch:
        with open(os.path.join(scratch, "work.py"), "w") as f:
            f.write(WORK)
        locs = {lib: os.path.join(scratch, lib) for lib in ("mlcache", "joblib")}
        for lib, loc in locs.items():  # the first run: computes and stores every entry
            child(lib, loc, n, scratch)
        rows = {
            f"{lib}: {what}": Result(f"{lib}: {what}", info=what not in ("new run", "repeated"))
            for lib in locs
            for what in ("new run", "repeated", "first call", "import + Memory", "new run, CPU")
        }
        for i in range(trials + 1):  # round 0 is a warm-up (file pages, .pyc)
            for lib in list(locs)[i % 2 :] + list(locs)[: i % 2]:
                got = child(lib, locs[lib], n, scratch)
                if i == 0:
                    continue
                rows[f"{lib}: new run"].times.append(got["new"])
                rows[f"{lib}: repeated"].times.append(got["repeated"])
                rows[f"{lib}: first call"].times.append(got["first"])
                rows[f"{lib}: import + Memory"].times.append(got["setup"])
                rows[f"{lib}: new run, CPU"].times.append(got["new_cpu"])
            print(f"  round {i}/{trials} done", file=sys.stderr, flush=True)
    out = report(
        f"a small function's hit, per call: {n} entries hit once each by a fresh "
        "process (the next run of a script), then again by the same process",
        rows,
        [
            Target("new run: joblib / mlcache", "joblib: new run", "mlcache: new run", ">=", 10),
            Target("repeated: joblib / mlcache", "joblib: repeated", "mlcache: repeated", ">=", 10),
        ],
        note="'new run' includes the first call (breakdown: 'first call', which pays "
        "what a function costs at its first use); 'import + Memory' is not in any row. "
        "'new run, CPU' is the same calls in the process's own CPU time (time.thread_time): "
        "what a busy machine adds to the wall-clock rows (waiting for a core) is not in it.",
    )
    return finish(args, "bench_new_run", {"hits": rows}, out)


if __name__ == "__main__":
    sys.exit(main())
