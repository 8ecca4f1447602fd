"""PipeOffload's family beyond its published group sizes (issue 32: orders the rules do not try).

PipeOffload's orders (``schedule.baselines._gis_order``) interleave microbatches in groups of
``g``; the paper (and so the ``pipeoffload`` baseline) uses ``g`` in ``[ceil(p/2), p]`` and 1.
The sizes between, 2 to ``ceil(p/2) - 1``, build too and hold memory between the two ends: on
the 16-stage bench_peer problem at 25% of 1F1B's memory, ``g = 4`` with two chunks offloaded fits
at 32.08 s where the published family's best (``g = 1``) gives 33.19 s. This module tries them,
each with the published copy grid (``_offload_grid``: 1 to v offloaded chunks, the lazy rule
over every order, then the fit rule: ``grid_members``) and, once every order's grid is tried,
with AdaOffload's excess-only offload (``_listsched.offload_to_fit``, ``excess_members``; that
one also on the published sizes other than the two AdaOffload starts from), fastest base order
first in each pass, skipping an order already slower than the incumbent (offload only delays).
The solve runs the unequal final groups between the two passes (``phases._run_search``). Every
schedule is timed by the one simulator.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..schedule.baselines import make_schedule
from ..schedule.baselines._gis_order import gis_order, group_sizes
from ..schedule.baselines._listsched import offload_to_fit
from ..schedule.baselines._offload_grid import RULES
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import SimResult, simulate
from .grid_fit import grid_fits

Rows = list[list[Action]]


def applies(problem: Problem) -> bool:
    """Interleaved chunks under a memory limit with offload: where the extra sizes can help."""
    return (
        problem.num_chunks > 1
        and problem.placement == "interleaved"
        and problem.offload is not None
        and any(x is not None for x in problem.memory_limits())
    )


@dataclass(frozen=True)
class Base:
    """One extra group size's order and its simulation without copies."""

    makespan: float
    group_size: int
    rows: Rows
    result: SimResult


def bases(problem: Problem, deadline: float | None = None) -> list[Base] | None:
    """The orders of the group sizes the published family leaves out (and the published ones
    other than AdaOffload's two starts), fastest first; None when ``deadline`` passed first."""
    if not applies(problem):
        return []
    p = problem.num_stages
    published = set(group_sizes(problem))
    out: list[Base] = []
    for g in range(2, p + 1):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        if g in published and g in (p, (p + 1) // 2):
            continue  # AdaOffload's bases: both offloads tried there already
        try:
            rows = gis_order(problem, g)
        except ValueError:
            continue
        res = simulate(problem, rows)
        if res.makespan is not None:
            out.append(Base(res.makespan, g, rows, res))
    out.sort(key=lambda b: b.makespan)
    return out


def grid_members(
    problem: Problem, found: list[Base], incumbent: float, deadline: float | None = None
) -> Iterator[Schedule]:
    """The orders of ``found`` that fit as they are, or with the published copy grid (the
    unpublished sizes only), beating ``incumbent`` (each one yielded beats the ones before),
    until ``deadline``. One rule at a time over every order, the lazy rule first (where both fit
    they gave the same makespan on bench_peer's 32-stage problems, and the second rule doubled
    the cost of every order that fits with neither: at h8192-s8k-p32-m64-25% five such orders
    come before g = 8, the one that fits)."""
    published = set(group_sizes(problem))

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    best = incumbent
    for n, rule in enumerate(RULES):
        for base in found:
            if base.makespan >= best * (1 - 1e-9):
                break  # fastest first: offload only delays, the rest are slower already
            if late():
                return
            if base.result.feasible:
                if n == 0:
                    best = base.makespan
                    as_is = {"group_size": base.group_size, "offload_chunks": 0}
                    yield make_schedule(problem, "optpipe", base.rows, as_is)
                continue
            if base.group_size in published:
                continue
            g = base.group_size
            for fit in grid_fits(problem, g, base.rows, base.result, (rule,), late):
                if fit.makespan < best * (1 - 1e-9):
                    best = fit.makespan
                    params: dict[str, object] = {
                        "group_size": g,
                        "offload_chunks": fit.offload_chunks,
                        "rule": rule,
                    }
                    yield make_schedule(problem, "optpipe", fit.rows, params)


def excess_members(
    problem: Problem, found: list[Base], incumbent: float, deadline: float | None = None
) -> Iterator[Schedule]:
    """The orders of ``found`` that do not fit as they are, with AdaOffload's excess-only
    offload (slower to plan: 0.2-0.3 s an order at 32 stages, where it seldom wins), beating
    ``incumbent``, until ``deadline``."""
    best = incumbent
    for base in found:
        if base.result.feasible or base.makespan >= best * (1 - 1e-9):
            continue
        if deadline is not None and time.perf_counter() > deadline:
            return
        plan_fit, _why = offload_to_fit(problem, base.rows, base_result=base.result)
        if plan_fit is not None and plan_fit.result is not None:
            ms = plan_fit.result.makespan
            if plan_fit.result.feasible and ms is not None and ms < best * (1 - 1e-9):
                best = ms
                params: dict[str, object] = {"group_size": base.group_size, "offload": "excess"}
                yield make_schedule(problem, "optpipe", plan_fit.rows, params)


def extra_members(
    problem: Problem, incumbent: float, deadline: float | None = None
) -> Iterator[Schedule]:
    """Schedules of the group sizes the published family leaves out (module doc) that fit and
    beat ``incumbent`` (a makespan; each one yielded beats the ones before), until ``deadline``
    (``time.perf_counter()``): every order's copy grids first (``grid_members``), the
    excess-only offload only then (``excess_members``: on h8192-s8k-p32-m64-25% the grid of
    g = 8 comes 18th of 29 orders, after 17 excess plans it would otherwise wait for)."""
    found = bases(problem, deadline)
    if not found:
        return
    best = incumbent
    for sched in grid_members(problem, found, best, deadline):
        assert sched.evaluation is not None and sched.evaluation.makespan is not None
        best = sched.evaluation.makespan
        yield sched
    yield from excess_members(problem, found, best, deadline)
