"""The ``mlcache`` command (a thin layer over :mod:`mlcache.admin`).

Global options (``--location``, ``--json``) go before or after the command.
A missing or empty cache is an empty result, not an error (as ``pip cache``).
Output piped into ``head`` ends quietly.

Exit codes: 0 done; 1 the command found a problem (``verify``: damaged entries
or packs left in place); 2 a usage error (bad arguments, no such function or
pack in the cache, ``clear`` of everything refused without confirmation).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from typing import Any

from . import __version__, admin
from ._tables import age_text as _age
from ._tables import count_text as _n
from ._tables import duration_text as _duration
from ._tables import print_table
from ._tables import seconds_text as _secs
from ._tables import size_text as _size
from ._util import parse_bytes, parse_duration
from .data.fetch import is_url
from .memo.memory import Memory
from .store.local import cache_folder, default_location

OK, PROBLEM, USAGE = 0, 1, 2


# -- formatting -------------------------------------------------------------------------
def _short(func: str) -> str:
    """A function's name as a reader wants it: a script's path (``__main__.f@/home/me/
    proj/train.py``) relative to the current folder when it lies below it, else under
    ``~``; :func:`_full` turns it back."""
    name, at, path = func.rpartition("@")
    if not at or not os.path.isabs(path):
        return func
    here = os.getcwd()
    if here != os.sep and path.startswith(os.path.join(here, "")):
        return f"{name}@{os.path.relpath(path, here)}"
    home = os.path.expanduser("~")
    if home != "~" and path.startswith(os.path.join(home, "")):
        return f"{name}@~{path[len(home) :]}"
    return func


def _full(name: str) -> str:
    """A name as given on the command line, with the script path :func:`_short` gave
    made absolute again (``f@train.py``, ``f@~/proj/train.py``)."""
    func, at, path = name.rpartition("@")
    if not at or not path or os.path.isabs(path) or "://" in path:
        return name
    return f"{func}@{os.path.abspath(os.path.expanduser(path))}"


def _again(args: argparse.Namespace, *words: str) -> str:
    """A command to suggest, with the options that chose this cache (``mlcache
    --location cache clear --yes``): without them it would act on another cache."""
    where = ["--location", args.location] if args.location else []
    return "`" + shlex.join(["mlcache", *where, *words]) + "`"


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _terminal() -> bool:
    return sys.stdout.isatty()


_NOT_OURS = (
    "made by mlcache.data.pack(), which mlcache cannot rebuild: kept (--all-packs removes it)"
)


# -- commands ---------------------------------------------------------------------------
def _ls(mem: Memory, location: str, args: argparse.Namespace) -> int:
    funcs, found = admin.functions(mem), admin.packs(location)
    if args.json:
        _dump(
            {
                "location": location,
                "functions": [f.as_dict() for f in funcs],
                "datasets": [p.as_dict() for p in found],
            }
        )
        return OK
    if not found and not any(f.entries for f in funcs):
        print(f"the cache at {location} is empty: nothing to list")
        return OK
    rows = [
        [
            _short(f.func) if f.func else f.folder,
            f"{f.entries:,}",
            _size(f.size),
            _age(f.last_used),
            f"{f.hits:,}",
            f"{f.misses:,}",
            _secs(f.computed),
            _secs(f.saved),
            f"{f.audits:,}" + (f" ({f.mismatches:,} wrong)" if f.mismatches else ""),
        ]
        for f in funcs
    ]
    headers = ["function", "entries", "size", "last use", "hits", "misses", "computing"]
    headers += ["time saved", "audits"]
    print_table(f"Functions in {location}", headers, rows)
    print()
    rows = [
        [
            p.name,
            p.dataset.rpartition(".")[2] if p.dataset else "pack()",
            "replaced" if p.replaced_by else "current",
            "damaged" if p.error else f"{p.samples:,}",
            _size(p.size),
            _age(p.last_used),
            f"{p.hits:,}" if p.dataset else "-",
            f"{p.misses:,}" if p.dataset else "-",
            _secs(p.computed) if p.dataset else "-",
            _secs(p.saved) if p.dataset else "-",
            ", ".join(f["name"] for f in p.fields),
        ]
        for p in found
    ]
    headers = ["pack", "made by", "state", "samples", "size", "last use", "hits", "builds"]
    headers += ["building", "time saved", "fields"]
    print_table(f"Datasets in {location}", headers, rows)
    print()
    print(_totals(funcs, found))
    return OK


def _totals(funcs: list[Any], found: list[admin.PackInfo]) -> str:
    """``ls``'s last line: what the cache holds, and what it saved."""
    results = sum(f.entries for f in funcs)
    line = (
        f"total: {_n(results, 'result')} of {_n(sum(1 for f in funcs if f.entries), 'function')}"
        f", {_size(sum(f.size for f in funcs))}; {_n(len(found), 'dataset pack')}, "
        f"{_size(sum(p.size for p in found))}"
    )
    saved = sum(f.saved for f in funcs) + sum(p.saved for p in found)
    return line + (f"; saved {_duration(saved)} of computing" if saved else "")


