"""Why a call of a memoized function computed: what its log line says (with
``verbose=2``, or when logging is configured)."""

from __future__ import annotations

from ..entry import read_entry_info
from ..store import Store
from .layout import is_entry
from .versions import FunctionCode

__all__ = ["miss_reason"]


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
