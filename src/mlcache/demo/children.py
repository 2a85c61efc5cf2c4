"""The fresh processes of the demo's parts 1 and 4 (:mod:`mlcache.demo.loading`,
:mod:`mlcache.demo.scaling`): a server started once, numpy and mlcache imported,
that forks a fresh child for each trial, and what the children run and measure.

A child reopens a cache (``"pickled list"``: ``pickle.load`` of the file;
``"mlcache"``: ``PackedDataset(path)``, the pack alone, no source to check;
``"mlcache dataset"``: the demo's ``PatientsByItem`` over the folder ``path``,
its source files checked) and reads one sample, timed in the child after its
imports; or, as one of several workers at once, reads every sample, then reports
its memory (:func:`resident`) while every worker still holds its data.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..data import PackedDataset
from .datasets import PatientsByItem

__all__ = ["DATASET", "PACK", "PICKLE", "Server", "resident", "serve"]

PICKLE = "pickled list"
PACK = "mlcache"
DATASET = "mlcache dataset"
#: how long a child may take to answer, seconds (a 500,000-sample load takes ~3 s)
_TIMEOUT = 600.0


def resident(path: str | None = None) -> dict[str, int] | None:
    """This process's resident memory from ``/proc/self/smaps_rollup``, in bytes
    (``Rss``, ``Anonymous``, ``Private_Dirty``...), or None where there is none.
    With ``path``, also ``Mapped``: the resident pages of that file's mappings
    (from ``/proc/self/smaps``)."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            lines = f.readlines()[1:]  # the first line names the address range
        out = {name: kb for name, kb in _sizes(lines)}
        if path is not None:
            with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
                out["Mapped"] = _mapped(f, os.path.realpath(path))
    except OSError:
        return None
    return out if "Rss" in out and "Anonymous" in out else None


def _sizes(lines: Any) -> Iterator[tuple[str, int]]:
    for line in lines:
        name, _, rest = line.partition(":")
        value = rest.split()
        if len(value) == 2 and value[1] == "kB" and value[0].isdigit():
            yield name, int(value[0]) * 1024


def _mapped(smaps: Any, path: str) -> int:
    """The ``Rss`` of the mappings of ``path`` in an smaps listing."""
    total, ours = 0, False
    for line in smaps:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            ours = len(head) == 6 and head[5].rstrip("\n") == path  # a mapping's first line
        elif ours and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def _open(kind: str, path: str, cache: str | None = None) -> Any:
    if kind == PICKLE:
        with open(path, "rb") as f:
            return pickle.load(f)
    if kind == DATASET:
        return PatientsByItem(path, cache_dir=cache, progress=False)
    return PackedDataset(path)


def _reopen_child(conn: Any, kind: str, path: str, cache: str | None) -> None:
    """Open the cache, read one sample; send the seconds it took."""
    try:
        t0 = time.perf_counter()
        data = _open(kind, path, cache)
        data[0]
        conn.send(("ok", time.perf_counter() - t0))
    except Exception as exc:  # said to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _worker_child(conn: Any, kind: str, path: str) -> None:
    """Open the cache, read every sample once; when every worker has, measure."""
    try:
        before = resident()
        t0 = time.perf_counter()
        data = _open(kind, path)
        for i in range(len(data)):
            data[i]
        conn.send(("ok", time.perf_counter() - t0))
        conn.recv()  # every worker holds its data now
        conn.send(("ok", (before, resident(path))))
        conn.recv()  # every worker has measured: the pages stay mapped until then
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class _Children:
    """``n`` child processes running ``target(conn, *args)``, each on its own pipe."""

    def __init__(self, ctx: Any, target: Callable[..., None], args: tuple[Any, ...], n: int):
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(mine)

    def answers(self) -> list[Any]:
        """One answer from each child; a child's error or death raises RuntimeError."""
        out = []
        for proc, conn in zip(self.procs, self.conns):
            try:
                if not conn.poll(_TIMEOUT):
                    raise RuntimeError(f"a child gave no answer in {_TIMEOUT:.0f} s")
                status, value = conn.recv()
            except EOFError:
                proc.join(5)
                raise RuntimeError(f"a child exited with code {proc.exitcode}") from None
            if status != "ok":
                raise RuntimeError(f"a child failed: {value}")
            out.append(value)
        return out

    def tell(self) -> None:
        for conn in self.conns:
            conn.send("go")

    def close(self) -> None:
        for proc, conn in zip(self.procs, self.conns):
            conn.close()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _workers_here(ctx: Any, kind: str, path: str, n: int) -> list[Any]:
    """In the server: ``n`` workers at once; each one's pass seconds and memory."""
    kids = _Children(ctx, _worker_child, (kind, path), n)
    try:
        passes = kids.answers()
        kids.tell()
        memory = kids.answers()
        kids.tell()
    finally:
        kids.close()
    return [passes, memory]


def _reopen_here(ctx: Any, kind: str, path: str, cache: str | None) -> float:
    kids = _Children(ctx, _reopen_child, (kind, path, cache), 1)
    try:
        took: float = kids.answers()[0]
    finally:
        kids.close()
    return took


def serve() -> None:
    """The process server's loop: one JSON request a line on stdin (``[job, kind,
    path, workers, cache]``), one JSON answer a line on stdout (``["ok", value]`` or
    ``["error", message]``); ends at the end of stdin."""
    ctx = multiprocessing.get_context("fork")
    gc.freeze()  # what is here now: no collection in a child touches (and copies) it
    for line in sys.stdin:
        job, kind, path, n, cache = json.loads(line)
        try:
            if job == "reopen":
                value: Any = _reopen_here(ctx, kind, path, cache)
            else:
                value = _workers_here(ctx, kind, path, n)
            answer = ["ok", value]
        except Exception as exc:  # the parent raises it
            answer = ["error", f"{type(exc).__name__}: {exc}"]
        # flushed before the next fork: a child never inherits (and writes) a half answer
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class Server:
    """A clean process, numpy and mlcache imported, that forks the children.

    Started once with ``sys.executable``, so a child starts in milliseconds,
    holds nothing of the demo's process and never runs the caller's ``__main__``
    again (as ``spawn`` and ``forkserver`` would); single-threaded (one BLAS
    thread), so forking it is safe.
    """

    def __init__(self) -> None:
        if not hasattr(os, "fork"):
            raise RuntimeError("part 4 needs os.fork (Linux, macOS): skipped here")
        import mlcache

        root = os.path.dirname(os.path.dirname(os.path.abspath(mlcache.__file__)))
        paths = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import {__name__} as s; s.serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def ask(
        self, job: str, kind: str, path: str, workers: int = 1, cache: str | None = None
    ) -> Any:
        """``job`` (``"reopen"``: one child's seconds; ``"workers"``) of ``kind`` on
        ``path`` (``cache``: the ``cache_dir`` of a :data:`DATASET`)."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both piped above
        try:
            stdin.write((json.dumps([job, kind, path, workers, cache]) + "\n").encode())
            stdin.flush()
        except BrokenPipeError:
            pass  # the server has exited: said below
        answer = stdout.readline()
        if not answer:
            code = self.proc.wait(10)
            raise RuntimeError(f"the demo's process server exited with code {code}")
        status, value = json.loads(answer)
        if status != "ok":
            raise RuntimeError(f"a child process failed: {value}")
        return value

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
