"""Property: on random valid problems every generator here yields a schedule the simulator
accepts (memory-aware ones within the limit) or says why it does not apply."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import NotApplicable, generate

costs = st.floats(min_value=0.1, max_value=3.0)


@st.composite
def problems(draw: st.DrawFn, v_shape: bool, with_offload: bool) -> Problem:
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 12))
    v = 2 if v_shape else draw(st.integers(1, 3))

    def grid(values: st.SearchStrategy[float]) -> list[list[float]]:
        return [[draw(values) for _ in range(v)] for _ in range(p)]

    m_f = grid(st.floats(0.1, 2.0))
    frac = grid(st.floats(0.0, 1.0).map(lambda x: round(x, 6)))  # no byte count below 1e-9
    m_b = [[-f * x for f, x in zip(rf, rx, strict=True)] for rf, rx in zip(m_f, frac, strict=True)]
    m_w = [[-(f + b) for f, b in zip(rf, rb, strict=True)] for rf, rb in zip(m_f, m_b, strict=True)]
    one = max(max(r) for r in m_f)  # one activation: no limit below it can hold
    data: dict[str, object] = dict(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        placement="vshape" if v_shape else draw(st.sampled_from(["interleaved", "vshape"])),
        t_f=grid(costs),
        t_b=grid(costs),
        t_w=grid(st.one_of(st.just(0.0), costs)),
        t_comm=draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0).map(lambda x: round(x, 6)))),
        m_f=m_f,
        m_b=m_b,
        m_w=m_w,
    )
    if with_offload:
        data["placement"] = draw(st.sampled_from(["interleaved", "interleaved", "vshape"]))
        share = grid(st.floats(0.3, 1.0))
        groups = [[s, s + 1] for s in range(0, p - 1, 2)] if draw(st.booleans()) else []
        if draw(st.sampled_from([True, True, True, False])):  # mostly a limit, often tight
            data["memory_limit"] = draw(st.floats(0.9, 4.0)) * one
        if draw(st.sampled_from([True, True, True, False])):  # mostly copies allowed
            data["offload"] = {
                "bytes": [
                    [f * s for f, s in zip(rf, rs, strict=True)]
                    for rf, rs in zip(m_f, share, strict=True)
                ],
                "d2h_bandwidth": draw(st.floats(0.2, 5.0)),
                "h2d_bandwidth": draw(st.floats(0.2, 5.0)),
                "channel_groups": groups,
            }
    return Problem.model_validate(data)


def check(name: str, pb: Problem, memory_aware: bool) -> None:
    try:
        s = generate(name, pb)
    except NotApplicable as e:
        assert str(e)  # one-line reason
        assert "\n" not in str(e)
        return
    ev = s.evaluation
    assert ev is not None and s.problem_hash == pb.hash
    kinds = {v.kind for v in ev.violations}
    if memory_aware:
        assert ev.feasible, ev.violations[:2]
    else:
        assert kinds <= {"memory"}, ev.violations[:2]
        assert ev.makespan is not None


FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(problems(v_shape=True, with_offload=False))
def test_v_generators_accept_random_problems(pb: Problem) -> None:
    for name in ("zbv", "v-half", "v-min"):
        check(name, pb, memory_aware=False)


@FAST
@given(problems(v_shape=False, with_offload=True))
def test_pipeoffload_accepts_random_problems(pb: Problem) -> None:
    check("pipeoffload", pb, memory_aware=True)


@FAST
@given(problems(v_shape=False, with_offload=True))
def test_adaoffload_accepts_random_problems(pb: Problem) -> None:
    check("adaoffload", pb, memory_aware=True)
