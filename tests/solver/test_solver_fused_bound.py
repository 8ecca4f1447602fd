"""The exact backends model every backward as B then W: where a fused BW is cheaper, their bound
and "optimal" hold for split schedules only, and ``solve`` must not report them."""

from __future__ import annotations

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.solver import lower_bound, solve
from optpipe_lightning.solver.solve import backend_bounds_hold
from optpipe_lightning.solver.ticks import tick_model


def _fused_cheaper(t_bw: float = 1.2) -> Problem:
    return Problem(
        name="fused cheaper",
        num_stages=4,
        num_microbatches=8,
        num_chunks=1,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        t_bw=t_bw,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
    )


def test_a_split_only_search_claims_no_proof_where_fused_is_cheaper() -> None:
    pb = _fused_cheaper()
    # without the baselines, every schedule found runs B then W; GPipe with fused backwards
    # (F + BW = 2.2 per microbatch and stage, against 3 split) is faster than all of them
    res = solve(pb, backend="cpsat", time_limit=5.0, workers=1, seed=0, use_baselines=False)
    fused = simulate(pb, generate("gpipe", pb))
    assert fused.feasible and fused.makespan is not None
    assert fused.makespan < res.makespan - 1e-9
    assert res.status != "optimal"
    assert res.lower_bound <= fused.makespan + 1e-9
    assert res.lower_bound == lower_bound(pb)  # the cheap arguments, which cover fused ops


def test_backend_bounds_hold_only_without_a_cheaper_fused_backward() -> None:
    tm = tick_model(_fused_cheaper(), 100.0)
    assert tm.exact
    assert not backend_bounds_hold(_fused_cheaper(), tm)
    assert backend_bounds_hold(_fused_cheaper(t_bw=2.0), tm)  # BW = B + W: fused never pays
    assert backend_bounds_hold(_fused_cheaper(t_bw=2.5), tm)
