"""The names a dataset's items give, as the walk of a folder attribute needs them
(:mod:`mlcache.data.folders`): a file an item names counts item by item, so the
walk leaves it out of the folder's own digest.

:class:`Named` holds each path part's :func:`~mlcache.data.sources.candidates`
(absolute, no ``stat``) and, asked for, the paths they name; :func:`names_record`
is what a walk records of them (their digest and the folders whose changes could
make them name other paths), :func:`same_names` what the next open checks
against that record (one ``stat`` a watched folder, none a name).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import xxhash

from .checking import KEEPS_TIMES, fs_type, trusted_after
from .sources import candidates, path_parts

__all__ = [
    "NONE_NAMED",
    "Named",
    "as_recorded",
    "names_of",
    "names_record",
    "same_names",
]

#: a walk that left no file out as named: any later names only count files twice
NONE_NAMED = "none"
#: the rules that make names of the items (:func:`_chains`), in the names' key: a
#: record keyed by older rules is checked name by name
_NAMES_RULES = "names 2"


class Named:
    """The names the items give (each part's :func:`~mlcache.data.sources.candidates`,
    absolute, no ``stat``; built when first asked) and, asked for, the paths they
    name: for each part the one path its check stats
    (:func:`~mlcache.data.sources.existing_path`, the first candidate that
    exists). A file that a name could mean but that the item check does not stat
    (``masks/0001.png`` beside the ``images/0001.png`` it finds first) is no
    item's: it counts in its folder.

    ``key``: a digest of all the names are made of (the working folder, the
    folders they are relative to, the items by their keys in the item table),
    so that the same key means the same names, none built; None when unknown."""

    def __init__(self, chains: Callable[[], list[tuple[str, ...]]], key: str | None) -> None:
        self._build, self.key = chains, key
        self._chains: list[tuple[str, ...]] | None = None
        self._paths: set[str] | None = None

    @property
    def chains(self) -> list[tuple[str, ...]]:
        """Each part's candidates (the names, ~6 µs an item: asked only when
        :attr:`key` does not tell)."""
        if self._chains is None:
            self._chains = self._build()
        return self._chains

    @property
    def paths(self) -> set[str]:
        """The path each part names, as far as a walk can tell (one ``stat`` a
        candidate tried before the last: a part with one candidate names it if
        anything does, and a walk meets only what exists)."""
        if self._paths is None:
            exists = os.path.exists
            found = {chain[0] for chain in self.chains if len(chain) == 1}
            for chain in self.chains:
                if len(chain) == 1:
                    continue
                path = next((c for c in chain if exists(c)), None)
                if path is not None:
                    found.add(path)
            self._paths = found
        return self._paths


def names_of(
    files: Sequence[Any],
    items: Sequence[Any] = (),
    bases: Sequence[str] = (),
    keys: bytes | None = b"",
) -> Named:
    """The names ``files`` give as they are and ``items`` give, relative to the
    working folder or to one of ``bases``; ``keys``: the items' keys in the item
    table (:func:`~mlcache.data.items.key_bytes`; None: unknown, then so is the
    key of the names)."""

    def chains() -> list[tuple[str, ...]]:
        return _chains(files, ()) + _chains(items, bases)

    cwd = _cwd()
    if keys is None or cwd is None:
        return Named(chains, None)
    text = "\0".join([_NAMES_RULES, cwd, str(len(bases)), *bases, *map(os.fsdecode, files)])
    digest = xxhash.xxh3_128(text.encode("utf-8", "surrogateescape"))
    digest.update(keys)
    return Named(chains, digest.hexdigest())


def _chains(items: Iterable[Any], bases: Sequence[str]) -> list[tuple[str, ...]]:
    """The candidates of each path part of ``items``, absolute (as
    ``os.path.abspath`` makes them, the working folder read once, if a name needs
    it: 20,000 items ~30 ms against ~90). A relative name with no working folder
    (removed) names nothing, as for the item's check."""
    chains: list[tuple[str, ...]] = []
    join, normpath, sep = os.path.join, os.path.normpath, os.sep
    # what normpath leaves as it is, told by three searches (20,000 listed paths:
    # ~8 ms against ~45): an absolute name with no empty, "." or ".." part and no
    # trailing separator (a hidden file's name starts with ".": normpath's)
    plain = os.altsep is None
    double, dot = sep + sep, sep + "."
    cwd: str | None = ""
    for item in items:
        if (
            plain
            and item.__class__ is str
            and item[:1] == sep
            and item[-1] != sep
            and double not in item
            and dot not in item
            and "\0" not in item
        ):
            chains.append((item,))  # as candidates() and normpath() make it
            continue
        for part in path_parts(item):
            chain = []
            for c in candidates(part, bases):
                if c[0] != sep:
                    if cwd == "":
                        cwd = _cwd()
                    if cwd is None:
                        continue
                    c = join(cwd, c)
                chain.append(normpath(c))
            if chain:
                chains.append(tuple(chain))
    return chains


