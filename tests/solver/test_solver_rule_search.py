"""The local search over the list rules' parameters (``solver.rule_search``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_problems import bench_problem, one_lane
from solver_budget import UNBOUNDED_SECONDS

import optpipe_lightning.solver.rule_search as rs
from optpipe_lightning.schedule import Problem, Schedule, evaluate
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.heuristics import ListRule, default_rules, run_rule
from optpipe_lightning.solver.rule_search import (
    _key,
    neighbours,
    pair_moves,
    rule_label,
    search_rules,
)

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")

_pb = bench_problem


def test_neighbours_change_one_parameter_and_say_so_in_their_name() -> None:
    pb = _pb(4, 8, 2, 0.5, 0.5)
    rule = ListRule("offload-all-lead2", "all", 1.0, reload_lead=2)
    nbs = neighbours(rule, pb)
    keys = {_key(n) for n in nbs}
    assert len(keys) == len(nbs) and _key(rule) not in keys
    assert {n.reload_lead for n in nbs} == {1, 2, 3}
    assert {round(n.inflight, 6) for n in nbs if n.inflight is not None} == {
        0.75,
        0.9,
        1.0,
        1.1,
        1.25,
        1.5,
    }
    assert any(n.wait for n in nbs) and any(n.offload == "lazy" for n in nbs)
    for n in nbs:
        assert n.name == rule_label(n)
        assert n.name.startswith(f"search:{n.offload}-x")
    fitted = ListRule("fit", "none", 0.75, fit=True)
    steps = sorted(n.inflight for n in neighbours(fitted, pb) if n.fit and n.inflight is not None)
    assert steps == pytest.approx(
        [0.65, 0.7, 0.75, 0.75, 0.8, 0.85]
    )  # +-0.05, +-0.1; reserve and order switched
    assert all(n.offload == "none" for n in neighbours(fitted, pb))  # no copies to tune
    one_chunk = _pb(4, 8, 1, 0.5, 0.5)
    assert not any(n.reserve or n.fit for n in neighbours(rule, one_chunk))


def test_pair_moves_step_the_depth_with_the_lead_or_the_round_trip() -> None:
    pb = _pb(4, 8, 2, 0.5, 0.5)
    rule = ListRule("r", "lazy", 0.75, reload_lead=3, wait=True, headroom=2)
    pairs = pair_moves(rule, pb)
    assert pairs and all(n.name == rule_label(n) for n in pairs)
    for n in pairs:
        assert n.inflight is not None and abs(n.inflight - 0.75) > 1e-9
        assert (n.trip_room != rule.trip_room) != (n.reload_lead != rule.reload_lead)
    # the move the climb missed at 16x64x2 (rule_search.pair_moves)
    assert any(
        abs(n.inflight - 0.85) < 1e-9 and n.trip_room == 1.0  # type: ignore[operator]
        for n in pairs
    )
    assert pair_moves(replace(rule, offload="none"), pb) == []


def _portfolio(pb: Problem) -> list[tuple[float, ListRule]]:
    out = []
    for r in default_rules(pb):
        sched = run_rule(pb, r)
        if sched is not None and sched.evaluation is not None and sched.evaluation.feasible:
            assert sched.evaluation.makespan is not None
            out.append((sched.evaluation.makespan, r))
    return out


def test_search_improves_on_the_portfolio_with_checked_schedules() -> None:
    pb = one_lane(_pb(8, 32, 2, 0.25, 0.5))  # as measured: one lane, both directions
    starts = _portfolio(pb)
    first = min(m for m, _ in starts)
    assert first == pytest.approx(114.5)
    found = list(search_rules(pb, starts, lambda: True, tried=default_rules(pb)))
    assert found, "the search found nothing better"
    spans = []
    for rule, sched in found:
        ev = evaluate(pb, sched)  # the simulator, again
        assert ev.feasible and ev.makespan == pytest.approx(sched.evaluation.makespan)
        assert rule.name.startswith("search:")
        spans.append(ev.makespan)
    assert spans == sorted(spans, reverse=True) and len(set(spans)) == len(spans)
    assert spans[-1] <= 110.0  # measured 109


def test_search_stops_when_told_and_never_reruns_a_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    pb = _pb(8, 32, 2, 0.25, 0.5)
    starts = _portfolio(pb)
    asked = 0

    def three() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 3

    ran: list[ListRule] = []
    real = rs.run_rule

    def counting(problem: Problem, rule: ListRule) -> Schedule | None:
        ran.append(rule)
        return real(problem, rule)

    monkeypatch.setattr(rs, "run_rule", counting)
    list(search_rules(pb, starts, three, tried=default_rules(pb)))
    assert len(ran) == 3
    ran.clear()
    list(search_rules(pb, starts, lambda: True, tried=default_rules(pb)))
    keys = [_key(r) for r in ran]
    assert len(keys) == len(set(keys))
    assert not {_key(r) for r in default_rules(pb)} & set(keys)


def test_solve_reports_the_searched_rule() -> None:
    pb = _pb(8, 32, 2, 0.25, 0.5)
    res = solve(pb, backend="heuristic", time_limit=UNBOUNDED_SECONDS, workers=1)
    assert res.makespan <= 110.0
    # (the robust pick may keep it under its own name: "robust:heuristic:search:...")
    assert res.schedule.params["source"].removeprefix("robust:").startswith("heuristic:search:")
    assert "rule search" in res.schedule.params["phase_seconds"]
    sources = [i.source for i in res.incumbents]
    assert any(s.startswith("heuristic:search:") for s in sources)


def test_no_search_once_the_bound_proves_the_portfolio_optimal() -> None:
    # unlimited memory: the portfolio's ZB-H1-like greedy meets the bound (103); neither the
    # search nor the baselines (hints only) can do better
    res = solve(
        _pb(8, 32, 1, None, 0.5), backend="heuristic", time_limit=UNBOUNDED_SECONDS, workers=1
    )
    assert res.makespan == pytest.approx(103) and res.status == "optimal"
    phases = res.schedule.params["phase_seconds"]
    assert "rule search" not in phases and "baselines" not in phases
    # a gap target the portfolio already meets ends the search before it starts, too
    pb = _pb(8, 32, 2, 0.25, 0.5)  # portfolio 114.5, bound 99.5: gap 13.1%
    res = solve(pb, backend="heuristic", time_limit=60, workers=1, gap_target=0.2)
    assert "rule search" not in res.schedule.params["phase_seconds"]
