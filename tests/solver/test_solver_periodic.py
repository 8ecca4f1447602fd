"""Periodic patterns (``solver.periodic``): valid when unrolled, and better where copies are slow."""

from __future__ import annotations

import importlib
import itertools
import time
from collections import defaultdict

import pytest
from bench_problems import bench_problem, one_lane
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.lanes import lane_of
from optpipe_lightning.solver import periodic, solve
from optpipe_lightning.solver.backend import schedule_from_ticks
from optpipe_lightning.solver.heuristics import heuristic_schedules
from optpipe_lightning.solver.ticks import OpKey, TickModel, tick_model

solve_module = importlib.import_module("optpipe_lightning.solver.solve")


def _list_best(pb: Problem) -> float:
    return min(
        s.evaluation.makespan
        for s in heuristic_schedules(pb)
        if s.evaluation is not None and s.evaluation.feasible and s.evaluation.makespan is not None
    )


# 6 stages x 18 microbatches, half of 1F1B's memory, copies 1x, on one lane for both directions:
# the instance the numbers below were measured on
SLOW6 = one_lane(bench_problem(6, 18, 1, 0.5, 1.0))


def _check_timed(pb: Problem, tm: TickModel, starts: dict[OpKey, int], ends: dict[OpKey, int]):
    """Every rule of the problem, on the planned times themselves (not the simulator's re-timing):
    chains and hops, one op at a time per device and per copy lane, memory within the limit."""
    table = pb.group_table
    G = len(table)
    for j in range(pb.num_microbatches):
        for g, (s, c) in enumerate(table):
            f, b, w = (("F", s, c, j), ("B", s, c, j), ("W", s, c, j))
            assert f in starts and b in starts and w in starts
            if g:
                ps, pc = table[g - 1]
                lag = tm.comm[ps][pc] if ps != s else 0
                assert starts[f] >= ends[("F", ps, pc, j)] + lag
            if g + 1 < G:
                ns, nc = table[g + 1]
                lag = tm.comm[ns][nc] if ns != s else 0
                assert starts[b] >= ends[("B", ns, nc, j)] + lag
            assert starts[b] >= ends[f] and starts[w] >= ends[b]
            o, r = ("OFFLOAD", s, c, j), ("RELOAD", s, c, j)
            assert (o in starts) == (r in starts)
            if o in starts:
                assert starts[o] >= ends[f] and starts[r] >= ends[o] and starts[b] >= ends[r]
    busy: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for key, st in starts.items():
        op, s, _c, _j = key
        where = ("lane", lane_of(pb, s, op)) if op in ("OFFLOAD", "RELOAD") else ("dev", s)
        busy[where].append((st, ends[key]))
    for spans in busy.values():
        spans.sort()
        for (_a0, a1), (b0, _b1) in itertools.pairwise(spans):
            assert a1 <= b0
    limits = pb.memory_limits()
    events: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    cost = {n: pb.cost(n) for n in ("m_f", "m_b", "m_w", "offload_bytes")}
    for op, s, c, _j in starts:
        delta = {
            "F": (ends, cost["m_f"][s, c]),
            "B": (ends, cost["m_b"][s, c]),
            "W": (ends, cost["m_w"][s, c]),
            "OFFLOAD": (ends, -cost["offload_bytes"][s, c]),
            "RELOAD": (starts, cost["offload_bytes"][s, c]),
        }[op]
        t = delta[0][(op, s, c, _j)]
        events[s][t] += float(delta[1])
    for s, by_time in events.items():
        lim = limits[s]
        if lim is None:
            continue
        level = 0.0
        for t in sorted(by_time):
            level += by_time[t]
            assert level <= lim + 1e-9, f"stage {s} holds {level} > {lim} at tick {t}"


