"""AdaOffload: memory-adaptive offload (the OptPipe paper's initial schedule; its rule inferred).

1. Base orders, memory-aware: the greedy list scheduler (``_listsched.list_schedule``) under
   caps of 1, 1.25, 1.5, 2 and 3 times the memory limit and without a cap, plus the structured
   orders of the problem's shape (GIS group sizes p and ceil(p/2) for interleaved chunks; ZB-V,
   V-Half and V-Min for V placement).
2. For each base: while some stage exceeds its limit, offload the live activation at the
   violation with the longest lifespan whose window hides its round trip (offload + reload time
   on its copy channel) and whose copy can be out before the violation and back after it
   (``_listsched.offload_to_fit``); OFFLOAD right after its F, RELOAD after the last compute op
   that ends at least 1.05 reload times before its B (a transfer is issued when the compute op
   listed before it ends). Only the excess is offloaded, so a base that fits offloads nothing;
   offloads the fitted plan turns out not to need are dropped again (bounded pruning).
3. The fitting result with the smallest makespan wins, fewer offloads on ties.

Any chunk count and placement. ``NotApplicable`` names why when no base fits even with offload.
"""

from __future__ import annotations

import math

from ..problem import Problem
from ..schedule import Schedule
from ..simulator import simulate
from . import NotApplicable, make_schedule
from ._deadline import check_deadline
from ._listsched import (
    OffloadPlan,
    Rows,
    below_one_activation,
    list_schedule,
    offload_to_fit,
    prune_offloads,
)
from .pipeoffload import runnable_gis
from .vshape import block_slots, zbv_rows

CAP_FACTORS = (1.0, 1.25, 1.5, 2.0, 3.0, None)
PRUNE_WORK = 150_000  # pruning gets PRUNE_WORK / (ops in the problem) simulations, 16 to 120


def _bases(problem: Problem) -> list[tuple[str, Rows]]:
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    limits = problem.memory_limits()
    out: list[tuple[str, Rows]] = []
    for k in CAP_FACTORS:
        if k is None or all(x is None for x in limits):
            caps: list[float | None] = [None] * p
            label = "greedy"
        else:
            caps = [None if x is None else x * k for x in limits]
            label = f"greedy-cap{k:g}x"
        check_deadline()
        rows = list_schedule(problem, caps, w_caps=limits)
        if rows is not None:
            out.append((label, rows))
        if label == "greedy":
            break
    if v > 1 and problem.placement == "interleaved":
        for g in dict.fromkeys((min(p, m), min(math.ceil(p / 2), m))):
            out.append((f"gis-g{g}", runnable_gis(problem, g)[0]))
    if v == 2 and problem.placement == "vshape":
        out.append(("zbv", zbv_rows(p, m)))
        for kind in ("half", "min"):
            out.append((f"v-{kind}", [[a for _, a in r] for r in block_slots(p, m, kind)]))
    return out


def adaoffload(problem: Problem) -> Schedule:
    """The fastest memory-aware order that fits the limit, offloading only what it needs."""
    inf = float("inf")
    why_not = below_one_activation(problem)
    if why_not:
        raise NotApplicable(f"adaoffload: {why_not}")
    best: tuple[float, int, OffloadPlan, str] | None = None
    reasons: list[str] = []
    # Offload only delays ops, so a base no faster than the best fitted plan cannot win: try
    # the bases fastest first and stop early.
    sims = []
    for label, rows in _bases(problem):
        check_deadline()
        sims.append((simulate(problem, rows), label, rows))
    sims.sort(key=lambda x: (inf if x[0].makespan is None else x[0].makespan, not x[0].feasible))
    for res, label, rows in sims:
        if (
            best is not None
            and res.makespan is not None
            and (
                res.makespan > best[0] * (1 + 1e-9)
                or (res.makespan >= best[0] * (1 - 1e-9) and (best[1] == 0 or not res.feasible))
            )
        ):
            continue
        plan, why = offload_to_fit(problem, rows, base_result=res)
        if plan is None:
            reasons.append(f"{label}: {why}")
            continue
        assert plan.result is not None and plan.result.makespan is not None
        key = (plan.result.makespan, len(plan.offloaded))
        if (
            best is None
            or key[0] < best[0] * (1 - 1e-9)
            or (key[0] <= best[0] * (1 + 1e-9) and key[1] < best[1])
        ):
            best = (key[0], key[1], plan, label)
    if best is None:
        raise NotApplicable(
            "adaoffload found no order that fits the memory limit"
            + (" even with offload" if problem.offload is not None else " (offload: null)")
            + ": "
            + "; ".join(reasons[:2])
        )
    _ms, _n, plan, label = best
    if plan.offloaded:
        assert plan.result is not None
        compute = [[a for a in r if a.is_compute] for r in plan.rows]
        n_ops = 3 * problem.num_stages * problem.num_chunks * problem.num_microbatches
        budget = max(16, min(120, PRUNE_WORK // n_ops))
        plan = prune_offloads(problem, compute, plan.offloaded, plan.result, budget)
    return make_schedule(
        problem, "adaoffload", plan.rows, {"base": label, "num_offloaded": len(plan.offloaded)}
    )
