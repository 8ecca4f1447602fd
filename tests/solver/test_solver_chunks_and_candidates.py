"""solve() with chunks as a decision, given candidates, and the lowest peak among ties."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from bench_problems import bench_problem
from typer.testing import CliRunner

import optpipe_lightning.schedule.baselines.adaoffload as adaoffload_mod
import optpipe_lightning.solver.candidates as candidates_mod
import optpipe_lightning.solver.phases as phases_mod
from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.bounds import lower_bound
from optpipe_lightning.schedule.chunking import rechunk
from optpipe_lightning.solver import InfeasibleMemoryLimit, solve
from optpipe_lightning.solver.incumbent import Best


def layered(mem: float | None = None, layers: int = 4) -> Problem:
    """4 stages x 8 microbatches, F = 1, B = 1.5, W = 0.5 per stage, activation 4 (B frees 3),
    ``layers`` layers per stage; copies of the whole activation take one F."""
    return Problem(
        num_stages=4,
        num_microbatches=8,
        t_f=1.0,
        t_b=1.5,
        t_w=0.5,
        m_f=4.0,
        m_b=-3.0,
        m_w=-1.0,
        memory_limit=mem,
        offload=None if mem is None else {"bytes": 4.0, "d2h_bandwidth": 4, "h2d_bandwidth": 4},
        layers_per_stage=layers,
    )


def test_solve_searches_every_chunking_and_keeps_the_best() -> None:
    base = layered()
    res = solve(base, backend="heuristic", time_limit=30, workers=1)
    tried = res.schedule.params["chunkings"]
    assert [(c["num_chunks"], c["placement"]) for c in tried] == [
        (1, "interleaved"),
        (2, "interleaved"),
        (2, "vshape"),
        (4, "interleaved"),
        (4, "vshape"),
    ]
    best = min(c["makespan"] for c in tried)
    assert res.makespan == pytest.approx(best)
    one = solve(base, backend="heuristic", time_limit=30, workers=1, chunkings=[(1, "x")])
    assert res.makespan < one.makespan  # finer chunks shrink the fill and drain
    # the schedule is for the winning re-chunking: it embeds it and records its chunking
    sched = res.schedule
    assert sched.problem is not None and sched.problem_hash == sched.problem.hash
    assert (sched.num_chunks, sched.placement) == (
        sched.problem.num_chunks,
        sched.problem.placement,
    )
    assert sched.problem.hash == rechunk(base, sched.num_chunks or 1, sched.placement or "").hash
    # the bound is the least over the chunkings (each holds for its own schedules only)
    assert res.lower_bound <= min(c["lower_bound"] for c in tried) + 1e-9
    assert res.lower_bound <= min(lower_bound(rechunk(base, v, "interleaved")) for v in (1, 2, 4))


def test_a_limit_only_finer_chunks_fit_is_solved_with_them() -> None:
    """Below one whole activation (what one chunk per stage needs, offload or not) but above
    what chunks need when the lower ones are offloaded while the higher ones run."""
    base = layered(mem=3.0, layers=4)
    with pytest.raises(InfeasibleMemoryLimit):
        solve(base, chunkings=[(1, "interleaved")], time_limit=1)
    res = solve(base, backend="heuristic", time_limit=10, workers=1)
    assert res.schedule.num_chunks in (2, 4)
    ev = res.schedule.evaluation
    assert ev is not None and ev.feasible and max(ev.peak_memory) <= 3.0 + 1e-9


def test_a_chunking_the_layers_do_not_allow_is_an_error() -> None:
    with pytest.raises(ValueError, match="allowed chunk counts: 1, 2, 4"):
        solve(layered(), chunkings=[(3, "interleaved")], time_limit=1)


def _slow_adaoffload(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = adaoffload_mod.adaoffload

    def slow(problem: Problem) -> Any:
        time.sleep(seconds)  # past the solver's share, as on a busy machine
        return real(problem)

    monkeypatch.setattr(adaoffload_mod, "adaoffload", slow)


def _without_fitted_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The list rules that tie adaoffload here, and the rule search, out of the solver."""
    rules = phases_mod.default_rules
    # default_rules is looked up where the list rules run and where the rule search starts
    for mod in (candidates_mod, phases_mod):
        monkeypatch.setattr(mod, "default_rules", lambda p: [r for r in rules(p) if not r.fit])
    monkeypatch.setattr(phases_mod, "search_rules", lambda *a, **k: iter(()))


