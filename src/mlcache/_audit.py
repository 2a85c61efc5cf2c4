"""Audits: what a cache spends on checking itself, and how it compares two values.

No key sees every input (an environment variable, a file read by a path built
inside the function, a database row, the clock, a random draw), so the caches
of :mod:`mlcache.memo` (and of :mod:`mlcache.data`) recompute a sample of their
hits and compare. This module is what both halves share, and imports neither:

- :class:`AuditPolicy`, the ``audit=`` setting (validated, frozen);
- :class:`AuditBudget`, the arithmetic: audits may spend ``share`` of the
  seconds the cache saved, and nothing until it saved some. A hit saves the
  compute time minus its own time; an audit costs what the recomputation took.
  With the default 2%, a 2 ms function hit 2,000 times (about 4 s saved) gets
  about 40 audits (80 ms); a 10-minute fit hit five times gets none (its first
  audit waits for 50 hits). No entry is audited before 1/share hits of its
  function, so code that counts the calls of a function hit a few times
  counts them exactly;
- :func:`compare`, which says whether two values are the same *value*, not the
  same bytes: dict order, NaN payloads and ``-0.0`` do not count; arrays are
  exact unless the policy gives a tolerance, and a float difference in the last
  bits only (a threaded reduction) is :data:`CLOSE`, not :data:`DIFFERENT`.
"""

from __future__ import annotations

import cmath
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, ConfigTypeError

__all__ = [
    "AUDIT_ENV",
    "CLOSE",
    "DIFFERENT",
    "SAME",
    "UNKNOWN",
    "AuditBudget",
    "AuditPolicy",
    "audit_policy",
    "compare",
]

#: ``MLCACHE_AUDIT=0`` (or ``false``, ``off``, ``no``) turns audits off everywhere
AUDIT_ENV = "MLCACHE_AUDIT"
_OFF = frozenset({"0", "false", "off", "no"})

#: the verdicts of :func:`compare`, best first
SAME, UNKNOWN, CLOSE, DIFFERENT = "same", "unknown", "close", "different"
_RANK = {SAME: 0, UNKNOWN: 1, CLOSE: 2, DIFFERENT: 3}
#: deeper than this, a value is not compared (UNKNOWN: never reported)
_MAX_DEPTH = 64


@dataclass(frozen=True, kw_only=True)
class AuditPolicy:
    """How a cache checks itself (``audit=`` of :class:`~mlcache.Memory` and
    :meth:`~mlcache.Memory.cache`).

    Parameters
    ----------
    share:
        The share of the time the cache saved that recomputing hits may spend
        (0.02: at most 2%).
    after:
        Seconds a function's hits must have saved in this process before its
        first audit.
    boost:
        After a mismatch, the function's share is multiplied by this for the
        rest of the process (it is audited more often).
    rtol, atol:
        Floats (arrays, scalars) that differ by at most ``atol + rtol * |x|``
        count as equal. 0 (the default) compares exactly; a difference in the
        last bits is then reported once as non-determinism, and results are
        still served.

    Examples
    --------
    >>> AuditPolicy(rtol=1e-9).share
    0.02
    """

    share: float = 0.02
    after: float = 1.0
    boost: float = 5.0
    rtol: float = 0.0
    atol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("share", "after", "boost", "rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigTypeError(f"AuditPolicy.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"AuditPolicy.{name} must be finite and >= 0, got {value!r}")
        if self.share > 1:
            raise ConfigError(
                f"AuditPolicy.share is a share of the time saved (0 to 1), got {self.share!r}"
            )
        if self.boost < 1:
            raise ConfigError(f"AuditPolicy.boost must be >= 1, got {self.boost!r}")


