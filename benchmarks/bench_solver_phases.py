"""What the periodic search adds to solved makespans (issue 22, item 8).

Each instance is solved with ``solve`` as it is (``all``) and without the periodic search
(``-periodic``: ``solver/periodic.py``'s phase does nothing), side by side (one right after the
other, so a change in the machine's load hits both alike); where the search does not apply the
second run is left out. The version of this script at commit 503ebb7 also measured the
steady-state bound (``solver/steady_bound.py``), removed after that measurement (BENCHMARKS.md).
Instances: ``PxMxV:mem:copy`` as in ``bench_solver.py`` (F = B = W = 1 per stage) or
``1.5B:share`` / ``14.6B:share`` (the ZB paper's measured profiles of ``bench_paper_solver.py``).

    python benchmarks/bench_solver_phases.py --time-limit 30
    python benchmarks/bench_solver_phases.py --instances 8x32x1:0.25:2,14.6B:0.5 --time-limit 60
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench_paper_solver import ROOT, SETTINGS, limited
from bench_solver import make_problem, parse_instance

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import periodic, solve

phases_module = importlib.import_module("optpipe_lightning.solver.phases")

# the slow-copy rows of bench_solver's 24-row table (where the periodic search runs), copies 1x,
# and the measured profiles at half and a quarter of 1F1B's memory
DEFAULT = [
    f"{p}x{m}x{v}:{mem}:{copy}"
    for copy in (2, 1)
    for p, m in ((4, 8), (8, 32), (16, 64))
    for v in ((1, 2) if copy == 2 else (1,))
    for mem in (0.25, 0.5)
    if copy == 2 or p > 4
] + ["1.5B:0.5", "1.5B:0.25", "14.6B:0.5", "14.6B:0.25"]
VARIANTS = ("all", "-periodic")


def problem_of(text: str) -> Problem:
    head = text.split(":")[0]
    if head in SETTINGS:
        share = float(text.split(":")[1])
        base = Problem.model_validate_json(
            (ROOT / "examples/problems" / SETTINGS[head]).read_text()
        )
        return limited(base, share).with_changes(name=text)
    p, m, v, mem, copy = parse_instance(text, "bench_solver_phases")
    return make_problem(p, m, v, mem, copy).with_changes(name=text)


@contextmanager
def without_periodic(off: bool) -> Iterator[None]:
    saved = phases_module._run_periodic
    try:
        if off:
            phases_module._run_periodic = lambda *a, **k: None
        yield
    finally:
        phases_module._run_periodic = saved


def run(pb: Problem, variant: str, time_limit: float, workers: int) -> dict[str, Any]:
    with without_periodic(variant == "-periodic"):
        res = solve(pb, time_limit=time_limit, workers=workers, seed=0)
    phases = res.schedule.params.get("phase_seconds") or {}
    return {
        "instance": pb.name,
        "variant": variant,
        "makespan": res.makespan,
        "bound": res.lower_bound,
        "gap": res.gap,
        "source": res.schedule.params.get("source"),
        "t_final": res.incumbents[-1].wall_time if res.incumbents else None,
        "periodic_s": phases.get("periodic", 0.0),
        "wall": res.solve_seconds,
    }


def _cell(r: dict[str, Any] | None, base: dict[str, Any]) -> str:
    if r is None:
        return "="
    ms, bd = r["makespan"], r["bound"]
    d_ms = "" if abs(ms - base["makespan"]) < 1e-9 else f" ({ms / base['makespan'] - 1:+.1%})"
    d_bd = "" if abs(bd - base["bound"]) < 1e-9 else f" ({bd / base['bound'] - 1:+.1%})"
    return f"{ms:.4g}{d_ms} / {bd:.4g}{d_bd}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--instances", default=",".join(DEFAULT))
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", default=None, help="one JSON object per solve")
    a = ap.parse_args(argv)
    jf = open(a.jsonl, "w") if a.jsonl else None  # noqa: SIM115 - closed below
    lines = [
        "| instance | solved / bound | -periodic | periodic (s) | source |",
        "|---|---|---|---|---|",
    ]
    for text in a.instances.split(","):
        pb = problem_of(text)
        limited_memory = any(x is not None for x in pb.memory_limits())
        got: dict[str, dict[str, Any]] = {}
        for v in VARIANTS:
            if v != "all" and not (limited_memory and periodic.applies(pb)):
                continue  # the periodic search does not run here: -periodic is all
            got[v] = r = run(pb, v, a.time_limit, a.workers)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if jf:
                jf.write(json.dumps(r) + "\n")
                jf.flush()
        base = got["all"]
        lines.append(
            f"| {text} | {_cell(base, base)} | {_cell(got.get('-periodic'), base)} | "
            f"{base['periodic_s']:.1f} | {base['source']} |"
        )
    if jf:
        jf.close()
    cmd = "python benchmarks/bench_solver_phases.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    print(f"Command: `{cmd}` ({a.time_limit:g} s per solve, {a.workers} workers)\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
