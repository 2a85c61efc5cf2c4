"""What a code object says, read from its bytecode: the normalised digest of what
it runs (:func:`code_digest`), the names it reads (:func:`references`), and how
it uses attributes and containers' keys (:func:`attribute_reads`,
:func:`subscript_uses`).

*Normalised code* is the bytecode without line numbers: instructions, names,
constants (recursively through nested functions, lambdas and comprehensions),
argument counts and flags, and which instructions sit inside ``try``. Constants
that no instruction loads are left out: that is where a docstring lives. So
comments, docstrings, blank lines and formatting never change a digest; any
change to what runs does, including a moved line or a debug print. The digest
names the Python version too (bytecode differs between versions).

This module is the bottom of :mod:`mlcache.keys`: the hashing of functions (in
a code walk) and code versions (:mod:`mlcache.keys.code_version`) both use it,
and it imports neither.

Both functions are cached per code object (code objects are immutable).
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import xxhash

__all__ = [
    "COMPUTED",
    "EVERY_ATTRIBUTE",
    "PY",
    "RAISED",
    "READ",
    "WHOLE",
    "attribute_reads",
    "code_digest",
    "global_reads",
    "references",
    "subscript_uses",
]

#: the Python version that every normalised digest names
PY = f"py{sys.version_info[0]}.{sys.version_info[1]}"
_CONST_OPS = frozenset(dis.hasconst)
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_DEREF_OPS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF"})


@functools.lru_cache(maxsize=8192)
def code_digest(code: types.CodeType) -> str:
    """The normalised digest of ``code`` (16 hex digits; see the module docstring).

    Examples
    --------
    >>> def f(x):
    ...     '''A docstring.'''
    ...     return x + 1  # a comment
    >>> def g(x):
    ...     return x + 1
    >>> code_digest(f.__code__) == code_digest(g.__code__)
    True
    """
    h = xxhash.xxh3_64(PY.encode())
    _code_bytes(code, h)
    return h.hexdigest()


#: opcodes whose argument is an index into ``co_consts`` (KW_NAMES: Python 3.11-3.12)
_CONST_CODES = frozenset(dis.hasconst) | {dis.opmap.get("KW_NAMES", -1)}


def _loaded_consts(code: types.CodeType) -> set[int]:
    """Indices of the constants some instruction loads (a docstring is not one).

    The bytecode is read as ``dis`` reads it (two bytes an instruction, prefixes
    of ``EXTENDED_ARG`` shifted into the argument; the inline caches of 3.11+ are
    zeros in ``co_code``, an opcode with no argument), without building an
    ``Instruction`` per instruction: a function's first call walks its code and
    the code it depends on (~40 µs for a one-line function with ``dis``)."""
    used: set[int] = set()
    raw = code.co_code
    ext = 0
    for i in range(0, len(raw), 2):
        op = raw[i]
        if op == dis.EXTENDED_ARG:
            ext = (ext | raw[i + 1]) << 8
            continue
        if op in _CONST_CODES:
            used.add(ext | raw[i + 1])
        ext = 0
    return used


def _code_bytes(code: types.CodeType, h: xxhash.xxh3_64) -> None:
    h.update(code.co_code)
    h.update(getattr(code, "co_exceptiontable", b""))  # Python 3.11+: where `try` is
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode())
    counts = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    h.update(repr(counts).encode())
    used = _loaded_consts(code)
    for i, const in enumerate(code.co_consts):
        if i not in used:
            continue  # the docstring (or the None that stands for its absence)
        h.update(b"%d:" % i)
        if isinstance(const, types.CodeType):
            h.update(b"<code>")
            _code_bytes(const, h)
        elif isinstance(const, frozenset):  # its repr depends on the hash seed
            h.update(repr(sorted(map(repr, const))).encode("utf-8", "surrogatepass"))
        else:
            h.update(repr(const).encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=4096)
def references(code: types.CodeType) -> list[tuple[str, ...]]:
    """The globals, attribute chains and body imports ``code`` reads, in nested
    code too, in the order first met:

    - ``("g", name, *attrs)``: a global (``helper``, ``utils.clean``);
    - ``("d", name, *attrs)``: a closure variable;
    - ``("i", module, level, *names)``: an import in the body (``level`` is the
      number of leading dots, as text). A module imported in the body and bound
      to a local name (``import proj.helpers as h``, ``from proj import
      helpers``) is followed through that name (``h.clean(x)``).

    The list is cached: do not change it.

    Examples
    --------
    >>> def f(x):
    ...     return np.linalg.norm(x)
    >>> references(f.__code__)
    [('g', 'np', 'linalg', 'norm')]
    """
    refs: list[tuple[str, ...]] = []
    for c in _all_code(code):
        chain: list[str] | None = None
        consts: list[object] = []
        imported: dict[str, tuple[str, ...]] = {}  # local name -> ("i", module, level, *names)
        pending: tuple[str, ...] | None = None  # what the next STORE_FAST binds
        for op, argval in _listed(c):
            if op in _ATTR_OPS and chain is not None:
                chain.append(str(argval))
                continue
            if chain is not None:
                refs.append(tuple(chain))
                chain = None
            if op in _GLOBAL_OPS:
                chain = ["g", str(argval)]
            elif op in _DEREF_OPS:
                chain = ["d", str(argval)]
            elif op == "LOAD_FAST" and str(argval) in imported:
                chain = list(imported[str(argval)])
            elif op == "IMPORT_NAME":
                level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
                names = consts[-1] if consts and isinstance(consts[-1], tuple) else ()
                module = str(argval)
                refs.append(("i", module, str(level)))
                refs.extend(("i", module, str(level), str(n)) for n in names)
                pending = ("i", module, str(level))
            elif op == "IMPORT_FROM" and pending is not None:
                source, attr = pending[1], str(argval)
                # `import a.b as h` binds the module a.b; `from a import b`, a.b
                if not source.endswith("." + attr):
                    pending = (*pending[:3], attr)
            elif op == "STORE_FAST" and pending is not None:
                imported[str(argval)] = pending
                pending = None
            elif op != "IMPORT_FROM":
                pending = None if op not in ("POP_TOP", "LOAD_CONST") else pending
            if op == "LOAD_CONST":
                consts.append(argval)
        if chain is not None:
            refs.append(tuple(chain))
    return list(dict.fromkeys(refs))


#: how the argument of the instructions :func:`references` reads becomes their value
#: on CPython 3.11 (``dis``'s rules: LOAD_GLOBAL's name index is shifted by one bit)
_NAMES_311 = {"LOAD_ATTR", "LOAD_METHOD", "LOAD_NAME", "IMPORT_NAME", "IMPORT_FROM"}
_NAMES_311 |= {"STORE_GLOBAL", "DELETE_GLOBAL"}
_LOCALS_311 = {"LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FAST", "STORE_FAST", "STORE_DEREF"}
_CACHE = dis.opmap.get("CACHE", -1)


def _instructions_311(code: types.CodeType) -> Iterator[tuple[str, Any]]:
    """(name, argument value) of each instruction of ``code``, as
    ``dis.get_instructions`` gives them on CPython 3.11 (``EXTENDED_ARG`` given,
    inline caches skipped: ``co_code`` holds them as ``CACHE`` units, opcode 0),
    without building an ``Instruction`` each: a function's first call walks its
    code and what it depends on (~55 µs a one-line function with ``dis``, ~130 µs
    the first time in a process). Only the values :func:`references` reads are
    resolved (others are None)."""
    raw, names, consts = code.co_code, code.co_names, code.co_consts
    # 3.11's fast locals: the variables (arguments first), the cells that are not
    # arguments, then the free variables (what dis's _varname_from_oparg indexes)
    local = code.co_varnames
    cells = tuple(c for c in code.co_cellvars if c not in local)
    localsplus = local + cells + code.co_freevars
    opnames, extended, with_arg, cache = dis.opname, dis.EXTENDED_ARG, dis.HAVE_ARGUMENT, _CACHE
    ext = 0
    for i in range(0, len(raw), 2):
        op = raw[i]
        if op == cache:
            continue
        name = opnames[op]
        if op < with_arg:
            ext = 0
            yield name, None
            continue
        arg = raw[i + 1] | ext
        ext = arg << 8 if op == extended else 0
        if name == "LOAD_GLOBAL":
            yield name, names[arg >> 1]
        elif name in _NAMES_311:
            yield name, names[arg]
        elif name in _LOCALS_311:
            yield name, localsplus[arg]
        elif name == "LOAD_CONST":
            yield name, consts[arg]
        elif name == "BINARY_OP":  # which operator: += is an in-place one
            yield name, arg
        else:
            yield name, None


def _instructions_dis(code: types.CodeType) -> Iterator[tuple[str, Any]]:
    for ins in dis.get_instructions(code):
        yield ins.opname, ins.argval


#: the bytecode of other Python versions is read by ``dis`` itself
_instructions = _instructions_311 if sys.version_info[:2] == (3, 11) else _instructions_dis


@functools.lru_cache(maxsize=1024)
def _listed(code: types.CodeType) -> tuple[tuple[str, Any], ...]:
    """:func:`_instructions` of ``code`` (not nested), kept a while: a walk reads
    each code object four times, one after the other (:func:`references`,
    :func:`attribute_reads`, :func:`subscript_uses`, :func:`global_reads`)."""
    return tuple(_instructions(code))


@functools.lru_cache(maxsize=8192)
def attribute_reads(code: types.CodeType) -> frozenset[str]:
    """The attribute names ``code`` (and the code nested in it) reads other than to
    raise them in place (``self.n += 1`` loads ``n`` right after a ``COPY``, or
    ``DUP_TOP`` before 3.11), and its string constants (``getattr(self, "n")``):
    an int a call raises that the code reads otherwise (a cursor, a seed) may
    change the result, so it is no counter (:mod:`mlcache.keys.state`).

    A closure variable is read when the code loads it more often than it raises
    it in place (``nonlocal pos; pos += n`` loads it once, for the ``+=``; a
    cursor ``data[pos:]`` once more): found as ``pos`` and ``<closure pos>``, as
    the parts of state name it. An object's attributes read whole (``vars(self)``,
    ``self.__dict__``; not to ``update`` them) may be any of them: found as
    :data:`EVERY_ATTRIBUTE`."""
    found: set[str] = set()
    for c in _all_code(code):
        before: tuple[str, Any] = ("", None)
        cells: dict[str, int] = {}  # closure variable -> loads not for a raise in place
        ins = _listed(c)
        for i, (op, arg) in enumerate(ins):
            if arg in _WHOLE_NAMES and _all_attributes(op, arg, ins[i + 1 : i + 6]):
                found.add(EVERY_ATTRIBUTE)
            if op in _ATTR_OPS and before[0] not in ("COPY", "DUP_TOP"):
                found.add(str(arg))
            elif op == "LOAD_CONST" and isinstance(arg, str):
                found.add(arg)
            elif op in _DEREF_OPS:
                cells[str(arg)] = cells.get(str(arg), 0) + 1
            elif op == "STORE_DEREF" and _in_place(*before):
                cells[str(arg)] = cells.get(str(arg), 0) - 1
            before = (op, arg)
        found.update(n for v, k in cells.items() if k > 0 for n in (v, f"<closure {v}>"))
    return frozenset(found)


#: in :func:`attribute_reads`: the code reads an object's attributes whole
EVERY_ATTRIBUTE = "<every attribute>"
_WHOLE_NAMES = frozenset({"__dict__", "vars", "getattr"})


def _all_attributes(op: str, arg: Any, after: Sequence[tuple[str, Any]]) -> bool:
    """Whether the instruction (``op``, ``arg``), followed by ``after``, reads an
    object's attributes whole: ``vars(obj)``, ``obj.__dict__``, other than to
    set them (``self.__dict__.update(kwargs)``, ``vars(self)["n"] = 0``), or one
    named by a value (``getattr(self, FIELD)``: no string constant before the call)."""
    if op in _GLOBAL_OPS and arg == "getattr":
        calls = [j for j, (o, _) in enumerate(after) if o.startswith(("CALL", "PRECALL"))]
        args = after[: calls[0]] if calls else after
        return not any(o in _KEY_OPS and isinstance(a, str) for o, a in args)
    if op in _ATTR_OPS and arg == "__dict__":
        rest = after
    elif op in _GLOBAL_OPS and arg == "vars":
        calls = [j for j, (o, _) in enumerate(after) if o.startswith("CALL")]
        rest = after[calls[0] + 1 :] if calls else []
    else:
        return False
    if rest and rest[0][0] in _ATTR_OPS and rest[0][1] == "update":
        return False
    return not (len(rest) >= 2 and rest[0][0] in _KEY_OPS and rest[1][0] == "STORE_SUBSCR")


@functools.lru_cache(maxsize=8192)
def global_reads(code: types.CodeType) -> frozenset[str]:
    """The globals ``code`` (and the code nested in it) loads other than to raise
    them in place: ``global CALLS; CALLS += 1`` loads ``CALLS`` once, for the
    ``+=``; a cursor ``data[LEVEL:]`` once more. A global a call rebinds that the
    code reads so may change the next result: input, not the call's own state
    (:meth:`mlcache.memo.versions.FunctionCode.note_rebound`)."""
    found: set[str] = set()
    for c in _all_code(code):
        before: tuple[str, Any] = ("", None)
        loads: dict[str, int] = {}  # global -> loads not for a raise in place
        for op, arg in _listed(c):
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                loads[str(arg)] = loads.get(str(arg), 0) + 1
            elif op == "STORE_GLOBAL" and _in_place(*before):
                loads[str(arg)] = loads.get(str(arg), 0) - 1
            before = (op, arg)
        found.update(name for name, k in loads.items() if k > 0)
    return frozenset(found)


#: BINARY_OP's arguments of the in-place operators (``+=`` ... ``^=``; 3.11+)
_NB_INPLACE = range(13, 26)


def _in_place(op: str, arg: Any) -> bool:
    return (op == "BINARY_OP" and arg in _NB_INPLACE) or op.startswith("INPLACE_")


#: how code uses a container's key (:func:`subscript_uses`): raised in place
#: (``STATE["n"] += 1``), read otherwise (``STATE["n"]``, ``STATE.get("n")``), or
#: the container used some other way (passed on, iterated, ``**STATE``, a computed
#: key), so that which of its keys it reads cannot be told
RAISED, READ, WHOLE = "raised", "read", "whole"
#: the key of a raise in place whose key is a name (``COUNTS[word] += 1``)
COMPUTED = ("<computed key>",)
#: the instructions that load a value under a name a part of state can carry:
#: a global, a closure variable, a local (``self``), an attribute
_LABEL_OPS = _GLOBAL_OPS | _DEREF_OPS | {"LOAD_FAST", "LOAD_ATTR"}
#: a constant key: the instructions that load one, and the types it is told by
_KEY_OPS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})  # LOAD_SMALL_INT: 3.14
_KEY_TYPES = (str, int, bool, float, type(None))
#: methods that read one key (``STATE.get("n")``)
_KEY_METHODS = frozenset({"get", "pop", "setdefault"})
_NB_SUBSCR = 26  # BINARY_OP's argument for ``x[k]`` on 3.14 (BINARY_SUBSCR before)


def _subscript(op: str, arg: Any) -> bool:
    return op == "BINARY_SUBSCR" or (op == "BINARY_OP" and arg == _NB_SUBSCR)


@functools.lru_cache(maxsize=8192)
def subscript_uses(code: types.CodeType) -> frozenset[tuple[str, Any, Any]]:
    """How ``code`` (and the code nested in it) uses the keys of containers, as
    ``(how, label, key)``: ``how`` is :data:`RAISED`, :data:`READ` or
    :data:`WHOLE` (``key`` None); ``label`` names the container as a part of
    state ends (``STATE``, the attribute ``state`` of ``self.state``, a closure
    variable), or is ``(k,)`` for the value under the constant key ``k`` of
    another (``STATE["a"]["b"]``).

    A key raised in place (``STATE["n"] += 1``: the container and key loaded, two
    ``COPY`` and the subscript; ``DUP_TOP_TWO`` before 3.11) is told from a read
    (``STATE["n"]``), and both from any other use of the container, after which
    any of its keys may be read: an int calls raise is a counter only when its key
    is raised and neither read nor its container used otherwise
    (:func:`mlcache.keys.learned.read_counters`)."""
    found: set[tuple[str, Any, Any]] = set()
    for c in _all_code(code):
        ins = _listed(c)
        for i, (op, arg) in enumerate(ins):
            if op in _LABEL_OPS:
                label: Any = str(arg)
            elif _subscript(op, arg) and i >= 1 and ins[i - 1][0] in _KEY_OPS:
                label = (ins[i - 1][1],)  # the value under a constant key
            else:
                continue
            use = _key_use(label, ins, i + 1)
            if use is not None:
                found.add(use)
    return frozenset(found)


def _key_use(label: Any, ins: Sequence[tuple[str, Any]], i: int) -> tuple[str, Any, Any] | None:
    """How the container ``label``, loaded just before ``ins[i]``, is used (None: a
    key set, removed or tested, ``"n" in STATE``: what it held is not read)."""
    op, key = ins[i] if i < len(ins) else ("", None)
    after = ins[i + 1 : i + 4]
    ops = [o for o, _ in after]
    if (
        op in _LABEL_OPS
        and ops[:2] == ["COPY", "COPY"]
        and len(after) == 3
        and _subscript(*after[2])
    ):
        return RAISED, label, COMPUTED  # COUNTS[word] += 1: some key raised in place
    if op in _KEY_OPS and type(key) in _KEY_TYPES:
        if ops[:2] == ["COPY", "COPY"] and len(after) == 3 and _subscript(*after[2]):
            return RAISED, label, key
        if ops[:2] == ["DUP_TOP_TWO", "BINARY_SUBSCR"]:  # before 3.11
            return RAISED, label, key
        if after and _subscript(*after[0]):
            return READ, label, key
        if ops[:1] in (["STORE_SUBSCR"], ["DELETE_SUBSCR"]):
            return None
    elif op in _ATTR_OPS and key in _KEY_METHODS and after:
        if ops[0] in _KEY_OPS and type(after[0][1]) in _KEY_TYPES:
            return READ, label, after[0][1]
    elif op == "CONTAINS_OP" and i >= 2 and ins[i - 2][0] in _KEY_OPS:
        return None
    return WHOLE, label, None


def _all_code(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in its constants (functions,
    lambdas, comprehensions, classes defined in it), depth first."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_code(const)