def audit_policy(audit: Any) -> AuditPolicy | None:
    """``audit=`` as a policy, or None when audits are off: ``False``, a share of 0,
    or ``MLCACHE_AUDIT=0`` in the environment. ``True`` (or None) is the default
    policy, a number its ``share``, a dict the keyword arguments of
    :class:`AuditPolicy`."""
    if os.environ.get(AUDIT_ENV, "").strip().lower() in _OFF:
        return None
    if audit is None or audit is True:
        policy = AuditPolicy()
    elif audit is False:
        return None
    elif isinstance(audit, AuditPolicy):
        policy = audit
    elif isinstance(audit, Mapping):
        try:
            policy = AuditPolicy(**audit)
        except TypeError as exc:
            raise ConfigTypeError(f"audit={dict(audit)!r}: {exc}") from None
    elif isinstance(audit, (int, float)):
        policy = AuditPolicy(share=audit)
    else:
        raise ConfigTypeError(
            "audit must be True, False, a share of the time saved (0.02), a dict or an "
            f"AuditPolicy; got {type(audit).__name__}: {audit!r}"
        )
    return policy if policy.share > 0 else None


class AuditBudget:
    """The seconds audits may spend: ``share`` of the seconds hits saved, less the
    seconds audits spent, once hits saved ``after`` seconds. Not locked: a lost
    update between threads moves the budget by one hit."""

    __slots__ = ("after", "saved", "share", "spent")

    def __init__(self, share: float, after: float = 0.0) -> None:
        self.share = share
        self.after = after
        self.saved = 0.0  #: seconds of computing the hits avoided
        self.spent = 0.0  #: seconds the audits took

    def hit(self, saved: float, cost: float) -> bool:
        """Count a hit that saved ``saved`` seconds (a negative saving counts as 0);
        True when an audit expected to cost ``cost`` seconds fits the budget now."""
        if saved > 0:
            self.saved += saved
        saved = self.saved
        return saved > self.after and self.spent + cost <= self.share * saved

    def spend(self, seconds: float) -> None:
        """An audit took ``seconds``."""
        self.spent += seconds

    @property
    def available(self) -> float:
        """The seconds an audit may take now."""
        return self.share * self.saved - self.spent


def _worst(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


def compare(fresh: Any, cached: Any, *, rtol: float = 0.0, atol: float = 0.0) -> str:
    """Whether ``fresh`` (computed now) is the value ``cached`` is: :data:`SAME`,
    :data:`CLOSE` (floats that differ in their last bits only), :data:`DIFFERENT`,
    or :data:`UNKNOWN` (values this function cannot compare: never reported).

    >>> compare({"a": 1.0, "b": [0.0]}, {"b": [-0.0], "a": 1.0})
    'same'
    >>> compare(0.1 + 0.2, 0.3), compare(1.0, 2.0)
    ('close', 'different')
    """
    return _compare(fresh, cached, rtol, atol, 0)


def _compare(a: Any, b: Any, rtol: float, atol: float, depth: int) -> str:
    if a is b:
        return SAME
    if depth > _MAX_DEPTH:
        return UNKNOWN
    module = type(a).__module__.partition(".")[0]
    if module == "numpy" or type(b).__module__.startswith("numpy"):
        return _arrays(a, b, rtol, atol)
    if isinstance(a, (str, bytes, bool, type(None))) or isinstance(b, (str, bytes, bool)):
        return SAME if type(a) is type(b) and a == b else DIFFERENT
    if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
        return _numbers(a, b, rtol, atol)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return DIFFERENT
        verdict = SAME
        for k in a:
            verdict = _worst(verdict, _compare(a[k], b[k], rtol, atol, depth + 1))
            if verdict == DIFFERENT:
                break
        return verdict
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return DIFFERENT
        verdict = SAME
        for x, y in zip(a, b, strict=True):
            verdict = _worst(verdict, _compare(x, y, rtol, atol, depth + 1))
            if verdict == DIFFERENT:
                break
        return verdict
    if isinstance(a, (set, frozenset)) and isinstance(b, (set, frozenset)):
        return SAME if a == b else DIFFERENT
    if module in ("pandas", "torch", "scipy", "polars", "pyarrow"):
        return _library_value(module, a, b, rtol, atol)
    if type(a) is not type(b):
        return UNKNOWN
    try:  # a plain object (a fitted estimator, a dataclass): its attributes
        mine, theirs = vars(a), vars(b)
    except TypeError:  # no __dict__: its own equality, if it has one
        if type(a).__eq__ is object.__eq__:
            return UNKNOWN
        try:
            equal = a == b
        except Exception:
            return UNKNOWN
        return SAME if equal is True else DIFFERENT if equal is False else UNKNOWN
    return _compare(mine, theirs, rtol, atol, depth + 1)


def _numbers(a: Any, b: Any, rtol: float, atol: float) -> str:
    try:
        if a == b:
            return SAME
        if isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral) and not atol:
            return DIFFERENT
        x, y = complex(a), complex(b)
    except Exception:  # a number type without a complex value, a signalling NaN
        return UNKNOWN
    if (x != x) and (y != y):  # NaN, whatever its payload
        return SAME
    if not (cmath.isfinite(x) and cmath.isfinite(y)):
        return DIFFERENT
    if abs(x - y) <= atol + rtol * max(abs(x), abs(y)):
        return SAME
    if isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral):
        return DIFFERENT
    return CLOSE if abs(x - y) <= _LAST_BITS * max(abs(x), abs(y)) else DIFFERENT


