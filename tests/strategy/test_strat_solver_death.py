"""A background solver that dies is noticed, logged once with the reason, and given up
(issue 33.2): training keeps its schedule."""

from __future__ import annotations

import logging
import time

import pytest
from bench_problems import bench_problem

from optpipe_lightning.strategy.scheduling.resolve import BackgroundSolver

WAIT = 120.0


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_killed_background_solver_is_logged_once_and_given_up(
    start_method: str, caplog: pytest.LogCaptureFixture
) -> None:
    problem = bench_problem(8, 32, 2)
    solver = BackgroundSolver(problem, 1e9, time_limit=600, start_method=start_method)
    solver.proc.kill()
    end = time.monotonic() + WAIT
    with caplog.at_level(logging.WARNING):
        while not solver.done:
            assert time.monotonic() < end, "the dead solver was never noticed"
            solver.poll()
            time.sleep(0.02)
        for _ in range(3):
            assert solver.poll().kind == "done"
    lines = [r.getMessage() for r in caplog.records if "background solver" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "killed by SIGKILL" in lines[0] and "given up" in lines[0]


def test_the_solver_child_ends_quietly_when_the_training_process_is_gone() -> None:
    import json
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "optpipe_lightning.solver.background"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    request = {"problem": bench_problem(4, 8).model_dump_json(), "time_limit": 60}
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    proc.stdout.close()  # the reader is gone: its next line meets a broken pipe
    err = proc.stderr.read()
    proc.wait(timeout=WAIT)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