def test_periodic_search_applies_only_where_copies_are_as_slow_as_compute() -> None:
    assert periodic.applies(bench_problem(8, 32, 1, 0.25, 2.0))
    assert periodic.applies(bench_problem(8, 32, 1, 0.5, 1.0))
    assert periodic.applies(bench_problem(8, 32, 2, 0.25, 2.0))
    assert not periodic.applies(bench_problem(8, 32, 1, 0.25, 0.5))
    assert not periodic.applies(bench_problem(8, 32, 1, None, 2.0))
    assert not periodic.applies(bench_problem(8, 32, 1, 0.25, 2.0).with_changes(offload=None))


@pytest.mark.usefixtures("deterministic_cpsat")
@pytest.mark.xfail(
    strict=True,
    reason="issue 34: measured when an offload's bytes left at its copy's end; under settle "
    "points the list rules' best is 87 and the pattern model (conservative settle delay) finds "
    "no pattern under it in these budgets; not re-established",
)
def test_a_pattern_beats_every_list_rule_where_copies_are_as_slow_as_the_compute() -> None:
    # 6 stages x 18 microbatches, half of 1F1B's activation memory, a copy as long as a
    # microbatch's F + B + W: the list rules move in waves (85 at best); two microbatches every
    # 9 ticks, one of them offloaded on the low stages, give 79-80
    pb = SLOW6
    assert _list_best(pb) == pytest.approx(85.0)
    tm = tick_model(pb, 85.0)
    pat = periodic.solve_pattern(pb, tm, 2, 4, cutoff=84, time_limit=30.0, workers=1)
    assert pat is not None and pat.size == 2
    assert pat.makespan <= 80
    assert pat.offloaded  # the channel carries some activations, and not all of them
    assert len(pat.offloaded) < 2 * (pb.num_stages - 1)
    starts, ends = periodic.unrolled(pb, tm, pat)
    _check_timed(pb, tm, starts, ends)
    sched = schedule_from_ticks(pb, tm, starts, ends, "periodic")
    assert sched is not None and sched.evaluation is not None and sched.evaluation.feasible
    assert sched.evaluation.makespan is not None
    assert sched.evaluation.makespan <= pat.makespan * tm.tick


def _uneven(duplex: bool) -> Problem:
    """3 stages with p2p lags and uneven costs; stages 0 and 1 share one copy channel."""
    return Problem(
        num_stages=3,
        num_microbatches=12,
        t_f=[1.0, 2.0, 1.0],
        t_b=[2.0, 3.0, 2.0],
        t_w=[1.0, 1.0, 2.0],
        t_comm=0.5,
        m_f=2.0,
        m_b=-1.0,
        m_w=-1.0,
        memory_limit=[4.0, 4.0, 100.0],
        offload={
            "bytes": 2.0,
            "d2h_bandwidth": 0.5,
            "h2d_bandwidth": 0.5,
            "channel_groups": [[0, 1]],
            "duplex": duplex,
        },
    )


@pytest.mark.usefixtures("deterministic_cpsat")
@pytest.mark.parametrize(
    ("pb", "size", "window"),
    [
        # the narrowest window: instances meet only their neighbours
        (bench_problem(4, 12, 1, 0.5, 2.0), 1, 2),
        (bench_problem(4, 12, 1, 0.5, 2.0), 3, 2),
        (one_lane(bench_problem(4, 12, 1, 0.5, 2.0)), 3, 2),
        # two chunks per stage (V-shape), several of them on one device's channel
        (bench_problem(4, 12, 2, 0.5, 2.0), 2, 3),
        (one_lane(bench_problem(4, 12, 2, 0.5, 2.0)), 2, 3),
        # p2p lags, uneven stages and one copy channel shared by stages 0 and 1
        (_uneven(True), 2, 2),
        (_uneven(False), 2, 2),
    ],
)
def test_unrolled_patterns_keep_every_rule(pb: Problem, size: int, window: int) -> None:
    tm = tick_model(pb, 1000.0)
    big = 10 * tm.to_ticks(_list_best(pb))
    pat = periodic.solve_pattern(pb, tm, size, window, cutoff=big, time_limit=20.0, workers=1)
    assert pat is not None
    starts, ends = periodic.unrolled(pb, tm, pat)
    assert max(ends.values()) == pat.makespan  # the model's objective is the unrolled makespan
    _check_timed(pb, tm, starts, ends)
    sched = schedule_from_ticks(pb, tm, starts, ends, "periodic")
    assert sched is not None and sched.evaluation is not None and sched.evaluation.feasible


