"""Limits below what any schedule can fit give one clear error naming the smallest limit."""

from __future__ import annotations

import pytest
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import InfeasibleMemoryLimit, memory_need_lower_bound, solve

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def _pb(v: int, limit: float, offload: bool, bytes_: float = 1.0) -> Problem:
    return Problem(
        num_stages=2,
        num_microbatches=3,
        num_chunks=v,
        placement="vshape",
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=limit,
        offload={"bytes": bytes_, "d2h_bandwidth": 4.0, "h2d_bandwidth": 4.0} if offload else None,
    )


@pytest.mark.parametrize(
    "v,offload,bytes_,smallest",
    [
        (1, False, 1.0, 1.0),  # one activation at a time
        (1, True, 1.0, 1.0),  # offload cannot go below the activation being made
        (2, False, 1.0, 2.0),  # chunk 0's activation stays while chunk 1 runs
        (2, True, 1.0, 1.0),  # ... unless it is offloaded
        (2, True, 0.25, 1.75),  # only a quarter can move
    ],
)
def test_below_the_smallest_feasible_limit(
    v: int, offload: bool, bytes_: float, smallest: float
) -> None:
    pb = _pb(v, smallest * 0.9, offload, bytes_)
    with pytest.raises(InfeasibleMemoryLimit) as info:
        solve(pb, time_limit=5, workers=1)
    assert info.value.smallest_feasible_limit == pytest.approx(smallest)
    msg = str(info.value)
    assert f"smallest feasible memory_limit is {smallest:g}" in msg
    assert "\n" not in msg
    assert max(memory_need_lower_bound(pb)) == pytest.approx(smallest)
    # exactly at the limit it solves, within the limit
    ok = solve(
        _pb(v, smallest, offload, bytes_),
        time_limit=UNBOUNDED_SECONDS,
        workers=1,
        deterministic_time=1.0,
    )
    ev = ok.schedule.evaluation
    assert ev is not None and ev.feasible
    assert max(ev.peak_memory) <= smallest + 1e-9


def test_error_is_a_value_error_for_the_cli() -> None:
    with pytest.raises(ValueError, match=r"memory_limit 0\.5 on stage 0 is below"):
        solve(_pb(1, 0.5, False), time_limit=1)
