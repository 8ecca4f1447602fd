"""Fixed-rule baselines against their closed forms on uniform costs (and the ZB paper anchors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optpipe_lightning.schedule import Problem, Schedule, simulate
from optpipe_lightning.schedule.baselines import NotApplicable, generate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"
COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (3.0, 4.0, 2.0), (1.0, 1.2, 0.9)]


def uniform(p: int, m: int, f: float, b: float, w: float, c: float = 0.0, **kw: object) -> Problem:
    return Problem(num_stages=p, num_microbatches=m, t_f=f, t_b=b, t_w=w, t_comm=c, **kw)


def largest_span(pb: Problem, sched: Schedule) -> float:
    """max over stages of (end of last op - start of first F), from the simulator's timeline."""
    tl = simulate(pb, sched).timeline
    assert tl is not None
    spans = []
    for s in range(pb.num_stages):
        rows = tl.compute_rows(s)
        first_f = min(st for a, st, _ in rows if a.op == "F")
        spans.append(max(en for _, _, en in rows) - first_f)
    return max(spans)


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 2), (4, 4), (4, 9), (6, 13)])
def test_1f1b_and_gpipe_bubble_and_peak(p: int, m: int, f: float, b: float, w: float) -> None:
    pb = uniform(p, m, f, b, w)
    t = f + b + w
    ev = generate("1f1b", pb).evaluation
    assert ev is not None and ev.feasible
    assert ev.makespan == pytest.approx((m + p - 1) * t)
    assert ev.peak_memory == pytest.approx([min(p - s, m) for s in range(p)])
    gp = generate("gpipe", pb).evaluation
    assert gp is not None and gp.feasible
    assert gp.makespan == pytest.approx((m + p - 1) * t)
    assert gp.peak_memory == pytest.approx([float(m)] * p)


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("p,m", [(2, 2), (3, 4), (4, 8), (5, 11), (6, 18)])
def test_zb_h1_bubble_and_peak(p: int, m: int, f: float, b: float, w: float) -> None:
    pb = uniform(p, m, f, b, w)
    ev = generate("zb-h1", pb).evaluation
    assert ev is not None and ev.feasible
    assert ev.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))
    assert max(ev.peak_memory) == pytest.approx(p)  # 1F1B's memory


@pytest.mark.parametrize("p,m", [(2, 3), (3, 4), (4, 9), (6, 13)])
def test_zb_h1_with_comm(p: int, m: int) -> None:
    # the notes' "(p-1)(F+B-W+4c)", which the paper's 1.5B anchor (.1585) is consistent with
    f, b, w, c = 1.0, 1.2, 0.9, 0.1
    ev = generate("zb-h1", uniform(p, m, f, b, w, c)).evaluation
    assert ev is not None
    assert ev.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w + 4 * c))


@pytest.mark.parametrize("f,b,w", COSTS)
@pytest.mark.parametrize("c", [0.0, 0.1])
@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (5, 15), (6, 12)])
def test_zb_h2_stage_span_bubble_and_peak(
    p: int, m: int, c: float, f: float, b: float, w: float
) -> None:
    pb = uniform(p, m, f, b, w, c)
    sched = generate("zb-h2", pb)
    ev = sched.evaluation
    assert ev is not None and ev.feasible
    work = m * (f + b + w)
    assert largest_span(pb, sched) - work == pytest.approx((p - 1) * (f + b - 2 * w + 2 * c))
    assert max(ev.peak_memory) == pytest.approx(2 * p - 1)


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8), (4, 12), (5, 5)])
def test_interleaved_1f1b_bubble_is_one_vth(p: int, m: int, v: int) -> None:
    f, b, w = 1.0, 1.5, 0.5  # per chunk
    pb = Problem(num_stages=p, num_microbatches=m, num_chunks=v, t_f=f, t_b=b, t_w=w)
    ev = generate("interleaved-1f1b", pb).evaluation
    assert ev is not None and ev.feasible and ev.makespan is not None
    work = m * v * (f + b + w)
    assert ev.makespan - work == pytest.approx((p - 1) * (f + b + w))
    # the same layers in one chunk per stage: 1F1B's bubble is v times larger
    one = generate("1f1b", uniform(p, m, v * f, v * b, v * w)).evaluation
    assert one is not None and one.makespan is not None
    assert (one.makespan - work) == pytest.approx(v * (ev.makespan - work))
    # peak in chunk units on stage 0: p*v + p - 1 (capped by all m*v chunks)
    assert ev.peak_memory[0] == pytest.approx(min(p * v + p - 1, m * v))


def test_interleaved_not_divisible_keeps_megatron_order_or_says_why() -> None:
    pb = Problem(num_stages=4, num_microbatches=6, num_chunks=2, t_f=1, t_b=1, t_w=1)
    ev = generate("interleaved-1f1b", pb).evaluation
    assert ev is not None and ev.feasible and ev.makespan is not None
    assert ev.makespan > 6 * 2 * 3 + 3 * 3 - 1e-9  # never better than the divisible closed form
    bad = Problem(num_stages=5, num_microbatches=7, num_chunks=2, t_f=1, t_b=1, t_w=1)
    with pytest.raises(NotApplicable, match="deadlocks"):
        generate("interleaved-1f1b", bad)


