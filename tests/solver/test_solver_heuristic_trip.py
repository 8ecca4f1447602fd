"""Offload only where the copies fit in the round trip (``ListRule.trip_room``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_problems import bench_problem, one_lane

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver.heuristics import ListRule, default_rules, run_rule
from optpipe_lightning.solver.rule_search import _key, neighbours, rule_label

TRIP = ListRule("t", "lazy", 1.5, reload_lead=2, wait=True, trip_room=1.0)


def _makespan(pb: Problem, rule: ListRule) -> float | None:
    sched = run_rule(pb, rule)
    if sched is None or sched.evaluation is None or not sched.evaluation.feasible:
        return None
    return sched.evaluation.makespan


def _offloading_stages(pb: Problem, rule: ListRule) -> set[int]:
    sched = run_rule(pb, rule)
    assert sched is not None
    return {s for s, row in enumerate(sched.actions) if any(a.op == "OFFLOAD" for a in row)}


def test_the_last_stages_keep_their_activations_where_the_copies_outlast_the_round_trip() -> None:
    # 4x8x1, half of 1F1B's memory, a copy half a microbatch's compute (1.5): offload plus reload
    # take 3, the round trip from stage s's F end to its B start is 2 (3 - s): 6, 4, 2, 0
    pb = bench_problem(4, 8, 1, 0.5, 0.5)
    assert _offloading_stages(pb, TRIP) == {0, 1}
    assert _offloading_stages(pb, replace(TRIP, trip_room=0.0)) == {0, 1, 2}
    assert _offloading_stages(pb, replace(TRIP, trip_room=1.5)) == {0}  # 4 < 1.5 * 3
    assert _offloading_stages(pb, replace(TRIP, trip_room=100.0)) == set()


def test_round_trip_rules_beat_every_rule_that_offloads_wherever_it_can() -> None:
    pb = one_lane(bench_problem(4, 8, 1, 0.5, 0.5))  # as measured: one lane, both directions
    rules = default_rules(pb)
    trip = [r for r in rules if r.trip_room > 0]
    others = [r for r in rules if r.trip_room == 0]
    assert trip and others
    best_trip = min(m for r in trip if (m := _makespan(pb, r)) is not None)
    best_other = min(m for r in others if (m := _makespan(pb, r)) is not None)
    # under settle points (issue 34): 34.5 -> 35 and 29.5 -> 34 (the old rule's optimum was 29,
    # proven by CP-SAT then; not re-proven under the new rule)
    assert best_other == pytest.approx(35.0)
    assert best_trip == pytest.approx(34.0)


def test_the_rule_search_steps_the_round_trip_and_names_it() -> None:
    pb = bench_problem(4, 8, 1, 0.5, 0.5)
    trips = sorted(r.trip_room for r in neighbours(TRIP, pb) if r.trip_room != TRIP.trip_room)
    assert trips == [0.5, 1.5]
    at_zero = neighbours(replace(TRIP, trip_room=0.0), pb)
    assert sorted({r.trip_room for r in at_zero}) == [0.0, 0.5]  # never below zero
    assert "trip1.5" in rule_label(replace(TRIP, trip_room=1.5))
    assert "trip" not in rule_label(replace(TRIP, trip_room=0.0))
    assert _key(TRIP) != _key(replace(TRIP, trip_room=1.5))
    # the plan rule has its own margin instead
    plan = ListRule("p", "plan", None, margin=0.5, eager=True)
    assert {r.trip_room for r in neighbours(plan, pb)} == {0.0}
