"""The "plan" list rule: copies planned on the channel's timeline (``solver.heuristics``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_problems import bench_problem, one_lane
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.solver.heuristics import ListRule, default_rules, run_rule
from optpipe_lightning.solver.rule_search import _key, neighbours, rule_label

PLAN = ListRule("offload-plan", "plan", None, margin=0.5, eager=True)


def _makespan(pb: Problem, rule: ListRule) -> float | None:
    sched = run_rule(pb, rule)
    if sched is None or sched.evaluation is None or not sched.evaluation.feasible:
        return None
    return sched.evaluation.makespan


def test_planned_copies_beat_every_other_rule_where_copies_are_as_slow_as_the_compute() -> None:
    # 6 stages x 12 microbatches, half of 1F1B's activation memory, a copy as long as a
    # microbatch's F + B + W: offloading every activation saturates the channel, and without
    # offload the stage's memory holds too few microbatches in flight (one lane for both
    # directions, as measured)
    pb = one_lane(bench_problem(6, 12, 1, 0.5, 1.0))
    rules = default_rules(pb)
    plan = [r for r in rules if r.offload == "plan"]
    others = [r for r in rules if r.offload != "plan"]
    assert plan and others
    best_plan = min(m for r in plan if (m := _makespan(pb, r)) is not None)
    best_other = min(m for r in others if (m := _makespan(pb, r)) is not None)
    assert best_plan == pytest.approx(59.0)  # 57 before settle points (issue 34)
    assert best_other == pytest.approx(61.0)
    sched = run_rule(pb, PLAN)
    assert sched is not None
    res = simulate(pb, sched)
    assert res.feasible
    moved = sum(a.op == "OFFLOAD" for row in sched.actions for a in row)
    reloaded = sum(a.op == "RELOAD" for row in sched.actions for a in row)
    # some activations go to the host, not all of them (the channel could not keep up)
    assert 0 < moved == reloaded < (pb.num_stages - 1) * pb.num_microbatches


def test_plan_rules_run_first_among_offload_rules_where_copies_are_slow() -> None:
    slow = bench_problem(8, 32, 1, 0.25, 2.0)
    rules = default_rules(slow)
    offload = [r for r in rules if r.offload != "none"]
    assert [r.offload for r in offload[:2]] == ["plan", "plan"]
    fast = bench_problem(8, 32, 1, 0.25, 0.5)
    offload = [r for r in default_rules(fast) if r.offload != "none"]
    assert offload[-1].offload == "plan" and offload[0].offload != "plan"
    # not with several chunks per stage (it gets stuck there), nor without offload or a limit
    assert not any(r.offload == "plan" for r in default_rules(bench_problem(8, 32, 2, 0.25, 2.0)))
    assert not any(r.offload == "plan" for r in default_rules(slow.with_changes(offload=None)))
    assert not any(r.offload == "plan" for r in default_rules(slow.with_changes(memory_limit=None)))


def test_a_lazy_plan_offloads_nothing_where_every_forward_fits() -> None:
    pb = bench_problem(4, 8, 1, 0.5, 1.0).with_changes(memory_limit=100.0)
    sched = run_rule(pb, replace(PLAN, eager=False))
    assert sched is not None and sched.evaluation is not None and sched.evaluation.feasible
    assert not any(a.op == "OFFLOAD" for row in sched.actions for a in row)


def test_search_neighbours_of_a_plan_rule_tune_its_margin_and_eagerness() -> None:
    pb = bench_problem(8, 32, 1, 0.25, 2.0)
    nbs = neighbours(PLAN, pb)
    keys = {_key(n) for n in nbs}
    assert len(keys) == len(nbs) and _key(PLAN) not in keys
    assert all(n.offload == "plan" for n in nbs)
    assert {n.margin for n in nbs} == {0.25, 0.5, 0.75}
    assert any(not n.eager for n in nbs)
    for n in nbs:
        assert n.name == rule_label(n) and n.name.startswith("search:plan-")
    assert "margin0.25" in rule_label(replace(PLAN, margin=0.25))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.integers(2, 6),
    extra=st.integers(0, 10),
    t_f=st.sampled_from([0.5, 1.0, 1.5]),
    t_b=st.sampled_from([1.0, 1.5, 2.0]),
    t_w=st.sampled_from([0.5, 1.0]),
    limit=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    ratio=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    comm=st.sampled_from([0.0, 0.1]),
    margin=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    eager=st.booleans(),
)
def test_plan_rule_never_gets_stuck_and_its_schedules_fit(
    p: int,
    extra: int,
    t_f: float,
    t_b: float,
    t_w: float,
    limit: float,
    ratio: float,
    comm: float,
    margin: float,
    eager: bool,
) -> None:
    copy = ratio * (t_f + t_b + t_w)
    pb = Problem(
        num_stages=p,
        num_microbatches=p + extra,
        t_f=t_f,
        t_b=t_b,
        t_w=t_w,
        t_comm=comm,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=limit,
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / copy, "h2d_bandwidth": 1 / copy},
    )
    sched = run_rule(pb, replace(PLAN, margin=margin, eager=eager))
    assert sched is not None, "the plan rule got stuck"
    assert sched.evaluation is not None and sched.evaluation.feasible, sched.evaluation


def test_plan_rule_beats_the_no_offload_greedy_where_copies_are_slow() -> None:
    # 16 x 64, a quarter of the memory, copies twice the compute: no other offload rule beats
    # greedy-1f1b (551) here. The reload of a late microbatch must not be starved by forwards
    # admitted on the hope that earlier, late-running backwards free memory in time
    pb = bench_problem(16, 64, 1, 0.25, 2.0)
    greedy = _makespan(pb, ListRule("greedy-1f1b", "none", 1.0))
    assert greedy == pytest.approx(551.0)
    planned = _makespan(pb, PLAN)
    assert planned is not None and planned < greedy - 10
