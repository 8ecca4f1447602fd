"""Every generator of this area on random valid problems: a valid schedule or NotApplicable."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import NotApplicable, generate
from optpipe_lightning.schedule.baselines.zb_auto import capped_1f1b_order

FIXED_RULE = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")  # memory-unaware
MEMORY_AWARE = ("zb-auto",)


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 12))
    v = draw(st.sampled_from([1, 1, 2, 3]))
    time = st.floats(0.05, 3.0)

    def grid(values: st.SearchStrategy[float]) -> list[list[float]]:
        return [[draw(values) for _ in range(v)] for _ in range(p)]

    m_f = grid(st.floats(0.5, 2.0))
    # part of m_f that B frees (negative: B allocates); rounded, so no byte count is a residue
    # below the format's smallest (1e-9)
    share = grid(st.floats(-0.3, 1.0).map(lambda x: round(x, 6)))
    m_b = [[-m_f[s][c] * share[s][c] for c in range(v)] for s in range(p)]
    m_w = [[-m_f[s][c] - m_b[s][c] for c in range(v)] for s in range(p)]
    limit = draw(
        st.one_of(
            st.none(),
            st.floats(0.5, 4.0 * p * v),
            st.lists(st.floats(0.5, 4.0 * p * v), min_size=p, max_size=p),
        )
    )
    return Problem(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement=draw(st.sampled_from(["interleaved", "vshape"])),
        t_f=grid(time),
        t_b=grid(time),
        t_w=grid(st.floats(0.0, 3.0).map(lambda x: round(x, 6))),  # 0 or >= 1e-6 s
        t_comm=draw(st.floats(0.0, 0.5).map(lambda x: round(x, 6))),
        m_f=m_f,
        m_b=m_b,
        m_w=m_w,
        memory_limit=limit,
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_generators_yield_valid_schedules_or_say_why(pb: Problem) -> None:
    for name in FIXED_RULE + MEMORY_AWARE:
        try:
            sched = generate(name, pb)
        except NotApplicable as e:
            assert str(e), name
            continue
        assert sched.problem_hash == pb.hash and sched.generator == name
        ev = sched.evaluation
        assert ev is not None
        kinds = {x.kind for x in ev.violations}
        if name in MEMORY_AWARE:
            assert ev.feasible, (name, [x.message for x in ev.violations])
            limits = pb.memory_limits()
            for peak, lim in zip(ev.peak_memory, limits, strict=True):
                assert lim is None or peak <= lim * (1 + 1e-9) + 1e-9
        else:
            assert kinds <= {"memory"}, (name, [x.message for x in ev.violations])
            assert ev.makespan is not None
        # the embedded evaluation is the simulator's
        assert simulate(pb, sched).evaluation == ev


@settings(max_examples=60, deadline=None)
@given(problems())
def test_zb_auto_fallback_order_is_valid(pb: Problem) -> None:
    if pb.num_chunks != 1:
        return
    mf, mb = pb.cost("m_f")[:, 0], pb.cost("m_b")[:, 0]
    if any(
        lim is not None and lim < max(mf[s], mf[s] + mb[s])
        for s, lim in enumerate(pb.memory_limits())
    ):
        return
    ev = simulate(pb, capped_1f1b_order(pb)).evaluation
    assert ev.feasible, [x.message for x in ev.violations]


def test_zb_auto_with_heterogeneous_memory_stays_feasible() -> None:
    # stage 0 has room for one microbatch only, the others for many
    pb = Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1,
        t_b=1,
        t_w=1,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=[1.0, 6.0, 6.0, 6.0],
    )
    ev = generate("zb-auto", pb).evaluation
    assert ev is not None and ev.feasible
    assert ev.peak_memory[0] == pytest.approx(1.0)


def test_zb_auto_falls_back_when_the_greedy_cannot_fit() -> None:
    # B allocates (m_b > 0): the greedy's warm-up leaves no room for a B at every knob setting
    pb = Problem(
        num_stages=2,
        num_microbatches=3,
        t_f=1,
        t_b=1,
        t_w=1,
        m_f=1.0,
        m_b=0.5,
        m_w=-1.5,
        memory_limit=3.0,
    )
    sched = generate("zb-auto", pb)
    ev = sched.evaluation
    assert ev is not None and ev.feasible
    assert sched.params["fallback"] is True
    assert max(ev.peak_memory) <= 3.0
