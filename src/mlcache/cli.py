"""The ``mlcache`` command (a thin layer over the Python API)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from ._default import default_location
from .memory import Memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mlcache", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mlcache {__version__}")
    parser.add_argument(
        "--location",
        default=None,
        help="cache folder (default: $MLCACHE_DIR or the user cache folder)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", help="check every entry's checksums")
    verify.add_argument("--fix", action="store_true", help="remove damaged entries")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    demo = sub.add_parser("demo", help="time the function cache on generated data")
    demo.add_argument("--size", type=int, default=4000, help="array side (default 4000)")
    demo.add_argument("--quick", action="store_true", help="a small, fast run (for CI)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        if args.size <= 0:
            parser.error(f"--size must be positive, got {args.size}")
        run_demo(size=300 if args.quick else args.size, location=args.location)
        return 0
    location = args.location or default_location()
    if not os.path.isdir(location):
        print(f"no cache at {location}", file=sys.stderr)
        return 2
    mem = Memory(location, verbose=0)
    if args.command == "verify":
        damaged = mem.verify(fix=args.fix)
        if args.json:
            print(json.dumps({"location": location, "damaged": damaged, "fixed": args.fix}))
        else:
            for name in damaged:
                print(f"damaged: {name}" + (" (removed)" if args.fix else ""))
            print(f"{len(damaged)} damaged entries in {location}")
        return 1 if damaged and not args.fix else 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
