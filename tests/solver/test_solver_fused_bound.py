"""Fused or split backward, per backward: where a fused BW is cheaper than B then W, CP-SAT's
model chooses for each one (so its bound and "optimal" hold for every schedule); the MILPs run
every backward as B then W, so there ``solve`` does not report their bound."""

from __future__ import annotations

import pytest
from bench_problems import fused_problem
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.solver import lower_bound, solve
from optpipe_lightning.solver.solve import backend_bounds_hold
from optpipe_lightning.solver.ticks import fusable, tick_model

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def _fused_cheaper(t_bw: float = 1.2, limit: float | None = None) -> Problem:
    return fused_problem(t_bw, limit)


def _ops(res_actions: list[list[object]]) -> set[str]:
    return {a.op for row in res_actions for a in row}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "t_bw,limit,expected",
    [
        # every schedule split: 27 (ZB); every one fused: GPipe 24.2. Mixed: 23.2
        (1.2, None, 23.2),
        # split 27, fused 28.6 (GPipe, 1F1B): mixed 25.4
        (1.6, None, 25.4),
        # three activations: split 31 (GPipe does not fit); mixed 29
        (1.6, 3.0, 29.0),
    ],
)
def test_cpsat_mixes_fused_and_split_backwards_and_proves_it(
    t_bw: float, limit: float | None, expected: float
) -> None:
    pb = _fused_cheaper(t_bw, limit)
    res = solve(
        pb,
        backend="cpsat",
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=30.0,
        workers=1,
        seed=0,
        use_baselines=False,
    )
    assert res.status == "optimal"
    assert res.makespan == pytest.approx(expected, abs=1e-9)
    assert _ops(res.schedule.actions) >= {"B", "W", "BW"}  # both kinds in one schedule
    ev = simulate(pb, res.schedule).evaluation
    assert ev.feasible and ev.makespan == pytest.approx(res.makespan, abs=1e-12)
    assert lower_bound(pb) <= res.makespan + 1e-9
    for name in ("gpipe", "1f1b"):
        base = simulate(pb, generate(name, pb))
        if base.feasible:
            assert base.makespan is not None and res.makespan <= base.makespan + 1e-9


def test_where_fusing_cannot_pay_nothing_is_fused() -> None:
    pb = _fused_cheaper(t_bw=2.0)  # BW = B + W
    assert not fusable(pb)
    res = solve(
        pb,
        backend="cpsat",
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=10.0,
        workers=1,
        seed=0,
        use_baselines=False,
    )
    assert res.status == "optimal" and res.makespan == pytest.approx(27.0)
    assert "BW" not in _ops(res.schedule.actions)


def test_backend_bounds_hold_for_cpsat_and_for_the_milps_only_without_a_cheaper_fused_one() -> None:
    tm = tick_model(_fused_cheaper(), 100.0)
    assert tm.exact and tm.t_bw == [[6]] * 4  # BW 1.2 s at a tick of 0.2 s
    assert backend_bounds_hold(_fused_cheaper(), tm, "cpsat")
    for milp in ("highs", "gurobi"):
        assert not backend_bounds_hold(_fused_cheaper(), tm, milp)
        assert backend_bounds_hold(_fused_cheaper(t_bw=2.0), tm, milp)  # fusing never pays
        assert backend_bounds_hold(_fused_cheaper(t_bw=2.5), tm, milp)
