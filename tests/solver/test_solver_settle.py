"""CP-SAT's settle-point model (``solver/settle.py``): which ops may settle an offload, and that
the model accepts the simulator's own timing of every schedule the simulator accepts."""

from __future__ import annotations

import pytest
from bench_problems import bench_problem
from ortools.sat.python import cp_model

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import cpsat
from optpipe_lightning.solver.heuristics import heuristic_schedules
from optpipe_lightning.solver.hints import tick_times
from optpipe_lightning.solver.settle import first_settle, settle_candidates
from optpipe_lightning.solver.ticks import OpKey, TickModel, tick_model


def test_candidates_leave_out_what_the_order_places_before_the_forward_or_after_the_backward() -> (
    None
):
    # one stage, two chunks (groups 0 and 1 on stage 0), microbatches 0..3
    group = {(0, 0): 0, (0, 1): 1}
    keys: list[OpKey] = [
        (op, 0, c, j)
        for op in ("F", "B", "W", "OFFLOAD", "RELOAD")
        for c in (0, 1)
        for j in range(4)
    ]
    got = set(settle_candidates((0, 1, 1), keys, group, None))
    # before F(1, 1) ends: F of groups <= 1 for microbatches <= 1; after B(1, 1) starts: B and W
    # of groups <= 1 for microbatches >= 1; its own ops; no offload settles another
    assert ("F", 0, 0, 1) not in got and ("F", 0, 1, 0) not in got
    assert ("F", 0, 1, 2) in got and ("F", 0, 0, 2) in got
    assert ("B", 0, 1, 0) in got and ("W", 0, 0, 0) in got
    assert ("B", 0, 0, 1) not in got and ("W", 0, 1, 3) not in got
    assert not any(k[3] == 1 and k[2] == 1 for k in got)
    assert not any(k[0] == "OFFLOAD" for k in got)
    assert ("RELOAD", 0, 0, 3) in got and ("RELOAD", 0, 0, 0) in got
    # within 0 microbatches: group 0's F and B of microbatch 1 come before and after; its reload
    # may come between
    assert set(settle_candidates((0, 1, 1), keys, group, 0)) == {("RELOAD", 0, 0, 1)}
    near = settle_candidates((0, 1, 1), keys, group, 1)
    assert near and all(abs(k[3] - 1) <= 1 for k in near)


def test_first_settle_is_the_simulators_rule() -> None:
    # copy ends at 5: a compute op at 5 settles it (freed one tick on, after that instant's
    # allocations), a reload at or after 5 at its start; the own reload (at 9) otherwise
    starts: dict[OpKey, int] = {("F", 0, 0, 2): 4, ("B", 0, 0, 0): 5, ("RELOAD", 0, 0, 3): 7}
    cands = list(starts)
    assert first_settle((0, 0, 1), 5, 9, starts, cands) == (("B", 0, 0, 0), 6)
    assert first_settle((0, 0, 1), 6, 9, starts, cands) == (("RELOAD", 0, 0, 3), 7)
    assert first_settle((0, 0, 1), 8, 9, starts, cands) == (None, 9)


def _accepts(
    pb: Problem,
    tm: TickModel,
    tight: bool,
    starts: dict[OpKey, int],
    off: set[tuple[int, int, int]],
    horizon: int,
) -> bool:
    """The model (exact with ``tight``, else the relaxation) with every start fixed is feasible."""
    tm_model = cpsat._Model(pb, tm, horizon, 0, tight, None)
    md = tm_model.model
    for key, var in tm_model.start.items():
        if key[0] in ("OFFLOAD", "RELOAD") and key[1:] not in off:
            continue
        md.add(var == starts[key])
    for act, o in tm_model.offload.items():
        md.add(o == (act in off))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 10.0
    solver.parameters.expand_reservoir_constraints = False
    return solver.solve(md) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


@pytest.mark.parametrize(
    "pb",
    [
        pytest.param(bench_problem(4, 8, 1, 0.25, 0.5), id="4x8x1-quarter-copies-0.5x"),
        pytest.param(bench_problem(4, 8, 2, 0.25, 0.5), id="4x8x2-quarter-copies-0.5x"),
    ],
)
def test_the_model_accepts_every_timing_the_simulator_accepts(pb: Problem) -> None:
    """Each feasible list-rule schedule with offloads, fixed to the simulator's timing of it, is a
    solution of the relaxation and of the exact model, so the model loses no schedule the
    simulator accepts (with the old stand-in, an offload freed the stage's longest F after its
    copy, 30 of these problems' 31 such schedules were rejected)."""
    checked = 0
    for sched in heuristic_schedules(pb):
        ev = sched.evaluation
        if ev is None or not ev.feasible or ev.makespan is None:
            continue
        tm = tick_model(pb, ev.makespan)
        hint = tick_times(pb, sched, tm)
        assert hint is not None
        starts, off, horizon = hint
        if not off:
            continue
        assert _accepts(pb, tm, False, starts, off, horizon), sched.params
        assert _accepts(pb, tm, True, starts, off, horizon), sched.params
        checked += 1
    assert checked >= 2
