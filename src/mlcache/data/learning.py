"""What a dataset's build learns: the module-level values it changes that are
bookkeeping (state), judged by the function cache's rules
(:mod:`mlcache.keys.learned`) and recorded per dataset class and code shape
(``.learned-<shape>`` beside its packs). A base of
:class:`~mlcache.data.building.PackBuilder`, kept apart from finding and building.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from .._atomic import write_bytes_atomic
from ..keys.learned import Watch, checked_kinds, merge

__all__ = ["STATE_FILE", "BuildLearning", "read_state", "write_state"]

logger = logging.getLogger("mlcache")
#: what builds learned, per code shape (``.learned-<shape>``): not the ``.state-``
#: records of mlcache 0.4, whose builds learned by other rules (never read again)
STATE_FILE = ".learned"
#: (class folder, code shape) -> what was learned, then seen changed otherwise: never again
_REVOKED: dict[tuple[str, str], set[str]] = {}


def read_state(folder: str, shape: str) -> dict[str, str]:
    """What builds of this class, with code of this shape, were learned to change
    as bookkeeping (name -> kind: see :mod:`mlcache.keys.learned`); empty when
    nothing is recorded or the record cannot be read (learned again)."""
    try:
        with open(os.path.join(folder, f"{STATE_FILE}-{shape}"), "rb") as f:
            return checked_kinds(json.loads(f.read()).get("kinds"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as exc:  # unreadable: learned again
        logger.debug("mlcache: could not read %s: %s", STATE_FILE, exc)
        return {}


def write_state(root: str, folder: str, shape: str, kinds: Mapping[str, str]) -> None:
    """Record what builds of this class and code shape were learned to change as
    bookkeeping (see :func:`read_state`)."""
    try:
        data = json.dumps({"kinds": dict(sorted(kinds.items()))}).encode()
        path = os.path.join(folder, f"{STATE_FILE}-{shape}")
        write_bytes_atomic(path, data, durable=False, root=root)
    except OSError as exc:  # learned again by the next build
        logger.debug("mlcache: could not record what building changes: %s", exc)


class BuildLearning:
    """The learning half of a pack's builder; the builder sets the attributes below
    and names the pack (:meth:`_name_pack`)."""

    pack_path: str
    _root: str
    _folder: str
    _shape: str
    _state: dict[str, str]  # what builds were learned to change: name -> kind
    _watched_before: Any

    def _name_pack(self) -> str:
        raise NotImplementedError

    def _learned(self, watch: Watch) -> str | None:
        """The pack's name once what the build changed since ``watch`` was made is
        learned (into ``self._state``; the caller records it), or None when that
        teaches nothing new. A build that also changed an input keeps the name it
        was asked under: what remains is not what the build started from."""
        try:
            kept, changed = watch.verdict()
        except Exception as exc:  # learning is an optimisation: never fail the build
            logger.debug("mlcache: cannot judge what building %s changed: %s", self.pack_path, exc)
            return None
        revoked = _REVOKED.setdefault((self._folder, self._shape), set())
        learned = merge({**self._read_learned(), **self._state}, kept, changed, revoked)
        if learned == self._state:
            return None
        said = ", ".join(f"{n} ({k})" for n, k in sorted(learned.items() - self._state.items()))
        if said:
            what = "treated as state (bookkeeping, not input), counted as before builds changed it"
            logger.info("mlcache: building %s changes %s: %s", type(self).__qualname__, said, what)
        self._state = learned
        return self.pack_path if changed else self._name_pack()

    def _read_learned(self) -> dict[str, str]:
        """What builds of this class and code shape were learned to change (by
        earlier processes too), less what this process saw changed otherwise."""
        revoked = _REVOKED.get((self._folder, self._shape), set())
        return {n: k for n, k in read_state(self._folder, self._shape).items() if n not in revoked}

    def _learn_while_filling(self) -> str | None:
        """After a first sample is loaded: what it changed is learned, and the pack
        being filled renamed for it (its records too); the new name, or None."""
        watch = getattr(self, "_watched_before", None)  # (not sent to a worker)
        named = None if watch is None else self._learned(watch)
        if named is None:
            return None
        moved = named != self.pack_path
        if moved:  # first: a process told the state finds the records
            with contextlib.suppress(OSError):
                os.rename(self.pack_path + ".fill", named + ".fill")
        write_state(self._root, self._folder, self._shape, self._state)
        self.pack_path = named
        return named if moved else None