#: "the last bits": half the significand of a float64 agrees (sqrt(eps))
_LAST_BITS = 2.0**-26


def _arrays(a: Any, b: Any, rtol: float, atol: float) -> str:
    import numpy as np

    try:
        x, y = np.asarray(a), np.asarray(b)
    except Exception:
        return UNKNOWN
    if x.shape != y.shape:
        return DIFFERENT
    if x.dtype.kind == "O" or y.dtype.kind == "O":
        return _compare(x.tolist(), y.tolist(), rtol, atol, 1)
    if x.dtype != y.dtype and not (x.dtype.kind in "fc" and y.dtype.kind in "fc"):
        return SAME if x.shape == () and x.item() == y.item() else DIFFERENT
    try:
        # NaN (and NaT) payloads are one value; -0.0 == 0.0
        if np.array_equal(x, y, equal_nan=x.dtype.kind in "fcmM"):
            return SAME
        if x.dtype.kind not in "fc" or y.dtype.kind not in "fc":
            return DIFFERENT
        with np.errstate(all="ignore"):
            if (rtol or atol) and np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
                return SAME
            both = np.abs(np.concatenate([x.ravel(), y.ravel()]))
            finite = both[np.isfinite(both)]
            scale = float(finite.max()) if finite.size else 0.0
            last_bits = float(np.finfo(x.dtype).eps) ** 0.5 * scale
            close = np.allclose(x, y, rtol=0.0, atol=last_bits, equal_nan=True)
        return CLOSE if close else DIFFERENT
    except (TypeError, ValueError):  # structured or void dtypes: bytes compare
        return SAME if x.tobytes() == y.tobytes() else UNKNOWN


def _library_value(module: str, a: Any, b: Any, rtol: float, atol: float) -> str:
    """pandas, torch, scipy.sparse, polars and Arrow values, each by its own
    equality, then its numbers."""
    if type(a) is not type(b):
        return UNKNOWN
    try:
        if module == "torch":
            if a.shape != b.shape or a.dtype != b.dtype:
                return DIFFERENT
            x, y = a.detach().cpu(), b.detach().cpu()
            if x.is_floating_point():  # bfloat16 has no numpy twin
                x, y = x.double(), y.double()
            return _arrays(x.numpy(), y.numpy(), rtol, atol)
        if module == "scipy" and hasattr(a, "toarray"):
            return _arrays(a.toarray(), b.toarray(), rtol, atol)
        if module == "pandas":
            if a.equals(b):
                return SAME
            if hasattr(a, "columns") and not a.columns.equals(b.columns):
                return DIFFERENT
            if not a.index.equals(b.index):
                return DIFFERENT
            return _arrays(a.to_numpy(), b.to_numpy(), rtol, atol)
        if module in ("polars", "pyarrow"):
            return SAME if a.equals(b) else UNKNOWN
    except Exception:
        return UNKNOWN
    return UNKNOWN
