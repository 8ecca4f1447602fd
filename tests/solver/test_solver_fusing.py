"""Fusing adjacent B, W pairs where a fused backward is cheaper (``solver/fusing.py``)."""

from __future__ import annotations

import pytest
from bench_problems import fused_problem
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Action, Problem, Schedule, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.fusing import fuse_adjacent, fuse_where_faster

_problem = fused_problem


def _split_1f1b(pb: Problem) -> Schedule:
    """1F1B with every fused backward split into B then W (each pair adjacent)."""
    rows = [
        [x for a in row for x in ([Action("B", a.mb), Action("W", a.mb)] if a.op == "BW" else [a])]
        for row in generate("1f1b", pb).actions
    ]
    return Schedule.built(problem_hash=pb.hash, generator="test", actions=rows, problem=pb)


def test_fuse_adjacent_fuses_only_a_b_right_before_its_own_w_on_the_stages_named() -> None:
    pb = _problem(1.5)
    first = ["F0", "F1", "B0", "W0", "B1", "F2", "W1"]
    rows = [
        [Action(x[:-1], int(x[-1])) for x in first],
        [Action("F", 0), Action("B", 0), Action("W", 0)],
        [],
        [],
    ]
    out = fuse_adjacent(pb, rows, {0})
    fused = ["F0", "F1", "BW0", "B1", "F2", "W1"]
    assert out[0] == [Action(x[:-1], int(x[-1])) for x in fused]
    assert out[1] == rows[1]  # stage 1 not named
    assert fuse_adjacent(_problem(2.0), rows, {0, 1}) == rows  # BW = B + W: nothing to gain


def test_fusing_a_split_schedule_where_bw_is_cheaper_makes_it_faster() -> None:
    pb = _problem(1.5)
    split = _split_1f1b(pb)
    before = simulate(pb, split).makespan
    fused = fuse_where_faster(pb, split)
    assert fused is not None
    res = simulate(pb, fused)
    assert res.feasible and before is not None and res.makespan is not None
    # every pair fused: 1F1B with BW, (m + p - 1) * (F + BW) = 11 * 2.5, against 30 split
    assert res.makespan == pytest.approx(27.5) and before == pytest.approx(30.0)
    assert fused.evaluation is not None and fused.evaluation.makespan == res.makespan


def test_fusing_is_kept_only_where_it_is_faster() -> None:
    # BW 1.9 lasts nearly B + W: fusing delays each B's hand-on down the pipeline by 0.9 s
    pb = _problem(1.9)
    split = _split_1f1b(pb)
    before = simulate(pb, split).makespan
    fused = fuse_where_faster(pb, split)
    if fused is not None:
        after = simulate(pb, fused).makespan
        assert before is not None and after is not None and after < before
    assert fuse_where_faster(_problem(2.0), split) is None  # nothing can gain


def test_solve_offers_the_fused_schedule() -> None:
    """With the backend off, the list rules build split schedules only; at three activations of
    memory the best (greedy, 31) keeps each W next to its B, and fusing them gives 30.2."""
    pb = _problem(1.2).with_changes(memory_limit=3.0)
    res = solve(pb, backend="heuristic", time_limit=UNBOUNDED_SECONDS, use_baselines=False)
    assert res.makespan == pytest.approx(30.2)
    assert res.schedule.params["source"] == "fused:heuristic:greedy"
    assert any(a.op == "BW" for row in res.schedule.actions for a in row)
    ev = simulate(pb, res.schedule).evaluation
    assert ev.feasible and ev.makespan == pytest.approx(res.makespan)
