"""A margin that holds (issue 32.3): a schedule solved with a memory margin carries the budget
its memory waits were planned for (``Schedule.memory_budget``), and the simulator keeps it
there at the real limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_problems import bench_problem
from pydantic import ValidationError
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.profiles_db.storage import content_digest
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.margin import apply_memory_margin
from optpipe_lightning.schedule.simulator import MEMORY_TOLERANCE, evaluate, simulate
from optpipe_lightning.solver import solve

runner = CliRunner()
LIMIT = 1.0


def _problem() -> Problem:
    """Slow copies (2x a chunk's compute), 2 chunks: the solve at 90% relies on memory waits,
    and the same actions waiting only for the real limit fill it to 100%."""
    return bench_problem(4, 8, v=2, mem=0.25, copy=2.0).with_changes(memory_limit=LIMIT)


def _solve(problem: Problem, **kw: object) -> Schedule:
    result = solve(
        problem,
        backend="heuristic",
        time_limit=30,
        seed=0,
        workers=1,
        lns=False,
        robust=False,
        **kw,  # type: ignore[arg-type]
    )
    return result.schedule


def _peak(problem: Problem, schedule: Schedule) -> float:
    ev = evaluate(problem, schedule)
    assert ev.feasible, ev.violations
    return max(ev.peak_memory)


def test_margin_without_budget_fills_the_limit() -> None:
    """The old behaviour (the bug): the schedule solved at 90%, simulated at the real limit
    without its budget, waits only for 100% and reaches it."""
    pb = _problem()
    sched = _solve(apply_memory_margin(pb, 0.1))
    assert sched.memory_budget is None
    assert max(sched.evaluation.peak_memory) <= 0.9 * LIMIT * (1 + MEMORY_TOLERANCE)  # type: ignore[union-attr]
    bare = sched.model_copy(update={"problem_hash": pb.hash, "problem": pb})
    assert _peak(pb, bare) > 0.95 * LIMIT


def test_solve_api_margin_holds_at_the_real_limit() -> None:
    pb = _problem()
    sched = _solve(pb, memory_margin=0.1)
    assert sched.problem_hash == pb.hash
    assert sched.memory_budget == pytest.approx([0.9 * LIMIT] * pb.num_stages)
    assert sched.evaluation is not None and sched.evaluation.memory_limit == [LIMIT] * 4
    assert _peak(pb, sched) <= 0.9 * LIMIT * (1 + MEMORY_TOLERANCE) + 1e-6
    # the same timing as the solve at the reduced limit
    reduced = apply_memory_margin(pb, 0.1)
    same = sched.model_copy(update={"problem_hash": reduced.hash, "problem": reduced})
    assert evaluate(reduced, same.model_copy(update={"memory_budget": None})).makespan == (
        sched.evaluation.makespan
    )


def test_cli_solve_margin_holds_when_simulated(tmp_path: Path) -> None:
    pb = _problem()
    prob = tmp_path / "problem.json"
    prob.write_text(pb.model_dump_json())
    out = tmp_path / "s.json"
    args = ["solve", str(prob), "--solver", "heuristic", "--time-limit", "20"]
    res = runner.invoke(app, [*args, "--memory-margin", "0.1", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["problem"] == pb.hash
    assert "memory_budget" in json.loads(out.read_text())
    res = runner.invoke(app, ["simulate", str(prob), str(out), "--json"])
    assert res.exit_code == 0, res.output
    ev = json.loads(res.stdout)
    assert ev["feasible"] and ev["memory_limit"] == [LIMIT] * 4
    assert max(ev["peak_memory"]) <= 0.9 * LIMIT * (1 + MEMORY_TOLERANCE) + 1e-6


def test_budget_round_trips_and_is_omitted_when_absent() -> None:
    pb = _problem()
    sched = generate("zbv", pb.with_changes(memory_limit=None))
    text = sched.to_json()
    assert "memory_budget" not in text
    with_b = sched.model_copy(update={"memory_budget": [2.0, 2.5, 3.0, 3.5]})
    back = Schedule.from_json(with_b.to_json())
    assert back.memory_budget == [2.0, 2.5, 3.0, 3.5] and back == with_b
    plain = json.loads(text)
    assert content_digest(sched.problem_hash, plain) == content_digest(
        sched.problem_hash, {"actions": plain["actions"], "generator": "other"}
    )
    assert content_digest(sched.problem_hash, json.loads(with_b.to_json())) != content_digest(
        sched.problem_hash, plain
    )
    with pytest.raises(ValidationError, match="memory_budget has 2 entries"):
        Schedule.from_json(json.dumps({**plain, "memory_budget": [1.0, 2.0]}))
    with pytest.raises(ValidationError):
        Schedule.from_json(json.dumps({**plain, "memory_budget": [1.0, 0.0, 1.0, 1.0]}))


def test_old_file_reads_and_simulates_as_before() -> None:
    pb = bench_problem(4, 8, mem=None)
    sched = generate("1f1b", pb)
    old = {k: v for k, v in json.loads(sched.to_json()).items() if k != "memory_budget"}
    read = Schedule.from_json(json.dumps(old))
    assert read.memory_budget is None and read == sched
    assert evaluate(pb, read) == evaluate(pb, sched)
    # a budget below the peak is a memory violation that names the budget
    peak = max(evaluate(pb, sched).peak_memory)
    tight = read.model_copy(update={"memory_budget": [peak / 2] * pb.num_stages})
    ev = simulate(pb, tight).evaluation
    assert not ev.feasible and ev.memory_limit == [None] * pb.num_stages
    assert any(v.kind == "memory" and "memory_budget" in v.message for v in ev.violations)


def test_bare_actions_take_the_budget_like_the_executor() -> None:
    """The executor checks and times bare action lists (``engine.validate_for_execution``):
    with the schedule's budget they get the schedule's waits."""
    pb = _problem()
    sched = _solve(pb, memory_margin=0.1)
    assert sched.memory_budget is not None
    bare = simulate(pb, sched.actions, memory_budget=sched.memory_budget)
    assert bare.evaluation == simulate(pb, sched).evaluation
    assert bare.timeline is not None and max(bare.evaluation.peak_memory) <= 0.9 * LIMIT + 1e-6


def test_executor_waits_follow_the_budget() -> None:
    """The executor's check (``validate_for_execution``) returns the waits of the budgeted
    timeline: the ones the schedule was solved with, not the real limit's."""
    from optpipe_lightning.strategy.runtime.engine import validate_for_execution
    from optpipe_lightning.strategy.runtime.offload import execution_waits

    pb = _problem()
    sched = _solve(pb, memory_margin=0.1)
    budgeted = simulate(pb, sched).timeline
    bare = simulate(pb, sched.actions).timeline
    assert budgeted is not None and bare is not None
    waits = validate_for_execution(pb, sched)
    assert waits == execution_waits(budgeted)
    assert waits != execution_waits(bare)  # at the real limit the same actions wait less
