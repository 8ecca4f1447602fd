"""Needless offloads are dropped from the answer at no cost in makespan (``offload_trim``)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.chunking import rechunk
from optpipe_lightning.schedule.margin import apply_memory_margin
from optpipe_lightning.solver.offload_trim import trim_offloads

runner = CliRunner()


def _readme_problem(tmp: Path) -> Problem:
    """README's command-line problem (a GPT on 8 A100s, 8 microbatches of memory) at 5% margin,
    3 interleaved chunks: PipeOffload offloads a chunk of every microbatch on every stage."""
    path = tmp / "p.json"
    args = "--layers 24 --hidden 2304 --heads 24 --seq-len 1024 --microbatch-size 6"
    args += " --device a100 --stages 8 --microbatches 24 --memory-limit-microbatches 8 --offload"
    res = runner.invoke(app, ["problem", *args.split(), "--out", str(path)])
    assert res.exit_code == 0, res.output
    pb = Problem.model_validate_json(path.read_text())
    return rechunk(apply_memory_margin(pb, 0.05), 3, "interleaved")


def test_offloads_that_buy_nothing_go_and_the_makespan_and_limit_hold(tmp_path: Path) -> None:
    pb = _readme_problem(tmp_path)
    start = generate("pipeoffload", pb)
    assert start.evaluation is not None and start.evaluation.num_offloaded == 192
    out, dropped = trim_offloads(start)
    assert out.evaluation is not None and out.evaluation.feasible
    assert dropped == 192 - out.evaluation.num_offloaded and out.evaluation.num_offloaded < 60
    assert out.evaluation.makespan is not None and start.evaluation.makespan is not None
    assert out.evaluation.makespan <= start.evaluation.makespan
    # the one simulator agrees, within every stage's limit
    again = simulate(pb, out.actions)
    assert again.feasible
    for peak, limit in zip(out.evaluation.peak_memory, pb.memory_limits(), strict=True):
        assert limit is not None and peak <= limit * (1 + 1e-9)
    # the stages that need copies keep some: the first stage holds the most microbatches
    assert any(a.op == "OFFLOAD" for a in out.actions[0])
    # deterministic, and a trimmed schedule has nothing left to trim
    assert trim_offloads(start)[0].actions == out.actions
    assert trim_offloads(out) == (out, 0)


def test_a_bounded_trim_stops_and_a_schedule_without_offloads_is_returned_as_is(
    tmp_path: Path,
) -> None:
    pb = _readme_problem(tmp_path)
    start = generate("pipeoffload", pb)
    some, dropped = trim_offloads(start, max_tries=3)
    assert 0 < dropped < 154 and some.evaluation is not None and some.evaluation.feasible
    assert trim_offloads(start, max_tries=0) == (start, 0)
    plain = generate(
        "1f1b", rechunk(pb.model_copy(update={"memory_limit": None}), 1, "interleaved")
    )
    assert trim_offloads(plain) == (plain, 0)
