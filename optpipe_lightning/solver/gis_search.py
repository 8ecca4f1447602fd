"""PipeOffload's family beyond its published group sizes (issue 32: orders the rules do not try).

PipeOffload's orders (``schedule.baselines._gis_order``) interleave microbatches in groups of
``g``; the paper (and so the ``pipeoffload`` baseline) uses ``g`` in ``[ceil(p/2), p]`` and 1.
The sizes between, 2 to ``ceil(p/2) - 1``, build too and hold memory between the two ends: on
the 16-stage bench_peer problem at 25% of 1F1B's memory, ``g = 4`` with two chunks offloaded fits
at 32.08 s where the published family's best (``g = 1``) gives 33.19 s. This module tries them,
each with the published copy grid (``_offload_grid``: both rules, 1 to v offloaded chunks) and,
once every order's grid is tried, with AdaOffload's excess-only offload
(``_listsched.offload_to_fit``; that one also on the published sizes other than the two
AdaOffload starts from), fastest base order first in each pass, skipping an order already
slower than the incumbent (offload only delays). Every schedule is timed by the one simulator.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..schedule.baselines import make_schedule
from ..schedule.baselines._gis_order import gis_order, group_sizes
from ..schedule.baselines._listsched import offload_to_fit
from ..schedule.baselines._offload_grid import RULES
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import simulate
from .grid_fit import grid_fits


def applies(problem: Problem) -> bool:
    """Interleaved chunks under a memory limit with offload: where the extra sizes can help."""
    return (
        problem.num_chunks > 1
        and problem.placement == "interleaved"
        and problem.offload is not None
        and any(x is not None for x in problem.memory_limits())
    )


def extra_members(
    problem: Problem, incumbent: float, deadline: float | None = None
) -> Iterator[Schedule]:
    """Schedules of the group sizes the published family leaves out (module doc) that fit and
    beat ``incumbent`` (a makespan; each one yielded beats the ones before), until ``deadline``
    (``time.perf_counter()``)."""
    if not applies(problem):
        return
    p = problem.num_stages
    published = set(group_sizes(problem))

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    bases = []
    for g in range(2, p + 1):
        if late():
            return
        if g in published and g in (p, (p + 1) // 2):
            continue  # AdaOffload's bases: both offloads tried there already
        try:
            rows = gis_order(problem, g)
        except ValueError:
            continue
        res = simulate(problem, rows)
        if res.makespan is not None:
            bases.append((res.makespan, g, rows, res))
    bases.sort(key=lambda x: x[0])
    best = incumbent
    # the copy grids of every order first, the excess-only offload (slower to plan: 0.2-0.3 s
    # an order at 32 stages, where it seldom wins) only then: on h8192-s8k-p32-m64-25% the grid
    # of g = 8 comes 18th of 29 orders, after 17 excess plans it would otherwise wait for
    for base_ms, g, rows, base in bases:
        if base_ms >= best * (1 - 1e-9) or late():
            continue
        if base.feasible:
            best = base_ms
            yield make_schedule(problem, "optpipe", rows, {"group_size": g, "offload_chunks": 0})
            continue
        for fit in grid_fits(problem, g, rows, base, RULES if g not in published else (), late):
            if fit.makespan < best * (1 - 1e-9):
                best = fit.makespan
                member = {"group_size": g, "offload_chunks": fit.offload_chunks, "rule": fit.rule}
                yield make_schedule(problem, "optpipe", fit.rows, member)
    for base_ms, g, rows, base in bases:
        if base.feasible or base_ms >= best * (1 - 1e-9):
            continue
        if late():
            return
        plan_fit, _why = offload_to_fit(problem, rows, base_result=base)
        if plan_fit is not None and plan_fit.result is not None:
            ms = plan_fit.result.makespan
            if plan_fit.result.feasible and ms is not None and ms < best * (1 - 1e-9):
                best = ms
                params: dict[str, object] = {"group_size": g, "offload": "excess"}
                yield make_schedule(problem, "optpipe", plan_fit.rows, params)