def _info(mem: Memory, location: str, args: argparse.Namespace) -> int:
    st = admin.find_function(mem, _full(args.name))
    chosen = [] if st is not None else admin.find_packs(location, args.name)
    entries = admin.function_entries(mem, st) if st is not None else []
    if args.json and (st is not None or chosen):
        _dump(
            {
                "location": location,
                "function": st.as_dict() if st is not None else None,
                "entries": entries,
                "datasets": [p.as_dict() for p in chosen],
            }
        )
        return OK
    if st is not None:
        print(
            f"{_short(st.func) if st.func else st.folder}: {_n(st.entries, 'entry', 'entries')}, "
            f"{_size(st.size)}, "
            f"{_n(st.hits, 'hit')}, {_n(st.misses, 'miss', 'misses')}, "
            f"{_secs(st.computed)} spent computing, {_secs(st.saved)} of computing saved; "
            f"{_n(st.audits, 'audit')} ({_n(st.mismatches, 'mismatch', 'mismatches')}, "
            f"{_secs(st.audited)})"
        )
        short = _terminal()  # a terminal's reader; a script gets whole keys
        rows = [
            [
                e["key"][:12] if short else e["key"],
                (lambda a: a[:80] if short else a)(
                    ", ".join(f"{k}={v}" for k, v in e["args"].items())
                ),
                _size(e["size"]),
                _age(e["created"]),
                _age(e["last_used"]),
                _secs(e["duration"]),
            ]
            for e in entries
        ]
        headers = ["key", "arguments", "size", "created", "last use", "compute"]
        print_table("Entries", headers, rows)
        return OK
    if not chosen:
        if _is_empty(mem, location):
            return _empty(location, args, missing=False)
        _no_such(args, location)
        return USAGE
    for i, pack in enumerate(chosen):
        if i:
            print()
        _pack_info(pack)
    return OK


def _no_such(args: argparse.Namespace, location: str) -> None:
    where = f"no function or dataset named {args.name!r} in {location}"
    print(f"{where}: {_again(args, 'ls')} lists the names", file=sys.stderr)


def _pack_info(pack: admin.PackInfo) -> None:
    made = f"built by the dataset {pack.dataset}" if pack.dataset else "made by pack()"
    if pack.replaced_by:  # still read by a process: removed when none does
        made += f", replaced by {os.path.basename(pack.replaced_by)}"
    if pack.error:
        print(f"{pack.path} ({made}): damaged: {pack.error}; `mlcache verify` says more")
        return
    print(
        f"{pack.path} ({made}): {_n(pack.samples or 0, 'sample')}, {_size(pack.size)}, "
        f"last used {_age(pack.last_used)}, pack format version {pack.version}"
    )
    if pack.dataset:
        print(
            f"{_n(pack.hits, 'hit')} (opens that found it built), {_n(pack.misses, 'build')}, "
            f"{_secs(pack.computed)} spent building, {_secs(pack.saved)} of building saved"
        )
    rows = [
        [
            f["name"],
            f["kind"] + (" (some None)" if f.get("nullable") else ""),
            f.get("dtype", "-"),
            str(f.get("shape", f.get("ndim", "-"))),
        ]
        for f in pack.fields
    ]
    print_table("Fields", ["field", "kind", "dtype", "shape (column) or ndim (ragged)"], rows)


def _what(cleared: admin.Cleared) -> str:
    results = sum(st.entries for st in cleared.functions)
    parts = []
    if cleared.functions:
        parts.append(
            f"{_n(results, 'result')} of {_n(len(cleared.functions), 'function')}"
            if len(cleared.functions) > 1
            else f"{_short(cleared.functions[0].func) or cleared.functions[0].folder} "
            f"({_n(results, 'result')})"
        )
    if cleared.packs:
        parts.append(_n(len(cleared.packs), "dataset pack"))
    return f"{' and '.join(parts) or 'nothing'}, {_size(cleared.size)}"


