"""solve(): result fields, incumbent stream, baselines, bounds, stop, backends, errors."""

from __future__ import annotations

import threading

import pytest
from bench_problems import bench_problem
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.solver import (
    Incumbent,
    heuristic_schedules,
    lower_bound,
    solve,
)
from optpipe_lightning.solver.candidates import baseline_schedules

# what a solve reaches is asserted on CP-SAT's deterministic time, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")


def _pb(
    p: int,
    m: int,
    *,
    v: int = 1,
    limit: float | None = 2.0,
    bw: float = 2.0,
    offload: bool = True,
    placement: str = "vshape",
) -> Problem:
    """The benchmark's instance (F = B = W = 1 per stage) with an absolute limit and copy
    bandwidth, as in the solver note's prototype."""
    return bench_problem(p, m, v, mem=None).with_changes(
        placement=placement,
        memory_limit=limit,
        offload={"bytes": 1.0 / v, "d2h_bandwidth": bw, "h2d_bandwidth": bw} if offload else None,
    )


def test_known_optima_of_the_measured_prototype() -> None:
    """4x8, memory of 2 activations: 41 without offload, 27 unlimited (proven); with offload 28
    was the optimum while an offload's bytes left at its copy's end. Under the settle-point rule
    (DESIGN: they leave at the next compute action's start) the solver finds 28.5 and the bound
    stays 28 (CP-SAT's model of the rule is conservative, so it does not prove 28.5)."""
    budget = {"time_limit": UNBOUNDED_SECONDS, "deterministic_time": 30.0, "workers": 1}
    r_off = solve(_pb(4, 8), seed=0, use_baselines=False, **budget)
    r_no = solve(_pb(4, 8, offload=False), use_baselines=False, **budget)
    r_un = solve(_pb(4, 8, limit=None), use_baselines=False, **budget)
    assert (r_no.makespan, r_un.makespan) == (41.0, 27.0)
    assert r_no.status == r_un.status == "optimal"
    assert 28.0 <= r_off.lower_bound <= r_off.makespan <= 28.5
    assert r_off.schedule.num_offloaded() > 0
    assert r_no.schedule.num_offloaded() == 0


def test_result_is_the_simulators_and_incumbents_improve() -> None:
    pb = _pb(4, 8)
    seen: list[Incumbent] = []
    res = solve(
        pb,
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=30.0,
        workers=1,
        seed=1,
        on_incumbent=seen.append,
        use_baselines=False,
    )
    sched = res.schedule
    assert sched.generator == "optpipe"
    assert sched.params["backend"] == "cpsat" and sched.params["seed"] == 1
    assert sched.params["time_limit"] == UNBOUNDED_SECONDS
    assert sched.problem_hash == pb.hash
    ev = simulate(pb, sched).evaluation
    assert ev.feasible and ev.makespan == res.makespan
    assert sched.evaluation == ev
    assert max(ev.peak_memory) <= 2.0 + 1e-9
    assert seen == res.incumbents and len(seen) >= 2
    spans = [i.makespan for i in seen]
    assert spans == sorted(spans, reverse=True) and len(set(spans)) == len(spans)
    assert spans[-1] == res.makespan
    assert seen[0].source.startswith("heuristic:")
    assert all(i.bound is not None and i.bound <= res.makespan for i in seen)
    assert 0 <= res.first_solution_seconds <= seen[-1].wall_time <= res.solve_seconds
    assert res.lower_bound <= res.makespan
    assert res.gap == pytest.approx((res.makespan - res.lower_bound) / res.makespan)


@pytest.mark.parametrize(
    "pb",
    [
        _pb(4, 8, limit=None, offload=False),
        _pb(4, 8, limit=4.0, offload=False),
        _pb(4, 8, limit=2.0),
        _pb(4, 8, v=2, limit=2.0),
        _pb(4, 8, v=2, limit=None, offload=False, placement="interleaved"),
        # a fused backward 0.75 x (B + W): the baselines' BW against the solver's fused choice
        _pb(4, 8, limit=None, offload=False).with_changes(t_bw=1.5),
        _pb(4, 8, v=2, limit=2.0).with_changes(t_bw=0.75),
    ],
    ids=[
        "unlimited",
        "mem4-no-offload",
        "mem2-offload",
        "vshape-mem2-offload",
        "interleaved",
        "fused-cheaper",
        "fused-cheaper-vshape-mem2-offload",
    ],
)
def test_never_slower_than_any_feasible_baseline_or_heuristic(pb: Problem) -> None:
    res = solve(pb, time_limit=UNBOUNDED_SECONDS, workers=1, seed=0, deterministic_time=1.0)
    others = [s for _, s in baseline_schedules(pb)] + heuristic_schedules(pb)
    feasible = [s.evaluation.makespan for s in others if s.evaluation and s.evaluation.feasible]
    assert feasible, "at least the heuristics give a schedule"
    assert res.makespan <= min(feasible) + 1e-9
    assert lower_bound(pb) <= res.lower_bound <= res.makespan + 1e-9


