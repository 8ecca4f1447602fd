"""From solver start times to an ordinary schedule (per-stage action lists) and back.

A solver decides start times; the product is an action list that the one simulator times ASAP.
Compute ops are ordered by start. A transfer is placed right after the last compute op of its
stage that ends no later than the transfer starts, so the simulator issues it no later than the
solver started it. ASAP timing can still move an allocation before a free it followed in the
solver's plan; ``repair`` then moves the offending reloads later (one compute op at a time) until
the simulator accepts the memory profile, and the simulator's makespan is what is reported.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..schedule.problem import Problem
from ..schedule.schedule import Action
from ..schedule.simulator import SimResult, simulate
from .ticks import OpKey

_COMPUTE_RANK = {"W": 0, "B": 1, "BW": 1, "F": 2}  # zero-length W first at equal starts


def actions_from_times(
    problem: Problem,
    start: Mapping[OpKey, float],
    end: Mapping[OpKey, float],
) -> list[list[Action]]:
    """Per-stage action lists from start/end times of compute ops and of the chosen transfers."""
    p = problem.num_stages
    compute: list[list[tuple[float, float, int, int, int, str]]] = [[] for _ in range(p)]
    transfers: list[list[tuple[float, int, int, int, str]]] = [[] for _ in range(p)]
    for key, st in start.items():
        op, s, c, j = key
        if op in ("OFFLOAD", "RELOAD"):
            transfers[s].append((st, 0 if op == "OFFLOAD" else 1, j, c, op))
        else:
            compute[s].append((st, end[key], _COMPUTE_RANK[op], j, c, op))
    rows: list[list[Action]] = []
    for s in range(p):
        comp = sorted(compute[s])
        xfer = sorted(transfers[s])
        row: list[Action] = []
        k = 0
        # after compute op i (0-based) go the transfers whose start >= its end and < next end
        ends = [e for (_st, e, *_rest) in comp]
        eps = 1e-9 * max(1.0, max(ends, default=1.0))
        pending = list(xfer)
        pi = 0
        # transfers issued at time 0 (before any compute op ends)
        for i in range(len(comp) + 1):
            if i > 0:
                st, _e, _r, j, c, op = comp[i - 1]
                row.append(Action(op, j, c))
            limit_next = ends[i] if i < len(comp) else float("inf")
            while pi < len(pending) and pending[pi][0] < limit_next - eps:
                _t0, _r2, j2, c2, op2 = pending[pi]
                row.append(Action(op2, j2, c2))
                pi += 1
        assert pi == len(pending)
        k += 1
        rows.append(row)
    return rows


def _move_later(row: list[Action], idx: int) -> bool:
    """Move the RELOAD at ``idx`` after the next compute op, unless that op is its backward."""
    a = row[idx]
    j = idx + 1
    while j < len(row) and not row[j].is_compute:
        j += 1
    if j >= len(row):
        return False
    nxt = row[j]
    if nxt.mb == a.mb and nxt.chunk == a.chunk and nxt.op in ("B", "BW"):
        return False
    del row[idx]
    row.insert(j, a)  # j shifted by one after the delete: now right after the compute op
    return True


def repair(problem: Problem, rows: list[list[Action]], max_moves: int = 200) -> SimResult:
    """Simulate; while memory is exceeded, issue the reloads that caused it later."""
    res = simulate(problem, rows)
    moves = 0
    while not res.feasible and moves < max_moves:
        mem = [v for v in res.evaluation.violations if v.kind == "memory"]
        if not mem or len(mem) != len(res.evaluation.violations) or res.timeline is None:
            return res
        viol = mem[0]
        s = viol.stage
        t = viol.time
        assert s is not None and t is not None
        row = rows[s]
        starts = res.timeline.start[s]
        # reloads that have allocated by t and whose backward has not started by then
        cands: list[tuple[int, int]] = []
        pos = {a: i for i, a in enumerate(row)}
        for i, a in enumerate(row):
            if a.op != "RELOAD" or starts[i] > t + 1e-12:
                continue
            bi = pos.get(Action("B", a.mb, a.chunk), pos.get(Action("BW", a.mb, a.chunk)))
            if bi is None or starts[bi] <= t:
                continue
            cands.append((bi, i))
        moved = False
        for _bi, i in sorted(cands, reverse=True):
            if _move_later(row, i):
                moved = True
                break
        if not moved:
            return res
        moves += 1
        res = simulate(problem, rows)
    return res
