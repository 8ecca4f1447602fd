"""List-scheduling rules that let a forward wait for an offload (the simulator's memory wait)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.solver.heuristics import ListRule, default_rules, run_rule


def _slow_copy_problem() -> Problem:
    """4 stages x 8 microbatches, a quarter of 1F1B's activation memory, copies twice as slow
    as a microbatch's F + B + W."""
    return Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1.0,
        t_b=1.0,
        t_w=1.0,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=1.0,
        offload={"bytes": 1.0, "d2h_bandwidth": 1 / 6, "h2d_bandwidth": 1 / 6},
    )


@pytest.mark.parametrize("name", ["offload-all", "offload-all-lead2", "offload-lazy"])
def test_waiting_for_the_copy_beats_idling_until_it_ends(name: str) -> None:
    pb = _slow_copy_problem()
    rule = next(r for r in default_rules(pb) if r.name == name)
    assert not rule.wait
    plain = run_rule(pb, rule)
    waiting = run_rule(pb, replace(rule, wait=True))
    assert plain is not None and waiting is not None
    assert plain.evaluation is not None and waiting.evaluation is not None
    assert plain.evaluation.feasible and waiting.evaluation.feasible
    assert waiting.evaluation.makespan is not None and plain.evaluation.makespan is not None
    assert waiting.evaluation.makespan < plain.evaluation.makespan
    res = simulate(pb, waiting)
    assert res.timeline is not None
    assert any(res.timeline.memory_waits), "the better schedule uses the memory wait"


def test_wait_rules_are_in_the_portfolio_only_where_offload_can_help() -> None:
    pb = _slow_copy_problem()
    assert any(r.wait for r in default_rules(pb))
    assert not any(r.wait for r in default_rules(pb.with_changes(offload=None)))
    assert not any(r.wait for r in default_rules(pb.with_changes(memory_limit=None)))


def test_a_rule_that_cannot_wait_never_produces_a_wait() -> None:
    pb = _slow_copy_problem()
    sched = run_rule(pb, ListRule("offload-all", "all", 1.0))
    assert sched is not None
    res = simulate(pb, sched)
    assert res.timeline is not None and not any(res.timeline.memory_waits)
