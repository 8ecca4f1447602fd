"""1F1B (PipeDream-flush) and Megatron's interleaved 1F1B, both with fused backward (``BW``).

1F1B, one chunk per stage: stage ``s`` runs ``min(p-s-1, m)`` warm-up forwards, then alternates
one forward and one backward, then drains the remaining backwards. Uniform costs, no comm:
makespan ``m(F+B+W) + (p-1)(F+B+W)``, peak ``min(p-s, m)`` microbatches on stage ``s``.

Interleaved 1F1B (Megatron-LM ``forward_backward_pipelining_with_interleaving``), ``v >= 2``
chunks with interleaved placement (chunk ``c`` of stage ``s`` is layer group ``c*p+s``):
microbatches are taken in groups of ``p``; within a group every chunk runs the group's
microbatches in chunk order (Megatron's schedule table; the last group takes the remainder when
``p`` does not divide ``m``, as ``get_schedule_table`` does). Stage ``s`` runs
``2(p-s-1) + (v-1)p`` warm-up forwards (all of them when that reaches ``m*v``), then one forward
and one backward per step; backwards walk the same table with chunks mirrored (``v-1-c``).
Megatron requires ``m >= p`` (its microbatch group size must lie in ``[p, m]``), so smaller ``m``
is not applicable; when ``p`` does not divide ``m`` that order can deadlock (stage 0's warm-up
reaches into the short last group, whose chunk-1 forwards wait on chunk-0 forwards that stage
``p-1`` queues behind a backward) -- those cases are reported not applicable too (the simulator
finds the cycle), the others are kept. With ``p | m``, uniform per-chunk costs and no comm the bubble is
``(p-1)(F+B+W)`` with per-chunk F, B, W, i.e. ``1/v`` of 1F1B on the same layers; the peak is
``pv + p - 1`` chunk units on stage 0.
"""

from __future__ import annotations

from ..problem import Problem
from ..schedule import Action, Schedule
from . import NotApplicable, make_schedule
from ._common import capped_warmups, require_single_chunk


def one_f_one_b(problem: Problem) -> Schedule:
    require_single_chunk(problem, "1f1b", "interleaved-1f1b, gpipe or a V schedule")
    p, m = problem.num_stages, problem.num_microbatches
    rows: list[list[Action]] = []
    for warm in capped_warmups(p, m, 1):
        row = [Action("F", mb) for mb in range(warm)]
        for mb in range(m):
            if warm + mb < m:
                row.append(Action("F", warm + mb))
            row.append(Action("BW", mb))
        rows.append(row)
    return make_schedule(problem, "1f1b", rows, {"backward": "fused"})


def megatron_schedule_table(
    num_microbatches: int, num_chunks: int, group: int
) -> list[tuple[int, int]]:
    """Megatron's (microbatch, chunk) order of forwards: groups of ``group`` microbatches."""
    table: list[tuple[int, int]] = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table += [(mb, c) for c in range(num_chunks) for mb in range(lo, hi)]
    return table


def interleaved_1f1b(problem: Problem) -> Schedule:
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    if v < 2:
        raise NotApplicable("interleaved-1f1b needs num_chunks >= 2 (use 1f1b for one chunk)")
    if problem.placement != "interleaved":
        raise NotApplicable(
            "interleaved-1f1b needs placement 'interleaved', the problem has 'vshape' "
            "(use zbv, v-half or v-min)"
        )
    if m < p:
        raise NotApplicable(
            f"interleaved-1f1b (Megatron) needs num_microbatches >= num_stages, got m={m} < p={p}"
        )
    table = megatron_schedule_table(m, v, p)
    total = m * v
    rows: list[list[Action]] = []
    for s in range(p):
        warm = min(2 * (p - s - 1) + (v - 1) * p, total)
        row = [Action("F", mb, c) for mb, c in table[:warm]]
        for k in range(total):
            if warm + k < total:
                mb, c = table[warm + k]
                row.append(Action("F", mb, c))
            mb, c = table[k]
            row.append(Action("BW", mb, v - 1 - c))
        rows.append(row)
    sched = make_schedule(
        problem, "interleaved-1f1b", rows, {"backward": "fused", "microbatch_group": p}
    )
    ev = sched.evaluation
    if ev is not None and any(x.kind == "deadlock" for x in ev.violations):
        raise NotApplicable(
            f"Megatron's interleaved order deadlocks at m={m}, p={p}, v={v} (its last "
            f"microbatch group has {m % p} < p microbatches); use m divisible by p"
        )
    return sched