@pytest.mark.usefixtures("deterministic_cpsat")
def test_a_repeated_pattern_is_the_same_schedule() -> None:
    pb = bench_problem(4, 12, 1, 0.5, 2.0)
    tm = tick_model(pb, 1000.0)
    pat = periodic.solve_pattern(pb, tm, 2, 3, cutoff=10_000, time_limit=20.0, workers=1)
    assert pat is not None
    twice = periodic.repeated(pat, 2)
    assert twice.size == 4 and twice.period == 2 * pat.period
    assert periodic.unrolled(pb, tm, twice) == periodic.unrolled(pb, tm, pat)
    # as a hint it is feasible for the larger model: that model finds it (or better) at once
    pat4 = periodic.solve_pattern(
        pb, tm, 4, 3, cutoff=pat.makespan, time_limit=20.0, workers=1, hint=pat
    )
    assert pat4 is not None and pat4.makespan <= pat.makespan


@pytest.mark.usefixtures("deterministic_cpsat")
def test_search_yields_better_patterns() -> None:
    pb = SLOW6
    tm = tick_model(pb, 85.0)
    deadline = time.perf_counter() + UNBOUNDED_SECONDS  # each pattern: its deterministic budget
    found = list(
        periodic.search(pb, tm, incumbent=85.0, lower_bound=60.0, deadline=deadline, workers=1)
    )
    assert found
    spans = [p.makespan for p in found]
    assert spans == sorted(spans, reverse=True) and len(set(spans)) == len(spans)
    assert spans[0] < 85
    # a problem too short for any window of two repeats yields nothing
    assert not list(
        periodic.search(
            bench_problem(4, 8, 1, 0.5, 2.0),
            tick_model(bench_problem(4, 8, 1, 0.5, 2.0), 41.0),
            incumbent=41.0,
            lower_bound=30.0,
            deadline=time.perf_counter() + 2.0,
        )
    )


def test_search_keeps_its_deadline() -> None:
    """On the wall clock (no deterministic budget here): whatever it found by then."""
    pb = bench_problem(6, 18, 1, 0.5, 1.0)
    tm = tick_model(pb, 85.0)
    t0 = time.perf_counter()
    for _ in periodic.search(pb, tm, incumbent=85.0, lower_bound=60.0, deadline=t0 + 2.0):
        pass
    assert (
        time.perf_counter() - t0 < 2.0 + 10.0
    )  # CP-SAT stops on its wall limit (busy machine: slack)


