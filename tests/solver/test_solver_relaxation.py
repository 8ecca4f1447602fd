"""The one-device relaxation bound is valid (never above a feasible makespan) and can beat the
cheap bounds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_strategies import problems, random_valid_actions
from test_solver_bruteforce import _problem, exhaustive_optimum

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.solver.relaxation import applicable, relaxation_bound


@pytest.mark.parametrize(
    "p,m,limit,offload,bandwidth",
    [
        (2, 2, 2.0, False, 4.0),
        (2, 2, 2.0, True, 4.0),
        (2, 2, 2.0, True, 1.0),
        (3, 2, 2.0, False, 4.0),
    ],
)
def test_never_above_the_exhaustive_optimum(
    p: int, m: int, limit: float, offload: bool, bandwidth: float
) -> None:
    pb = _problem(p, m, t_w=0.0, limit=limit, offload=offload, bandwidth=bandwidth)
    best = exhaustive_optimum(pb, True)
    rb = relaxation_bound(pb, best, time_limit=5.0, seed=0)
    assert rb is not None
    assert rb.value <= best + 1e-9


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pb=problems(max_stages=3, max_mb=4, limit=True), seed=st.integers(0, 10**6))
def test_never_above_any_feasible_schedule(pb: Problem, seed: int) -> None:
    ev = simulate(pb, random_valid_actions(pb, seed)).evaluation
    if not ev.feasible or ev.makespan is None or not applicable(pb):
        return
    rb = relaxation_bound(pb, ev.makespan, time_limit=1.0, seed=0)
    assert rb is not None
    assert rb.value <= ev.makespan * (1 + 1e-9) + 1e-9


def test_tighter_than_the_cheap_bound_where_copies_are_slow() -> None:
    # 4 stages x 8 microbatches, half of 1F1B's activation memory, copies 2x a microbatch's
    # compute: the cheap bound says 30, the relaxation of device 0 proves 39 (the best known
    # schedule takes 41)
    pb = Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=2.0,
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / 6, "h2d_bandwidth": 1 / 6},
    )
    assert lower_bound(pb) == pytest.approx(30.0)
    rb = relaxation_bound(pb, 41.0, time_limit=20.0, devices=[0], seed=0)
    assert rb is not None and rb.proved
    assert rb.value == pytest.approx(39.0)


def test_not_applicable_without_a_memory_limit() -> None:
    pb = _problem(2, 2, t_w=0.0, limit=None, offload=False)
    assert not applicable(pb)
    assert relaxation_bound(pb, 10.0, time_limit=1.0) is None
