"""Cache keys: which function (:mod:`.identity`), which code
(:mod:`.code_version`), which arguments (:mod:`.hashing`, :mod:`.call`).

Inside the package, imports point down::

    call, code_version          the key of a call; functions' code versions
      |                         (code_version registers the hashing of
    dependencies, identity      functions and classes into hashing's table)
      |
    state, _handlers            what calls change; the handlers of value types
      |
    hashing                     the canonical stream, the dispatch table
      |
    bytecode, origin            normalised code; user code or a library's

Importing any ``mlcache.keys`` module runs this file first, which imports the
handler modules: so a function is never hashed without its code version,
whatever a program imports first.
"""

from . import _handlers, code_version, hashing

__all__ = ["_handlers", "code_version", "hashing"]
