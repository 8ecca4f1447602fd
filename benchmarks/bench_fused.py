"""Fused or split backward per backward, where a fused BW is cheaper than B then W (issue 3).

Measured profiles often have one: the Lightning strategy records ``t_bw`` next to ``t_b`` and
``t_w``. The solver then fuses B, W pairs of its best list schedule where that is faster
(``fusing``), and CP-SAT's model chooses, per backward, one BW op or B then W. Before, every
schedule it built ran every backward split, fused ones came only from the baselines (GPipe,
1F1B), and CP-SAT's bound proved nothing there.

For each instance this runs ``solve`` twice, side by side: with fusing (``fused choice``) and
with the split-only solver of before (``split only``, ``fusing.FUSE_BACKWARDS = False``), and
reports each one's makespan, status and gap, how many backwards the first one fuses, and the
best baseline. Costs as in
``bench_solver.py`` (F = B = W = 1 s per stage, split over chunks), with ``t_bw`` = ``--bw``
times ``t_b + t_w``.

    python benchmarks/bench_fused.py --instances 4x8x1:none:0.5,8x32x1:0.5:0.5 --bw 0.8
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from bench_solver import make_problem, parse_instance, run_baselines

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import SolveResult, fusing, solve


@dataclass
class Row:
    name: str
    bw: float
    fused: SolveResult
    fused_seconds: float
    split: SolveResult
    split_seconds: float
    baseline: tuple[str, float] | None


def best_baseline(pb: Problem) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for name, sched in run_baselines(pb).items():
        ev = None if isinstance(sched, str) else sched.evaluation
        if ev is None or not ev.feasible or ev.makespan is None:
            continue  # not applicable, or does not fit
        if best is None or ev.makespan < best[1]:
            best = (name, ev.makespan)
    return best


def run(spec: tuple[int, int, int, float | None, float], bw: float, limit: float) -> Row:
    p, m, v, mem, copy = spec
    base = make_problem(p, m, v, mem, copy)
    t_b = float(base.cost("t_b")[0, 0])
    t_w = float(base.cost("t_w")[0, 0])
    pb = base.with_changes(t_bw=bw * (t_b + t_w), name=f"{base.name} bw={bw:g}")
    name = f"{p}x{m}x{v}, {'unlimited' if mem is None else f'{mem:g}p'}, {copy:g}x"
    out = []
    for fuse in (True, False):
        fusing.FUSE_BACKWARDS = fuse
        t0 = time.perf_counter()
        res = solve(pb, time_limit=limit, workers=2, seed=0)
        out.append((res, time.perf_counter() - t0))
    fusing.FUSE_BACKWARDS = True
    return Row(name, bw, out[0][0], out[0][1], out[1][0], out[1][1], best_baseline(pb))


def table(rows: list[Row]) -> str:
    lines = [
        "| instance | BW / (B + W) | best baseline | split only | gap | fused choice | gap | "
        "fused backwards | fused / split |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n_bw = sum(1 for row in r.fused.schedule.actions for a in row if a.op == "BW")
        n_back = sum(1 for row in r.fused.schedule.actions for a in row if a.op in ("B", "BW"))
        base = "-" if r.baseline is None else f"{r.baseline[1]:.4g} ({r.baseline[0]})"
        lines.append(
            f"| {r.name} | {r.bw:g} | {base} | {r.split.makespan:.4g} ({r.split.status}) | "
            f"{r.split.gap:.1%} | {r.fused.makespan:.4g} ({r.fused.status}) | {r.fused.gap:.1%} | "
            f"{n_bw} of {n_back} | {r.fused.makespan / r.split.makespan:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--instances",
        default="4x8x1:none:0.5,4x8x1:0.5:0.5,8x32x1:none:0.5,8x32x1:0.5:0.5",
        help="PxMxV:mem:copy, comma-separated (mem: share of 1F1B's memory, or none)",
    )
    ap.add_argument("--bw", default="0.8", help="t_bw / (t_b + t_w), comma-separated")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    args = ap.parse_args(argv)
    specs = [parse_instance(t, "bench_fused") for t in args.instances.split(",") if t.strip()]
    ratios = [float(x) for x in args.bw.split(",") if x.strip()]
    rows = []
    for spec in specs:
        for bw in ratios:
            rows.append(run(spec, bw, args.time_limit))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    text = (
        f"Command: `python benchmarks/bench_fused.py {' '.join(argv or sys.argv[1:])}`\n\n"
        + table(rows)
    )
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
