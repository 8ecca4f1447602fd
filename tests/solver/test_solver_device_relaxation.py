"""``cpsat.solve_device_relaxation``: only the chosen devices' resources bind."""

from __future__ import annotations

import pytest

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import cpsat
from optpipe_lightning.solver.ticks import tick_model

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def _problem() -> Problem:
    # two stages, stage 0 held to one activation (a forward waits for the last backward to
    # end), stage 1 unconstrained in practice; copies slow enough not to help much
    return Problem(
        name="relaxation",
        num_stages=2,
        num_microbatches=4,
        num_chunks=1,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=[1.0, 100.0],
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / 6, "h2d_bandwidth": 1 / 6},
    )


def _relaxed(pb: Problem, devices: set[int]) -> int:
    tm = tick_model(pb, 100.0)
    out = cpsat.solve_device_relaxation(pb, tm, devices, horizon=200, hint=None, time_limit=30.0)
    assert out.status == "optimal" and out.objective is not None
    return out.objective


def _full(pb: Problem) -> int:
    tm = tick_model(pb, 100.0)
    out = cpsat.solve_cpsat(
        pb,
        tm,
        horizon=200,
        lower_bound=0,
        hint=None,
        time_limit=30.0,
        gap_target=0.0,
        seed=0,
        workers=1,
        on_solution=None,
        stop=None,
        tight=False,
    )
    assert out.status == "optimal" and out.objective is not None
    return out.objective


def test_only_the_chosen_devices_resources_bind() -> None:
    pb = _problem()
    full = _full(pb)
    assert _relaxed(pb, {0, 1}) == full  # every device's resources: the model itself
    stage0 = _relaxed(pb, {0})
    stage1 = _relaxed(pb, {1})
    assert stage0 <= full
    # without stage 0's limit (and its one op at a time) stage 0 runs every F at once: stage 1
    # starts after one F and then does its 4 x 3 ticks of work; stage 0's last B and W fit
    # beside stage 1's last W's
    assert stage1 < stage0
    assert stage1 == 1 + 12
