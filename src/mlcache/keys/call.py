"""The key of one call: function identity + code version + canonical arguments.

Arguments are bound to the function's parameters the way Python would bind
them, defaults applied, so ``f(1)``, ``f(x=1)`` and ``f()`` (with default
``x=1``) make one key; ``ignore=`` names are left out. Binding has a fast path
for the common signature (no ``*args``/``**kwargs``) that costs well under a
microsecond; anything else goes through :func:`inspect.Signature.bind`.
"""

from __future__ import annotations

import inspect
import reprlib
import types
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

from ..errors import CallArgumentsError, ConfigError, UnhashableArgument
from .hashing import HASH_SCHEME, Hasher

__all__ = ["CallKeyer", "UnhashableArgument"]


_MISSING = object()
_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 6


def _short_repr(value: Any) -> str:
    t = type(value)
    try:
        # looked up on the type: a dotdict's __getattr__ raises KeyError, a proxy's
        # anything
        if hasattr(t, "shape") and hasattr(t, "dtype"):
            return f"{t.__name__}(shape={tuple(value.shape)}, dtype={value.dtype})"
        return _repr.repr(value)
    except Exception:  # a broken __repr__ must not break the call
        return f"<{t.__name__}>"


class CallKeyer:
    """Computes keys for calls of ``func``.

    Parameters
    ----------
    func:
        The function whose calls are keyed.
    ignore:
        Parameter names left out of the key.
    prefix:
        Bytes that identify the function and its code version; they start every
        key's stream.
    captured:
        Other names ``ignore`` may hold (what the function captures, which the
        caller leaves out of the key itself); said in the error for a wrong name.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        ignore: Iterable[str] | None,
        prefix: bytes,
        captured: Iterable[str] = (),
    ):
        try:
            self.signature = inspect.signature(func)
        except (TypeError, ValueError):  # some builtins have no signature
            self.signature = inspect.Signature(
                [
                    inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                    inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
                ]
            )
        params = list(self.signature.parameters.values())
        self.names = [p.name for p in params]
        if isinstance(ignore, str):
            raise ConfigError(f"ignore must be a list of parameter names, got {ignore!r}")
        ignore = list(ignore or ())
        if not all(isinstance(n, str) for n in ignore):
            raise ConfigError(f"ignore must be a list of parameter names, got {ignore!r}")
        captured = sorted(captured)
        unknown = [n for n in ignore if n not in self.names and n not in captured]
        if unknown:
            raise ConfigError(
                f"ignore={unknown!r}: not parameters of {getattr(func, '__qualname__', func)}; "
                f"its parameters are {self.names}"
                + (f" and it captures {captured}" if captured else "")
            )
        self._keep = [i for i, n in enumerate(self.names) if n not in ignore]
        kinds = {p.kind for p in params}
        P = inspect.Parameter
        self._simple = not (kinds & {P.VAR_POSITIONAL, P.VAR_KEYWORD, P.POSITIONAL_ONLY})
        self._npos = sum(p.kind == P.POSITIONAL_OR_KEYWORD for p in params)
        self._defaults = [_MISSING if p.default is P.empty else p.default for p in params]
        self._required = [i for i, d in enumerate(self._defaults) if d is _MISSING]
        self._index = {n: i for i, n in enumerate(self.names)}
        # the kept parameters' names: f(a, b) with ignore=["b"] and with ignore=["a"]
        # must not share keys
        kept = "\0".join(self.names[i] for i in self._keep).encode()
        self._prefix = bytes([HASH_SCHEME]) + prefix + b"\0" + kept + b"\0"
        self._func = func
        # hashers to reuse (making one is ~0.8 µs of a ~3 µs key): a list, whose
        # pop and append are atomic, so that no two threads ever share one
        self._hashers: list[Hasher] = []

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """Every parameter's value, in signature order (``*args`` as a tuple,
        ``**kwargs`` as a dict).

        A call the signature refuses raises :class:`~mlcache.errors.CallArgumentsError`:
        a ``TypeError`` with the message the call itself would give, and the
        ``ValueError`` joblib raises, whose wording starts the message (``"Too many
        arguments for f(a, *, b=1): f() takes 1 positional argument but 2 were
        given"``)."""
        if self._simple and len(args) <= self._npos:
            values = self._defaults.copy()
            values[: len(args)] = args
            if kwargs:
                n = len(args)
                for k, v in kwargs.items():
                    i = self._index.get(k)
                    if i is None or i < n:
                        return self._slow_bind(args, kwargs)  # raises the right TypeError
                    values[i] = v
            for i in self._required:
                if values[i] is _MISSING:  # identity: `in` would compare arrays with ==
                    return self._slow_bind(args, kwargs)
            return values
        return self._slow_bind(args, kwargs)

    def _slow_bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            message = str(exc)
            f = self._func
            if (
                type(f) is types.FunctionType
                and not hasattr(f, "__wrapped__")
                and "__signature__" not in f.__dict__
            ):
                try:  # binding fails before the body runs: the real message
                    f(*args, **kwargs)
                except TypeError as real:
                    message = str(real)
            raise CallArgumentsError(f"{self._joblib_wording(args, kwargs)}: {message}") from None
        bound.apply_defaults()
        return [bound.arguments[n] for n in self.names]

    def _joblib_wording(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """What joblib's ``filter_args`` says of a call the signature refuses (code
        written for joblib may match on it), checked in joblib's order."""
        P = inspect.Parameter
        params = list(self.signature.parameters.values())
        positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        kinds = {p.kind for p in params}
        sig = str(self.signature)
        name = getattr(self._func, "__name__", type(self._func).__name__)
        where = f"{name}{sig if len(sig) <= 200 else sig[:199] + '…'}"
        for i, p in enumerate(positional):
            by_keyword = p.name in kwargs and p.kind is P.POSITIONAL_OR_KEYWORD
            if i < len(args) and by_keyword:
                return f"Argument {p.name} was given both as positional and as keyword for {where}"
            if i >= len(args) and not by_keyword and p.default is P.empty:
                return f"Wrong number of arguments for {where}"
        if len(args) > len(positional) and P.VAR_POSITIONAL not in kinds:
            return f"Too many arguments for {where}"
        for p in params:
            if p.kind is P.KEYWORD_ONLY and p.default is P.empty and p.name not in kwargs:
                return f"Wrong number of arguments for {where}"
        return f"Too many keyword arguments for {where}"

    def key(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], extra: bytes = b""
    ) -> tuple[str, list[bytes]]:
        """The 32-hex-digit key of the call ``func(*args, **kwargs)``, and the
        16-byte digest of each kept argument it combines (which say, on a miss,
        which argument changed). ``extra`` is the digest of the function's own
        state (closure values, bound object).

        Whatever hashing an argument raises (a ``__reduce_ex__`` that refuses, a
        lazy proxy's ``RuntimeError``, a tensor without data) becomes
        :class:`UnhashableArgument` naming the argument: the call then runs
        uncached, it never fails because of the cache."""
        values = self.bind(args, kwargs)
        try:
            h = self._hashers.pop()
        except IndexError:  # none spare: this thread's first, or others hold them
            h = Hasher()
        digests = []
        for i in self._keep:
            try:
                digests.append(h.digest_of(values[i]))
            except Exception as exc:  # digest_of raises TypeError naming the cause
                t = type(values[i])  # never values[i].__class__: it may raise too
                raise UnhashableArgument(
                    f"cannot hash argument {self.names[i]!r} of type "
                    f"{t.__module__}.{t.__qualname__}: {exc}"
                ) from exc
        h.forget()  # it keeps no argument alive while it waits for the next call
        self._hashers.append(h)
        return xxhash.xxh3_128_hexdigest(self._prefix + extra + b"".join(digests)), digests

    def combine(self, digests: list[bytes], extra: bytes = b"") -> str:
        """The key of a call whose kept arguments' digests (as :meth:`key` returned
        them) are ``digests``, with the function's state digest ``extra``."""
        return xxhash.xxh3_128_hexdigest(self._prefix + extra + b"".join(digests))

    def changed(self, old: dict[str, str], digests: list[bytes]) -> list[str]:
        """The kept arguments whose digest differs from ``old`` (name -> hex digest,
        as stored in an entry's metadata under ``"arg_digests"``)."""
        return [
            self.names[i] for i, d in zip(self._keep, digests) if old.get(self.names[i]) != d.hex()
        ]

    def digest_map(self, digests: list[bytes]) -> dict[str, str]:
        """``{argument name: hex digest}``, for an entry's metadata."""
        return {self.names[i]: d.hex() for i, d in zip(self._keep, digests)}

    def describe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
        """Short reprs of the arguments, for the entry's metadata."""
        try:
            values = self.bind(args, kwargs)
        except TypeError:
            return {}
        return {self.names[i]: _short_repr(values[i]) for i in self._keep}
