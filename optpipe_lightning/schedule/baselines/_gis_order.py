"""PipeOffload's compute orders: GIS, grouped GIS and the uniform repeating order, as published.

The authors' generator (sail-sg/zero-bubble-pipeline-parallelism, ``group_interleaved_1f1b.py``,
class ``GroupBuildingBlockScheduler``) lays out a building block of slots, three per microbatch
and chunk, repeats it every ``3 g v`` slots for each group of ``g`` microbatches, drops the
microbatches ``>= m`` and keeps each device's ops in slot order (its later passes shift and
squeeze slots to time them, never reordering). This module computes the same slots in closed
form, written from that description:

- ``k = ceil(g_min / g)`` groups of spacing, ``period = v / gcd(v, k)``, and for device ``d``,
  microbatch ``j = q g + i`` (group ``q``, index ``i`` in it) and chunk ``c``::

      F(j, c)        at 3 g v q + 3 k g c + 3 i + d + 3 g (c // period)
      B(j, v-1-c)    at 3 g v q + first_b(d) + 3 k g c + 3 i + 3 g (c // period)
      W(j, v-1-c)    one slot after that B
      first_b(d)     = F(0, v-1) of device d + 3 (p-1-d) + 1

  so every device runs ``g (v-1) + p - d`` forwards (fewer if m is short) before its first B,
  then B, W, F in turn.
- ``g = p`` is GIS, ``g = ceil(p/2)`` GIS-H (``g`` in ``[ceil(p/2), p]`` are the paper's interleave
  group sizes, ``k = 1`` there), ``g = 1`` the uniform repeating order (each microbatch's
  chunks spread over its block, ``3 g_min`` slots apart and more at each ``period``).
- ``g_min`` is the published minimum group size: ``ceil(p/2)``, raised while
  ``max_s(F+B+W) * g_min < max(sum_s F, sum_s B)``.

The published generator asserts that no two ops of a device share a slot modulo the block
length and that ``max(0, 2p - 3 k g) < p``; a group size that fails either cannot be built
there, and ``gis_slots`` raises ``ValueError`` for it too.

``planning_times`` gives the timeline the published offload pass plans its copies on: the
orders timed with per-stage costs and no p2p time (what the authors' runtime passes it), except
for ``g = 1``, where the published generator stamps each op with its slot times the largest F
instead of timing it (see the pitfalls in the project's schedule notes); then the warm-up
forwards after the first F of the last chunk are postponed as late as their successors allow
(``postpone_forward_in_warmup``).
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import Problem
from ..schedule import Action
from ..simulator import simulate

Rows = list[list[Action]]
# per stage, per compute op in order: (action, start, end) on the planning timeline
Plan = list[list[tuple[Action, float, float]]]


def min_group_size(problem: Problem) -> int:
    """The published ``min_group_size`` (see the module doc); at most p."""
    p = problem.num_stages
    tf, tb, tw = (problem.cost(n).max(axis=1) for n in ("t_f", "t_b", "t_w"))
    max_fbw = float((tf + tb + tw).max())
    need = max(float(tf.sum()), float(tb.sum()))
    g = (p + 1) // 2
    while max_fbw * g < need * (1 - 1e-12) and g < p:
        g += 1
    return g


def group_sizes(problem: Problem) -> list[int]:
    """The interleave group sizes PipeOffload sweeps: p down to ceil(p/2), then 1 (uniform);
    one order (``[p]``) when v = 1, where every group size gives the same order."""
    p, v = problem.num_stages, problem.num_chunks
    if v == 1:
        return [p]
    return [*range(p, (p + 1) // 2 - 1, -1), 1]


def block_shape(p: int, v: int, g: int, g_min: int) -> tuple[int, int]:
    """``(k, period)`` of the building block of group size ``g``: each chunk's forwards ``k``
    groups apart, a gap every ``period`` chunks (see the module doc). Raises ValueError where
    the block does not exist (``g`` outside 1..p, or ``3 k g <= p``)."""
    if not 1 <= g <= p:
        raise ValueError(f"group size {g} is outside 1..{p}")
    k = -(-g_min // g)
    if max(0, 2 * p - 3 * k * g) >= p:
        raise ValueError(f"group size {g}: the published building block needs 3kg > p")
    return k, v // math.gcd(v, k)


def gis_slots(p: int, m: int, v: int, g: int, g_min: int) -> list[list[tuple[int, Action]]]:
    """Per device, (slot, action) of every op in slot order (see the module doc)."""
    k, period = block_shape(p, v, g, g_min)
    block = 3 * g * v

    def f_off(c: int, i: int, d: int) -> int:
        return 3 * k * g * c + 3 * i + d + 3 * g * (c // period)

    rows: list[list[tuple[int, Action]]] = []
    for d in range(p):
        first_b = f_off(v - 1, 0, d) + 3 * (p - 1 - d) + 1
        block_slots: set[int] = set()
        for c in range(v):
            for i in range(g):
                b = first_b + 3 * k * g * c + 3 * i + 3 * g * (c // period)
                block_slots.update((f_off(c, i, d) % block, b % block, (b + 1) % block))
        if len(block_slots) != block:
            raise ValueError(f"group size {g}: two ops share a slot of the published block")
        row: list[tuple[int, Action]] = []
        for j in range(m):
            q, i = divmod(j, g)
            base = block * q
            for c in range(v):
                row.append((base + f_off(c, i, d), Action("F", j, c)))
                b = base + first_b + 3 * k * g * c + 3 * i + 3 * g * (c // period)
                row.append((b, Action("B", j, v - 1 - c)))
                row.append((b + 1, Action("W", j, v - 1 - c)))
        row.sort()
        rows.append(row)
    return rows


def gis_order(problem: Problem, g: int) -> Rows:
    """The published compute order of group size g on the problem's p, m, v."""
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    return [[a for _, a in row] for row in gis_slots(p, m, v, g, min_group_size(problem))]


