"""Why a call of a memoized function computed: what its log line says (with
``verbose=2``, or when logging is configured)."""

from __future__ import annotations

import logging
from typing import Any

from .._log import logger_for, logging_configured
from ..entry import read_entry_info
from ..store import Store
from .layout import is_entry
from .versions import FunctionCode

__all__ = ["log_call", "miss_reason"]


def log_call(
    verbose: int,
    func_id: str,
    code: FunctionCode,
    store: Store,
    keyed: tuple[str, list[bytes]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Log a call that computes, with its arguments and, with ``verbose=2`` or
    logging configured, why it missed."""
    log = logger_for(verbose)
    if not log.isEnabledFor(logging.INFO):
        return
    assert code.keyer is not None
    shown = ", ".join(f"{k}={v}" for k, v in code.keyer.describe(args, kwargs).items())
    if verbose < 2 and not logging_configured():
        # the default console output: why it missed costs a listing of the
        # function's folder (a LIST on S3), so it waits for verbose=2 or logging
        log.info("[Memory] calling %s(%s)", func_id, shown)
        return
    reason = miss_reason(code, store, keyed[1])
    log.info("[Memory] calling %s(%s): %s", func_id, shown, reason)


def miss_reason(code: FunctionCode, store: Store, digests: list[bytes]) -> str:
    """Why a call of ``code``'s function with argument digests ``digests`` missed,
    against the most recently used entry of the function (a listing of its
    folder: paid on a logged miss only)."""
    assert code.keyer is not None
    try:
        entries = [e for e in store.list(code.code_dir) if is_entry(e.name)]
        latest = max(entries, key=lambda e: e.last_used, default=None)
        if latest is None:
            if not code.code_changed:
                return "no entry yet"
            changes = code.code_changes
            return f"its code changed ({', '.join(changes)})" if changes else "its code changed"
        old = read_entry_info(store, latest.name).get("arg_digests")
    except Exception:  # an explanation must never fail the call
        return "new arguments"
    if not isinstance(old, dict):
        return "new arguments"
    changed = code.keyer.changed(old, digests)
    if not changed:  # the same arguments, but the function's state differs
        learned = code.state_names()
        state = f"; treated as state: {', '.join(learned[:8])}" if learned else ""
        return f"what the function captures (closure, bound object) changed{state}"
    what = ", ".join(repr(c) for c in changed)
    return f"argument{'s' if len(changed) > 1 else ''} {what} changed since the last entry"