@pytest.mark.parametrize(
    "name,problem,match",
    [
        ("1f1b", dict(num_chunks=2), "num_chunks=2"),
        ("zb-h1", dict(num_chunks=2, placement="vshape"), "num_chunks=2"),
        ("zb-h2", dict(num_chunks=3), "num_chunks=3"),
        ("zb-auto", dict(num_chunks=2), "num_chunks=2"),
        ("interleaved-1f1b", dict(num_chunks=1), "num_chunks >= 2"),
        ("interleaved-1f1b", dict(num_chunks=2, placement="vshape"), "vshape"),
        ("interleaved-1f1b", dict(num_chunks=2, num_microbatches=3), "m=3 < p=4"),
        ("zb-auto", dict(memory_limit=0.9), "below one microbatch"),
    ],
)
def test_not_applicable_says_why(name: str, problem: dict[str, object], match: str) -> None:
    args: dict[str, object] = dict(num_stages=4, num_microbatches=8, t_f=1, t_b=1, t_w=1)
    args.update(problem)
    with pytest.raises(NotApplicable, match=match):
        generate(name, Problem.model_validate(args))


def test_gpipe_runs_chunks_in_group_order() -> None:
    pb = Problem(
        num_stages=3, num_microbatches=4, num_chunks=2, placement="vshape", t_f=1, t_b=2, t_w=1
    )
    ev = generate("gpipe", pb).evaluation
    assert ev is not None and ev.feasible
    assert ev.peak_memory == pytest.approx([8.0] * 3)  # every microbatch of both chunks


# ---- zb-auto -----------------------------------------------------------------------------


@pytest.mark.parametrize("p,m", [(2, 5), (4, 8), (5, 12)])
@pytest.mark.parametrize("units", [1.0, 1.5, 2.0, 3.0, 4.5])
def test_zb_auto_keeps_any_limit(p: int, m: int, units: float) -> None:
    pb = uniform(p, m, 1.0, 1.3, 0.8, 0.05, m_f=2.0, m_b=-1.2, m_w=-0.8, memory_limit=2.0 * units)
    ev = generate("zb-auto", pb).evaluation
    assert ev is not None and ev.feasible
    assert max(ev.peak_memory) <= 2.0 * units + 1e-9


@pytest.mark.parametrize("p,m", [(3, 6), (4, 12), (6, 18)])
def test_zb_auto_unlimited_is_at_least_as_good_as_zb_h2(p: int, m: int) -> None:
    pb = uniform(p, m, 1.0, 1.0, 0.5)
    auto = generate("zb-auto", pb).evaluation
    h2 = generate("zb-h2", pb).evaluation
    assert auto is not None and h2 is not None and auto.makespan and h2.makespan
    assert auto.makespan <= h2.makespan + 1e-9
    big = generate("zb-auto", pb.with_changes(memory_limit=1e9)).evaluation
    assert big is not None and big.makespan == pytest.approx(auto.makespan)


def test_zb_auto_at_p_microbatches_equals_zb_h1_on_unit_costs() -> None:
    pb = uniform(4, 12, 1.0, 1.0, 1.0, memory_limit=4.0)
    auto = generate("zb-auto", pb).evaluation
    assert auto is not None and auto.feasible
    assert auto.makespan == pytest.approx(12 * 3 + 3 * 1)  # (p-1)(F+B-W)


# ---- the Zero Bubble paper's anchors (stage-span metric, comm on every hop) ----------------


@pytest.mark.parametrize(
    "fname,units,expected",
    [
        (
            "zb-1.5b-p8-m24.json",
            2,
            {"1f1b": 0.2431, "zb-h1": 0.1585, "zb-h2": 0.1083, "zb-auto": 0.0433},
        ),
        ("zb-1.5b-p8-m24.json", 1, {"zb-auto": 0.1585}),
        ("zb-14.6b-p16-m48.json", 2, {"1f1b": 0.2552, "zb-h2": 0.0672, "zb-auto": 0.0066}),
        ("zb-14.6b-p16-m48.json", 1, {"zb-h1": 0.1397, "zb-auto": 0.1397}),
    ],
)
def test_paper_stage_span_bubble_rates(fname: str, units: int, expected: dict[str, float]) -> None:
    pb = Problem.model_validate_json((EXAMPLES / fname).read_text())
    pb = pb.with_changes(memory_limit=units * pb.num_stages * pb.activation_unit())
    for name, rate in expected.items():
        ev = generate(name, pb).evaluation
        assert ev is not None and ev.stage_span_bubble_rate is not None
        assert round(ev.stage_span_bubble_rate, 4) == rate, name
        if name == "zb-auto":
            assert ev.feasible