@pytest.mark.parametrize("p,m,v", [(2, 3, 1), (4, 8, 1), (3, 6, 2), (8, 32, 1)])
def test_cheap_bound_never_exceeds_any_schedule(p: int, m: int, v: int) -> None:
    for limit, off in [(None, False), (2.0, True), (3.0, False)]:
        pb = _pb(p, m, v=v, limit=limit, offload=off)
        lb = lower_bound(pb)
        for s in heuristic_schedules(pb):
            assert s.evaluation is not None and s.evaluation.makespan is not None
            assert lb <= s.evaluation.makespan + 1e-9


def test_unlimited_bound_is_tight_for_uniform_stages() -> None:
    # m(F+B+W) + (p-1)F, proved optimal in the solver note (27 / 103)
    assert lower_bound(_pb(4, 8, limit=None, offload=False)) == pytest.approx(27.0)
    assert lower_bound(_pb(8, 32, limit=None, offload=False)) == pytest.approx(103.0)


def test_heuristic_backend_answers_without_a_solver() -> None:
    res = solve(_pb(8, 32), backend="heuristic", time_limit=UNBOUNDED_SECONDS, use_baselines=False)
    assert res.backend == "heuristic"
    assert res.status == "heuristic"
    assert res.makespan <= 110.0  # the offload-aware list scheduler
    assert res.schedule.evaluation is not None and res.schedule.evaluation.feasible
    # the drain argument: the last stage holds at most 2 deferred W-parts beside its last B's
    # activation, and idles 5 of the 8 units of backward chain below it (103 -> 108)
    assert res.lower_bound == pytest.approx(108.0)
    assert res.gap == pytest.approx((res.makespan - 108.0) / res.makespan)


def test_stop_event_ends_the_search_early() -> None:
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    try:
        res = solve(_pb(8, 32), time_limit=60, workers=1, stop=stop, use_baselines=False)
    finally:
        timer.cancel()
    assert res.solve_seconds < 20
    assert res.schedule.evaluation is not None and res.schedule.evaluation.feasible


def test_unknown_backend_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown solver backend 'cplex'; one of auto, cpsat"):
        solve(_pb(2, 2), backend="cplex")


def test_hint_is_used_and_foreign_hint_is_ignored() -> None:
    pb = _pb(4, 8)
    first = solve(pb, backend="heuristic", use_baselines=False)
    res = solve(pb, backend="heuristic", hint=first.schedule, use_baselines=False)
    assert res.makespan <= first.makespan
    other = solve(_pb(4, 8, limit=3.0), backend="heuristic", use_baselines=False)
    res2 = solve(pb, backend="heuristic", hint=other.schedule, use_baselines=False)
    assert res2.message is not None and "another problem" in res2.message


def test_backend_starts_from_the_bound_rounded_up_to_whole_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # with exact ticks every simulated time is a whole number of them, so CP-SAT may start at the
    # bound rounded up; rounded down (207.5 for 208) it searched on after meeting the bound
    import optpipe_lightning.solver.cpsat as cpsat

    seen: dict[str, object] = {}

    def fake(problem: Problem, tm: object, **kw: object) -> cpsat.CpOutcome:
        seen.update(kw, tick=tm.tick, exact=tm.exact)
        return cpsat.CpOutcome("unknown", None, None, 0.0)

    monkeypatch.setattr(cpsat, "solve_cpsat", fake)
    # the backend must be reached on any machine: no wall limit cuts the phases before it
    pb = bench_problem(8, 32, 1, 0.5, 0.5)  # drain bound 104, times in halves
    res = solve(pb, time_limit=UNBOUNDED_SECONDS, use_baselines=False, lns=False)
    assert res.lower_bound == pytest.approx(104.0)
    assert seen["exact"] is True
    assert seen["lower_bound"] == round(104.0 / float(seen["tick"]))  # type: ignore[arg-type]


def test_cpsat_reaches_its_search_where_every_op_lasts_one_tick() -> None:
    # two chunks of F = B = W: each device's no-overlap becomes an all-different, which presolve
    # used to expand into value literals (4x16x2: 5-10 s of presolve; 8x32x2: past a 60 s
    # limit). Kept whole, the relaxed model takes its hint within about a second.
    from optpipe_lightning.solver.cpsat import solve_cpsat
    from optpipe_lightning.solver.heuristics import default_rules, run_rule
    from optpipe_lightning.solver.hints import tick_times
    from optpipe_lightning.solver.ticks import tick_model

    pb = bench_problem(4, 16, 2, 0.5, 2.0)
    best = run_rule(pb, default_rules(pb)[0])  # the memory-fitted order, no copies
    assert best is not None and best.evaluation is not None and best.evaluation.makespan
    tm = tick_model(pb, best.evaluation.makespan * 1.1)
    hint = tick_times(pb, best, tm)
    assert hint is not None and tm.exact
    assert all(tm.duration(op, s, c) == 1 for op in "FBW" for s in range(4) for c in range(2))
    out = solve_cpsat(
        pb,
        tm,
        horizon=hint[2],
        lower_bound=0,
        hint=(hint[0], hint[1]),
        time_limit=UNBOUNDED_SECONDS,
        # the hint is taken within 0.2 of deterministic time (about a second of one core);
        # expanded, presolve alone took 5-10 s
        deterministic_time=0.2,
        gap_target=0.0,
        seed=0,
        workers=1,
        on_solution=None,
        stop=None,
        tight=False,
    )
    assert out.status in ("feasible", "optimal")
    assert out.objective is not None and out.objective <= hint[2]
