"""solve() honours its time limit by phases: what it skips, and the deadline it passes down."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from bench_problems import bench_problem
from solver_budget import UNBOUNDED_SECONDS

import optpipe_lightning.schedule.baselines as baselines_pkg
import optpipe_lightning.solver.backend as backend_mod
import optpipe_lightning.solver.candidates as candidates_mod
import optpipe_lightning.solver.cpsat as cpsat_mod
import optpipe_lightning.solver.phases as phases_mod
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines._deadline import check_deadline
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.candidates import baseline_order, baseline_schedules
from optpipe_lightning.solver.cpsat import CpOutcome
from optpipe_lightning.solver.incumbent import Budget

_pb = bench_problem


def test_solver_deadline_zero_limit_still_answers_and_lists_what_it_skipped() -> None:
    res = solve(_pb(16, 64, 2), time_limit=0.0, workers=1)
    ev = res.schedule.evaluation
    assert ev is not None and ev.feasible and ev.makespan == pytest.approx(res.makespan)
    assert len(res.incumbents) >= 1
    skipped = res.schedule.params["skipped"]
    assert any(x.startswith("heuristics not started: ") for x in skipped)
    first = ", ".join(baseline_order(_pb(16, 64, 2))[:7])  # closed forms, then the strongest
    assert any(x.startswith(f"baselines not started: {first}") for x in skipped), skipped
    assert "cpsat search (no time left)" in skipped
    assert res.message is not None and res.message.startswith("time limit 0 s: skipped ")
    phases = res.schedule.params["phase_seconds"]
    assert "heuristics" in phases and "cpsat (build and search)" not in phases


@pytest.mark.usefixtures("deterministic_cpsat")
def test_solver_deadline_nothing_skipped_when_time_suffices() -> None:
    # time that suffices on any machine: a wall limit never reached, CP-SAT on its work
    res = solve(
        _pb(4, 8, mem=0.5, copy=2.0),
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=30.0,
        workers=1,
        seed=0,
    )
    assert "skipped" not in res.schedule.params
    assert res.message is None
    assert res.status == "optimal"


class _FakeSearch:
    """Stands in for CP-SAT: records what it was given and waits for its stop event."""

    def __init__(self, on_start: threading.Event | None = None) -> None:
        self.time_limit: float | None = None
        self.stopped: bool | None = None
        self.on_start = on_start

    def __call__(self, problem: Problem, tm: Any, **kw: Any) -> CpOutcome:
        self.time_limit = kw["time_limit"]
        if self.on_start is not None:
            self.on_start.set()
        stop = kw["stop"]
        assert stop is not None
        self.stopped = stop.wait(30.0)
        return CpOutcome("unknown", None, None, 0.0)


def test_solver_deadline_backend_is_stopped_at_the_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeSearch()
    monkeypatch.setattr(cpsat_mod, "solve_cpsat", fake)
    # a limit the phases before CP-SAT leave room in on a loaded machine (heuristics take
    # milliseconds here, the search phase 40% of what is left)
    res = solve(_pb(4, 8, mem=0.5), time_limit=5.0, workers=1, use_baselines=False)
    assert fake.time_limit is not None and 0 < fake.time_limit <= 5.0
    assert fake.stopped is True  # the deadline set the backend's stop event
    assert res.schedule.evaluation is not None and res.schedule.evaluation.feasible
    assert "cpsat (build and search)" in res.schedule.params["phase_seconds"]


def test_solver_deadline_user_stop_reaches_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    fake = _FakeSearch(on_start=stop)  # the user stops the solve while the search runs
    monkeypatch.setattr(cpsat_mod, "solve_cpsat", fake)
    solve(_pb(4, 8, mem=0.5), time_limit=600.0, workers=1, stop=stop, use_baselines=False)
    assert fake.time_limit is not None and fake.time_limit > 100
    assert fake.stopped is True


def test_solver_deadline_backend_skipped_when_its_model_cannot_be_built_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeSearch()
    monkeypatch.setattr(cpsat_mod, "solve_cpsat", fake)
    # pretend building the model takes far longer than the limit
    monkeypatch.setattr(backend_mod, "BUILD_PER_SIM", 1e9)
    res = solve(_pb(4, 8, mem=0.5), time_limit=5.0, workers=1, use_baselines=False)
    assert fake.time_limit is None  # never started
    assert any(x.startswith("cpsat search (") for x in res.schedule.params["skipped"])


def test_solver_deadline_running_baseline_is_stopped_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def slow(name: str, problem: Problem) -> Any:
        calls.append(name)
        while True:  # a generator that would never end without the deadline
            check_deadline()
            time.sleep(0.01)

    monkeypatch.setattr(baselines_pkg, "generate", slow)
    budget = Budget(time.perf_counter(), 0.3)
    out = baseline_schedules(_pb(4, 8), budget.at(0.5), budget)
    assert out == []
    order = baseline_order(_pb(4, 8))
    assert calls == [order[0]]  # none started after the one stopped
    assert budget.skipped[0].startswith(f"baseline {order[0]} stopped after ")
    assert budget.skipped[1] == "baselines not started: " + ", ".join(order[1:])
    assert budget.phase_seconds[f"baseline:{order[0]}"] > 0


def _without_fitted_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the memory-fitted list rules and the rule search (they tie adaoffload on the
    problem these tests use)."""
    rules = phases_mod.default_rules
    # default_rules is looked up where the list rules run and where the rule search starts
    for mod in (candidates_mod, phases_mod):
        monkeypatch.setattr(mod, "default_rules", lambda p: [r for r in rules(p) if not r.fit])
    monkeypatch.setattr(phases_mod, "search_rules", lambda *a, **k: iter(()))