def planning_times(problem: Problem, g: int) -> Plan | None:
    """The timeline the published offload pass plans on (module doc); None if the order does
    not run."""
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    slots = gis_slots(p, m, v, g, min_group_size(problem))
    plan: Plan
    if g == 1:
        # slot times the largest F, after the published shift of device d by min(d, extra)
        unit = float(problem.cost("t_f").max())
        first = {(a.mb, a.chunk): t for t, a in slots[p - 1] if a.op == "F"}
        extra = p - 1
        for t, a in slots[0]:
            if a.op == "F" and a.chunk > 0:
                extra = min(extra, t - 1 - first[(a.mb, a.chunk - 1)])
        plan = [
            [(a, (t + min(d, extra)) * unit, (t + min(d, extra) + 1) * unit) for t, a in row]
            for d, row in enumerate(slots)
        ]
    else:
        rows = [[a for _, a in row] for row in slots]
        timing = problem.with_changes(t_comm=0.0, memory_limit=None, offload=None)
        res = simulate(timing, rows)
        if res.timeline is None:
            return None
        plan = [res.timeline.compute_rows(s) for s in range(p)]
    return _postpone_warmup(problem, plan)


def _postpone_warmup(problem: Problem, plan: Plan) -> Plan:
    """The published ``postpone_forward_in_warmup`` (no p2p time, as the runtime plans it):
    from the last device to the first, walk back from the first B to the first F of the last
    chunk and start each forward as late as the next layer group's F and the op after it allow
    (never earlier than planned)."""
    p, v = problem.num_stages, problem.num_chunks
    where: dict[tuple[int, int, int], tuple[int, int]] = {}  # (group, mb, F) -> (stage, index)
    for s, row in enumerate(plan):
        for i, (a, _st, _en) in enumerate(row):
            if a.op == "F":
                where[(problem.group_of(s, a.chunk), a.mb, 0)] = (s, i)
    out = [list(row) for row in plan]
    for s in range(p - 1, -1, -1):
        row = out[s]
        first_b = next(i for i, (a, _st, _en) in enumerate(row) if a.op in ("B", "BW"))
        b_st, b_en = row[first_b][1], row[first_b][2]
        cur = b_st - (b_en - b_st)
        for i in range(first_b - 1, -1, -1):
            a, st, en = row[i]
            if a.op == "F" and a.chunk == v - 1 and a.mb == 0:
                break
            nxt = where.get((problem.group_of(s, a.chunk) + 1, a.mb, 0))
            cost = en - st
            late = cur - cost
            if nxt is not None:
                ns, ni = nxt
                late = min(out[ns][ni][1] - cost, late)
            if late > st:
                row[i] = (a, late, late + cost)
            cur = row[i][1]
    return out


def stage_fbw(problem: Problem) -> np.ndarray:
    """Per stage, the largest F + B + W over its chunks (what the published offload time is a
    ratio of)."""
    return (problem.cost("t_f") + problem.cost("t_b") + problem.cost("t_w")).max(axis=1)
