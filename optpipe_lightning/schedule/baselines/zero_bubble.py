"""Zero Bubble's handcrafted schedules ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, §2.2).

Both split the backward into ``B`` (input gradient, on the critical path) and ``W`` (weight
gradient, deferrable) and run one chunk per stage. Stage ``s`` runs ``k(p-s-1)`` warm-up forwards
(``k = 1`` for ZB-H1, ``k = 2`` for ZB-H2; capped at ``m``), then steps of one ``F`` (while any
are left) and one ``B``; the ``W`` of a step is held back for the first ``k*s`` steps and runs
after the step's ``B`` from then on (in microbatch order); the held-back ``W`` close the stage.

Closed forms at uniform costs (``m >= 2p`` for ZB-H2), no comm:

- ZB-H1: bubble ``(p-1)(F+B-W)``, peak ``p`` microbatches (1F1B's memory);
- ZB-H2: stage-span bubble ``(p-1)(F+B-2W)``, with comm ``(p-1)(F+B-2W+2c)``; peak ``2p-1``.

They are fixed rules, not memory-aware: under a smaller ``memory_limit`` the schedule is returned
with the simulator's memory violation in its evaluation.
"""

from __future__ import annotations

from ..problem import Problem
from ..schedule import Action, Schedule
from . import make_schedule
from ._common import capped_warmups, require_single_chunk


def handcrafted_rows(num_stages: int, num_microbatches: int, k: int) -> list[list[Action]]:
    """Per-stage actions of ZB-H``k``: ``k(p-s-1)`` warm-up F, W held back for ``k*s`` steps."""
    p, m = num_stages, num_microbatches
    rows: list[list[Action]] = []
    for s, warm in enumerate(capped_warmups(p, m, k)):
        hold = k * s
        row = [Action("F", mb) for mb in range(warm)]
        w_next = 0
        for i in range(m):
            if warm + i < m:
                row.append(Action("F", warm + i))
            row.append(Action("B", i))
            if i >= hold:
                row.append(Action("W", w_next))
                w_next += 1
        row += [Action("W", mb) for mb in range(w_next, m)]
        rows.append(row)
    return rows


def zb_h1(problem: Problem) -> Schedule:
    require_single_chunk(problem, "zb-h1", "zbv, v-half or v-min")
    rows = handcrafted_rows(problem.num_stages, problem.num_microbatches, 1)
    return make_schedule(problem, "zb-h1", rows, {"warmup_per_stage": 1, "held_w_per_stage": 1})


def zb_h2(problem: Problem) -> Schedule:
    require_single_chunk(problem, "zb-h2", "zbv, v-half or v-min")
    rows = handcrafted_rows(problem.num_stages, problem.num_microbatches, 2)
    return make_schedule(problem, "zb-h2", rows, {"warmup_per_stage": 2, "held_w_per_stage": 2})
