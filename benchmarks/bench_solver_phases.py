"""What two solver phases add: the steady-state bound and the periodic search (issue 22, item 8).

Each instance is solved once per variant, the variants side by side (one instance after the
other, so a change in the machine's load hits every variant of a row alike):

- ``all``: ``solve`` as it is;
- ``-steady``: without the steady-state bound (``solver/steady_bound.py``: its phase returns 0);
- ``-periodic``: without the periodic search (``solver/periodic.py``: its phase does nothing);
- ``-both``: without either.

A variant whose phase does not apply to the instance is not run (its row would repeat ``all``).
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

solve_module = importlib.import_module("optpipe_lightning.solver.solve")

# the 24 memory-limited rows of bench_solver's table, with copies 1x where the periodic search
# also runs, and the measured profiles at half and a quarter of 1F1B's memory
DEFAULT = [
    f"{p}x{m}x{v}:{mem}:{copy}"
    for p, m in ((4, 8), (8, 32), (16, 64))
    for v in (1, 2)
    for mem in (0.25, 0.5)
    for copy in (0.5, 2)
] + ["8x32x1:0.25:1", "8x32x1:0.5:1", "16x64x1:0.25:1", "16x64x1:0.5:1"]
DEFAULT += ["1.5B:0.5", "1.5B:0.25", "14.6B:0.5", "14.6B:0.25"]
VARIANTS = ("all", "-steady", "-periodic", "-both")


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
def without(steady: bool, periodic_search: bool) -> Iterator[None]:
    saved = (solve_module.steady_state_bound, solve_module._run_periodic)
    try:
        if steady:
            solve_module.steady_state_bound = lambda *a, **k: 0.0  # type: ignore[assignment]
        if periodic_search:
            solve_module._run_periodic = lambda *a, **k: None  # type: ignore[assignment]
        yield
    finally:
        solve_module.steady_state_bound, solve_module._run_periodic = saved


def run(pb: Problem, variant: str, time_limit: float, workers: int) -> dict[str, Any]:
    with without(
        "steady" in variant or "both" in variant, "periodic" in variant or "both" in variant
    ):
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
        "steady_s": phases.get("steady-state bound", 0.0),
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
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", default=None, help="one JSON object per solve")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    jf = open(a.jsonl, "w") if a.jsonl else None  # noqa: SIM115 - closed below
    lines = [
        "| instance | all: solved / bound | -steady | -periodic | -both | steady s | periodic s |",
        "|---|---|---|---|---|---|---|",
    ]
    for text in a.instances.split(","):
        pb = problem_of(text)
        limited_memory = any(x is not None for x in pb.memory_limits())
        got: dict[str, dict[str, Any]] = {}
        for v in variants:
            if v != "all" and not limited_memory:
                continue
            if v in ("-periodic", "-both") and not periodic.applies(pb):
                continue  # the periodic search does not run here: -periodic is all
            got[v] = r = run(pb, v, a.time_limit, a.workers)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if jf:
                jf.write(json.dumps(r) + "\n")
                jf.flush()
        base = got["all"]
        if "-both" not in got and "-steady" in got:
            got["-both"] = got["-steady"]  # no periodic search here: -both is -steady
        cells = [_cell(got.get(v), base) if v != "all" else _cell(base, base) for v in VARIANTS]
        lines.append(
            f"| {text} | "
            + " | ".join(cells)
            + f" | {base['steady_s']:.1f} | {base['periodic_s']:.1f} |"
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
