"""Arguments 8 and 9 of the bound: one device's relaxation solved exactly on its state graph
(``solver/steady_bound.py``)."""

from __future__ import annotations

import importlib
import threading
import time

import pytest
from bench_problems import bench_problem, brute_problem
from solver_budget import UNBOUNDED_SECONDS

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.steady_bound import (
    DeviceSteadyState,
    device_steady_state,
    device_walk,
    steady_state_bound,
)

# what a solve reaches is asserted on its deterministic budget, never the wall clock
pytestmark = pytest.mark.usefixtures("deterministic_cpsat")

HORIZON = 1000.0
# CP-SAT's deterministic time for a reference optimum: 4x8x1 at half the memory, copies 1x, is
# proven optimal (39) after about 2.6 (12 s of one core)
REFERENCE_WORK = 60.0
solve_module = importlib.import_module("optpipe_lightning.solver.solve")


def _steady(pb: Problem, s: int) -> DeviceSteadyState:
    got = device_steady_state(pb, s, horizon=HORIZON)
    assert isinstance(got, DeviceSteadyState), got
    return got


_OPTIMA: dict[str, float] = {}


def _reference_optimum(pb: Problem, monkeypatch: pytest.MonkeyPatch) -> float:
    """CP-SAT's proven optimum, without argument 8 in its bound (an independent reference)."""
    if pb.hash in _OPTIMA:
        return _OPTIMA[pb.hash]
    with monkeypatch.context() as mp:
        mp.setattr(solve_module, "steady_state_bound", lambda *a, **k: 0.0)
        res = solve(
            pb,
            backend="cpsat",
            time_limit=UNBOUNDED_SECONDS,
            workers=1,
            seed=0,
            deterministic_time=REFERENCE_WORK,
        )
    assert res.status == "optimal", (pb.name, res.status)
    _OPTIMA[pb.hash] = res.makespan
    return res.makespan


@pytest.mark.parametrize(
    "pb",
    [
        bench_problem(4, 8, 1, 0.5, 1.0),
        bench_problem(3, 6, 1, 0.34, 2.0),
        bench_problem(3, 6, 1, 0.67, 0.5),
        bench_problem(2, 4, 1, 0.5, 2.0),
        brute_problem(3, 3, limit=4.0),  # no offload
        brute_problem(3, 3, limit=4.0, offload=True, bandwidth=1.0),
        brute_problem(2, 3, limit=3.0, offload=True, bandwidth=2.0),
        bench_problem(2, 4, 2, 0.5, 2.0),  # two chunks per device
        Problem.model_validate(  # the same, interleaved instead of a V
            {
                **bench_problem(2, 4, 2, 0.5, 2.0).model_dump(),
                "placement": "interleaved",
                "name": "2x4x2 interleaved",
            }
        ),
    ],
    ids=lambda pb: pb.name or "brute",
)
def test_steady_bound_never_exceeds_the_optimum(
    pb: Problem, monkeypatch: pytest.MonkeyPatch
) -> None:
    optimum = _reference_optimum(pb, monkeypatch)
    for s in range(pb.num_stages):
        got = _steady(pb, s)
        assert got.bound <= optimum + 1e-9, (s, got)
        assert got.cycle is None or got.per_microbatch <= got.cycle + 1e-9
        # the whole walk is at least its steady state (argument 9 >= argument 8)
        assert got.walk is not None and got.walk >= got.steady - 1e-9
        assert got.bound == max(got.walk, got.steady)


def test_steady_bound_proves_more_than_the_cheap_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """4x8x1, half of 1F1B's memory, copies as slow as the compute: the cheap bound is 31.38,
    the steady state of device 0 proves 36 (4.5 per microbatch, a cycle achieves it), its whole
    walk 38, and the optimum is 39."""
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    got = _steady(pb, 0)
    assert lower_bound(pb) == pytest.approx(31.3846, abs=1e-4)
    assert got.per_microbatch == pytest.approx(4.5)
    assert got.cycle == pytest.approx(4.5)
    assert got.steady == pytest.approx(36.0)
    # start and end: no backward before the first round trip, the drain after the last forward
    assert got.walk == pytest.approx(38.0)
    assert _reference_optimum(pb, monkeypatch) == pytest.approx(39.0)


