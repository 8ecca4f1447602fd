"""PipeOffload as published: GIS / grouped GIS orders, the copy grid, the family sweep.

Unit costs (F = B = W = 1, no comm) and one chunk unit of activation per F freed by its W
(m_f = 1, m_b = 0, m_w = -1), so peaks read in chunk units, unless a test says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optpipe_lightning.schedule import Action, Problem, simulate
from optpipe_lightning.schedule.baselines import NotApplicable, generate
from optpipe_lightning.schedule.baselines._gis_order import (
    gis_order,
    group_sizes,
    min_group_size,
    planning_times,
)
from optpipe_lightning.schedule.baselines._offload_grid import GridError, place_copies
from optpipe_lightning.schedule.baselines.pipeoffload import Member, member_orders

FIXTURE = Path(__file__).parent / "data" / "pipeoffload_published_orders.json"
FAST = {"bytes": 1, "d2h_bandwidth": 2, "h2d_bandwidth": 2}  # a copy takes 0.5, F takes 1
SLOW = {"bytes": 1, "d2h_bandwidth": 0.01, "h2d_bandwidth": 0.01}  # no copy can hide


def unit(
    p: int, m: int, v: int = 1, f: object = 1, b: object = 1, w: object = 1, **kw: object
) -> Problem:
    data: dict[str, object] = dict(
        num_stages=p,
        num_microbatches=m,
        num_chunks=v,
        t_f=f,
        t_b=b,
        t_w=w,
        m_f=1,
        m_b=0,
        m_w=-1,
        offload=FAST,
    )
    data.update(kw)
    return Problem.model_validate(data)


def idle(pb: Problem, rows: list[list[Action]]) -> tuple[float, float]:
    """(bubble per device = makespan - one device's work, peak in chunk units)."""
    ev = simulate(pb, rows).evaluation
    assert ev.makespan is not None and ev.feasible
    per_device = float((pb.cost("t_f") + pb.cost("t_b") + pb.cost("t_w"))[0].sum())
    return ev.makespan - pb.num_microbatches * per_device, max(ev.peak_memory)


# ---- the paper's figures (d = 8, v = 4, m = 32, unit costs) ------------------------------------


def test_gis_and_gis_h_paper_anchors() -> None:
    pb = unit(8, 32, 4)
    gis = simulate(pb, gis_order(pb, 8)).evaluation
    gis_h = simulate(pb, gis_order(pb, 4)).evaluation
    # bubble rate 1 - work / (p * makespan); every stage is busy from its first F to the end
    # of the iteration, so the stage-span rate is the same number here
    assert round(gis.bubble_rate or 0, 4) == 0.0352 and max(gis.peak_memory) == 32
    assert round(gis.stage_span_bubble_rate or 0, 4) == 0.0352
    assert round(gis_h.bubble_rate or 0, 4) == 0.0634 and max(gis_h.peak_memory) == 20
    assert round(gis_h.stage_span_bubble_rate or 0, 4) == 0.0634
    assert gis.makespan == 384 + 14 and gis_h.makespan == 384 + 26  # 14 and 26 units of bubble


@pytest.mark.parametrize("p,v", [(8, 4), (6, 3), (4, 2), (5, 2)])
def test_grouped_gis_closed_forms_at_unit_costs(p: int, v: int) -> None:
    # (p-1)(F+B) + (p-g)(v-1)(F+B-W) of bubble, g(v-1) + p chunk units, g in [ceil(p/2), p]
    for g in range((p + 1) // 2, p + 1):
        pb = unit(p, 3 * g, v)
        assert idle(pb, gis_order(pb, g)) == ((p - 1) * 2 + (p - g) * (v - 1), g * (v - 1) + p)


@pytest.mark.parametrize("f,b,w", [(1, 2, 1), (2, 3, 1), (1.5, 2, 1)])
def test_grouped_gis_closed_forms_at_unequal_costs(f: float, b: float, w: float) -> None:
    p, v = 8, 4
    for g in range(p // 2, p + 1):
        pb = unit(p, 4 * g, v, f, b, w)
        bubble, peak = idle(pb, gis_order(pb, g))
        form = (p - 1) * (f + b) + (p - g) * (v - 1) * (f + b - w)
        assert peak == g * (v - 1) + p
        if g in (p, p // 2):  # GIS and GIS-H: the paper's form exactly
            assert bubble == pytest.approx(form)
        else:  # between them the form is an upper bound
            assert bubble <= form + 1e-9


def test_published_warmup_then_backward_weight_forward() -> None:
    p, m, v, g = 6, 12, 3, 4
    pb = unit(p, m, v)
    for d, row in enumerate(gis_order(pb, g)):
        warm = next(i for i, a in enumerate(row) if a.op == "B")
        assert warm == g * (v - 1) + p - d
        steady = [a.op for a in row[warm : warm + 3 * 6]]
        assert steady == ["B", "W", "F"] * 6
    # the uniform order (g = 1) at d = 8, v = 4: a microbatch's chunks spread over the block
    # (as the published generator prints it)
    pb = unit(8, 32, 4)
    fwd = [str(a) for a in gis_order(pb, 1)[0] if a.op == "F"][:10]
    assert fwd == ["F0", "F1", "F0.1", "F2", "F1.1", "F0.2", "F3", "F2.1", "F1.2", "F0.3"]


def test_min_group_size_grows_when_forwards_outweigh_a_slot() -> None:
    assert min_group_size(unit(8, 16, 2)) == 4
    # F + B + W = 5.1 per slot must cover max(sum F, sum B) = 8 * 4 over the group
    assert min_group_size(unit(8, 16, 2, 1, 4, 0.1)) == 7
    assert group_sizes(unit(8, 16, 2)) == [8, 7, 6, 5, 4, 1]
    assert group_sizes(unit(8, 16, 1)) == [8]


# ---- the authors' own orders ------------------------------------------------------------------


def test_orders_are_the_published_ones() -> None:
    # made by the authors' generator (benchmarks/bench_peer.py --write-fixture, their passes
    # group_interleaved_1f1b + add_time + add_offload), partial groups and the uniform order
    # included
    cases = json.loads(FIXTURE.read_text())
    assert len(cases) >= 12
    for case in cases:
        pb = Problem.model_validate(case["problem"])
        ours = member_orders(pb, Member(case["group_size"], case["offload_chunks"], "lazy"))
        assert [" ".join(map(str, r)) for r in ours] == case["orders"], (
            case["group_size"],
            case["offload_chunks"],
        )


def test_selective_offload_matches_the_reference_simulation() -> None:
    # PipeOffload's reference sim, d = 8, v = 4, 2 chunks offloaded: GIS-H peak 20 -> 10,
    # uniform 23 -> 8; offload never slows these (copies of 0.5 hide)
    pb = unit(8, 32, 4)
    for g, before, after, makespan in ((4, 20, 10, 410), (1, 23, 8, 425)):
        assert max(simulate(pb, gis_order(pb, g)).evaluation.peak_memory) == before
        ev = simulate(pb, member_orders(pb, Member(g, 2, "lazy"))).evaluation
        assert max(ev.peak_memory) == after and ev.makespan == makespan
        assert ev.num_offloaded == 2 * 32 * 8


def test_lazy_rule_skips_short_windows_the_fit_rule_does_not() -> None:
    pb = unit(4, 8, 1, offload={"bytes": 1, "d2h_bandwidth": 1, "h2d_bandwidth": 1})
    plan = planning_times(pb, 4)
    assert plan is not None
    _rows, lazy = place_copies(pb, plan, 1, "lazy")
    rows, fit = place_copies(pb, plan, 1, "fit")
    assert set(lazy) < set(fit)  # a round trip of 2 needs a window above 6 under "lazy"
    for s, mb, c in fit:  # every copy still out before its reload, back before its B
        res = simulate(pb, rows)
        assert res.timeline is not None
        t = {a: (st, en) for a, st, en in res.timeline.transfer_rows(s)}
        comp = {a: (st, en) for a, st, en in res.timeline.compute_rows(s)}
        assert t[Action("OFFLOAD", mb, c)][1] <= t[Action("RELOAD", mb, c)][0]
        assert t[Action("RELOAD", mb, c)][1] <= comp[Action("B", mb, c)][0]


def test_lazy_rule_fails_where_the_published_pass_asserts() -> None:
    pb = unit(6, 12, 2, offload={"bytes": 1, "d2h_bandwidth": 1, "h2d_bandwidth": 1})
    plan = planning_times(pb, 6)
    assert plan is not None
    with pytest.raises(GridError, match="fewer offloaded chunks"):
        place_copies(pb, plan, 2, "lazy")
    rows, fit = place_copies(pb, plan, 2, "fit")
    ev = simulate(pb, rows).evaluation
    # the rule of issue #70 fitted 4 units when an offload's bytes left at its copy's end; at
    # its settle point (issue 34) one stage holds a fifth while a copy finishes
    assert fit and max(ev.peak_memory) == 5


def test_fit_rule_plans_on_the_timeline_that_runs() -> None:
    # the published planning postpones the warm-up forwards (F1 at 1.2, F3 at 5.6 here); they
    # run as soon as they can, and so do the reloads listed for the postponed timeline: the
    # lazy (published) member misses the limit, the fit member keeps it
    f = [1.0 + 0.1 * s for s in range(4)]
    b = [1.3 - 0.1 * s for s in range(4)]
    w = [0.7 + 0.03 * s for s in range(4)]
    pb = unit(4, 8, 1, f, b, w, t_comm=0.05, m_b=-0.6, m_w=-0.4, memory_limit=2.5)
    lazy = simulate(pb, member_orders(pb, Member(4, 1, "lazy"))).evaluation
    fit = simulate(pb, member_orders(pb, Member(4, 1, "fit"))).evaluation
    assert max(lazy.peak_memory) == 3 and not lazy.feasible
    assert fit.feasible and fit.makespan == simulate(pb, gis_order(pb, 4)).makespan
    assert generate("pipeoffload", pb).params["rule"] == "fit"


# ---- the family sweep -------------------------------------------------------------------------


def test_pipeoffload_is_gis_when_memory_is_free() -> None:
    s = generate("pipeoffload", unit(8, 32, 4))
    assert s.params["group_size"] == 8 and s.params["offload_chunks"] == 0
    assert s.evaluation is not None and s.evaluation.makespan == 398


def test_pipeoffload_falls_back_to_gis_h_when_copies_cannot_hide() -> None:
    s = generate("pipeoffload", unit(8, 32, 4, memory_limit=20, offload=SLOW))
    ev = s.evaluation
    assert ev is not None and s.params["group_size"] == 4 and ev.num_offloaded == 0
    assert ev.makespan == 410 and max(ev.peak_memory) == 20


def test_pipeoffload_offloads_the_least_chunks_that_fit() -> None:
    s = generate("pipeoffload", unit(8, 32, 4, memory_limit=16))
    ev = s.evaluation
    assert ev is not None and ev.feasible and ev.makespan == 398  # GIS speed at half its memory
    assert s.params["group_size"] == 8 and s.params["offload_chunks"] == 2
    assert max(ev.peak_memory) <= 16


def test_pipeoffload_takes_the_fit_rule_where_lazy_cannot_lay_out() -> None:
    pb = unit(
        6, 12, 2, memory_limit=4, offload={"bytes": 1, "d2h_bandwidth": 1, "h2d_bandwidth": 1}
    )
    s = generate("pipeoffload", pb)
    ev = s.evaluation
    assert ev is not None and ev.feasible and max(ev.peak_memory) <= 4
    assert s.params["rule"] == "fit"


def test_pipeoffload_with_one_chunk_is_1f1b_split_with_offload() -> None:
    pb = unit(4, 12, 1, memory_limit=2)
    s = generate("pipeoffload", pb)
    ev = s.evaluation
    assert ev is not None and ev.feasible and max(ev.peak_memory) <= 2
    assert 0 < ev.num_offloaded < 4 * 12
    # the v = 1 order holds p - d microbatches on device d
    base = simulate(pb, gis_order(pb, 4)).evaluation
    assert base.peak_memory == [4, 3, 2, 1]


def test_pipeoffload_without_offload_is_the_gis_family() -> None:
    s = generate("pipeoffload", unit(8, 32, 4, memory_limit=26, offload=None))
    ev = s.evaluation
    assert ev is not None and ev.feasible and ev.num_offloaded == 0
    # peaks 32, 29, 26, 23, 20 for g = 8 .. 4 (m = 32: 6 and 5 leave a short last group,
    # 416 and 419); GIS-H (410) is the fastest that fits 26
    assert s.params["group_size"] == 4 and ev.makespan == 410


def test_pipeoffload_not_applicable_reasons() -> None:
    with pytest.raises(NotApplicable, match="ZB-H1"):
        generate("pipeoffload", unit(4, 8, offload=None, memory_limit=2))
    with pytest.raises(NotApplicable, match="interleaved placement"):
        generate("pipeoffload", unit(4, 8, 2, placement="vshape"))
    with pytest.raises(NotApplicable, match="fits the memory limit"):
        generate("pipeoffload", unit(4, 8, memory_limit=2, offload=SLOW))
    with pytest.raises(NotApplicable, match="below one activation"):
        generate("pipeoffload", unit(4, 8, memory_limit=0.5))
