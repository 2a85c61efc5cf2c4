"""Whether a build's worker processes pay: what the machine gives this process,
measured while it loads, and the rule that decides from it (see
:mod:`mlcache.data.workers`, which loads the items).

Why measured, and not only counted (``os.sched_getaffinity``): on a machine
whose other cores are busy (other jobs; on a shared VM, other sessions, each its
own scheduling group under Linux's autogroups), a second process of ours only
shares the first one's core: CPU-bound items then load 0.73-0.93x as fast in
two processes as in one (measured: 600 small CSV files parsed by pandas, two
plain forked processes against one, with no CPU idle). Items that wait on files
or a network go faster in parallel whatever the CPUs do. So a window of loading
in the building process is timed with the clocks that tell those apart: its CPU
time, the time it waited for a CPU (``/proc/thread-self/schedstat``), and the
CPU time the machine left idle (``/proc/stat``; elsewhere the load average).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["WORTH", "Machine", "Snapshot", "cpus", "machine_since", "plan_workers"]

#: workers are used when the rest would take at most this share of its time here
WORTH = 0.75


@dataclass(frozen=True)
class Machine:
    """What the probe measured of the machine, while this process loaded alone.

    ``cpus``: the CPUs this process may run on. ``cpu_share``: its CPU time over
    the probe's wall time (1.0: loading is CPU-bound and had a core to itself;
    0.01: it waits on files, a network, a sleep). ``run_share``: of the time it
    was ready to run, the share it ran (1.0: it never waited for a CPU; 0.5:
    other work took half of its core). ``idle_cores``: the CPUs left idle
    meanwhile (on a quiet 2-core machine, about 1.0; when other work fills them,
    0: then a second process of ours only shares the first one's core)."""

    cpus: int
    cpu_share: float
    run_share: float
    idle_cores: float


def plan_workers(
    rest: int, per_item: float, per_transfer: float, workers: int, machine: Machine, start: float
) -> int:
    """How many workers to start for the ``rest`` items, or 0 to load them here.

    ``n`` workers load at most ``n`` times as fast as this process, and at most
    as fast as the CPUs left to them allow: an item takes ``cpu_share`` of its
    time here in CPU, and the workers together get the ``run_share`` of a core
    this process gets plus the idle cores, so the speed-up is at most
    ``(run_share + idle_cores) / cpu_share``. Items that wait more than they
    compute go ``n`` times as fast, busy CPUs or not; CPU-bound items on a
    machine whose other cores are busy go no faster at all (measured: two
    processes then load 0.73-0.93x as fast as one). No more workers are started
    than that speed-up rounds to, and they are started when the rest is
    predicted to take at most :data:`WORTH` of its time here: ``start + (here -
    start) / speed-up`` plus sending every sample back, with ``here = rest *
    per_item`` and ``start`` the seconds to the first worker ready (this process
    goes on loading meanwhile). Pure: the decision is tested with given figures.

    >>> quiet = Machine(cpus=2, cpu_share=1.0, run_share=1.0, idle_cores=1.0)
    >>> busy = Machine(cpus=2, cpu_share=1.0, run_share=1.0, idle_cores=0.0)
    >>> [plan_workers(8000, 1e-3, 1e-5, 2, m, start=0.05) for m in (quiet, busy)]
    [2, 0]
    """
    here = rest * per_item
    cores = min(workers, machine.cpus)
    if cores < 2 or here <= 0:
        return 0
    cpus_left = max(machine.run_share, 0.0) + max(machine.idle_cores, 0.0)
    # (no CPU time measured: nothing to share)
    speedup = min(cores, cpus_left / max(machine.cpu_share, 1e-9))
    # no more processes than the CPUs give (two on one free core only share it)
    n = min(cores, max(2, round(speedup)))
    start = min(start, here)
    there = start + (here - start) / min(n, speedup) + rest * per_transfer
    return n if there <= WORTH * here else 0


@dataclass(frozen=True)
class Snapshot:
    """The clocks :func:`machine_since` compares."""

    wall: float
    cpu: float
    idle: float | None
    ran: tuple[int, int] | None

    @classmethod
    def now(cls) -> Snapshot:
        return cls(time.perf_counter(), time.process_time(), _idle_seconds(), _run_times())


def machine_since(before: Snapshot) -> Machine:
    """What the machine gave this process since ``before`` (see :class:`Machine`)."""
    wall = max(time.perf_counter() - before.wall, 1e-9)
    return Machine(
        cpus=cpus(),
        cpu_share=(time.process_time() - before.cpu) / wall,
        run_share=_run_share(before.ran),
        idle_cores=_idle_cores(before.idle, wall),
    )


def _idle_seconds() -> float | None:
    """The CPU-seconds all CPUs of the machine spent idle (or waiting on I/O) since
    it started, from ``/proc/stat``; None where there is none."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait ...
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _run_times() -> tuple[int, int] | None:
    """The nanoseconds this thread ran and waited to run (ready, another task on
    its CPU), from ``/proc/thread-self/schedstat``; None where there is none."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            ran, waited = f.read().split()[:2]
        return int(ran), int(waited)
    except (OSError, ValueError):
        return None


def _run_share(ran0: tuple[int, int] | None) -> float:
    """Of the time this thread was ready to run since ``ran0`` (its
    :func:`_run_times` then), the share it ran; 1.0 where it is not known."""
    ran1 = _run_times()
    if ran0 is None or ran1 is None:
        return 1.0
    ran, waited = ran1[0] - ran0[0], ran1[1] - ran0[1]
    return ran / (ran + waited) if ran > 0 else 1.0


def _idle_cores(idle0: float | None, wall: float) -> float:
    """The CPUs left idle over the last ``wall`` seconds, when ``idle0`` was
    :func:`_idle_seconds`: else the load average's estimate, else all but one."""
    idle1 = _idle_seconds()
    if idle0 is not None and idle1 is not None:
        return max(0.0, idle1 - idle0) / wall
    try:
        return max(0.0, cpus() - os.getloadavg()[0])
    except (AttributeError, OSError):  # no load average (Windows)
        return cpus() - 1.0


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
