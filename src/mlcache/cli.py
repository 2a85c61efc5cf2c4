"""The ``mlcache`` command (a thin layer over the Python API).

Exit codes: 0 done; 1 the command found a problem (``verify``: damaged entries
or packs left in place); 2 a usage error (bad arguments, no cache at the
location, no such function or pack).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from typing import Any

from . import __version__, admin
from ._tables import print_table
from ._util import parse_bytes, parse_duration
from .memo.memory import Memory
from .store.local import cache_folder, default_location

OK, PROBLEM, USAGE = 0, 1, 2


# -- formatting -------------------------------------------------------------------------
def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _age(t: float | None) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= span:
            return f"{s / span:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.3f} s" if s < 60 else str(_dt.timedelta(seconds=round(s)))


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


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
    rows = [
        [
            f.func,
            str(f.entries),
            _size(f.size),
            _age(f.last_used),
            str(f.hits),
            str(f.misses),
            _secs(f.saved),
        ]
        for f in funcs
    ]
    headers = ["function", "entries", "size", "last use", "hits", "misses", "time saved"]
    print_table(f"Functions in {location}", headers, rows)
    print()
    rows = [
        [
            p.name,
            "damaged" if p.error else f"{p.samples:,}",
            _size(p.size),
            _age(p.built),
            ", ".join(f["name"] for f in p.fields),
        ]
        for p in found
    ]
    print_table(f"Datasets in {location}", ["pack", "samples", "size", "built", "fields"], rows)
    return OK


def _info(mem: Memory, location: str, args: argparse.Namespace) -> int:
    st = admin.find_function(mem, args.name)
    if st is not None:
        entries = admin.function_entries(mem, st)
        if args.json:
            _dump({"function": st.as_dict(), "entries": entries})
            return OK
        print(
            f"{st.func}: {st.entries} entries, {_size(st.size)}, {st.hits} hits, "
            f"{st.misses} misses, {_secs(st.saved)} of computing saved"
        )
        rows = [
            [
                e["key"][:12],
                ", ".join(f"{k}={v}" for k, v in e["args"].items())[:80],
                _size(e["size"]),
                _age(e["created"]),
                _age(e["last_used"]),
                _secs(e["duration"]),
            ]
            for e in entries
        ]
        print_table("Entries", ["key", "arguments", "size", "created", "last use", "compute"], rows)
        return OK
    pack = admin.find_pack(location, args.name)
    if pack is None:
        print(f"no function or pack named {args.name!r} in {location}", file=sys.stderr)
        return USAGE
    if args.json:
        _dump(pack.as_dict())
        return OK if not pack.error else PROBLEM
    if pack.error:
        print(f"{pack.path}: {pack.error}")
        return PROBLEM
    print(
        f"{pack.path}: {pack.samples:,} samples, {_size(pack.size)}, "
        f"pack format version {pack.version}"
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
    return OK


def _clear(mem: Memory, location: str, args: argparse.Namespace) -> int:
    cleared = admin.clear(mem, location, args.name)
    if cleared is None:
        print(f"no function or pack named {args.name!r} in {location}", file=sys.stderr)
        return USAGE
    if args.name is None:
        funcs, found = len(cleared.functions), len(cleared.packs)
        text = f"cleared {funcs} functions and {found} dataset packs in {location}"
    elif cleared.functions:
        st = cleared.functions[0]
        text = f"cleared {st.func} ({st.entries} entries, {_size(st.size)})"
    else:
        pack = cleared.packs[0]
        text = f"removed {pack.name} ({_size(pack.size)})"
    if args.json:
        _dump({"location": location, "cleared": cleared.names})
    else:
        print(text)
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
    plan = admin.prune(mem, max_size=max_size, older_than=older, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    if args.json:
        _dump(
            {
                "dry_run": args.dry_run,
                "removed": [
                    {"name": e.name, "size": e.size, "last_used": e.last_used} for e in plan
                ],
            }
        )
        return OK
    for e in plan:
        print(f"{verb} {e.name} ({_size(e.size)}, last used {_age(e.last_used)})")
    print(f"{verb} {len(plan)} items, {_size(sum(e.size for e in plan))}")
    return OK


def _verify(mem: Memory, location: str, args: argparse.Namespace) -> int:
    damaged = mem.verify(fix=args.fix)
    bad_packs = admin.verify_packs(location, fix=args.fix)
    if args.json:
        report = {"location": location, "damaged": damaged, "damaged_packs": bad_packs}
        _dump(report | {"fixed": args.fix})
    else:
        for name in damaged:
            print(f"damaged entry: {name}" + (" (removed)" if args.fix else ""))
        for bad in bad_packs:
            print(f"damaged pack: {bad['error']}" + (" (removed)" if bad["removed"] else ""))
        print(f"{len(damaged)} damaged entries, {len(bad_packs)} damaged packs in {location}")
    left = (damaged and not args.fix) or any(not bad["removed"] for bad in bad_packs)
    return PROBLEM if left else OK


def _bench(args: argparse.Namespace) -> int:
    import subprocess

    # only the checkout this package was installed from (src/mlcache -> ../../benchmarks),
    # never a script found in the current folder
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(os.path.dirname(os.path.dirname(here)), "benchmarks", "run_all.py")
    if os.path.exists(script):
        return subprocess.call([sys.executable, script, *(["--quick"] if args.quick else [])])
    print(
        "mlcache bench runs the scripts in benchmarks/ of a source checkout; "
        "run it from the repository folder",
        file=sys.stderr,
    )
    return USAGE


# -- the parser -------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlcache", description="Inspect and manage an mlcache cache; run the demo."
    )
    parser.add_argument("--version", action="version", version=f"mlcache {__version__}")
    where = "cache folder (default: $MLCACHE_DIR or the user cache folder)"
    parser.add_argument("--location", default=None, help=where)
    # also accepted after the command: `mlcache ls --location DIR`
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--location", default=argparse.SUPPRESS, help=where)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, json: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[shared])
        if json:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    command("ls", "functions and datasets in the cache: entries, size, last use, hits, time saved")
    p = command("info", "one function's entries, or one pack's fields")
    p.add_argument("name", help="a function (its name or module.name) or a pack")
    p = command("clear", "remove everything, or one function's results or one pack")
    p.add_argument("name", nargs="?", default=None, help="a function or a pack (default: all)")
    p = command("prune", "remove least recently used results and packs")
    p.add_argument("--max-size", default=None, help="keep at most this much, e.g. 10GB")
    p.add_argument("--older-than", default=None, help="remove what was unused for, e.g. 7d")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p = command("verify", "check every entry's and pack's checksums")
    p.add_argument("--fix", action="store_true", help="remove damaged entries and packs")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
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
    if args.command == "bench":
        return _bench(args)
    location = cache_folder(args.location) if args.location else default_location()
    if not os.path.isdir(location):
        print(f"no cache at {location}", file=sys.stderr)
        return USAGE
    mem = Memory(location, verbose=0)
    handlers = {"ls": _ls, "info": _info, "clear": _clear, "prune": _prune, "verify": _verify}
    try:
        return handlers[args.command](mem, location, args)
    except (ValueError, OSError) as exc:  # an ambiguous name; a folder it cannot read
        print(f"mlcache {args.command}: {exc}", file=sys.stderr)
        return USAGE if isinstance(exc, ValueError) else PROBLEM


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
