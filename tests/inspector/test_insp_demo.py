"""The demo list scheduler the inspector's tests and benchmark draw: valid on many shapes."""

from __future__ import annotations

import pytest

from optpipe_lightning.inspector.demo import (
    demo_problem,
    fitted_problem,
    greedy_actions,
    greedy_schedule,
)
from optpipe_lightning.schedule import evaluate


@pytest.mark.parametrize(
    ("p", "m", "v", "every"),
    [(1, 3, 1, 0), (2, 5, 1, 2), (4, 8, 2, 3), (3, 6, 3, 1), (8, 16, 2, 2)],
)
def test_greedy_schedules_are_valid(p: int, m: int, v: int, every: int) -> None:
    pb = demo_problem(p, m, v)
    sc = greedy_schedule(pb, offload_every=every)
    ev = sc.evaluation
    assert ev is not None and ev.feasible, [x.message for x in ev.violations]
    assert sum(len(r) for r in sc.actions) == p * m * v * 3 + (
        2 * p * v * len(range(0, m, every)) if every else 0
    )
    work = (pb.cost("t_f") + pb.cost("t_b") + pb.cost("t_w")).sum(axis=1).max() * m
    assert ev.makespan is not None and ev.makespan >= work - 1e-12


def test_fitted_problem_limit() -> None:
    pb = demo_problem(4, 8, 1)
    acts = greedy_actions(pb)
    fitted = fitted_problem(pb, acts, headroom=1.25)
    peak = max(evaluate(pb, acts).peak_memory)
    assert fitted.memory_limits() == [pytest.approx(1.25 * peak)] * 4
    assert evaluate(fitted, acts).feasible
