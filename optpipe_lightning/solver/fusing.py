"""Fusing a backward's B and W into one BW op where that makes a schedule faster.

Where a fused backward is cheaper than B then W (``ticks.fusable``), a split schedule (the list
rules and the periodic patterns build only those) may gain by running some backwards fused. The
cheap move: a B directly followed by its own W in a stage's list becomes one BW. Fusing delays
the B's hand-on and its memory release to the BW's end, so it can also slow the pipeline; the
simulator decides. Tried: every such pair at once, then stage by stage (kept where the makespan
drops); one simulation per try.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import simulate
from .ticks import fusable

_REL = 1e-9
# the solver offers fused backwards where they can pay: this pass, and the fused-or-split choice
# of CP-SAT's model (``cpsat``). False gives the split-only solver of before
# (``benchmarks/bench_fused.py`` compares the two side by side)
FUSE_BACKWARDS = True


def fuse_adjacent(
    problem: Problem, rows: Sequence[Sequence[Action]], stages: set[int]
) -> list[list[Action]]:
    """``rows`` with every B directly followed by its own W fused, on ``stages`` only (and only
    on the chunks where fusing can pay)."""
    fuse = fusable(problem)
    out: list[list[Action]] = []
    for s, row in enumerate(rows):
        if s not in stages:
            out.append(list(row))
            continue
        new: list[Action] = []
        i = 0
        while i < len(row):
            a = row[i]
            if (
                a.op == "B"
                and (s, a.chunk) in fuse
                and i + 1 < len(row)
                and row[i + 1] == Action("W", a.mb, a.chunk)
            ):
                new.append(Action("BW", a.mb, a.chunk))
                i += 2
            else:
                new.append(a)
                i += 1
        out.append(new)
    return out


def fuse_where_faster(
    problem: Problem, schedule: Schedule, deadline: float | None = None
) -> Schedule | None:
    """The schedule with B, W pairs fused where that lowers the simulated makespan (module doc),
    or None where nothing did. No simulation starts after ``deadline``
    (``time.perf_counter()``)."""
    if not FUSE_BACKWARDS or not fusable(problem):
        return None
    base = simulate(problem, schedule)
    if not base.feasible or base.makespan is None:
        return None
    best_rows = [list(r) for r in schedule.actions]
    best_ms = base.makespan
    best_eval = None
    tries: list[set[int]] = [set(range(problem.num_stages))]
    tries += [{s} for s in range(problem.num_stages)]
    for stages in tries:
        if deadline is not None and time.perf_counter() > deadline:
            break
        rows = fuse_adjacent(problem, best_rows, stages)
        if rows == best_rows:
            continue
        res = simulate(problem, rows)
        if res.feasible and res.makespan is not None and res.makespan < best_ms * (1 - _REL):
            best_rows, best_ms, best_eval = rows, res.makespan, res.evaluation
    if best_eval is None:
        return None
    return Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe-solver",
        params={**schedule.params, "fused": "adjacent B, W pairs where faster"},
        actions=best_rows,
        evaluation=best_eval,
        problem=problem,
    )
