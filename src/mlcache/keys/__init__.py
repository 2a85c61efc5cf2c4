"""Cache keys: which function (:mod:`.identity`), which code
(:mod:`.code_version`), which arguments (:mod:`.hashing`, :mod:`.call`).

Inside the package, imports point down::

    call, code_version            the key of a call; code versions (which register
      |                           the hashing of functions and classes)
    dependencies, learned         the walk behind a code version; what a cached
      |                           call or a dataset's build is learned to change
    identity, state, _handlers    which function; what calls change; the hashing
      |                           handlers of value types (numpy, pandas, torch...)
    hashing                       the canonical stream and its dispatch table
      |
    bytecode, origin, blocks      normalised code; user code or a library's;
                                  large buffers hashed block by block

Importing any ``mlcache.keys`` module runs this file first, which imports the
handler modules: so a function is never hashed without its code version,
whatever a program imports first.
"""

from . import _handlers, code_version, hashing

__all__ = ["_handlers", "code_version", "hashing"]