def test_given_candidates_are_never_beaten_by_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_fitted_rules(monkeypatch)
    pb = bench_problem(4, 8, 2, mem=0.25, copy=2.0)  # adaoffload 50.5, the rules left 96
    ada = generate("adaoffload", pb)
    assert ada.evaluation is not None and ada.evaluation.makespan == pytest.approx(50.5)
    alone = solve(pb, backend="heuristic", time_limit=0.5, workers=1, use_baselines=False)
    assert alone.makespan > 60
    res = solve(
        pb, backend="heuristic", time_limit=0.5, workers=1, use_baselines=False, candidates=[ada]
    )
    assert res.makespan == pytest.approx(50.5)
    assert res.incumbents[0].source == "baseline:adaoffload"  # the first answer, at once
    # a candidate for another problem is ignored, and said so
    other = generate("1f1b", bench_problem(4, 8, 1, mem=None))
    res = solve(pb, backend="heuristic", time_limit=0.2, workers=1, candidates=[other])
    assert res.message is not None and "another problem" in res.message


def test_compare_optpipe_is_never_slower_when_a_baseline_is_slow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The baseline is slowed past the solver's whole share (but within the baselines' half of
    the limit): compare's row of it is a candidate of the solver, so the optpipe row ties it."""
    _without_fitted_rules(monkeypatch)
    _slow_adaoffload(monkeypatch, 1.5)
    path = tmp_path / "p.json"
    path.write_text(bench_problem(4, 8, 2, mem=0.25, copy=2.0).model_dump_json())
    res = CliRunner().invoke(
        app, ["compare", str(path), "--json", "--time-limit", "8", "--solver", "heuristic"]
    )
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["schedules"]}
    assert rows["adaoffload"]["makespan"] == pytest.approx(50.5)
    fastest = min(r["makespan"] for r in rows.values() if r["feasible"])
    assert rows["optpipe"]["feasible"]
    assert rows["optpipe"]["makespan"] <= fastest * (1 + 1e-9)
    for r in rows.values():
        assert r["num_chunks"] >= 1 and r["placement"] in ("interleaved", "vshape")


def test_equal_makespans_keep_the_lower_peak() -> None:
    """GPipe and 1F1B (fused backward) take the same time on one stage, GPipe holding every
    microbatch and 1F1B one: whichever comes first, the incumbent ends with 1F1B."""
    pb = Problem(num_stages=1, num_microbatches=4, t_f=1, t_b=1, t_w=1, memory_limit=10.0, m_f=1.0)
    gpipe, ofob = generate("gpipe", pb), generate("1f1b", pb)
    assert gpipe.evaluation is not None and ofob.evaluation is not None
    assert gpipe.evaluation.makespan == pytest.approx(ofob.evaluation.makespan)
    assert max(gpipe.evaluation.peak_memory) > max(ofob.evaluation.peak_memory)
    for order in ([gpipe, ofob], [ofob, gpipe]):
        best = Best(pb, time.perf_counter(), None, 0.0)
        for s in order:
            best.offer(s, s.generator)
        assert best.schedule is ofob
    # the whole solve: every schedule of one stage takes m(F+B+W); it returns the least peak
    res = solve(pb, backend="heuristic", time_limit=30, workers=1, candidates=[gpipe])
    ev = res.schedule.evaluation
    assert ev is not None and res.makespan == pytest.approx(12.0)
    assert max(ev.peak_memory) == pytest.approx(1.0)


def test_a_baseline_stopped_at_its_deadline_keeps_the_chunkings_it_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a busy machine a row shows the best of the chunkings done in time, not nothing."""
    import optpipe_lightning.schedule.baselines as baselines_pkg
    from optpipe_lightning.schedule.baselines import generate_chunked
    from optpipe_lightning.schedule.baselines._deadline import (
        DeadlineExceeded,
        check_deadline,
        deadline_at,
    )

    real = baselines_pkg.generate

    def finer_never_end(name: str, problem: Problem) -> Any:
        while problem.num_chunks > 1:  # every finer chunking runs past the deadline
            check_deadline()
            time.sleep(0.01)
        return real(name, problem)

    monkeypatch.setattr(baselines_pkg, "generate", finer_never_end)
    base = layered(mem=None)
    with deadline_at(time.perf_counter() + 0.3):
        made = generate_chunked("gpipe", base)
    assert [s.num_chunks for s in made] == [1]  # the own chunking, computed first
    with deadline_at(time.perf_counter() + 0.3), pytest.raises(DeadlineExceeded):
        generate_chunked("gpipe", rechunk(base, 2, "interleaved"))  # nothing finished