@pytest.mark.usefixtures("deterministic_cpsat")
@pytest.mark.xfail(
    strict=True,
    reason="issue 34: measured when an offload's bytes left at its copy's end; under settle "
    "points the list rules' best is 87 and the pattern model (conservative settle delay) finds "
    "no pattern under it in these budgets; not re-established",
)
def test_search_ends_when_the_first_sizes_come_nowhere_near(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no pattern of K = 1, 2, 4 comes within 1% of the incumbent: the larger sizes are not tried
    # (their time goes to the full model); one that does keeps the search going
    pb = SLOW6
    tm = tick_model(pb, 85.0)
    tried: list[int] = []
    real = periodic.solve_pattern

    def no_better(problem: Problem, tmod: TickModel, size: int, *a: object, **k: object) -> None:
        tried.append(size)

    monkeypatch.setattr(periodic, "period_lower_bound", lambda *_a: 1)
    monkeypatch.setattr(periodic, "solve_pattern", no_better)
    deadline = time.perf_counter() + UNBOUNDED_SECONDS
    assert not list(periodic.search(pb, tm, incumbent=85.0, lower_bound=1.0, deadline=deadline))
    assert tried == list(periodic.PATTERN_SIZES[: periodic.PROBE_SIZES])

    tried.clear()

    def better_at_2(problem: Problem, tmod: TickModel, size: int, *a: object, **k: object):  # type: ignore[no-untyped-def]
        tried.append(size)
        return real(problem, tmod, 2, 3, cutoff=85, time_limit=3.0) if size == 2 else None

    monkeypatch.setattr(periodic, "solve_pattern", better_at_2)
    deadline = time.perf_counter() + UNBOUNDED_SECONDS
    found = list(periodic.search(pb, tm, incumbent=85.0, lower_bound=1.0, deadline=deadline))
    assert found and len(tried) > periodic.PROBE_SIZES
    # the same pattern (80 ticks) against an incumbent of 76: 5% over, the search ends
    tried.clear()
    assert found[0].makespan == 80
    deadline = time.perf_counter() + UNBOUNDED_SECONDS
    assert not list(periodic.search(pb, tm, incumbent=76.0, lower_bound=1.0, deadline=deadline))
    assert tried == list(periodic.PATTERN_SIZES[: periodic.PROBE_SIZES])


@pytest.mark.usefixtures("deterministic_cpsat")
@pytest.mark.cpsat_cap(1.0)  # each pattern and the backend: 1 of deterministic time
def test_solve_runs_the_periodic_search_where_copies_are_slow() -> None:
    pb = SLOW6
    # the large-neighbourhood search is not what this test is about (it takes 40 s here)
    res = solve(pb, time_limit=UNBOUNDED_SECONDS, deterministic_time=1.0, workers=1, lns=False)
    assert res.makespan < 85
    assert "periodic" in res.schedule.params["phase_seconds"]
    assert any(i.source.startswith("periodic:K=") for i in res.incumbents)
    fast = solve(
        one_lane(bench_problem(6, 18, 1, 0.5, 0.5)),
        time_limit=UNBOUNDED_SECONDS,
        deterministic_time=1.0,
        workers=1,
        lns=False,
    )
    assert "periodic" not in fast.schedule.params["phase_seconds"]


@pytest.mark.usefixtures("deterministic_cpsat")
def test_period_lower_bound_by_hand_and_below_every_pattern_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16x64x1 at a quarter of the memory (4 activations), copies 2x (6 ticks each way): stage 0
    # holds an activation 31 ticks from its F's end to its B's end, 1 more during the F and half
    # of one during W: 32.5 per microbatch; an offloaded one saves 31 - (12 + 1) + 1 = 19.
    # One lane (an offload keeps it 12 ticks): one microbatch per period, 32.5 / 4 -> 9 (no
    # copy fits in a period under 12); two, 65 / 4 > 12 without offload, and at 12 one offload
    # gives 46 <= 48 -> 12. Duplex lanes (6 ticks on each): one per period, at 6 one offload
    # gives 13.5 <= 24 (at 5 none fits: 32.5 > 20) -> 6; two, at 11 one offload gives 46 > 44,
    # at 12 two fit -> 12
    pb = bench_problem(16, 64, 1, 0.25, 2.0)
    tm = tick_model(pb, 1000.0)
    assert periodic.period_lower_bound(pb, tm, 1) == 6
    assert periodic.period_lower_bound(pb, tm, 2) == 12
    half = one_lane(pb)
    assert periodic.period_lower_bound(half, tm, 1) == 9
    assert periodic.period_lower_bound(half, tm, 2) == 12
    # the least periods the model finds without the bound (which also bounds the model's T):
    # any pattern found, optimal or not, has a period at least the bound
    bound = periodic.period_lower_bound
    monkeypatch.setattr(periodic, "period_lower_bound", lambda *_a: 1)
    small = SLOW6
    tm = tick_model(small, 85.0)
    for size in (1, 2, 3):
        least = periodic.solve_pattern(
            small, tm, size, 3, cutoff=10_000, time_limit=1.0, minimize_period=True
        )
        assert least is not None
        assert least.period >= bound(small, tm, size)
