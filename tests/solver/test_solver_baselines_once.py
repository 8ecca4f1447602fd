"""Issue 32.2 / 33.4: no baseline is computed twice in one command (calls counted), the strongest
baselines are computed first, a generator stops at its deadline between its own checks, and
``baseline`` takes the sizes the docs allow."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bench_problems import bench_problem
from typer.testing import CliRunner

import optpipe_lightning.schedule.baselines as baselines
from optpipe_lightning.cli import app
from optpipe_lightning.cli.size_guard import MAX_UNITS, STRONGEST_SHARE, CompareBudget
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines._deadline import (
    DeadlineExceeded,
    deadline_at,
    interruptible,
    timer_available,
)
from optpipe_lightning.schedule.chunking import chunkings, rechunk
from optpipe_lightning.solver import solve
from optpipe_lightning.solver.candidates import (
    CLOSED_FORM_BASELINES,
    STRONGEST_BASELINES,
    baseline_order,
)

runner = CliRunner()


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every baseline computed, as (name, problem hash), in order."""
    real = baselines.generate
    calls: list[tuple[str, str]] = []

    def generate(name: str, problem: Problem) -> Any:
        calls.append((name, problem.hash))
        return real(name, problem)

    monkeypatch.setattr(baselines, "generate", generate)
    return calls


def test_compare_computes_every_baseline_once_the_strongest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pb = bench_problem(4, 8, 2, 0.5, 0.5)
    path = tmp_path / "p.json"
    path.write_text(pb.model_dump_json())
    calls = _count_calls(monkeypatch)
    args = ["compare", str(path), "--json", "--time-limit", "20", "--solver", "heuristic"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    twice = [k for k, n in Counter(calls).items() if n > 1]
    assert not twice, twice
    names = list(dict.fromkeys(n for n, _ in calls))
    k = len(CLOSED_FORM_BASELINES)
    assert names[k : k + len(STRONGEST_BASELINES)] == list(STRONGEST_BASELINES)
    doc = json.loads(res.stdout)
    # the rows keep the usual order whatever order they were computed in
    shown = [r["name"] for r in doc["schedules"]][:-1]
    assert shown == [n for n in baselines.BASELINE_NAMES if n in shown]


def test_solve_does_not_recompute_a_baseline_given_as_a_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pb = bench_problem(4, 8, 1, 0.5, 0.5)
    given = baselines.generate("adaoffload", pb)
    calls = _count_calls(monkeypatch)
    res = solve(pb, backend="heuristic", time_limit=30, candidates=[given], lns=False)
    names = Counter(n for n, _ in calls)
    assert "adaoffload" not in names
    assert names and max(names.values()) == 1  # the others ran, once each
    assert res.makespan <= given.evaluation.makespan + 1e-9  # type: ignore[union-attr]


def test_the_order_puts_the_strongest_next_to_first_only_under_a_memory_limit() -> None:
    order = baseline_order(bench_problem(4, 8, 1, 0.5, 0.5))
    k = len(CLOSED_FORM_BASELINES)
    assert order[:k] == list(CLOSED_FORM_BASELINES)
    assert order[k : k + 2] == list(STRONGEST_BASELINES)
    assert baseline_order(bench_problem(4, 8, 1, None, 0.5)) == list(baselines.BASELINE_NAMES)


def test_the_strongest_baselines_have_a_longer_share_of_compare() -> None:
    pb = bench_problem(4, 8, 1, 0.5, 0.5)
    b = CompareBudget(pb, 20.0, solving=True, started=100.0)
    assert b.baselines_until == 110.0 and b.strongest_until == 100.0 + STRONGEST_SHARE * 20.0
    b = CompareBudget(pb, 20.0, solving=False, started=100.0)
    assert b.baselines_until == b.strongest_until == 120.0


@pytest.mark.skipif(not timer_available(), reason="no interval timer here")
def test_a_generator_is_stopped_at_its_deadline_between_its_own_checks() -> None:
    spins = 0

    def never_checks(_: object) -> None:
        nonlocal spins
        while True:  # no check_deadline(): only the timer can stop it
            spins += 1

    with pytest.raises(DeadlineExceeded), deadline_at(time.perf_counter() + 0.05):
        interruptible(never_checks, None)
    assert spins > 0
    # without a deadline the call is a plain call
    assert interruptible(lambda x: x + 1, 1) == 2


@pytest.mark.skipif(not timer_available(), reason="no interval timer here")
def test_an_outer_timer_survives_an_inner_deadline() -> None:
    import signal

    fired: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda s, f: fired.append(s))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # (replaces pytest-timeout's while here)
        with deadline_at(time.perf_counter() + 10.0):
            assert interruptible(lambda x: x * 2, 21) == 42
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 10.0 < left <= 30.0 and not fired  # re-armed with what was left of it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_baseline_takes_the_largest_size_the_docs_allow(tmp_path: Path) -> None:
    top = MAX_UNITS["baseline"]
    assert top > MAX_UNITS["compare"]
    pb = Problem(num_stages=64, num_microbatches=top // 64, t_f=1.0, t_b=1.0, t_w=1.0)
    path = tmp_path / "p.json"
    path.write_text(pb.model_dump_json())
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["baseline", "1f1b", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["generator"] == "1f1b"


def test_compare_makes_each_strongest_baselines_likely_best_chunking_before_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # on a busy machine every strongest row gets a schedule before either spends time on its
    # other chunkings (issue 32.2); each (baseline, chunking) is still made once
    pb = bench_problem(4, 8, 2, 0.5, 0.5).with_changes(layers_per_stage=4)
    path = tmp_path / "p.json"
    path.write_text(pb.model_dump_json())
    calls = _count_calls(monkeypatch)
    args = ["compare", str(path), "--json", "--time-limit", "20", "--solver", "heuristic"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert not [k for k, n in Counter(calls).items() if n > 1]
    strong = [(n, h) for n, h in calls if n in STRONGEST_BASELINES]
    assert [n for n, _ in strong[:2]] == list(STRONGEST_BASELINES)
    most = max(v for v, _ in chunkings(pb))
    hashes = {rechunk(pb, most, "interleaved").hash, rechunk(pb, most, "vshape").hash}
    assert strong[0][1] in hashes and strong[1][1] in hashes
    assert len(strong) > 2  # then their other chunkings
    doc = json.loads(res.stdout)
    assert {"pipeoffload", "adaoffload"} <= {r["name"] for r in doc["schedules"]}