def _confirmed(question: str) -> bool:
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _clear(mem: Memory, location: str, args: argparse.Namespace) -> int:
    args.name = _full(args.name) if args.name else None
    plan = admin.clear(mem, location, args.name, dry_run=True)
    if (plan is None or not plan.size) and _is_empty(mem, location):
        return _empty(location, args, missing=False)
    if plan is None:
        _no_such(args, location)
        return USAGE
    ours = [p for p in plan.packs if not p.rebuildable]
    if args.name is None and not args.dry_run and not args.yes and plan.names:
        question = f"Remove everything in {location}: {_what(plan)}?"
        if ours:
            question += f" {_n(len(ours), 'pack')} made by pack() cannot be rebuilt."
        if not sys.stdin.isatty():
            print(
                f"mlcache clear: this would remove {_what(plan)} from {location}; there is no "
                f"terminal to confirm on: run {_again(args, 'clear', '--yes')} to remove that, "
                f"{_again(args, 'clear', '--dry-run')} to list it",
                file=sys.stderr,
            )
            return USAGE
        if not _confirmed(question):
            print("nothing removed", file=sys.stderr)
            return OK
    done = plan if args.dry_run else admin.clear(mem, location, args.name)
    if done is None:  # removed meanwhile by another process
        done = admin.Cleared([], [])
    if args.json:
        _dump({"location": location, "dry_run": args.dry_run, "cleared": done.names})
        return OK
    verb = "would remove" if args.dry_run else "removed"
    if args.dry_run:
        for name in done.names:
            print(f"{verb} {name}")
    print(
        f"{verb} {_what(done)} from {location}" if done.names else f"{location}: nothing to clear"
    )
    return OK


def _prune(mem: Memory, location: str, args: argparse.Namespace) -> int:
    try:
        max_size = parse_bytes(args.max_size)
        older = parse_duration(args.older_than)
    except (ValueError, TypeError) as exc:
        print(f"mlcache prune: {exc}", file=sys.stderr)
        return USAGE
    if max_size is None and older is None:
        print("mlcache prune: give --max-size and/or --older-than", file=sys.stderr)
        return USAGE
    limits: dict[str, Any] = {"max_size": max_size, "older_than": older}
    plan = admin.prune(mem, **limits, all_packs=args.all_packs, dry_run=True)
    if not args.json and not args.dry_run and plan.removed:
        print(f"removing {_items(plan.removed)} from {location}")
    # the plan said is the plan carried out (one listing of the cache, not two)
    pruned = (
        plan
        if args.dry_run
        else admin.Pruned(admin.remove(mem, plan.removed, progress=True), plan.kept)
    )
    verb = "would remove" if args.dry_run else "removed"
    if args.json:
        rows = [w.as_dict() for w in pruned.removed]
        kept = [w.as_dict() | {"open": w.name in pruned.open} for w in pruned.kept]
        _dump({"location": location, "dry_run": args.dry_run, "removed": rows, "kept": kept})
        return OK
    for w in pruned.removed:
        print(f"{verb} {w.name} ({_size(w.size)}, last used {_age(w.last_used)}): {_why(w, older)}")
    for w in pruned.kept:
        why = "a process has it open (read now)" if w.name in pruned.open else _NOT_OURS
        print(f"kept {w.name} ({_size(w.size)}): {why}")
    print(f"{verb} {_items(pruned.removed)}")
    return OK


def _why(w: Any, older: float | None) -> str:
    """Why ``prune`` removes an entry: its age, or its worth (what keeping it saves)."""
    if w.reason == "age":
        return f"unused for more than {_duration(older or 0)}"
    made = "rebuilds" if w.name.endswith(".pack") else "recomputes"
    cost = f"{made} in {'~' if w.estimated else ''}{_secs(w.cost)}" + (
        " (its cost not recorded: the others' median per byte)" if w.estimated else ""
    )
    return f"worth least: {cost}, {_secs(w.seconds_per_mib)} per MiB kept"


def _items(found: list[Any]) -> str:
    return f"{_n(len(found), 'item')}, {_size(sum(e.size for e in found))}"


