"""Each incumbent the callback receives carries its schedule, checked by the simulator."""

from __future__ import annotations

import pytest
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.solver import Incumbent, solve

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def test_callback_incumbents_carry_their_schedules() -> None:
    pb = Problem(
        num_stages=3,
        num_microbatches=4,
        t_f=1,
        t_b=1,
        t_w=1,
        memory_limit=2,
        offload={"bytes": 1, "d2h_bandwidth": 2, "h2d_bandwidth": 2},
    )
    seen: list[Incumbent] = []
    res = solve(
        pb,
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=1.0,
        seed=0,
        workers=1,
        on_incumbent=seen.append,
    )
    assert seen, "no incumbent reported"
    spans = [inc.makespan for inc in seen]
    assert spans == sorted(spans, reverse=True)  # only improvements are reported
    for inc in seen:
        assert inc.schedule is not None
        ev = simulate(pb, inc.schedule).evaluation
        assert ev.feasible and ev.makespan == pytest.approx(inc.makespan)
    assert seen[-1].makespan == pytest.approx(res.makespan)
    assert all(inc.schedule is None for inc in res.incumbents)  # the result keeps numbers only


def test_bound_stays_valid_when_the_fused_backward_is_cheaper() -> None:
    from optpipe_lightning.schedule.baselines import generate

    # split B + W costs 2, a fused BW costs 1: 1F1B (fused) makes 10; B + W pricing would claim 12
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1.5, t_w=0.5, t_bw=1.0)
    fused = generate("1f1b", pb).evaluation
    assert fused is not None and fused.makespan == pytest.approx(10.0)
    res = solve(pb, time_limit=UNBOUNDED_SECONDS, deterministic_time=1.0, seed=0, workers=1)
    assert res.lower_bound <= fused.makespan + 1e-9
    assert res.makespan <= fused.makespan + 1e-9