def test_solver_deadline_stopped_baselines_get_the_time_the_backend_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the first half gives the baselines no time at all (as on a machine too slow for their
    # share); the heuristic backend leaves the rest of the limit: they run then, until it
    monkeypatch.setattr(phases_mod, "BASELINE_SHARE", 0.0)
    _without_fitted_rules(monkeypatch)
    pb = _pb(4, 8, 2, mem=0.25, copy=2.0)  # adaoffload (50.5) beats every list rule left (96)
    res = solve(pb, backend="heuristic", time_limit=20, workers=1)
    phases = res.schedule.params["phase_seconds"]
    assert "baselines (in the time left)" in phases
    assert res.schedule.params["source"] == "baseline:adaoffload"
    assert res.makespan == pytest.approx(50.5)
    assert res.solve_seconds < 20  # they finished; nothing waited for the limit


def test_solver_deadline_a_baseline_stopped_while_running_gets_a_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = baselines_pkg.generate
    calls: list[str] = []

    def first_too_slow(name: str, problem: Problem) -> Any:
        calls.append(name)
        if name == "adaoffload" and calls.count(name) == 1:
            while True:  # too slow for its share the first time
                check_deadline()
                time.sleep(0.01)
        return real(name, problem)

    monkeypatch.setattr(baselines_pkg, "generate", first_too_slow)
    _without_fitted_rules(monkeypatch)
    # the first try is stopped at its share (3 s); the second has what the heuristic backend
    # leaves of 30 s, far more than adaoffload needs on a busy machine (it returns at once)
    monkeypatch.setattr(phases_mod, "BASELINE_SHARE", 0.1)
    pb = _pb(4, 8, 2, mem=0.25, copy=2.0)  # adaoffload (50.5) beats every list rule left (96)
    res = solve(pb, backend="heuristic", time_limit=30, workers=1)
    assert calls.count("adaoffload") >= 2  # stopped, then tried again (more on a busy machine)
    skipped = res.schedule.params["skipped"]
    assert any(x.startswith("baseline adaoffload stopped after ") for x in skipped)
    assert "baselines (second chance)" in res.schedule.params["phase_seconds"]
    assert res.schedule.params["source"] == "baseline:adaoffload"
    assert res.makespan == pytest.approx(50.5)
