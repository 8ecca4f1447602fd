"""Issue 32: the search beyond the rules, judged by the one simulator (deterministic: tries are
counted, never timed)."""

from __future__ import annotations

from pathlib import Path

from bench_problems import bench_problem
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.baselines._gis_order import group_sizes
from optpipe_lightning.solver import action_search, gis_search

runner = CliRunner()


def _offload_everything(problem: Problem, rows: list[list]) -> list[list]:
    for s in range(problem.num_stages):
        for a in [a for a in rows[s] if a.op == "F"]:
            rows = action_search._add_offload(rows, s, a.mb, a.chunk) or rows
    return rows


def test_the_action_search_drops_offloads_that_only_delay() -> None:
    pb = bench_problem(4, 8, 1, 10.0, 2.0)  # a limit never reached, copies twice the compute
    plain = generate("1f1b", pb)
    slow = _offload_everything(pb, [list(r) for r in plain.actions])
    start = simulate(pb, slow)
    assert start.feasible and start.makespan is not None
    assert start.makespan > plain.evaluation.makespan  # type: ignore[union-attr]
    seen: list[float] = []
    rows, res, tried = action_search.improve(
        pb, slow, max_tries=200, on_better=lambda r, x: seen.append(x.makespan)
    )
    assert 0 < tried <= 200
    assert res.feasible and res.makespan is not None
    assert res.makespan <= plain.evaluation.makespan * (1 + 1e-9)  # type: ignore[union-attr]
    assert seen and seen == sorted(seen, reverse=True) and seen[-1] == res.makespan
    assert simulate(pb, rows).makespan == res.makespan  # what it returns is what it timed


def test_the_action_search_is_reproducible_and_never_worse() -> None:
    pb = bench_problem(4, 8, 2, 0.5, 0.5)
    start = generate("adaoffload", pb)
    a = action_search.improve(pb, start, max_tries=60, seed=3)
    b = action_search.improve(pb, start, max_tries=60, seed=3)
    assert a[0] == b[0] and a[2] == b[2] == 60
    assert a[1].feasible
    assert a[1].makespan <= start.evaluation.makespan * (1 + 1e-9)  # type: ignore[union-attr,operator]


def test_a_start_that_does_not_fit_is_returned_unsearched() -> None:
    pb = bench_problem(4, 8, 1, 0.25, 0.5)
    rows = [list(r) for r in generate("1f1b", pb).actions]
    out, res, tried = action_search.improve(pb, rows, max_tries=10)
    assert tried == 0 and not res.feasible and out == rows


def _gpt_problem(tmp: Path) -> Problem:
    path = tmp / "p.json"
    args = "--layers 32 --hidden 4096 --heads 32 --seq-len 8192 --microbatch-size 1 --device h100"
    args += " --efficiency 0.35 --attention flash --stages 8 --microbatches 8 --chunks 4"
    args += " --placement interleaved --memory-limit-microbatches 2 --offload"
    args += " --copy-bandwidth 25GB --stages-per-copy-channel 2"
    res = runner.invoke(app, ["problem", *args.split(), "--out", str(path)])
    assert res.exit_code == 0, res.output
    return Problem.model_validate_json(path.read_text())


def test_group_sizes_the_published_family_leaves_out_can_beat_adaoffload(tmp_path: Path) -> None:
    pb = _gpt_problem(tmp_path)  # no PipeOffload member fits here (every chunk offloaded)
    assert gis_search.applies(pb)
    ada = generate("adaoffload", pb).evaluation
    assert ada is not None and ada.makespan is not None
    found = list(gis_search.extra_members(pb, ada.makespan))
    assert found, "the extra group sizes found nothing faster than adaoffload"
    times = [s.evaluation.makespan for s in found]  # type: ignore[union-attr]
    assert all(t is not None and t < ada.makespan for t in times)
    assert times == sorted(times, reverse=True)  # each beats the ones before
    for s in found:
        again = simulate(pb, s.actions)
        assert again.feasible and again.makespan == s.evaluation.makespan  # type: ignore[union-attr]
        g = s.params["group_size"]
        assert isinstance(g, int) and 2 <= g <= pb.num_stages
        if s.params.get("offload") != "excess":  # the grid: only sizes not published
            assert g not in group_sizes(pb)
    assert list(gis_search.extra_members(pb, 0.0)) == []  # nothing beats a zero makespan


def test_the_extra_group_sizes_apply_only_to_interleaved_offload_under_a_limit() -> None:
    assert not gis_search.applies(bench_problem(4, 8, 2, 0.5, 0.5))  # V-shape
    assert not gis_search.applies(bench_problem(4, 8, 1, 0.5, 0.5))  # one chunk