def _verify(mem: Memory, location: str, args: argparse.Namespace) -> int:
    bad = admin.verify(mem, location, fix=args.fix, all_packs=args.all_packs, progress=True)
    entries = [b for b in bad if b.kind == "entry"]
    found = [b for b in bad if b.kind == "pack"]
    left = [b for b in bad if not b.removed]
    if args.json:
        _dump(
            {
                "location": location,
                "fixed": args.fix,
                "damaged": [b.name for b in entries],  # names, as before
                "damaged_entries": [b.as_dict() for b in entries],
                "damaged_packs": [b.as_dict() | {"error": b.detail} for b in found],
            }
        )
        return PROBLEM if left else OK
    for b in bad:
        what = "entry" if b.kind == "entry" else "dataset pack"
        status = "cannot be read" if b.unreadable else "damaged"
        line = f"{status} {what} {b.name}: {b.reason}"
        if b.removed:
            line += " (removed: " + (
                "its next call computes it again)"
                if b.kind == "entry"
                else "its dataset builds it again at its next open)"
            )
        elif b.kind == "pack" and not b.rebuildable and not b.unreadable and args.fix:
            line += " (" + _NOT_OURS.replace(" it", " this pack") + ")"
        print(line)
    print(
        f"{_n(len(entries), 'damaged entry', 'damaged entries')}, "
        f"{_n(len(found), 'damaged pack')} in {location}"
    )
    fixable = [b for b in left if not b.unreadable and (b.rebuildable or not args.fix)]
    if fixable and not args.fix:
        print(
            f"run {_again(args, 'verify', '--fix')} to remove the damaged entries and dataset "
            "packs: mlcache makes them again when they are next used"
            + (
                "; packs made by pack() are kept unless you add --all-packs "
                "(mlcache cannot rebuild them)"
                if any(not b.rebuildable for b in fixable)
                else ""
            )
        )
    return PROBLEM if left else OK


def _bench(args: argparse.Namespace) -> int:
    import subprocess

    # only the checkout this package was installed from (src/mlcache -> ../../benchmarks),
    # never a script found in the current folder
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(os.path.dirname(os.path.dirname(here)), "benchmarks", "run_all.py")
    if os.path.exists(script):
        options = ["--quick"] if args.quick else []
        options += ["--only", *args.only] if args.only else []
        return subprocess.call([sys.executable, script, *options])
    say = "mlcache bench runs the scripts in benchmarks/ of a source checkout"
    print(f"{say}; run it from the repository folder", file=sys.stderr)
    return USAGE


def _is_empty(mem: Memory, location: str) -> bool:
    """No results (statistics may stay) and no packs."""
    funcs = admin.functions(mem)
    return not any(f.entries for f in funcs) and not admin.packs(location, detail=False)


def _empty(location: str, args: argparse.Namespace, missing: bool) -> int:
    """A command on a missing cache: an empty result."""
    what = f"no cache at {location}" if missing else f"the cache at {location} is empty"
    if args.json:
        empties: dict[str, dict[str, Any]] = {
            "ls": {"functions": [], "datasets": []},
            "info": {"function": None, "entries": [], "datasets": []},
            "clear": {"dry_run": getattr(args, "dry_run", False), "cleared": []},
            "prune": {"dry_run": getattr(args, "dry_run", False), "removed": [], "kept": []},
            "verify": {"fixed": False, "damaged": [], "damaged_entries": [], "damaged_packs": []},
        }
        _dump({"location": location} | empties[args.command])
        return OK
    nothing = {"info": f"nothing named {getattr(args, 'name', '')!r}"}.get(
        args.command, f"nothing to {'list' if args.command == 'ls' else args.command}"
    )
    print(f"{what}: {nothing}")
    return OK


