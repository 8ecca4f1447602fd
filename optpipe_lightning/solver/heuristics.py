"""Offload-aware list schedulers: a valid first schedule at once, and the solver's hint.

Every rule of the portfolio (``list_rules.default_rules``) runs through the one greedy
(``list_scheduler``); the simulator judges each result, and the minimal-memory order
(``feasibility``), which fits whenever any order does, joins them.
"""

from __future__ import annotations

from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from .list_rules import ListRule, default_rules, no_offload_fits, slow_copies
from .list_scheduler import list_schedule

__all__ = [
    "ListRule",
    "default_rules",
    "heuristic_schedules",
    "list_schedule",
    "no_offload_fits",
    "run_rule",
    "slow_copies",
]


def heuristic_schedules(problem: Problem) -> list[Schedule]:
    """Every list-scheduling rule's schedule that the simulator accepts, best first."""
    from .feasibility import minimal_memory_schedule

    out: list[Schedule] = []
    for rule in default_rules(problem):
        sched = run_rule(problem, rule)
        if sched is not None and sched.evaluation is not None and sched.evaluation.feasible:
            out.append(sched)
    seq = minimal_memory_schedule(problem)
    if seq.evaluation is not None and seq.evaluation.feasible:
        out.append(seq)
    out.sort(key=lambda s: s.evaluation.makespan if s.evaluation and s.evaluation.makespan else 0)
    return out


def run_rule(problem: Problem, rule: ListRule) -> Schedule | None:
    """The schedule of one rule, evaluated (None if the greedy got stuck)."""
    rows = list_schedule(problem, rule)
    if rows is None:
        return None
    ev = evaluate(problem, rows)
    return Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe-heuristic",
        params={"rule": rule.name},
        actions=rows,
        evaluation=ev,
        problem=problem,
    )
