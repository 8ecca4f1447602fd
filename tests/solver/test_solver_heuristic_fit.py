"""Memory-fitted list rules: 1F1B's depths scaled to the limit, with room kept for deeper chunks."""

from __future__ import annotations

import pytest
from bench_problems import bench_problem, one_lane

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver.heuristics import (
    ListRule,
    default_rules,
    no_offload_fits,
    run_rule,
    slow_copies,
)
from optpipe_lightning.solver.list_rules import fitted_depths


def _vshape(p: int, m: int, mem_frac: float, copy: float) -> Problem:
    """V-shape, 2 chunks, the solver benchmark's instance."""
    return bench_problem(p, m, 2, mem_frac, copy)


def _makespan(pb: Problem, rule: ListRule) -> float | None:
    """The rule's makespan if the simulator accepts its schedule (None: stuck or over)."""
    sched = run_rule(pb, rule)
    if sched is None:
        return None
    assert sched.evaluation is not None
    if rule.fit:  # the fitted rules' F's fit when they end, and nothing is offloaded
        assert sched.evaluation.feasible, sched.evaluation.violations[:1]
    return sched.evaluation.makespan if sched.evaluation.feasible else None


def _rule(pb: Problem, name: str) -> ListRule:
    return next(r for r in default_rules(pb) if r.name == name)


def test_fitted_depths_fit_the_limit_and_keep_the_1f1b_shape() -> None:
    pb = _vshape(8, 32, 0.5, 2.0)
    G = 16
    groups_of = [[pb.group_of(s, c) for c in range(2)] for s in range(8)]
    m_f = pb.cost("m_f").tolist()
    depth = fitted_depths(pb, groups_of, pb.memory_limits(), m_f)
    for gs in groups_of:
        need = sum(depth[g] * 0.5 for g in gs)
        assert need == pytest.approx(4.0)  # scaled down to the limit exactly
        a, b = gs
        # the ratio between a stage's groups is 1F1B's (G - g)
        assert depth[a] / depth[b] == pytest.approx((G - a) / (G - b))
    # a limit that 1F1B's depths already fit leaves them alone
    roomy = pb.with_changes(memory_limit=100.0)
    assert fitted_depths(roomy, groups_of, roomy.memory_limits(), m_f) == [
        float(G - g) for g in range(G)
    ]


@pytest.mark.parametrize(
    ("p", "m", "mem", "old_best", "fitted_at_most"),
    [
        # old rules' best under settle points (issue 34): 99.5 -> 102, 88.5 -> 91
        (4, 8, 0.25, 102.0, 50.5),  # = adaoffload, the best known
        (4, 8, 0.5, 91.0, 30.0),  # v-min 29.5
        (8, 32, 0.5, 401.5, 110.0),  # v-min 109.5
    ],
)
def test_fitted_rules_beat_the_old_rules_where_copies_are_slow(
    p: int, m: int, mem: float, old_best: float, fitted_at_most: float
) -> None:
    pb = one_lane(_vshape(p, m, mem, 2.0))  # measured with one lane for both directions
    # the rules that predate the fitted ones (the round-trip rules came later)
    old = [r for r in default_rules(pb) if not r.fit and r.trip_room == 0]
    olds = [x for x in (_makespan(pb, r) for r in old) if x is not None]
    assert min(olds) == pytest.approx(old_best)
    fitted = [x for x in (_makespan(pb, r) for r in default_rules(pb) if r.fit) if x is not None]
    assert min(fitted) <= fitted_at_most


def test_keeping_room_for_the_deeper_chunk_avoids_the_deadlock() -> None:
    pb = _vshape(4, 8, 0.25, 2.0)
    # the shallow chunk's forwards fill the one activation the limit holds; the deep chunk's
    # forward, which every backward waits for, never fits
    assert _makespan(pb, ListRule("x", "none", 0.8, fit=True)) is None
    assert _makespan(pb, ListRule("x", "none", 0.8, fit=True, reserve=True)) == pytest.approx(50.5)
    assert _makespan(pb, ListRule("x", "none", None, reserve=True)) is not None


def test_rule_order_puts_a_cheap_no_offload_rule_first_and_slow_copies_last() -> None:
    slow = _vshape(8, 32, 0.25, 2.0)
    fast = _vshape(8, 32, 0.25, 0.5)
    assert slow_copies(slow) and not slow_copies(fast)
    names = [r.name for r in default_rules(slow)]
    assert names[0] == "fit-reserve"
    first_offload = min(i for i, r in enumerate(default_rules(slow)) if r.offload != "none")
    assert all(r.offload != "none" for r in default_rules(slow)[first_offload:])
    fast_rules = default_rules(fast)
    assert fast_rules[0].name == "fit-reserve"
    assert fast_rules[1].name == "offload-all-lead2"  # the usual best comes right after
    # one chunk: the 1F1B-depth greedy is the cheap one
    one = Problem(
        num_stages=4, num_microbatches=8, t_f=1.0, t_b=1.0, t_w=1.0, m_f=1.0, m_b=-0.5, m_w=-0.5,
        memory_limit=2.0, offload={"bytes": 1.0, "d2h_bandwidth": 1.0, "h2d_bandwidth": 1.0},
    )  # fmt: skip
    assert default_rules(one)[0].name == "greedy-1f1b"
    assert not any(r.fit for r in default_rules(one))


def test_no_offload_rules_wait_their_turn_where_only_offload_fits() -> None:
    # one microbatch's two chunk activations (1.0) do not fit 0.75: only offload can
    pb = _vshape(4, 8, 0.1875, 0.5)
    assert not no_offload_fits(pb)
    rules = default_rules(pb)
    assert rules[0].name == "offload-all-lead2"
    assert no_offload_fits(_vshape(4, 8, 0.25, 0.5))
    # no limit: the order of before
    assert [r.name for r in default_rules(pb.with_changes(memory_limit=None))][:2] == [
        "greedy",
        "greedy-1f1b",
    ]