def _cwd() -> str | None:
    """The working folder, or None when it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _named_chains(folder: str, named: Named) -> list[tuple[str, ...]]:
    """The names that may name a path under ``folder`` (or it): each part's
    candidates up to its last one there, sorted."""
    inside = os.path.join(folder, "")
    chains = named.chains
    # in the items' order, once each (sorting what is sorted already costs little);
    # a path listed by the dataset, one candidate, at a comprehension's speed
    found: dict[tuple[str, ...], None] = dict.fromkeys(
        [c for c in chains if len(c) == 1 and (c[0].startswith(inside) or c[0] == folder)]
    )
    for chain in chains:
        if len(chain) == 1:
            continue
        last = -1
        for i, c in enumerate(chain):
            if c == folder or c.startswith(inside):
                last = i
        if last >= 0:
            found[chain[: last + 1]] = None
    return sorted(found)


def _watched(chains: list[tuple[str, ...]]) -> list[list[int | str]]:
    """The folders of those candidates (each stat'ed: -1 when missing): a file
    appearing or going there can change which candidate an item's check stats."""
    # (the candidates are absolute and normalised: a folder is what the last
    # separator leaves, os.path.dirname's answer at a fifth of its cost)
    sep = os.sep
    folders = sorted({c.rpartition(sep)[0] or sep for chain in chains for c in chain})
    watched: list[list[int | str]] = []
    for path in folders:
        try:
            st = os.stat(path)
            watched.append([path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            watched.append([path, -1, -1, -1, -1])
    return watched


def _chains_digest(chains: list[tuple[str, ...]]) -> str:
    if not chains:
        return NONE_NAMED
    text = "\n".join([chain[0] if len(chain) == 1 else "\0".join(chain) for chain in chains])
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


def names_record(folder: str, named: Named) -> dict[str, Any]:
    """What a walk records of the names the items gave in ``folder``: their
    digest, and the folders whose changes could make them name other paths
    (none when no item named a path there: later names only count files twice)."""
    chains = _named_chains(folder, named)
    return {"named": _chains_digest(chains), "watch": _watched(chains) if chains else []}


def same_names(found: dict[str, Any], folder: str, named: Named) -> bool:
    """Whether the items give the names of the recorded walk (the same key, or the
    same names in ``folder``) and the folders of their candidates are as they were
    (see :func:`as_recorded`'s rules), so that each still names the path it named
    (no ``stat`` of the named files)."""
    keyed = named.key is not None and found.get("names_key") == named.key
    if not keyed and found.get("named") != _chains_digest(_named_chains(folder, named)):
        return False
    try:
        began = int(found["began"])
        for path, dev, ino, mtime, ctime in found["watch"]:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                if dev != -1:
                    return False
                continue
            if not as_recorded(st, (dev, ino, mtime, ctime), began):
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def as_recorded(st: os.stat_result, recorded: tuple[int, int, int, int], began: int) -> bool:
    """Whether a folder's ``stat`` is the recorded one (device, inode, modification
    and change times) and may be trusted: on a file system that moves folder times,
    and the walk began well after the folder's last change."""
    dev, _ino, _mtime, ctime = recorded
    return (
        (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) == recorded
        and began - ctime > trusted_after(ctime)
        and fs_type(dev) in KEEPS_TIMES
    )