# -- the parser -------------------------------------------------------------------------
_WHERE = (
    "the cache folder, or a shared cache's URL (s3://bucket/cache) (default: $MLCACHE_DIR, "
    "else the user cache folder)"
)
_JSON = "print machine-readable JSON"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlcache",
        description="Inspect and manage an mlcache cache; run the demo.",
        epilog="--location and --json may go before or after the command. Exit codes: 0 done, "
        "1 a problem found (verify), 2 a usage error.",
    )
    parser.add_argument("--version", action="version", version=f"mlcache {__version__}")
    parser.add_argument("--location", default=None, help=_WHERE)
    parser.add_argument("--json", action="store_true", default=False, help=_JSON)
    # the same options after the command (`mlcache ls --json --location DIR`); SUPPRESS:
    # absent after it, the value before it stays
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--location", default=argparse.SUPPRESS, help=_WHERE)
    shared = argparse.ArgumentParser(add_help=False, parents=[where])
    shared.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=_JSON)
    sub = parser.add_subparsers(dest="command", metavar="command")

    def command(name: str, help: str, json: bool = True) -> argparse.ArgumentParser:
        parents = [shared if json else where]
        return sub.add_parser(name, help=help, description=help, parents=parents)

    command(
        "ls",
        "list the functions (results, size, last use, hits, misses, time saved) and the "
        "dataset packs in the cache",
    )
    names = "a function (module.name, its name, or its folder), a pack (its path or file "
    names += "name), or a dataset class (every pack it built), as `mlcache ls --json` prints"
    p = command("info", "show one function's entries, or a dataset pack's fields")
    p.add_argument("name", help=names)
    p = command(
        "clear",
        "remove one function's results, or a dataset's packs; with no name, everything "
        "(asks first on a terminal; elsewhere give --yes)",
    )
    p.add_argument(
        "name",
        nargs="?",
        default=None,
        help=names + " (default: everything; a URL: everything in that shared cache)",
    )
    p.add_argument("-y", "--yes", action="store_true", help="remove everything without asking")
    p.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    p = command(
        "prune",
        "remove the least recently used results and dataset packs; packs made by "
        "mlcache.data.pack() are kept (mlcache cannot rebuild them) unless --all-packs",
    )
    p.add_argument(
        "--max-size",
        default=None,
        help="keep at most this much, e.g. 10GB (0: all that mlcache can rebuild)",
    )
    p.add_argument("--older-than", default=None, help="remove what was unused for, e.g. 7d")
    p.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    all_packs = "also remove packs made by mlcache.data.pack(), which mlcache cannot rebuild"
    p.add_argument("--all-packs", action="store_true", help=all_packs)
    p = command("verify", "check every byte of every entry and dataset pack; say what is damaged")
    p.add_argument(
        "--fix",
        action="store_true",
        help="remove the damaged entries and packs (mlcache makes them again when next used); "
        "packs made by pack() only with --all-packs",
    )
    p.add_argument("--all-packs", action="store_true", help="with --fix: " + all_packs)
    demo = command("demo", "show what mlcache saves, timed on generated data", json=False)
    demo.add_argument("--size", type=int, default=None, help="array side (default 4000)")
    demo.add_argument(
        "--patients", type=int, default=None, help="patient files to generate (default 5000)"
    )
    demo.add_argument(
        "--out", default="mlcache-demo", help="folder of the chart and report (./mlcache-demo)"
    )
    demo.add_argument("--quick", action="store_true", help="a small, fast run (for CI)")
    bench = command("bench", "run benchmarks/ (a source checkout) and print ratios", json=False)
    bench.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    bench.add_argument(
        "--only", nargs="+", metavar="SCRIPT", help="these scripts only (bench_hit.py ...)"
    )
    return parser


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .demo import run_demo

    size = args.size if args.size is not None else (300 if args.quick else 4000)
    patients = args.patients if args.patients is not None else (300 if args.quick else 5000)
    if size <= 0 or patients <= 0:
        parser.error("--size and --patients must be positive")
    try:
        os.makedirs(args.out, exist_ok=True)  # before the run: fail in a second, not after
        with tempfile.TemporaryFile(dir=args.out):
            pass
    except OSError as exc:
        print(f"mlcache demo: cannot write the report to {args.out}: {exc}", file=sys.stderr)
        return USAGE
    run_demo(size=size, patients=patients, location=args.location, out_dir=args.out)
    return OK


def _run(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `mlcache`: what it can do
        parser.print_help()
        return OK
    if args.command in ("demo", "bench") and args.json:
        parser.error(f"mlcache {args.command} has no --json output")
    if args.command == "demo":
        return _demo(parser, args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "clear" and args.location is None and is_url(args.name):
        args.location, args.name = args.name, None  # `mlcache clear s3://bucket/cache`
    if is_url(args.location):  # a shared cache: its function results (fsspec, and the
        location = args.location.rstrip("/")  # usual AWS_* variables for S3)
    else:
        location = cache_folder(args.location) if args.location else default_location()
        if not os.path.isdir(location):  # nothing is created for a look
            return _empty(location, args, missing=True)
    mem = Memory(location, verbose=0)
    handlers = {"ls": _ls, "info": _info, "clear": _clear, "prune": _prune, "verify": _verify}
    try:
        return handlers[args.command](mem, location, args)
    except KeyboardInterrupt:  # ^C (at clear's question, or during a long verify)
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # see main
    except (ValueError, OSError) as exc:  # an ambiguous name; a folder it cannot read
        print(f"mlcache {args.command}: {exc}", file=sys.stderr)
        return USAGE if isinstance(exc, ValueError) else PROBLEM


def main(argv: list[str] | None = None) -> int:
    """The ``mlcache`` command; its exit code."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, so that a closed pipe shows now, not at exit
        return code
    except KeyboardInterrupt:  # ^C (at clear's question, or during a long verify)
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (`| head`) has what it wanted: end quietly, as `ls | head` does;
        # stdout goes to devnull so that the interpreter's last flush finds no pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
