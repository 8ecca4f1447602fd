"""PipeOffload's compute orders with the knobs its rules fix (issue 32: orders the rules do not try).

Where the best baseline's makespan equals its compute order's makespan without any memory limit,
no change of copies helps: only another compute order can. PipeOffload's orders
(``schedule.baselines._gis_order.gis_slots``) have two knobs the rules (and ``gis_search``, which
varies the group size ``g``) fix:

- ``g_min``, the published ``min_group_size``: it sets ``k = ceil(g_min / g)``, how many groups of
  forwards run ahead of the first backward (the warm-up depth, and so the activations in flight).
  A smaller ``g_min`` holds fewer activations (less to offload), a larger one fills the pipeline
  sooner.
- ``w_delay``: how many slots each weight-gradient W runs after its B (0 published). A later W
  fills more of the drain with work that does not wait on other stages (Zero Bubble's W deferral),
  at the price of its W-part of the activation held longer.

Each (g, g_min, w_delay) order is simulated without a copy first; orders already no faster than the
incumbent are skipped (offload only delays), the rest fitted to the memory limit with the published
copy grid (both rules, 1 to v offloaded chunks) and with AdaOffload's excess-only offload, every
schedule timed by the one simulator. ``max_tries`` counts simulations, so a test is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..schedule.baselines import make_schedule
from ..schedule.baselines._gis_order import block_shape, min_group_size
from ..schedule.baselines._listsched import offload_to_fit
from ..schedule.baselines._offload_grid import RULES
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import simulate
from .gis_search import applies
from .grid_fit import grid_fits

Rows = list[list[Action]]
# W delays tried, in slots (3 slots per microbatch of a group)
W_DELAYS = (0, 3, 6)
_REL = 1e-9


def order(p: int, m: int, v: int, g: int, g_min: int, w_delay: int = 0) -> Rows:
    """PipeOffload's slot order of group size ``g`` (``_gis_order.gis_slots``) with ``g_min`` and
    each W ``w_delay`` slots after its B. Raises ValueError where the building block does not
    exist."""
    k, period = block_shape(p, v, g, g_min)
    rows: Rows = []
    for d in range(p):

        def f_off(c: int, i: int, d: int = d) -> int:
            return 3 * k * g * c + 3 * i + d + 3 * g * (c // period)

        first_b = f_off(v - 1, 0) + 3 * (p - 1 - d) + 1
        row: list[tuple[int, int, Action]] = []
        block = 3 * g * v
        for j in range(m):
            q, i = divmod(j, g)
            base = block * q
            for c in range(v):
                row.append((base + f_off(c, i), 0, Action("F", j, c)))
                b = base + first_b + 3 * k * g * c + 3 * i + 3 * g * (c // period)
                row.append((b, 1, Action("B", j, v - 1 - c)))
                row.append((b + 1 + w_delay, 2, Action("W", j, v - 1 - c)))
        row.sort(key=lambda x: (x[0], x[1]))
        rows.append([a for _, _, a in row])
    return rows


def variants(problem: Problem) -> Iterator[tuple[dict[str, int], Rows]]:
    """Every (g, g_min, w_delay) order that builds, except the published ones (``w_delay`` 0 at
    the published ``g_min``), nearest the published first (a deadline on a large problem then
    cuts the far ones): the published warm-up with a W delay, then one group of forwards fewer
    or more, and so on. ``g_min`` matters only through ``k = ceil(g_min / g)``, so one per k."""
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    published = min_group_size(problem)
    combos = []
    for g in range(1, p + 1):
        k_pub = -(-published // g)
        for k in range(1, -(-p // g) + 2):
            for w_delay in W_DELAYS:
                if w_delay == 0 and k == k_pub:
                    continue
                g_min = published if k == k_pub else g * k
                distance = abs(k - k_pub) + (w_delay > 0)
                combos.append((distance, w_delay, -g, g_min))
    combos.sort()
    for _distance, w_delay, minus_g, g_min in combos:
        g = -minus_g
        try:
            rows = order(p, m, v, g, g_min, w_delay)
        except ValueError:
            continue
        yield {"group_size": g, "g_min": g_min, "w_delay": w_delay}, rows


def members(
    problem: Problem,
    incumbent: float,
    deadline: float | None = None,
    max_tries: int | None = None,
) -> Iterator[Schedule]:
    """Schedules of the variant orders (module doc) that fit and beat ``incumbent`` (a makespan;
    each yielded beats the ones before), until ``deadline`` (``time.perf_counter()``) or
    ``max_tries`` simulations."""
    if not applies(problem):
        return
    tries = 0

    def late() -> bool:
        if max_tries is not None and tries >= max_tries:
            return True
        return deadline is not None and time.perf_counter() > deadline

    def count() -> None:
        nonlocal tries
        tries += 1

    bases = []
    for params, rows in variants(problem):
        if late():
            return
        tries += 1
        res = simulate(problem, rows)
        if res.makespan is not None and res.makespan < incumbent * (1 - _REL):
            bases.append((res.makespan, sorted(params.items()), params, rows, res))
    bases.sort(key=lambda x: (x[0], x[1]))
    best = incumbent
    for base_ms, _, params, rows, base in bases:
        if base_ms >= best * (1 - _REL) or late():
            continue
        if base.feasible:
            best = base_ms
            yield make_schedule(problem, "optpipe", rows, {**params, "offload_chunks": 0})
            continue
        for fit in grid_fits(problem, params["group_size"], rows, base, RULES, late, count):
            if fit.makespan < best * (1 - _REL):
                best = fit.makespan
                member = {**params, "offload_chunks": fit.offload_chunks, "rule": fit.rule}
                yield make_schedule(problem, "optpipe", fit.rows, member)
        if late():
            return
        tries += 1
        plan_fit, _why = offload_to_fit(problem, rows, base_result=base)
        if plan_fit is not None and plan_fit.result is not None:
            ms = plan_fit.result.makespan
            if plan_fit.result.feasible and ms is not None and ms < best * (1 - _REL):
                best = ms
                yield make_schedule(
                    problem, "optpipe", plan_fit.rows, {**params, "offload": "excess"}
                )
