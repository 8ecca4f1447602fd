"""Each command at the largest problem it takes, and the refusal of a larger one.

    python benchmarks/bench_size_limits.py [--quick]

For every command: the wall time at its largest accepted size (``size_guard.MAX_UNITS``) and, for
``solve`` and ``compare``, the ratio to the time limit (their smallest accepted limit there, and
compare's default 10 s with ``--no-solve``); then how long the issue's 64 x 4096 x 2 takes to be
refused, in-process and as a fresh ``optpipe`` process (Python start-up included). The problems
are the solver benchmark's (F = B = W = 1, half of 1F1B's memory, copies as slow as compute).
``--quick`` skips the runs that take the full time limit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_solver import make_problem
from typer.testing import CliRunner

from optpipe_lightning.cli import app
from optpipe_lightning.cli.size_guard import MAX_UNITS, min_time_limit
from optpipe_lightning.schedule.baselines import generate

runner = CliRunner()


def _run(args: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    res = runner.invoke(app, args)
    return time.perf_counter() - t0, res.exit_code, res.stderr.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the full-time-limit runs")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    tmp = Path(tempfile.mkdtemp(prefix="optpipe-bench-"))

    def problem(p: int, m: int, v: int) -> Path:
        path = tmp / f"{p}x{m}x{v}.json"
        path.write_text(make_problem(p, m, v, 0.5, 1.0).model_dump_json())
        return path

    rows: list[tuple[str, str, float, float | None, int]] = []
    sim = make_problem(64, 2048, 2, 0.5, 1.0)
    assert MAX_UNITS["simulate"] == 64 * 2048 * 2
    sched = tmp / "sim.json"
    sched.write_text(generate("gpipe", sim).to_json())  # over the limit: simulate exits 1
    took, code, _ = _run(["simulate", str(problem(64, 2048, 2)), str(sched), "--json"])
    rows.append(("simulate (gpipe)", "64x2048x2", took, None, code))
    trace_sched = tmp / "trace.json"
    trace_sched.write_text(generate("gpipe", make_problem(64, 512, 2, 0.5, 1.0)).to_json())
    took, code, _ = _run(["trace", str(trace_sched), "--out", str(tmp / "t.json")])
    size = (tmp / "t.json").stat().st_size / 1e6
    rows.append((f"trace ({size:.0f} MB)", "64x512x2", took, None, code))
    took, code, _ = _run(["compare", str(problem(64, 256, 2)), "--no-solve", "--json"])
    rows.append(("compare --no-solve", "64x256x2", took, 10.0, code))
    if not args.quick:
        for command in ("solve", "compare"):
            pb = make_problem(64, 512, 1, 0.5, 1.0)
            limit = min_time_limit(pb, command)
            took, code, _ = _run([command, str(problem(64, 512, 1)), "--json",
                                  "--time-limit", repr(limit)])  # fmt: skip
            rows.append((f"{command} --time-limit {limit:.3g}", "64x512x1", took, limit, code))
            for shape in ((64, 256, 2), (16, 2048, 1)):
                pb2 = make_problem(*shape, 0.5, 1.0)
                limit = min_time_limit(pb2, command)
                took, code, _ = _run([command, str(problem(*shape)), "--json",
                                      "--time-limit", repr(limit)])  # fmt: skip
                name = "x".join(map(str, shape))
                rows.append((f"{command} --time-limit {limit:.3g}", name, took, limit, code))
    huge = problem(64, 4096, 2)
    took, code, err = _run(["compare", str(huge), "--json"])
    rows.append(("compare (refused)", "64x4096x2", took, None, code))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "optpipe_lightning.cli", "compare", str(huge)],
        capture_output=True,
        text=True,
        check=False,
    )
    rows.append(("optpipe compare process (refused)", "64x4096x2", time.perf_counter() - t0,
                 None, proc.returncode))  # fmt: skip
    print(f"{'command':36} {'problem':10} {'wall s':>8} {'limit':>6} {'wall/limit':>10} exit")
    for name, shape, took, limit, code in rows:
        ratio = f"{took / limit:.3f}" if limit else "-"
        lim = f"{limit:.3g}" if limit else "-"
        print(f"{name:36} {shape:10} {took:8.2f} {lim:>6} {ratio:>10} {code}")
    print(f"refusal: {err}")


if __name__ == "__main__":
    main()
