"""The solver on the Zero Bubble paper's measured profiles under tight memory (issue 3, 2% goal).

The 24 synthetic rows of ``bench_solver.py`` (F = B = W = 1, copies 0.5x or 2x) are where the
gap is hardest. This script measures the same goals on the two measured settings shipped in
``examples/problems/`` (the ZB paper's 1.5B, p=8 m=24, and 14.6B, p=16 m=48: measured F, B, W,
comm; activation bytes from the model shape; whole activations offloaded at 25 GB/s each way,
two GPUs per PCIe switch). Each is solved at memory limits that are a share of 1F1B's peak
(``p`` activations on stage 0): 1, 0.75, 0.5 and 0.25 by default. On these profiles a copy takes
about 3x the microbatch's F + B + W on its stage, and two stages share one copy channel, so
copies are slow here too.

For each row: the best feasible baseline (name and makespan), the solver's makespan, its proven
bound, the gap ``(solved - bound) / bound`` (the issue's measure), the status, the time to the
first solution and the whole solve's wall time.

    python benchmarks/bench_paper_solver.py                          # 8 rows, 60 s each
    python benchmarks/bench_paper_solver.py --mems 0.5 --time-limit 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench_solver import run_baselines

from optpipe_lightning.schedule import Problem
from optpipe_lightning.solver import InfeasibleMemoryLimit, solve

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "1.5B": "zb-1.5b-p8-m24.json",
    "14.6B": "zb-14.6b-p16-m48.json",
}


def limited(base: Problem, share: float) -> Problem:
    """``base`` with a memory limit of ``share`` x 1F1B's peak (p activations of stage 0)."""
    act = float(base.cost("m_f")[0].sum())
    return base.with_changes(memory_limit=share * base.num_stages * act)


def row(model: str, share: float, time_limit: float, workers: int) -> str:
    base = Problem.model_validate_json((ROOT / "examples/problems" / SETTINGS[model]).read_text())
    pb = limited(base, share)
    best_name, best = "-", None
    for name, res in run_baselines(pb).items():
        ev = None if isinstance(res, str) else res.evaluation
        if ev is None or not ev.feasible or ev.makespan is None:
            continue
        if best is None or ev.makespan < best:
            best_name, best = name, ev.makespan
    t0 = time.perf_counter()
    try:
        res = solve(pb, time_limit=time_limit, workers=workers, seed=0)
    except InfeasibleMemoryLimit as e:
        return f"| {model} | {share:g}p | {best_name} | - | - | - | - | {e} | - | - |"
    wall = time.perf_counter() - t0
    gap = (res.makespan - res.lower_bound) / res.lower_bound
    ev = res.schedule.evaluation
    base_cell = "OOM" if best is None else f"{best:.4f} ({best_name})"
    return (
        f"| {model} | {share:g}p | {base_cell} | {res.makespan:.4f} | {res.lower_bound:.4f} | "
        f"{gap:.1%} | {ev.num_offloaded if ev else '-'} | "
        f"{res.status} | {res.first_solution_seconds:.3f} | {wall:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="1.5B,14.6B", help="comma-separated: 1.5B, 14.6B")
    ap.add_argument("--mems", default="1,0.75,0.5,0.25", help="shares of 1F1B's peak memory")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    models = [x.strip() for x in args.models.split(",") if x.strip()]
    bad = [x for x in models if x not in SETTINGS]
    if bad:
        raise SystemExit(f"bench_paper_solver: unknown model {bad[0]!r}; use 1.5B or 14.6B")
    try:
        shares = [float(x) for x in args.mems.split(",") if x.strip()]
    except ValueError:
        raise SystemExit("bench_paper_solver: --mems takes numbers, e.g. 1,0.5") from None
    print(f"Command: `python benchmarks/bench_paper_solver.py {' '.join(argv or sys.argv[1:])}`")
    print()
    print(
        "| model | memory | best baseline (s) | solved (s) | bound (s) | gap | offloads | status"
        " | t first (s) | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        for share in shares:
            print(row(model, share, args.time_limit, args.workers), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
