"""Properties of the formats, the simulator and the lower bound on arbitrary valid schedules."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_strategies import problems, random_valid_actions

from optpipe_lightning.schedule import Action, Problem, Schedule, simulate
from optpipe_lightning.schedule.bounds import lower_bound

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(problems(), st.integers(0, 10**6))
def test_random_topological_orders_are_valid(problem: Problem, seed: int) -> None:
    actions = random_valid_actions(problem, seed)
    ev = simulate(problem, actions).evaluation
    structural = [v for v in ev.violations if v.kind != "memory"]
    assert structural == [], structural
    assert ev.makespan is not None and ev.makespan > 0
    assert 0 <= ev.bubble_rate < 1  # type: ignore[operator]


@SETTINGS
@given(problems(), st.integers(0, 10**6))
def test_lower_bound_never_exceeds_a_valid_makespan(problem: Problem, seed: int) -> None:
    actions = random_valid_actions(problem, seed)
    ev = simulate(problem, actions).evaluation
    if not ev.feasible:  # over the memory limit: compare with the bound that ignores memory
        problem = problem.with_changes(memory_limit=None)
        ev = simulate(problem, actions).evaluation
    assert ev.feasible
    assert lower_bound(problem) <= ev.makespan * (1 + 1e-9) + 1e-9  # type: ignore[operator]


@SETTINGS
@given(problems())
def test_problem_json_round_trip_is_lossless(problem: Problem) -> None:
    again = Problem.model_validate_json(problem.model_dump_json())
    assert again == problem
    assert again.hash == problem.hash


@SETTINGS
@given(problems(), st.integers(0, 10**6))
def test_schedule_json_round_trip_is_lossless(problem: Problem, seed: int) -> None:
    actions = random_valid_actions(problem, seed)
    sched = Schedule(
        problem_hash=problem.hash,
        generator="random",
        params={"seed": seed},
        actions=actions,
        evaluation=simulate(problem, actions).evaluation,
        problem=problem,
    )
    text = sched.to_json()
    again = Schedule.from_json(text)
    assert again == sched
    assert json.loads(again.to_json()) == json.loads(text)
    assert simulate(problem, again).evaluation == sched.evaluation


@SETTINGS
@given(problems(offload=False), st.integers(0, 10**6), st.data())
def test_dropping_an_op_is_caught(problem: Problem, seed: int, data: st.DataObject) -> None:
    actions = random_valid_actions(problem, seed)
    s = data.draw(st.integers(0, problem.num_stages - 1))
    i = data.draw(st.integers(0, len(actions[s]) - 1))
    dropped = actions[s].pop(i)
    ev = simulate(problem, actions).evaluation
    assert not ev.feasible
    assert any(v.kind == "missing-op" and str(dropped.op)[0] in v.message for v in ev.violations)


@SETTINGS
@given(problems(offload=False), st.integers(0, 10**6), st.data())
def test_swapping_across_a_dependency_is_caught(
    problem: Problem, seed: int, data: st.DataObject
) -> None:
    actions = random_valid_actions(problem, seed)
    # find, on some stage, an op and a later op of the same (mb, chunk) it must precede
    pairs = [
        (s, i, k)
        for s, row in enumerate(actions)
        for i, a in enumerate(row)
        for k in range(i + 1, len(row))
        if row[k].mb == a.mb and row[k].chunk == a.chunk
    ]
    s, i, k = data.draw(st.sampled_from(pairs)) if pairs else (0, 0, 0)
    if not pairs:
        return
    row = actions[s]
    row[i], row[k] = row[k], row[i]
    ev = simulate(problem, actions).evaluation
    assert not ev.feasible
    assert any(v.kind == "deadlock" for v in ev.violations), ev.violations


def test_offload_mutations_are_caught() -> None:
    pb = Problem(
        num_stages=2,
        num_microbatches=2,
        t_f=1,
        t_b=1,
        t_w=1,
        offload={"bytes": 0.5, "d2h_bandwidth": 1.0, "h2d_bandwidth": 1.0},
    )
    base = [
        [
            Action("F", 0),
            Action("OFFLOAD", 0),
            Action("F", 1),
            Action("RELOAD", 0),
            Action("BW", 0),
            Action("BW", 1),
        ],
        [Action("F", 0), Action("BW", 0), Action("F", 1), Action("BW", 1)],
    ]
    assert simulate(pb, base).evaluation.feasible
    offload_first = [list(r) for r in base]
    offload_first[0][0], offload_first[0][1] = offload_first[0][1], offload_first[0][0]
    kinds = {v.kind for v in simulate(pb, offload_first).evaluation.violations}
    assert "offload-not-there" in kinds
    no_reload = [[a for a in base[0] if a.op != "RELOAD"], base[1]]
    kinds = {v.kind for v in simulate(pb, no_reload).evaluation.violations}
    assert kinds == {"offload-unpaired"}
    no_offload_allowed = pb.with_changes(offload=None)
    kinds = {v.kind for v in simulate(no_offload_allowed, base).evaluation.violations}
    assert kinds == {"offload-not-allowed"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 10**6))
def test_built_schedules_equal_validated_ones(problem: Problem, seed: int) -> None:
    rows = [[Action(*a) for a in row] for row in random_valid_actions(problem, seed)]
    ev = simulate(problem, rows).evaluation
    fields = dict(problem_hash=problem.hash, generator="g", params={"k": 1}, evaluation=ev)
    built = Schedule.built(actions=rows, problem=problem, **fields)  # type: ignore[arg-type]
    checked = Schedule(actions=rows, problem=problem, **fields)  # type: ignore[arg-type]
    assert built == checked
    assert built.to_json() == checked.to_json()
    assert Schedule.from_json(built.to_json()) == checked


def test_built_schedules_parse_anything_but_actions() -> None:
    pb = Problem(num_stages=1, num_microbatches=1, t_f=1.0, t_b=1.0, t_w=1.0)
    raw = [[("F", 0), {"op": "B", "mb": 0}, ["W", 0, 0]]]
    sched = Schedule.built(problem_hash=pb.hash, generator="g", actions=raw)  # type: ignore[arg-type]
    assert sched.actions == [[Action("F", 0), Action("B", 0), Action("W", 0)]]
