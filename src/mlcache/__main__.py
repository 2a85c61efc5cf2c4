"""``python -m mlcache``: the ``mlcache`` command."""

import sys

from .cli import main

if __name__ == "__main__":  # a spawned worker imports this module again: it must not run
    sys.exit(main())