def test_two_chunks_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """2x4x2 at half of 1F1B's memory, copies 2x: device 1 holds both chunks of the turn of the
    V, whose activations are held too briefly to move. Its walk is the optimum, 16.5, where the
    cheap bound is 13.5."""
    pb = bench_problem(2, 4, 2, 0.5, 2.0)
    assert lower_bound(pb) == pytest.approx(13.5)
    got = _steady(pb, 1)
    assert got.walk == pytest.approx(16.5)
    assert got.walk == pytest.approx(_reference_optimum(pb, monkeypatch))


def test_the_walk_proves_what_cpsat_alone_does_not() -> None:
    """2x4x2 at a quarter of the memory, copies 2x: CP-SAT alone stays at "feasible" 39 after
    40 s (measured); device 1's walk proves 39, so the solve ends optimal (CP-SAT finds 39 in a
    deterministic time of about 0.4)."""
    pb = bench_problem(2, 4, 2, 0.25, 2.0)
    assert _steady(pb, 1).walk == pytest.approx(39.0)
    res = solve(
        pb,
        backend="cpsat",
        time_limit=UNBOUNDED_SECONDS,
        workers=1,
        seed=0,
        deterministic_time=10.0,
    )
    assert res.makespan == pytest.approx(39.0)
    assert res.lower_bound == pytest.approx(39.0)
    assert res.status == "optimal"


def test_without_copies_the_walk_is_the_bound() -> None:
    """No offload: each device's graph without copies is its whole graph, so the search takes
    its walk directly."""
    pb = brute_problem(3, 3, limit=4.0)
    best = max(_steady(pb, s).bound for s in range(3))
    got = steady_state_bound(pb, horizon=HORIZON, deadline=time.perf_counter() + 30)
    assert got == pytest.approx(best)


def test_steady_bound_is_exact_where_one_device_limits() -> None:
    """4x8x1 at a quarter of the memory with copies 2x: stage 0 holds one activation at a time
    (9 per microbatch), and 8 x 9 = 72 is the optimum (BENCHMARKS.md: proven by CP-SAT)."""
    got = _steady(bench_problem(4, 8, 1, 0.25, 2.0), 0)
    assert got.per_microbatch == pytest.approx(9.0)
    assert got.bound == pytest.approx(72.0)


def test_solve_reports_the_steady_bound() -> None:
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    res = solve(pb, backend="heuristic", time_limit=UNBOUNDED_SECONDS, workers=1, seed=0)
    assert res.lower_bound == pytest.approx(38.0)
    assert res.lower_bound <= res.makespan


def test_where_it_does_not_run() -> None:
    fused = brute_problem(3, 3, limit=4.0, t_bw=2.5)
    assert device_steady_state(fused, 0, horizon=HORIZON) == (
        "a fused backward is cheaper than B + W (not modelled)"
    )
    unlimited = bench_problem(4, 8, 1, None, 1.0)
    assert device_steady_state(unlimited, 0, horizon=HORIZON) == "no memory limit"
    assert steady_state_bound(unlimited, horizon=HORIZON, deadline=time.perf_counter() + 5) == 0
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    assert device_steady_state(pb, 0, horizon=HORIZON, max_states=100) == "too many states"
    past = time.perf_counter() - 1
    assert device_steady_state(pb, 0, horizon=HORIZON, deadline=past) == "out of time"
    assert steady_state_bound(pb, horizon=HORIZON, deadline=past) == 0


def test_a_stop_ends_it() -> None:
    """The solver's stop event ends the search between states: 8x32x1 at a quarter of the
    memory, copies 2x, builds a graph of about 93,000 states for device 0 (about 15 s)."""
    pb = bench_problem(8, 32, 1, 0.25, 2.0)
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    t0 = time.perf_counter()
    got = steady_state_bound(pb, horizon=HORIZON, deadline=time.perf_counter() + 120, stop=stop)
    timer.join()
    assert time.perf_counter() - t0 < 5.0
    assert got == 0.0  # nothing was proven before the stop


@pytest.mark.parametrize(
    ("pb", "s"),
    [(bench_problem(4, 8, 1, 0.5, 1.0), 0), (bench_problem(2, 4, 2, 0.25, 2.0), 1)],
    ids=["4x8x1", "2x4x2"],
)
def test_the_solver_takes_the_walk_alone(pb: Problem, s: int) -> None:
    """``device_walk`` (what ``steady_state_bound`` runs, without the cycle search) is the same
    walk, and ``steady_state_bound`` takes the best device's."""
    walk = device_walk(pb, s, horizon=HORIZON)
    assert walk == _steady(pb, s).walk
    got = steady_state_bound(pb, horizon=HORIZON, deadline=time.perf_counter() + 30)
    assert got == max(_steady(pb, d).bound for d in range(pb.num_stages))
