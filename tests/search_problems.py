"""Problems and checks shared by the tests of the solver's search steps (warm-up fill, final
groups): bench_peer's family at a small size, and what every searched order must keep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.schedule import Problem

runner = CliRunner()


def gpt_problem(
    tmp: Path, stages: int = 4, microbatches: int = 8, memory_microbatches: int = 2
) -> Problem:
    """bench_peer's family at a small size (h4096, s8k, 4 interleaved chunks, offload over a
    lane shared by two stages): PipeOffload's g < p leaves warm-up gaps here."""
    path = tmp / "p.json"
    args = f"--layers {4 * stages} --hidden 4096 --heads 32 --seq-len 8192 --microbatch-size 1"
    args += f" --device h100 --efficiency 0.35 --attention flash --stages {stages}"
    args += f" --microbatches {microbatches} --chunks 4 --placement interleaved"
    args += f" --memory-limit-microbatches {memory_microbatches} --offload"
    args += " --copy-bandwidth 25GB --stages-per-copy-channel 2"
    res = runner.invoke(app, ["problem", *args.split(), "--out", str(path)])
    assert res.exit_code == 0, res.output
    return Problem.model_validate_json(path.read_text())


def deterministic_solve(pb: Problem, **kw: Any) -> Any:
    """``solve`` on the heuristic backend with a deterministic budget (1 deterministic second,
    seed 0, one worker, no LNS) at the problem's own chunking; ``kw`` adds or overrides."""
    from solver_budget import UNBOUNDED_SECONDS

    from optpipe_lightning.solver import solve

    args: dict[str, Any] = {
        "backend": "heuristic",
        "time_limit": UNBOUNDED_SECONDS,
        "deterministic_time": 1.0,
        "seed": 0,
        "workers": 1,
        "lns": False,
        "chunkings": [(pb.num_chunks, pb.placement)],
    }
    return solve(pb, **{**args, **kw})


def check_rows(pb: Problem, rows: list[list]) -> None:
    """Every compute op once; F before B before W; each OFFLOAD before its RELOAD before its B."""
    for s in range(pb.num_stages):
        ops = [(a.op, a.mb, a.chunk) for a in rows[s]]
        assert len(ops) == len(set(ops))
        assert sum(1 for a in rows[s] if a.is_compute) == 3 * pb.num_microbatches * pb.num_chunks
        for j in range(pb.num_microbatches):
            for c in range(pb.num_chunks):
                f, b = ops.index(("F", j, c)), ops.index(("B", j, c))
                assert f < b < ops.index(("W", j, c))
                if ("OFFLOAD", j, c) in ops:
                    assert f < ops.index(("OFFLOAD", j, c)) < ops.index(("RELOAD", j, c)) < b
