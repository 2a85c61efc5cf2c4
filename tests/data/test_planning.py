"""mlcache.data.planning: whether a build's workers pay, decided from what the
machine gives (the figures are given here: the rule does not depend on the
machine the tests run on)."""

from __future__ import annotations

import pytest

from mlcache.data.planning import Machine, Snapshot, machine_since, plan_workers

#: 8,000 items of a millisecond each, a sample sent back in 10 us, forked in 50 ms
CSV = {"rest": 8000, "per_item": 1e-3, "per_transfer": 1e-5, "start": 0.05}


def machine(cpu: float = 1.0, ran: float = 1.0, idle: float = 1.0, cpus: int = 2) -> Machine:
    return Machine(cpus=cpus, cpu_share=cpu, run_share=ran, idle_cores=idle)


def test_cpu_bound_items_use_a_free_core() -> None:
    assert plan_workers(workers=2, machine=machine(idle=1.0), **CSV) == 2


@pytest.mark.parametrize(
    ("what", "figures"),
    [
        ("another job holds the other core", machine(idle=0.0)),
        ("a tenth of a core idle", machine(idle=0.1)),
        # measured at a load average of 6: this process ran a third of the time
        ("every core shared", machine(cpu=0.35, ran=0.35, idle=0.0)),
    ],
)
def test_cpu_bound_items_stay_here_when_no_core_is_free(what: str, figures: Machine) -> None:
    """Two processes would only share this one's core (measured slower: 0.73-0.93x)."""
    assert plan_workers(workers=2, machine=figures, **CSV) == 0, what


def test_items_that_wait_use_workers_on_a_busy_machine() -> None:
    """Loads that wait on files, a network (1% of their time in CPU) overlap in
    workers whatever the CPUs do."""
    waiting = machine(cpu=0.01, ran=0.5, idle=0.0)
    assert plan_workers(workers=2, machine=waiting, **CSV) == 2
    assert plan_workers(workers=4, machine=machine(cpu=0.01, idle=0.0, cpus=4), **CSV) == 4


def test_no_more_workers_than_the_free_cores() -> None:
    """4 asked for on a 4-CPU machine with one core idle: 2 processes, not 4."""
    assert plan_workers(workers=4, machine=machine(idle=1.0, cpus=4), **CSV) == 2
    assert plan_workers(workers=4, machine=machine(idle=3.0, cpus=4), **CSV) == 4
    assert plan_workers(workers=8, machine=machine(idle=7.0, cpus=4), **CSV) == 4


def test_half_a_free_core_pays_for_a_long_build_only() -> None:
    half = machine(idle=0.5)  # 1.5x at best
    assert plan_workers(workers=2, machine=half, **CSV) == 2
    assert plan_workers(workers=2, machine=half, **{**CSV, "start": 0.5, "rest": 2000}) == 0


@pytest.mark.parametrize(
    "costs",
    [
        {"rest": 2000, "per_item": 3e-5},  # tiny JSON items: the start costs more
        {"per_transfer": 1e-3},  # sending a sample back costs its load
        {"rest": 0},
    ],
)
def test_workers_that_cost_more_than_they_save_are_not_started(costs: dict[str, float]) -> None:
    assert plan_workers(workers=2, machine=machine(idle=1.0), **{**CSV, **costs}) == 0


def test_one_cpu_or_one_worker_loads_here() -> None:
    waiting = machine(cpu=0.01, idle=0.0)
    assert plan_workers(workers=1, machine=waiting, **CSV) == 0
    assert plan_workers(workers=2, machine=machine(cpu=0.01, cpus=1), **CSV) == 0


def test_the_figures_are_measured_from_the_clocks() -> None:
    """A window of CPU work here: its CPU share is counted, and the shares are
    shares (what a figure is on a busy machine is the rule's business, above)."""
    before = Snapshot.now()
    x = 0
    while x < 300_000:
        x += 1
    got = machine_since(before)
    assert got.cpus >= 1
    assert got.cpu_share > 0.0
    assert 0.0 < got.run_share <= 1.0
    assert got.idle_cores >= 0.0
