"""The large-neighbourhood search (``solver/lns.py``): CP-SAT on windows of the incumbent.

Reproducible: one worker, a deterministic time per window and a number of windows (the wall
deadline is far away)."""

from __future__ import annotations

import time

import pytest

import optpipe_lightning.solver.backend as backend_mod
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.schedule.simulator import evaluate
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.lns import LnsStats, improve


def small(limit: float = 3.0, copy: float = 0.5) -> Problem:
    """4 x 8, F = B = W = 1, activation 1 (B frees half), 3 activations per stage, copies of
    ``copy`` x an F."""
    return Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1,
        t_b=1,
        t_w=1,
        m_f=1,
        m_b=-0.5,
        m_w=-0.5,
        memory_limit=limit,
        offload={"bytes": 1, "d2h_bandwidth": 1 / copy, "h2d_bandwidth": 1 / copy},
    )


def _improve(pb: Problem, name: str, windows: int, **kw: object) -> tuple[float, float, LnsStats]:
    start = generate(name, pb)
    assert start.evaluation is not None and start.evaluation.makespan is not None
    stats = LnsStats()
    seen: list[float] = []
    out = improve(
        pb,
        start,
        deadline=time.perf_counter() + 600,
        on_better=lambda s: seen.append(s.evaluation.makespan),  # type: ignore[union-attr]
        workers=1,
        deterministic_time=0.1,
        max_windows=windows,
        stats=stats,
        **kw,  # type: ignore[arg-type]
    )
    ev = out.evaluation
    assert ev is not None and ev.feasible and ev.makespan is not None
    assert evaluate(pb, out) == ev  # the simulator's evaluation of exactly its actions
    assert seen == stats.makespans  # every improvement was reported, in order
    assert seen == sorted(seen, reverse=True)
    return start.evaluation.makespan, ev.makespan, stats


@pytest.mark.xfail(
    strict=True,
    reason="issue 34: the windows reached the bound 27 when an offload's bytes left at its copy's "
    "end; under settle points (CP-SAT's conservative settle delay) they reach 28.5; whether 27 "
    "is still attainable was not re-established",
)
def test_lns_improves_a_greedy_schedule_to_the_bound() -> None:
    """ZB's memory-limited greedy gives 37 here; windows of the whole schedule reach 27, the
    lower bound (so optimal), where the search stops."""
    pb = small()
    before, after, stats = _improve(
        pb, "zb-auto", windows=8, window_ops=1000, lower_bound=lower_bound(pb)
    )
    assert before == pytest.approx(37.0)
    assert after == pytest.approx(lower_bound(pb)) and after == pytest.approx(27.0)
    assert stats.improved >= 1


def test_lns_small_windows_keep_what_is_fixed_and_never_get_worse() -> None:
    pb = small(limit=2.0, copy=1.0)
    before, after, stats = _improve(pb, "zb-auto", windows=12, window_ops=24)
    assert after <= before
    assert stats.windows == 12


def test_lns_keeps_a_schedule_it_cannot_improve() -> None:
    pb = small().with_changes(memory_limit=None, offload=None)
    start = generate("zb-h1", pb)  # 27: the bound
    stats = LnsStats()
    out = improve(
        pb,
        start,
        deadline=time.perf_counter() + 600,
        workers=1,
        deterministic_time=0.1,
        max_windows=3,
        stats=stats,
    )
    assert out is start and 1 <= stats.windows <= 3 and stats.improved == 0
    # at the bound it does not even start
    stats = LnsStats()
    at = lower_bound(pb)
    out = improve(pb, start, deadline=time.perf_counter() + 600, lower_bound=at, stats=stats)
    assert out is start and stats.windows == 0


def test_solve_with_and_without_lns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where CP-SAT's exact model is too large LNS runs before the backend (here made to count
    as too large), and its improvements are the solve's incumbents."""
    monkeypatch.setattr(backend_mod, "TIGHT_MODEL_MAX", 0)
    pb = small(limit=2.0, copy=1.0)
    kw = dict(time_limit=4, workers=1, seed=0, deterministic_time=0.1, use_baselines=False)
    with_lns = solve(pb, **kw)  # type: ignore[arg-type]
    assert "lns" in with_lns.schedule.params["phase_seconds"]
    without = solve(pb, lns=False, **kw)  # type: ignore[arg-type]
    assert "lns" not in without.schedule.params["phase_seconds"]
    monkeypatch.setattr(backend_mod, "TIGHT_MODEL_MAX", 10**9)
    small_model = solve(pb, **kw)  # type: ignore[arg-type]
    assert "lns" not in small_model.schedule.params["phase_seconds"]  # CP-SAT's exact model
