"""Argument 8 of the bound: one device's exact steady state (``solver/steady_bound.py``)."""

from __future__ import annotations

import importlib
import time

import pytest
from bench_problems import bench_problem, brute_problem

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.steady_bound import (
    DeviceSteadyState,
    device_steady_state,
    steady_state_bound,
)

HORIZON = 1000.0
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
        res = solve(pb, backend="cpsat", time_limit=30, workers=1, seed=0)
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


def test_steady_bound_proves_more_than_the_cheap_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """4x8x1, half of 1F1B's memory, copies as slow as the compute: the cheap bound is 31.38,
    the steady state of device 0 proves 36 (4.5 per microbatch, a cycle achieves it), and the
    optimum is 39."""
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    got = _steady(pb, 0)
    assert lower_bound(pb) == pytest.approx(31.3846, abs=1e-4)
    assert got.per_microbatch == pytest.approx(4.5)
    assert got.cycle == pytest.approx(4.5)
    assert got.bound == pytest.approx(36.0)
    assert _reference_optimum(pb, monkeypatch) == pytest.approx(39.0)


def test_steady_bound_is_exact_where_one_device_limits() -> None:
    """4x8x1 at a quarter of the memory with copies 2x: stage 0 holds one activation at a time
    (9 per microbatch), and 8 x 9 = 72 is the optimum (BENCHMARKS.md: proven by CP-SAT)."""
    got = _steady(bench_problem(4, 8, 1, 0.25, 2.0), 0)
    assert got.per_microbatch == pytest.approx(9.0)
    assert got.bound == pytest.approx(72.0)


def test_solve_reports_the_steady_bound() -> None:
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    res = solve(pb, backend="heuristic", time_limit=20, workers=1, seed=0)
    assert res.lower_bound == pytest.approx(36.0)
    assert res.lower_bound <= res.makespan


def test_where_it_does_not_run() -> None:
    assert device_steady_state(bench_problem(4, 8, 2, 0.5, 1.0), 0, horizon=HORIZON) == (
        "one chunk per stage only"
    )
    unlimited = bench_problem(4, 8, 1, None, 1.0)
    assert device_steady_state(unlimited, 0, horizon=HORIZON) == "no memory limit"
    assert steady_state_bound(unlimited, horizon=HORIZON, deadline=time.perf_counter() + 5) == 0
    pb = bench_problem(4, 8, 1, 0.5, 1.0)
    assert device_steady_state(pb, 0, horizon=HORIZON, max_states=100) == "too many states"
    past = time.perf_counter() - 1
    assert device_steady_state(pb, 0, horizon=HORIZON, deadline=past) == "out of time"
    assert steady_state_bound(pb, horizon=HORIZON, deadline=past) == 0
